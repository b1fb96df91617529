"""plait.tracing on its own: free when off; when on, spans nest, travel in
``traceparent``, are written one JSON object a line or sent over OTLP/HTTP; a server
span continues its caller's trace; a pass is a root with its phases and is dropped
when idle; store calls are spans only within a traced block."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

from plait import tracing
from plait.errors import Conflict, NotFound, ValidationError
from plait.store.protocol import Transaction
from plait.store.sqlite import SqliteStore

Spans = Callable[[], list[dict[str, Any]]]
CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"


@pytest.fixture
def spans(tmp_path: Path) -> Iterator[Spans]:
    """Tracing on, to a file; the spans written so far (flushed first)."""
    path = tmp_path / "spans.jsonl"
    assert tracing.configure(file=path, service="unit", instance="here")

    def read() -> list[dict[str, Any]]:
        tracing.flush()
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines()]

    try:
        yield read
    finally:
        tracing.shutdown()


def one(spans: list[dict[str, Any]], name: str) -> dict[str, Any]:
    found = [s for s in spans if s["name"] == name]
    assert len(found) == 1, (name, [s["name"] for s in spans])
    return found[0]


# -- off ------------------------------------------------------------------------------------
def test_off_every_hook_gives_back_what_it_was_given_and_spans_are_one_object() -> None:
    assert not tracing.configure()  # nothing to export to: stays off
    assert not tracing.enabled()
    first = tracing.span("a")
    assert tracing.span("b", kind="client", key="x") is first
    with first as s:
        s.set_attribute("k", 1)
    headers = [("traceparent", f"00-{CALLER_TRACE}-{CALLER_SPAN}-01")]
    assert tracing.inject(headers) is headers  # a proxy passes the caller's on as is

    def app() -> None: ...

    store = object()
    assert tracing.asgi(app) is app
    assert tracing.store(store) is store
    assert tracing.argv() == []

    @tracing.phased("pass")
    def run(x: int) -> int:
        tracing.phase("one", n=x)
        tracing.idle(True)
        return x + 1

    assert run(1) == 2
    tracing.phase("outside any run")  # (nothing to do, and no error)


def test_a_file_that_cannot_be_written_is_refused_and_tracing_stays_off(tmp_path) -> None:
    with pytest.raises(ValidationError, match="cannot write traces"):
        tracing.configure(file=tmp_path / "missing" / "spans.jsonl")
    assert not tracing.enabled()


# -- spans in a file ------------------------------------------------------------------------
def test_spans_nest_and_are_written_one_json_object_a_line(spans: Spans) -> None:
    with tracing.span("outer", job="web") as outer:
        outer.set_attribute("tasks", 3)
        with tracing.span("inner", kind="client"):
            pass
    with pytest.raises(RuntimeError), tracing.span("broken"):
        raise RuntimeError("no")
    got = spans()
    o, i, b = one(got, "outer"), one(got, "inner"), one(got, "broken")
    assert len(o["trace_id"]) == 32 and len(o["span_id"]) == 16
    assert o["parent_id"] is None and o["kind"] == "internal"
    assert o["attributes"] == {"job": "web", "tasks": 3}
    assert (i["trace_id"], i["parent_id"], i["kind"]) == (o["trace_id"], o["span_id"], "client")
    assert o["start_ns"] <= i["start_ns"] <= i["end_ns"] <= o["end_ns"]
    assert (o["service"], o["instance"]) == ("unit", "here")
    assert b["trace_id"] != o["trace_id"]  # another root, another trace
    assert b["status"] == "error" and b["events"][0]["name"] == "exception"
    assert o["status"] == "unset"


def test_inject_puts_the_current_span_in_place_of_the_callers(spans: Spans) -> None:
    sent = [("traceparent", f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"), ("x-request-id", "r1")]
    assert tracing.inject(sent) == sent  # no span under way: nothing to say
    with tracing.span("hop"):
        out = tracing.inject(sent)
    hop = one(spans(), "hop")
    parents = [v.rsplit("-", 1) for k, v in out if k == "traceparent"]
    assert [p for p, _ in parents] == [f"00-{hop['trace_id']}-{hop['span_id']}"]
    assert int(parents[0][1], 16) & 1  # sampled
    assert ("x-request-id", "r1") in out


def test_configured_again_it_exports_to_the_new_place_only(tmp_path, spans: Spans) -> None:
    with tracing.span("first"):
        pass
    first = spans()
    assert tracing.configure(file=tmp_path / "other.jsonl", service="unit")
    with tracing.span("second"):
        pass
    tracing.flush()
    assert [s["name"] for s in first] == ["first"]
    assert [json.loads(x)["name"] for x in (tmp_path / "other.jsonl").read_text()
            .splitlines()] == ["second"]
    assert tracing.argv() == ["--trace-file", str((tmp_path / "other.jsonl").resolve())]


# -- a server -------------------------------------------------------------------------------
async def _drive(app: Any, scope: dict[str, Any], messages: list[dict[str, Any]]
                 ) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []
    queue = list(messages)

    async def receive() -> dict[str, Any]:
        return queue.pop(0) if queue else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    return sent


def _http(path: str, headers: list[tuple[bytes, bytes]]) -> dict[str, Any]:
    return {"type": "http", "method": "GET", "path": path, "headers": headers,
            "query_string": b""}


def test_a_server_span_continues_the_callers_trace(spans: Spans) -> None:
    async def api(scope: Any, receive: Any, send: Any) -> None:
        with tracing.span("handler"):
            await send({"type": "http.response.start", "status": 404, "headers": []})
            await send({"type": "http.response.body", "body": b"{}"})

    app = tracing.asgi(api)
    asyncio.run(_drive(app, _http("/v1/jobs/web", [
        (b"traceparent", f"00-{CALLER_TRACE}-{CALLER_SPAN}-01".encode()),
        (b"x-request-id", b"req-1")]), []))
    asyncio.run(_drive(app, _http("/v1/jobs/other", [(b"x-request-id", b"no spaces")]), []))

    async def in_process() -> None:  # (as the web UI calls the API: no traceparent)
        with tracing.span("ui"):
            await _drive(app, _http("/v1/jobs/third", []), [])

    asyncio.run(in_process())
    got = spans()
    server = [s for s in got if s["kind"] == "server"]
    assert [s["name"] for s in server] == ["GET /v1/jobs/{name}"] * 3  # one name per route
    called, fresh, inner = server
    assert inner["parent_id"] == one(got, "ui")["span_id"]
    assert (called["trace_id"], called["parent_id"]) == (CALLER_TRACE, CALLER_SPAN)
    assert called["attributes"]["http.route"] == "/v1/jobs/{name}"
    assert called["attributes"]["http.response.status_code"] == 404
    assert called["attributes"]["plait.request_id"] == "req-1"
    assert "plait.request_id" not in fresh["attributes"]  # (not an id plait would keep)
    assert fresh["parent_id"] is None and fresh["trace_id"] != CALLER_TRACE
    handler = [s for s in got if s["name"] == "handler"]
    assert {(h["trace_id"], h["parent_id"]) for h in handler} == {
        (s["trace_id"], s["span_id"]) for s in server}


def test_a_server_exports_its_spans_before_it_says_it_has_shut_down(tmp_path) -> None:
    path = tmp_path / "spans.jsonl"
    tracing.configure(file=path, service="unit")
    try:
        async def api(scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] == "lifespan":
                while (await receive())["type"] != "lifespan.shutdown":
                    pass
                await send({"type": "lifespan.shutdown.complete"})
                return
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b""})

        app = tracing.asgi(api)
        asyncio.run(_drive(app, _http("/healthz", []), []))
        written_at_shutdown: list[str] = []

        async def lifespan() -> None:
            async def receive() -> dict[str, Any]:
                return {"type": "lifespan.shutdown"}

            async def send(message: dict[str, Any]) -> None:
                written_at_shutdown.append(path.read_text() if path.exists() else "")

            await app({"type": "lifespan"}, receive, send)

        asyncio.run(lifespan())
        assert '"GET /healthz"' in written_at_shutdown[0]
    finally:
        tracing.shutdown()


# -- a pass ---------------------------------------------------------------------------------
@tracing.phased("pass")
def a_pass(idle: bool, fail: bool = False) -> int:
    tracing.phase("reports")
    with tracing.span("work"):
        pass
    tracing.phase("save", changed_jobs=2)
    tracing.idle(idle)
    if fail:
        raise RuntimeError("store down")
    return 7


def test_a_pass_is_a_root_span_with_a_child_per_phase(spans: Spans) -> None:
    assert a_pass(idle=False) == 7
    got = spans()
    root, reports, save, work = (one(got, n) for n in ("pass", "pass.reports", "pass.save",
                                                       "work"))
    assert root["parent_id"] is None
    assert {reports["parent_id"], save["parent_id"]} == {root["span_id"]}
    assert work["parent_id"] == reports["span_id"]  # (what a phase calls is its child)
    assert reports["end_ns"] <= save["start_ns"]
    assert save["attributes"] == {"changed_jobs": 2}
    assert len({s["trace_id"] for s in got}) == 1


def test_an_idle_pass_is_dropped_with_its_phases_unless_it_fails(spans: Spans) -> None:
    assert a_pass(idle=True) == 7
    assert spans() == []
    with pytest.raises(RuntimeError):
        a_pass(idle=True, fail=True)
    got = spans()
    assert sorted(s["name"] for s in got) == ["pass", "pass.reports", "pass.save", "work"]
    assert one(got, "pass")["status"] == "error"


# -- the store ------------------------------------------------------------------------------
def test_store_calls_are_spans_within_a_traced_block_only(tmp_path, spans: Spans) -> None:
    base = SqliteStore(str(tmp_path / "plait.db"))
    store = tracing.store(base)
    try:
        assert store.create("/a", b"x") == 0  # (housekeeping: no span)
        with tracing.span("request"):
            assert store.get("/a") == (b"x", 0)
            with pytest.raises(NotFound):
                store.get("/missing")
            with pytest.raises(Conflict):
                store.set("/a", b"y", 5)
            store.commit(Transaction().set("/a", b"y", 0).create("/b", b"z"))
            assert sorted(store.children("/")) == ["a", "b"]
            assert store.get_many(["/a", "/b", "/c"]).keys() == {"/a", "/b"}
        session = store.session(5.0)  # (anything else is the store's own)
        session.close()
        got = spans()
    finally:
        base.close()
    request = one(got, "request")
    ops = [s for s in got if s["name"].startswith("store.")]
    assert [s["name"] for s in ops] == ["store.get", "store.get", "store.set", "store.commit",
                                       "store.children", "store.get_many"]
    assert {s["parent_id"] for s in ops} == {request["span_id"]}
    assert {s["kind"] for s in ops} == {"client"}
    assert {s["attributes"]["db.system.name"] for s in ops} == {"sqlite"}
    missing, conflict, commit = ops[1], ops[2], ops[3]
    assert missing["attributes"]["plait.store.key"] == "/missing"
    # not finding a key, losing a compare-and-swap: outcomes, not errors
    assert (missing["status"], missing["attributes"]["plait.store.outcome"]) == (
        "unset", "notfound")
    assert conflict["attributes"]["plait.store.outcome"] == "conflict"
    assert commit["attributes"]["plait.store.ops"] == 2
    assert ops[5]["attributes"]["plait.store.keys"] == 3


# -- OTLP over HTTP -------------------------------------------------------------------------
class _Collector(BaseHTTPRequestHandler):
    received: ClassVar[list[tuple[str, str, bytes]]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.received.append((self.path, self.headers["Content-Type"], body))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def test_an_otlp_endpoint_is_sent_the_spans_over_http_protobuf() -> None:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    server = HTTPServer(("127.0.0.1", 0), _Collector)
    _Collector.received = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        assert tracing.configure(endpoint=endpoint, service="collected")
        assert tracing.argv() == ["--otlp-endpoint", endpoint]
        with tracing.span("hello", job="web"):
            pass
        tracing.shutdown()  # (exports what is pending)
    finally:
        tracing.shutdown()
        server.shutdown()
        server.server_close()
    assert _Collector.received, "nothing reached the collector"
    path, content_type, body = _Collector.received[0]
    assert (path, content_type) == ("/v1/traces", "application/x-protobuf")
    request = ExportTraceServiceRequest.FromString(body)
    resource = request.resource_spans[0]
    service = {a.key: a.value.string_value for a in resource.resource.attributes}
    assert service["service.name"] == "collected"
    names = [s.name for scope in resource.scope_spans for s in scope.spans]
    assert names == ["hello"]


@pytest.mark.parametrize(("given", "url"), [
    ("http://collector:4318", "http://collector:4318/v1/traces"),
    ("http://collector:4318/", "http://collector:4318/v1/traces"),
    ("https://collector/otlp/v1/traces", "https://collector/otlp/v1/traces"),
])
def test_a_bare_endpoint_gets_the_traces_path(given: str, url: str) -> None:
    from plait.tracing.otel import traces_url

    assert traces_url(given) == url
