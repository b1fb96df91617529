"""HTTP limits: request heads are bounded, a request must arrive within its deadline,
and bodies over the limit are refused (413) before they are read: by the control
plane's API for chunked bodies too, and by the front end before authentication lets
anyone's body in."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from urllib.parse import urlsplit

import httpx
import pytest

from plait.frontend.proxy import MAX_BODY
from plait.harness.shards import ShardedBox
from plait.server.limits import MAX_HEADER_BYTES, Corked, LimitedHttpProtocol


def connect(url: str) -> socket.socket:
    parts = urlsplit(url)
    return socket.create_connection((parts.hostname, parts.port), timeout=30)


def closed_within(sock: socket.socket, seconds: float) -> bool:
    """The server closed the connection (EOF or reset) within ``seconds``."""
    sock.settimeout(0.2)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            data = sock.recv(65536)
        except TimeoutError:
            continue
        except OSError:
            return True
        if not data:
            return True
    return False


def read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    answer = b""
    try:
        while chunk := sock.recv(65536):
            answer += chunk
    except OSError:  # (a reset after the answer)
        pass
    return answer


def test_a_request_head_over_the_limit_is_refused(live):
    with connect(live.url) as sock:
        with contextlib.suppress(OSError):  # (closed while it still sent)
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " +
                         b"a" * (MAX_HEADER_BYTES * 2) + b"\r\n\r\n")
        answer = read_until_closed(sock)
        assert answer == b"" or answer.split(b" ")[1] == b"431", answer[:200]
    assert live.admin.get("/healthz").status_code == 200  # the server is fine


def test_a_head_that_grows_past_the_limit_in_small_pieces_is_refused(live):
    """The head is counted as it arrives, whatever the size of each piece (the
    parser would buffer a header line of any length)."""
    with connect(live.url) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: ")
        sent = 0
        with pytest.raises(OSError):  # refused and closed before it is all sent
            while sent <= MAX_HEADER_BYTES * 4:
                sock.sendall(b"a" * 1024)
                sent += 1024
                time.sleep(0.001)  # (the subject: a head arriving in pieces over time)
        assert sent <= MAX_HEADER_BYTES * 4
    assert live.admin.get("/healthz").status_code == 200


def test_requests_sent_together_on_one_connection_are_each_answered(live):
    """Two requests in one write (pipelined), then one in pieces within the deadline:
    each is answered, in order, on the one connection."""
    head = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    with connect(live.url) as sock:
        sock.sendall(head + head)
        for piece in (head[:10], head[10:30], head[30:]):
            sock.sendall(piece)
            time.sleep(0.05)  # (the subject: a request arriving in pieces over time)
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        answer = read_until_closed(sock)
    assert answer.count(b"HTTP/1.1 200 ") == 4, answer[:400]


def test_a_request_that_does_not_arrive_in_time_is_cut(live, monkeypatch):
    monkeypatch.setattr(LimitedHttpProtocol, "deadline", 1.0)
    with connect(live.url) as silent, connect(live.url) as slow:
        slow.sendall(b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\n")  # then nothing
        assert closed_within(silent, 20) and closed_within(slow, 20)
    # a request that arrives whole is answered, however long it then takes to answer
    assert live.admin.get("/healthz").status_code == 200


def test_a_chunked_body_over_the_limit_is_a_413(live):
    def chunks():
        for _ in range(MAX_BODY // 65536 + 2):
            yield b"x" * 65536

    r = live.admin.post("/v1/jobs", content=chunks())
    assert r.status_code == 413 and r.json()["error"] == "too_large", r.text
    small = httpx.post(f"{live.url}/v1/jobs", headers=dict(live.admin.headers),
                       content=iter([b'{"name": "c"']))
    assert small.status_code == 422  # under the limit: read and judged as usual


def test_the_front_end_reads_no_body_over_the_limit_nor_from_anyone(tmp_path):
    with ShardedBox(tmp_path, shards=1, machines=2) as box:
        url = box.front.url
        anon = httpx.Client(base_url=url, timeout=30)
        r = anon.post("/v1/jobs", content=b"{}")
        assert r.status_code == 401
        r = anon.post("/v1/jobs", headers={"Authorization": "Bearer plait_x_y"},
                      content=b"{}")
        assert r.status_code == 401 and r.json()["message"] == "invalid token"

        def chunks(n: int):
            for _ in range(n):
                yield b"x" * 65536

        # unauthenticated and chunked: refused before the body is read
        assert anon.post("/v1/jobs", content=chunks(2000)).status_code == 401
        # authenticated: a declared length over the limit, and a chunked body that
        # passes it, are both 413
        with connect(url) as sock:
            sock.sendall(b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nAuthorization: " +
                         box.api.headers["authorization"].encode() +
                         b"\r\nContent-Length: 50000000\r\n\r\n")
            assert b" 413 " in sock.recv(65536).split(b"\r\n")[0] + b" "
        r = box.api.post("/v1/jobs", content=chunks(MAX_BODY // 65536 + 2))
        assert r.status_code == 413, r.text
        anon.close()


class Transport:
    """What a transport was asked to do."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        assert not self.closed, "written after close"
        self.writes.append(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str) -> str:
        return f"info {name}"


def test_writes_in_one_turn_of_the_loop_leave_as_one_and_close_sends_them_first():
    async def scenario() -> Transport:
        raw = Transport()
        corked = Corked(raw, asyncio.get_running_loop())  # type: ignore[arg-type]
        corked.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
        corked.write(b"ok")
        assert raw.writes == []  # not yet: the turn goes on
        await asyncio.sleep(0)
        assert raw.writes == [b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"]
        corked.write(b"last")
        corked.close()  # what is pending goes out before the close
        assert raw.writes[-1] == b"last" and raw.closed
        await asyncio.sleep(0)  # (the turn's flush finds nothing left)
        assert len(raw.writes) == 2
        assert corked.get_extra_info("peername") == "info peername"  # the rest: as is
        return raw

    asyncio.run(scenario())


def test_a_tls_server_stops_at_once_with_an_idle_keep_alive_client(tmp_path):
    """An idle TLS connection does not hold the server's stop until asyncio's 30 s for
    a close_notify the client never sends; a request under way still completes."""
    import ssl
    import threading

    import uvicorn

    from plait.server.limits import uvicorn_options
    from plait.testing import free_port, wait_for
    from plait.tls import make_lab_certs

    release, arrived = threading.Event(), threading.Event()

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        if scope["path"] == "/slow":  # answered only once the stop has begun
            arrived.set()
            while not release.is_set():
                await asyncio.sleep(0.01)
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})
    certs = make_lab_certs(tmp_path / "certs", ["127.0.0.1"])
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(
        app, host="127.0.0.1", port=port, log_level="warning", **uvicorn_options(),
        ssl_certfile=str(certs["server"]), ssl_keyfile=str(certs["server-key"])))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for(lambda: server.started, 30, "the server starts")
    trust = ssl.create_default_context(cafile=str(certs["ca"]))
    idle = httpx.Client(verify=trust, base_url=f"https://127.0.0.1:{port}")
    busy = httpx.Client(verify=trust, base_url=f"https://127.0.0.1:{port}", timeout=30)
    try:
        assert idle.get("/").text == "ok"  # its connection stays open, idle
        answers: list[httpx.Response] = []
        under_way = threading.Thread(target=lambda: answers.append(busy.get("/slow")))
        under_way.start()
        wait_for(arrived.is_set, what="the request reaches the app")
        started = time.monotonic()
        server.should_exit = True

        def refused() -> bool:  # the stop has begun: the server listens no more
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
            except OSError:
                return True
            return False

        wait_for(refused, what="the server stops listening")
        release.set()
        under_way.join(30)
        thread.join(20)
        assert not thread.is_alive(), "the server's stop waited on the idle connection"
        assert time.monotonic() - started < 20
        assert [a.text for a in answers] == ["ok"]  # the request under way completed
    finally:
        idle.close()
        busy.close()
        server.should_exit = True
        thread.join(35)
