"""The OpenTelemetry side of ``plait.tracing``: imported only when tracing is
configured, and the only module of plait that imports OpenTelemetry.

The process keeps its own TracerProvider (never the global one: several control
planes in one test process each configure and stop tracing, and FastAPI's own
telemetry, which follows the global provider, stays off). Spans are exported in
batches by a thread of the SDK, to an OTLP/HTTP collector and/or a file
(``JsonLinesExporter``); ``PassFilter`` holds a phased run's spans until it ends and
drops those of an idle one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from contextvars import ContextVar
from typing import Any, ParamSpec, TypeVar
from urllib.parse import urlsplit

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import SpanKind, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from plait import __version__, requestid
from plait.errors import Conflict, NotFound
from plait.metrics import api_route

P = ParamSpec("P")
R = TypeVar("R")

KINDS = {"internal": SpanKind.INTERNAL, "server": SpanKind.SERVER,
         "client": SpanKind.CLIENT, "producer": SpanKind.PRODUCER,
         "consumer": SpanKind.CONSUMER}
#: the attribute that marks a phased run as idle (dropped with its spans)
IDLE = "plait.idle"
_TRACE_HEADERS = ("traceparent", "tracestate")
_TRACE_HEADER_BYTES = tuple(h.encode() for h in _TRACE_HEADERS)
#: how long a server's shutdown waits for its last spans to be exported
FLUSH_MILLIS = 5000


def traces_url(endpoint: str) -> str:
    """The OTLP/HTTP traces URL of a collector: a bare ``http://host:4318`` gets
    ``/v1/traces`` (as OTEL_EXPORTER_OTLP_ENDPOINT does); a URL with a path is used as
    it is."""
    if urlsplit(endpoint).path in ("", "/"):
        return endpoint.rstrip("/") + "/v1/traces"
    return endpoint


class Tracing:
    """Tracing of this process: the provider, its exporters, and the wrappers that
    ``plait.tracing`` hands out while it is on."""

    def __init__(self, endpoint: str | None, file: str | None, service: str,
                 instance: str | None = None) -> None:
        self.endpoint, self.file = endpoint, file
        attributes: dict[str, str] = {"service.name": service, "service.version": __version__}
        if instance:
            attributes["service.instance.id"] = instance
        exporters: list[SpanExporter] = []
        if file:
            exporters.append(JsonLinesExporter(file))
        if endpoint:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporters.append(OTLPSpanExporter(endpoint=traces_url(endpoint)))
        self.filter = PassFilter([BatchSpanProcessor(e) for e in exporters])
        self.provider = TracerProvider(resource=Resource.create(attributes))
        self.provider.add_span_processor(self.filter)
        self.tracer = self.provider.get_tracer("plait", __version__)
        self.propagator = TraceContextTextMapPropagator()
        self._run: ContextVar[PhasedRun | None] = ContextVar("plait_phased_run",
                                                             default=None)

    def shutdown(self) -> None:
        self.provider.shutdown()

    def flush(self, timeout_millis: int = 30000) -> None:
        self.provider.force_flush(timeout_millis)

    # -- spans and propagation ---------------------------------------------------------
    def span(self, name: str, kind: str, attrs: dict[str, Any]
             ) -> AbstractContextManager[trace.Span]:
        return self.tracer.start_as_current_span(name, kind=KINDS[kind],
                                                 attributes=attrs or None)

    def inject(self, headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
        carrier: dict[str, str] = {}
        self.propagator.inject(carrier)
        if not carrier:
            return headers
        kept = [(k, v) for k, v in headers if k.lower() not in _TRACE_HEADERS]
        return [*kept, *carrier.items()]

    def extract(self, headers: Sequence[tuple[bytes, bytes]]) -> Context | None:
        """The caller's span, from its ``traceparent``; None without one (the span
        under way, if any, is then the parent: an app called in-process, as the web
        UI calls the API)."""
        carrier = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in headers
                   if k.lower() in _TRACE_HEADER_BYTES}
        if "traceparent" not in carrier:
            return None
        return self.propagator.extract(carrier, context=Context())

    # -- wrappers ----------------------------------------------------------------------
    def asgi(self, app: Any) -> ServerSpans:
        return ServerSpans(app, self)

    def instrument(self, app: Any) -> None:
        app.add_middleware(ServerSpans, tracing=self)

    def store(self, store: Any) -> TracedStore:
        return TracedStore(store, self)

    # -- phased runs (passes) ----------------------------------------------------------
    def phased(self, name: str, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        # a root span of its own: a pass is nobody's child
        with self.tracer.start_as_current_span(name, context=Context()) as root:
            self.filter.hold(root.get_span_context().trace_id)
            run = PhasedRun(self, name, root)
            token = self._run.set(run)
            try:
                return fn(*args, **kwargs)
            finally:
                run.end_phase()
                self._run.reset(token)

    def phase(self, name: str, attrs: dict[str, Any]) -> None:
        run = self._run.get()
        if run is not None:
            run.phase(name, attrs)

    def idle(self) -> None:
        run = self._run.get()
        if run is not None:
            run.root.set_attribute(IDLE, True)


class PhasedRun:
    """The phases of one phased run: one child span open at a time, made current so
    that the store calls of a phase are its children."""

    def __init__(self, tracing: Tracing, name: str, root: trace.Span) -> None:
        self.tracing, self.name, self.root = tracing, name, root
        self._within = trace.set_span_in_context(root, Context())
        self._open: trace.Span | None = None
        self._token: object = None

    def phase(self, name: str, attrs: dict[str, Any]) -> None:
        self.end_phase()
        span = self.tracing.tracer.start_span(f"{self.name}.{name}", context=self._within,
                                              attributes=attrs or None)
        self._token = otel_context.attach(trace.set_span_in_context(span))
        self._open = span

    def end_phase(self) -> None:
        if self._open is not None:
            otel_context.detach(self._token)  # type: ignore[arg-type]
            self._open.end()
            self._open = None


class PassFilter(SpanProcessor):
    """Passes spans on to the exporters' processors, except that those of a phased
    run are held until its root span ends, and dropped if it was idle (and did not
    fail)."""

    def __init__(self, processors: list[SpanProcessor]) -> None:
        self.processors = processors
        self._held: dict[int, list[ReadableSpan]] = {}
        self._lock = threading.Lock()

    def hold(self, trace_id: int) -> None:
        with self._lock:
            self._held[trace_id] = []

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        for p in self.processors:
            p.on_start(span, parent_context)

    def on_end(self, span: ReadableSpan) -> None:
        ctx = span.get_span_context()
        assert ctx is not None
        with self._lock:
            held = self._held.get(ctx.trace_id)
            if held is not None and span.parent is not None:
                held.append(span)
                return
            if held is not None:  # the run's root: it has ended
                del self._held[ctx.trace_id]
                if (span.attributes or {}).get(IDLE) and span.status.status_code is not (
                        StatusCode.ERROR):
                    return
                out = [*held, span]
            else:
                out = [span]
        for s in out:
            for p in self.processors:
                p.on_end(s)

    def shutdown(self) -> None:
        for p in self.processors:
            p.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return all(p.force_flush(timeout_millis) for p in self.processors)


# -- the file exporter ---------------------------------------------------------------------
_KIND_NAMES = {v: k for k, v in KINDS.items()}


def span_record(span: ReadableSpan) -> dict[str, Any]:
    """A finished span as one JSON object: ids in W3C hex (as in ``traceparent``),
    times in Unix nanoseconds."""
    ctx = span.get_span_context()
    assert ctx is not None
    resource = span.resource.attributes
    record: dict[str, Any] = {
        "name": span.name,
        "trace_id": f"{ctx.trace_id:032x}",
        "span_id": f"{ctx.span_id:016x}",
        "parent_id": f"{span.parent.span_id:016x}" if span.parent is not None else None,
        "kind": _KIND_NAMES.get(span.kind, str(span.kind)),
        "start_ns": span.start_time,
        "end_ns": span.end_time,
        "status": span.status.status_code.name.lower(),
        "attributes": dict(span.attributes or {}),
        "service": resource.get("service.name"),
    }
    if "service.instance.id" in resource:
        record["instance"] = resource["service.instance.id"]
    if span.status.description:
        record["status_message"] = span.status.description
    if span.events:
        record["events"] = [{"name": e.name, "time_ns": e.timestamp,
                             "attributes": dict(e.attributes or {})} for e in span.events]
    return record


class JsonLinesExporter(SpanExporter):
    """Appends one JSON object per finished span, a line each, to a file. Every batch
    is one ``write`` on a descriptor opened for appending, so the processes of one
    region (``plait up``) can share the file without mixing their lines."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        data = "".join(json.dumps(span_record(s), separators=(",", ":"), default=str) + "\n"
                       for s in spans).encode()
        with self._lock:
            if self._fd is None:
                return SpanExportResult.FAILURE
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(self._fd, view):]
            except OSError:
                return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


# -- HTTP servers --------------------------------------------------------------------------
def route_of(scope: dict[str, Any]) -> str:
    """The route template a FastAPI app matched, else the API's template of the path
    (the front end routes by hand): a span name per route, not per job."""
    route: Any = scope.get("route")
    path = getattr(route, "path_format", None) or getattr(route, "path", None)
    return str(path) if path else api_route(str(scope.get("path", "")))


class ServerSpans:
    """An ASGI wrapper: every HTTP request a server span, child of the caller's
    ``traceparent`` if it sent one, named by method and route, with the status and
    the request id."""

    def __init__(self, app: Any, tracing: Tracing) -> None:
        self.app, self.tracing = app, tracing

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, receive, self._flushing(send))
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t = self.tracing
        method = str(scope.get("method", ""))
        span = t.tracer.start_span(method, context=t.extract(scope["headers"]),
                                   kind=SpanKind.SERVER, attributes={
                                       "http.request.method": method,
                                       "url.path": str(scope.get("path", ""))})
        token = otel_context.attach(trace.set_span_in_context(span))
        status, rid = 500, None

        async def sending(message: Any) -> None:
            nonlocal status, rid
            if message["type"] == "http.response.start":
                status = int(message["status"])
                # (read while the request is handled: a request-id middleware inside
                # this one has set it, and may reset it once the request is done)
                rid = requestid.current.get() or _request_id(message.get("headers", ()))
            await send(message)

        try:
            await self.app(scope, receive, sending)
        except BaseException as exc:
            span.record_exception(exc)
            raise
        finally:
            route = route_of(scope)
            span.update_name(f"{method} {route}")
            span.set_attribute("http.route", route)
            span.set_attribute("http.response.status_code", status)
            rid = rid or requestid.current.get() or _request_id(scope["headers"])
            if rid:
                span.set_attribute("plait.request_id", rid)
            if status >= 500:
                span.set_status(StatusCode.ERROR, f"HTTP {status}")
            span.end()
            otel_context.detach(token)


    def _flushing(self, send: Any) -> Any:
        """``send`` that exports the spans pending before the server says it has shut
        down (uvicorn then re-raises the signal that stopped it: no exit handler
        would run)."""
        async def sending(message: Any) -> None:
            if message["type"] == "lifespan.shutdown.complete":
                await asyncio.to_thread(self.tracing.flush, FLUSH_MILLIS)
            await send(message)
        return sending


def _request_id(headers: Any) -> str | None:
    """The X-Request-Id among ``headers``, if it is one ``requestid`` would keep."""
    for k, v in headers:
        if k.lower() == b"x-request-id":
            given = bytes(v).decode("latin-1")
            return given if requestid.accept(given) == given else None
    return None


# -- the store -----------------------------------------------------------------------------
class TracedStore:
    """A store whose reads and writes are client spans when made within a traced
    request or pass; anything else (sessions, elections, watches) is the store's as
    it is. Not finding a key and a failed compare-and-swap are outcomes, not errors."""

    def __init__(self, store: Any, tracing: Tracing) -> None:
        self.base = store
        self._tracer = tracing.tracer
        name = type(store).__name__.lower()
        self._system = "zookeeper" if name.startswith("zk") else name.removesuffix("store")

    @contextlib.contextmanager
    def _span(self, op: str, **attrs: Any) -> Iterator[None]:
        with self._tracer.start_as_current_span(
                f"store.{op}", kind=SpanKind.CLIENT, record_exception=False,
                set_status_on_exception=False, attributes={
                    "db.system.name": self._system, "db.operation.name": op,
                    **attrs}) as span:
            try:
                yield
            except (NotFound, Conflict) as exc:
                span.set_attribute("plait.store.outcome", type(exc).__name__.lower())
                raise
            except Exception as exc:
                span.record_exception(exc)
                span.set_status(StatusCode.ERROR, type(exc).__name__)
                raise

    @staticmethod
    def _traced() -> bool:
        return trace.get_current_span().is_recording()

    def get(self, key: str) -> tuple[bytes, int]:
        if not self._traced():
            return self.base.get(key)  # type: ignore[no-any-return]
        with self._span("get", **{"plait.store.key": key}):
            return self.base.get(key)  # type: ignore[no-any-return]

    def get_many(self, keys: list[str]) -> dict[str, tuple[bytes, int]]:
        if not self._traced():
            return self.base.get_many(keys)  # type: ignore[no-any-return]
        with self._span("get_many", **{"plait.store.keys": len(keys)}):
            return self.base.get_many(keys)  # type: ignore[no-any-return]

    def exists(self, key: str) -> bool:
        if not self._traced():
            return bool(self.base.exists(key))
        with self._span("exists", **{"plait.store.key": key}):
            return bool(self.base.exists(key))

    def create(self, key: str, value: bytes, session: Any = None) -> int:
        if not self._traced():
            return int(self.base.create(key, value, session))
        with self._span("create", **{"plait.store.key": key, "plait.store.bytes": len(value)}):
            return int(self.base.create(key, value, session))

    def set(self, key: str, value: bytes, version: int) -> int:
        if not self._traced():
            return int(self.base.set(key, value, version))
        with self._span("set", **{"plait.store.key": key, "plait.store.bytes": len(value)}):
            return int(self.base.set(key, value, version))

    def delete(self, key: str, version: int) -> None:
        if not self._traced():
            self.base.delete(key, version)
            return
        with self._span("delete", **{"plait.store.key": key}):
            self.base.delete(key, version)

    def children(self, prefix: str) -> list[str]:
        if not self._traced():
            return self.base.children(prefix)  # type: ignore[no-any-return]
        with self._span("children", **{"plait.store.key": prefix}):
            return self.base.children(prefix)  # type: ignore[no-any-return]

    def commit(self, txn: Any, session: Any = None) -> None:
        if not self._traced():
            self.base.commit(txn, session)
            return
        ops = txn.ops
        with self._span("commit", **{"plait.store.ops": len(ops),
                                     "plait.store.key": ops[0].key if ops else ""}):
            self.base.commit(txn, session)

    def __getattr__(self, name: str) -> Any:  # sessions, elections, watches, leader_of...
        return getattr(self.base, name)
