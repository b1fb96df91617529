"""The SDK's transport against small local servers: retries of 503 with Retry-After,
failover to the next URL, and no second send of a POST whose answer was lost."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from plait.client import ApiError, Client, Unreachable
from plait.testing import free_port


class _Quiet(ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        pass  # (the connections this test drops on purpose)


class Server:
    """Answers 503 (Retry-After: 0.1) ``refuse`` times, then 200 with the request."""

    def __init__(self, refuse: int = 0, drop: bool = False) -> None:
        self.refuse, self.drop = refuse, drop
        self.seen: list[tuple[str, str, str | None]] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _answer(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length).decode() if length else None
                owner.seen.append((self.command, self.path, body))
                if owner.drop:
                    self.connection.close()  # the answer is lost
                    return
                if owner.refuse > 0:
                    owner.refuse -= 1
                    payload = b'{"error": "unavailable", "message": "no leader"}'
                    self.send_response(503)
                    self.send_header("Retry-After", "0.1")
                elif self.path.startswith("/missing"):
                    payload = b'{"error": "not_found", "message": "job \'x\' not found"}'
                    self.send_response(404)
                else:
                    payload = json.dumps({"path": self.path, "body": body,
                                          "auth": self.headers.get("Authorization")}).encode()
                    self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = do_PUT = do_DELETE = _answer

        self.httpd = _Quiet(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def dead_url() -> str:
    return f"http://127.0.0.1:{free_port()}"  # nothing listens there now


@pytest.fixture(params=["httpx", "stdlib"])
def transport(request):
    return request.param


def test_a_503_is_retried_after_its_retry_after_and_the_token_is_sent(transport):
    srv = Server(refuse=2)
    try:
        with Client(srv.url, token="plait_x_y", transport=transport) as c:
            started = time.monotonic()
            got = c.get("/v1/jobs/web", limit=5)
            assert got["path"] == "/v1/jobs/web?limit=5" and got["auth"] == "Bearer plait_x_y"
            assert time.monotonic() - started >= 0.2  # two Retry-After waits
        assert len(srv.seen) == 3
    finally:
        srv.close()


def test_a_dead_url_fails_over_to_the_next_and_the_next_call_starts_there(transport):
    srv = Server()
    try:
        with Client([dead_url(), srv.url], transport=transport) as c:
            assert json.loads(c.post("/v1/jobs", {"name": "a"})["body"]) == {"name": "a"}
            assert c.url == srv.url
            c.get("/healthz")
        assert [s[0] for s in srv.seen] == ["POST", "GET"]
    finally:
        srv.close()


def test_errors_are_api_errors_and_nobody_answering_is_unreachable(transport):
    srv = Server()
    try:
        with Client(srv.url, transport=transport) as c, pytest.raises(ApiError) as err:
            c.get("/missing")
        assert err.value.status == 404 and err.value.kind == "not_found"
        assert "not found" in str(err.value)
    finally:
        srv.close()
    with Client([dead_url(), dead_url()], attempts=2, retry_timeout=2,
                transport=transport) as c, pytest.raises(Unreachable):
        c.get("/healthz")


def test_a_post_whose_answer_is_lost_is_not_sent_again(transport):
    srv = Server(drop=True)
    try:
        with Client(srv.url, transport=transport) as c, pytest.raises(Unreachable) as err:
            c.post("/v1/jobs/web/restart")
        assert "not sent again" in str(err.value)
        assert len(srv.seen) == 1
        srv.seen.clear()
        with Client(srv.url, attempts=2, retry_timeout=2, transport=transport) as c, \
                pytest.raises(Unreachable):
            c.get("/v1/jobs/web")  # a GET is retried: once per attempt
        assert len(srv.seen) == 2
    finally:
        srv.close()


def test_tls_to_a_server_that_speaks_none_is_not_retried(transport, monkeypatch, capfd):
    # an https URL pointed at a plain HTTP server: no retry can mend the handshake, so
    # the caller hears at once (it waited out every retry, a few seconds); a refused
    # connection is still retried
    srv = Server()
    rounds = []
    real = Client._round

    def counted(self, *args):
        rounds.append(1)
        return real(self, *args)
    monkeypatch.setattr(Client, "_round", counted)
    try:
        with Client(srv.url.replace("http://", "https://"), transport=transport,
                    attempts=4, retry_timeout=10) as c, pytest.raises(Unreachable) as err:
            c.get("/healthz")
        assert len(rounds) == 1 and "cannot connect" in str(err.value)
        assert srv.seen == []  # (the handshake failed: nothing was asked)
    finally:
        srv.close()
    rounds.clear()
    with Client(dead_url(), attempts=2, retry_timeout=5, transport=transport,
                quiet=True) as c, pytest.raises(Unreachable):
        c.get("/healthz")
    assert len(rounds) == 2
    out, errors = capfd.readouterr()  # (a quiet client's retries are not logged)
    assert "retry_scheduled" not in out + errors


def test_a_contexts_ca_file_is_kept_absolute_and_a_missing_one_is_named(
        tmp_path, monkeypatch):
    # a serve started with --ca-file tls/ca.pem wrote the relative path: the CLI then
    # failed in any other directory, with an error that named no file
    from plait.clientconfig import ClientConfig

    monkeypatch.chdir(tmp_path)
    config = ClientConfig()
    config.set_context("local", "https://127.0.0.1:9", "t", ca_file="tls/ca.pem")
    assert config.contexts["local"].ca_file == str(tmp_path / "tls" / "ca.pem")
    with Client("https://127.0.0.1:9", ca_file="nothere.pem", transport="stdlib",
                attempts=1) as c, pytest.raises(OSError, match=r"the CA file nothere\.pem"):
        c.get("/healthz")
