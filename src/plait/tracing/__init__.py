"""Traces of what plait's servers do (OpenTelemetry): API requests through the front
end, the hop to a shard and the shard's handling of them, control-plane passes and
their phases, and the store calls made within any of these.

Off unless configured, and then free: this module imports nothing of OpenTelemetry,
``span()`` hands back one shared do-nothing context manager, ``asgi``, ``instrument``
and ``store`` give back what they were given, and a phase mark is one test of a
global. ``configure`` turns tracing on for the process (``plait serve``, ``plait
frontend`` and ``plait up`` call it from their options, or the environment):

    PLAIT_OTLP_ENDPOINT=http://collector:4318   OTLP over HTTP/protobuf (/v1/traces)
    PLAIT_TRACE_FILE=/path/spans.jsonl          one JSON object per finished span

Configure before building the apps and stores to trace: they are wrapped (or not)
when built. Only ``plait.tracing.otel`` imports OpenTelemetry, and only
``configure`` imports it (an import contract in pyproject.toml keeps it that way).

::

    request --> front end: server span "POST /v1/jobs"      (plait.request_id, status)
                  |-- store.get ...                       (the shard map)
                  '-- proxy (client span) --traceparent--> shard: server span "POST /v1/jobs"
                                                                    '-- store.create ...
    loop    --> pass --> pass.reports, pass.operations, pass.scheduler, pass.save ...
                                                          '-- store.commit ...

A pass that changed no job and recorded no event is not exported (``idle``): a
control plane passes several times a second, and an idle region would fill the
trace with empty passes. Store calls are traced only within a request or a pass (the
store's own housekeeping, sessions and watches, is not).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ParamSpec, Protocol, TypeVar, cast

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from plait.tracing.otel import Tracing

#: the environment variables the daemons' options read
ENV_ENDPOINT = "PLAIT_OTLP_ENDPOINT"
ENV_FILE = "PLAIT_TRACE_FILE"

P = ParamSpec("P")
R = TypeVar("R")
S = TypeVar("S")


class Span(Protocol):
    """What a caller may do with the span it is in (OpenTelemetry's Span has it)."""

    def set_attribute(self, key: str, value: Any) -> None: ...


class _Off:
    """The span when tracing is off: one object for every call, entered and left for
    nothing."""

    __slots__ = ()

    def __enter__(self) -> _Off:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def set_attribute(self, key: str, value: Any) -> None:
        return None


_OFF = _Off()

#: the tracing in force (None: off)
_on: Tracing | None = None


def configure(endpoint: str | None = None, file: str | Path | None = None,
              service: str = "plait", instance: str | None = None) -> bool:
    """Trace this process, to an OTLP/HTTP collector at ``endpoint`` and/or to
    ``file``; neither given: tracing stays off. ``service`` and ``instance`` name the
    process in every span (service.name, service.instance.id). Raises
    ``plait.errors.ValidationError`` if OpenTelemetry's SDK is not installed (the
    ``plait[tracing]`` extra) or the file cannot be opened. Whether tracing is on."""
    global _on
    if not endpoint and not file:
        return False
    from plait.errors import ValidationError

    try:
        from plait.tracing import otel
    except ImportError as exc:
        raise ValidationError("tracing", f"tracing needs OpenTelemetry's SDK ({exc.name} is "
                                         "not installed): pip install 'plait[tracing]'") from None
    shutdown()
    try:
        _on = otel.Tracing(endpoint or None, str(Path(file).resolve()) if file else None,
                           service, instance)
    except OSError as exc:
        raise ValidationError("tracing", f"cannot write traces to {file}: "
                                         f"{exc.strerror or exc}") from None
    return True


def enabled() -> bool:
    return _on is not None


def shutdown() -> None:
    """Export what is pending and turn tracing off (what was wrapped while it was on
    keeps a reference to it, and exports nothing more)."""
    global _on
    on, _on = _on, None
    if on is not None:
        on.shutdown()


def flush() -> None:
    """Export every finished span now (they are exported in batches, off the request
    path)."""
    if _on is not None:
        _on.flush()


def argv() -> list[str]:
    """The options that give a ``plait serve`` this process starts the same tracing."""
    if _on is None:
        return []
    return [*(["--otlp-endpoint", _on.endpoint] if _on.endpoint else []),
            *(["--trace-file", _on.file] if _on.file else [])]


def span(name: str, kind: str = "internal", **attrs: Any) -> AbstractContextManager[Span]:
    """A span around a block, the current span's child (``kind``: internal, client,
    server, producer, consumer). Off: the shared do-nothing context manager."""
    on = _on
    if on is None:
        return _OFF
    return on.span(name, kind, attrs)


def inject(headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """``headers`` with the current span as W3C ``traceparent`` (and ``tracestate``),
    in place of any the caller sent: the receiver's spans are its children. Off: the
    same list, as it is."""
    on = _on
    if on is None:
        return headers
    return on.inject(headers)


def asgi(app: Any) -> Any:
    """A plain ASGI app whose HTTP requests are server spans (the caller's
    ``traceparent`` as parent), or ``app`` itself when off."""
    on = _on
    if on is None:
        return app
    return on.asgi(app)


def instrument(app: Any) -> None:
    """The same for a FastAPI (Starlette) app, as its outermost middleware; nothing
    when off."""
    on = _on
    if on is not None:
        on.instrument(app)


def store(s: S) -> S:
    """A store whose calls within a traced request or pass are spans, or ``s`` itself
    when off."""
    on = _on
    if on is None:
        return s
    return cast(S, on.store(s))


def phased(name: str) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Decorate a function that runs in phases (a control-plane pass): each call is a
    root span ``name``, each ``phase()`` within it a child span, until the next one or
    the end. Off: one test per call."""
    def wrap(fn: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(fn)
        def run(*args: P.args, **kwargs: P.kwargs) -> R:
            on = _on
            if on is None:
                return fn(*args, **kwargs)
            return on.phased(name, fn, *args, **kwargs)
        return run
    return wrap


def phase(name: str, **attrs: Any) -> None:
    """The ``phased`` run under way enters phase ``name`` (the previous one ends)."""
    on = _on
    if on is not None:
        on.phase(name, attrs)


def idle(nothing_done: bool) -> None:
    """Say whether the ``phased`` run under way did nothing worth exporting (it is
    then dropped with its phases and store calls, unless it fails)."""
    on = _on
    if on is not None and nothing_done:
        on.idle()
