"""What the agent's loop sleeps on (woken from another thread, or by a process's
exit) and its HTTP probes. Waits are liveness bounds."""

from __future__ import annotations

import contextlib
import http.server
import socket
import subprocess
import sys
import threading
import time

import pytest

from plait.agent.probe import Prober, http_probe
from plait.agent.wakeup import Wakeup
from plait.testing import wait_for


@pytest.fixture
def wakeup():
    w = Wakeup()
    yield w
    w.close()


def test_set_from_another_thread_wakes_the_sleeper(wakeup):
    threading.Timer(0.2, wakeup.set).start()
    started = time.monotonic()
    assert wakeup.wait(30) == []
    assert time.monotonic() - started < 25  # woken, not timed out
    wakeup.set()  # a wake-up before the sleep is kept
    assert wakeup.wait(30) == []


def test_a_watched_process_exit_wakes_the_sleeper_once(wakeup):
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.3)"])
    try:
        wakeup.keep({"a.0": proc.pid})
        started = time.monotonic()
        assert wakeup.wait(30) == ["a.0"]
        assert time.monotonic() - started < 25
        # the same (exited, not yet reaped) process is not watched again: no busy loop
        wakeup.keep({"a.0": proc.pid})
        assert wakeup.wait(0.2) == []
    finally:
        proc.wait()


def test_nothing_wakes_a_quiet_sleeper(wakeup):
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        wakeup.keep({"a.0": proc.pid})
        started = time.monotonic()
        assert wakeup.wait(0.3) == []
        assert time.monotonic() - started >= 0.25
        wakeup.keep({})  # (no longer watched: its kill wakes nothing)
        proc.kill()
        proc.wait()
        assert wakeup.wait(0.2) == []
    finally:
        proc.kill()
        proc.wait()


class _Server:
    """An HTTP/1.1 server counting its connections; ``status`` is what it answers."""

    def __init__(self) -> None:
        self.connections = 0
        self.status = 200
        outer = self

        class H(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                outer.connections += 1
                super().setup()

            def do_GET(self) -> None:
                self.send_response(outer.status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def test_an_http_probe_judges_the_status_over_a_new_connection_each_time():
    server = _Server()
    try:
        for _ in range(3):
            assert http_probe("127.0.0.1", server.port, "/healthz", 5.0)
        assert server.connections == 3  # as a new client sees the task
        server.status = 301
        assert http_probe("127.0.0.1", server.port, "/", 5.0)  # (3xx passes)
        server.status = 500
        assert not http_probe("127.0.0.1", server.port, "/", 5.0)
    finally:
        server.close()
    # a task that accepts no new connections fails, whatever old ones still do
    assert not http_probe("127.0.0.1", server.port, "/", 5.0)


def test_a_probe_that_may_change_health_wakes_the_agent():
    server = _Server()
    woken = threading.Event()
    prober = Prober(on_change=woken.set)
    probe = {"http": "/", "interval_seconds": 0.1}
    try:
        assert not prober.check("a.0", probe, "127.0.0.1", server.port, {}, None, 0.0)
        assert woken.wait(30)  # passed while unhealthy
        wait_for(lambda: prober.check("a.0", probe, "127.0.0.1", server.port, {}, None, 1.0),
                 what="the probe passes", poll=0.01)
        assert prober.next_due(1.0) is not None
    finally:
        prober.close()
        server.close()


def test_an_http_probe_judges_the_status_line_and_never_reads_an_endless_body():
    """A task answering 200 and then a body that never ends passes at once: the agent
    reads no body (its size and its time are the task's, not the agent's)."""
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    stop = threading.Event()

    def serve():
        conn, _ = listener.accept()
        conn.recv(65536)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000000000\r\n\r\n")
        while not stop.is_set():
            try:
                conn.sendall(b"x")  # a byte now and then, for ever
            except OSError:
                break
            stop.wait(0.5)
        conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        verdict = []
        probe = threading.Thread(target=lambda: verdict.append(
            http_probe("127.0.0.1", listener.getsockname()[1], "/", 2.0)), daemon=True)
        probe.start()
        probe.join(30)  # a liveness bound
        assert verdict == [True]
    finally:
        stop.set()
        listener.close()


def _answering(*chunks: bytes, gap: float = 0.0) -> tuple[socket.socket, threading.Event]:
    """A one-connection server that reads the request and sends ``chunks``, ``gap``
    seconds apart, then closes."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    stop = threading.Event()

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            for chunk in chunks:
                if stop.wait(gap):
                    return
                with contextlib.suppress(OSError):
                    conn.sendall(chunk)

    threading.Thread(target=serve, daemon=True).start()
    return listener, stop


@pytest.mark.parametrize(("chunks", "verdict"), [
    ((b"HTTP/1.1 204 No Content\r\n\r\n",), True),
    ((b"HTTP/1.0 302 Found\r\nLocation: /x\r\n\r\n",), True),
    ((b"HTT", b"P/1.1 2", b"00 OK\r\n"), True),  # a status line in pieces
    ((b"HTTP/1.1 200\r\n",), True),  # (no reason phrase)
    ((b"HTTP/1.1 404 Not Found\r\n\r\n",), False),
    ((b"HTTP/1.1 503 Unavailable\r\n\r\n",), False),
    ((b"SSH-2.0-OpenSSH_9.2\r\n",), False),  # not HTTP
    ((b"HTTP/1.1 2000 OK\r\n",), False),
    ((b"x" * 5000,), False),  # no status line within its bound
    ((), False),  # closed without a word
])
def test_an_http_probe_reads_only_a_well_formed_status_line(chunks, verdict):
    listener, stop = _answering(*chunks, gap=0.05)
    try:
        assert http_probe("127.0.0.1", listener.getsockname()[1], "/healthz", 5.0) is verdict
    finally:
        stop.set()
        listener.close()


def test_an_http_probe_that_drips_fails_at_its_deadline():
    """The timeout bounds the whole probe, not each read: a task sending its status
    line a byte at a time, slower than that, fails."""
    listener, stop = _answering(*(bytes([b]) for b in b"HTTP/1.1 200 OK\r\n"), gap=0.3)
    try:
        started = time.monotonic()
        assert not http_probe("127.0.0.1", listener.getsockname()[1], "/", 1.0)
        assert time.monotonic() - started < 30  # (a liveness bound: it did end)
    finally:
        stop.set()
        listener.close()


@pytest.mark.parametrize("path", ["/a b", "/x\r\nX-Injected: 1", "relative", "/é"])
def test_an_http_probe_sends_no_path_a_spec_could_not_hold(path):
    server = _Server()
    try:
        assert not http_probe("127.0.0.1", server.port, path, 5.0)
        assert server.connections == 0
    finally:
        server.close()
