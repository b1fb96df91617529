"""The Shard Manager client library, linked into a task of a sharded application
(paper section 2.8): the application implements ``add_shard`` and ``drop_shard``;
the library registers the task with Shard Manager (its job, index, endpoint and
fault domains), heartbeats, and serves Shard Manager's calls over HTTP on the task's
port, next to the application's own requests.

A task whose registration Shard Manager refuses as superseded (409: another process
of its task index started later, and plait runs that one; this one is an orphan
copy whose machine was cut off from plait) stops: it beats no more, and answers
Shard Manager's calls and the application's requests with 410, so a client with an
old map reads the new one. ``ShardApp.superseded`` is told (an application may exit
there).

    class Kv(ShardApp):
        def add_shard(self, shard, peers): ...   # load it (from peers' copies)
        def drop_shard(self, shard): ...
        def handle(self, request): ...            # the application's own requests

    ShardTask.from_env(Kv(), app="kv").serve_forever()

The task holds its own credential (``PLAIT_TASK_CREDENTIAL``, which plait's agent
sets: good for this task of this job only, at its own endpoint, ``PLAIT_TASK_ENDPOINT``,
which it listens on and registers), or, for an application defined without
its job's controller key, the application's task secret (``plait shardmanager token
APP``), and never sends it: its registrations are signed with a key of this process,
derived from it, its job, index and incarnation (``plait.shardmanager.credentials``),
and Shard Manager's calls (``POST /sm/add`` with ``{"shard", "peers", "nonce"}``, ``POST
/sm/drop`` with ``{"shard", "nonce"}``, ``GET /sm/shards``) are signed with the same
key, recently, each nonce once; every other request goes to the application's
``handle``. A task learns the region's settings from the environment its agent gives
it: ``PLAIT_JOB``, ``PLAIT_TASK_INDEX``, ``PLAIT_PORT``, ``PLAIT_FAULT_DOMAIN``
(region/dc/msb/row/rack), ``PLAIT_MACHINE``, ``PLAIT_TASK_ENDPOINT`` (host:port, as
discovery has it) and ``PLAIT_TASK_CREDENTIAL``; Shard
Manager's URL from ``PLAIT_SM_URL``, and an application's task secret, only where
there is no credential, from ``PLAIT_SM_TOKEN`` (or ``PLAIT_SM_TOKEN_FILE``).
Clients read the map (``watch``) with the application's read token (``plait
shardmanager token APP --reader``), which can change nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
import uuid
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx

from plait.errors import ValidationError
from plait.shardmanager import credentials

#: the largest body the library reads from a request
MAX_BODY = 16 * 1024 * 1024
#: how often a task tells Shard Manager it is alive
HEARTBEAT_SECONDS = 2.0


@dataclass
class Request:
    """One of the application's own HTTP requests."""

    method: str
    path: str
    query: Mapping[str, list[str]]
    body: bytes
    headers: Mapping[str, str]


@dataclass
class Response:
    status: int = 200
    body: bytes | str | dict[str, Any] | list[Any] = b""
    headers: dict[str, str] = field(default_factory=dict)


class ShardApp:
    """What a sharded application implements. ``add_shard`` must return only once the
    task serves the shard (Shard Manager marks the replica ready then); ``peers`` are
    the endpoints of the shard's ready replicas, to copy its data from."""

    def add_shard(self, shard: str, peers: Sequence[str]) -> None:
        raise NotImplementedError

    def drop_shard(self, shard: str) -> None:
        raise NotImplementedError

    def handle(self, request: Request) -> Response:
        return Response(404, {"error": f"{request.path}: not found"})

    def superseded(self, reason: str) -> None:
        """Shard Manager refused this process as superseded (``reason``: its words):
        the library serves nothing more. Called once, from the heartbeat's thread."""


def fault_domains(path: str, machine: str) -> tuple[str, ...]:
    """A task's fault domains for Shard Manager, coarsest first: (msb, rack,
    machine), from its agent's fault domain path region/dc/msb/row/rack."""
    parts = [p for p in path.split("/") if p]
    if len(parts) >= 5:
        return ("/".join(parts[:3]), "/".join(parts[:5]), machine)
    return (*("/".join(parts[:i]) for i in range(1, len(parts) + 1)), machine)


def endpoint_url(endpoint: str) -> str:
    """The URL of a ``host:port`` endpoint (an IPv6 host in brackets)."""
    host, _, port = endpoint.rpartition(":")
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class ShardTask:
    def __init__(self, app_impl: ShardApp, *, app: str, job: str, index: int, port: int,
                 manager: str, token: str | None = None, credential: str | None = None,
                 host: str = "127.0.0.1", advertise: str | None = None,
                 domains: Sequence[str] = (), endpoint: str | None = None) -> None:
        """``credential``: this task's own (its ``PLAIT_TASK_CREDENTIAL``), for an
        application defined with its job's controller key; else ``token``: the
        application's task secret. Neither is ever sent. ``endpoint``: the URL it
        registers (by default ``http://ADVERTISE:PORT``, ADVERTISE defaulting to
        ``host``); a task's credential is good for its own endpoint only."""
        secret = credential or token
        if not secret:
            raise ValueError("a task's credential (PLAIT_TASK_CREDENTIAL) or the "
                             "application's task secret (PLAIT_SM_TOKEN)")
        self.impl = app_impl
        self.app = app
        self.job = job
        self.index = index
        self.manager = manager.rstrip("/")
        self.incarnation = uuid.uuid4().hex
        #: this process's key: signs its registrations and Shard Manager's calls to it
        self.key = credentials.task_key(secret, app, job, index, self.incarnation)
        #: the nonces of Shard Manager's calls seen within the signatures' window
        self._nonces: dict[str, float] = {}
        self._nonce_lock = threading.Lock()
        #: when this process started (Shard Manager keeps the later of two processes)
        self.started = time.time()
        #: Shard Manager's words when it refused this process as superseded
        self.gone: str | None = None
        self.domains = tuple(domains)
        self.endpoint = endpoint or f"http://{advertise or host}:{port}"
        self._server = ThreadingHTTPServer((host, port), self._handler())
        self._server.daemon_threads = True
        self._stop = threading.Event()
        self._lock = threading.Lock()  # (one add or drop at a time)
        #: the shards this task serves
        self.shards: set[str] = set()
        self.http = httpx.Client(timeout=5.0, trust_env=False)

    @classmethod
    def from_env(cls, impl: ShardApp, *, app: str,
                 env: Mapping[str, str] | None = None) -> ShardTask:
        """(Its own credential when its agent gave it one: an application whose tasks
        plait runs is defined with its job's controller key, and takes nothing else.)"""
        env = os.environ if env is None else env
        credential = env.get("PLAIT_TASK_CREDENTIAL") or None
        token = env.get("PLAIT_SM_TOKEN")
        if credential is None and token is None and env.get("PLAIT_SM_TOKEN_FILE"):
            with open(env["PLAIT_SM_TOKEN_FILE"]) as f:
                token = f.read().strip()
        if not credential and not token:
            raise SystemExit("PLAIT_TASK_CREDENTIAL (set by plait's agent), or PLAIT_SM_TOKEN "
                             "or PLAIT_SM_TOKEN_FILE (the application's task secret)")
        machine = env.get("PLAIT_MACHINE", "")
        # (the endpoint discovery has for the task, which its credential is bound to:
        # listened on and registered)
        where = env.get("PLAIT_TASK_ENDPOINT") or None
        host = "127.0.0.1" if where is None else where.rpartition(":")[0]
        return cls(impl, app=app, job=env["PLAIT_JOB"], index=int(env["PLAIT_TASK_INDEX"]),
                   port=int(env["PLAIT_PORT"]), manager=env["PLAIT_SM_URL"],
                   token=None if credential else token, credential=credential,
                   domains=fault_domains(env.get("PLAIT_FAULT_DOMAIN", ""), machine),
                   host=host, endpoint=None if where is None else endpoint_url(where))

    # -- Shard Manager ---------------------------------------------------------------------
    def register(self) -> bool:
        """Tell Shard Manager this task is here (again); False if it did not answer."""
        if self.gone is not None:
            return False
        shards = sorted(self.shards)  # (a copy in one step: no lock held through an add)
        body = json.dumps({
            "index": self.index, "endpoint": self.endpoint, "job": self.job,
            "incarnation": self.incarnation, "domains": list(self.domains),
            "shards": shards, "started": self.started}).encode()
        try:
            r = self.http.post(f"{self.manager}/v1/apps/{self.app}/tasks", content=body,
                               headers={"Content-Type": "application/json",
                                        credentials.SIGNATURE_HEADER: credentials.sign(
                                            self.key, body, time.time())})
        except httpx.HTTPError:
            return False
        if r.status_code == 409:
            self._superseded(_detail(r))
        return r.is_success

    def _superseded(self, reason: str) -> None:
        with self._lock:
            if self.gone is not None:
                return
            self.gone = reason or "superseded by a newer process of this task"
            self.shards.clear()
        print(f"plait shardmanager: {self.gone}", file=sys.stderr, flush=True)
        self.impl.superseded(self.gone)

    def _heartbeat(self) -> None:
        while self.gone is None and not self._stop.wait(HEARTBEAT_SECONDS):
            self.register()

    def serve_forever(self) -> None:
        self.register()
        threading.Thread(target=self._heartbeat, name="sm-heartbeat", daemon=True).start()
        with contextlib.suppress(KeyboardInterrupt):
            self._server.serve_forever(poll_interval=0.2)

    def start(self) -> ShardTask:
        """Serve in a thread (tests, or an application with a main loop of its own)."""
        threading.Thread(target=self.serve_forever, name="sm-task", daemon=True).start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._server.shutdown()
        self._server.server_close()
        self.http.close()

    def _call(self, op: str, data: dict[str, Any]) -> Response:
        shard = data.get("shard")
        if not isinstance(shard, str) or not shard or len(shard) > 256:
            return Response(422, {"error": "shard: a name of 1-256 characters"})
        with self._lock:
            if op == "add":
                peers = data.get("peers", [])
                if not isinstance(peers, list) or not all(isinstance(p, str) for p in peers):
                    return Response(422, {"error": "peers: a list of endpoints"})
                self.impl.add_shard(shard, [p for p in peers if p != self.endpoint])
                self.shards.add(shard)
            else:
                self.impl.drop_shard(shard)
                self.shards.discard(shard)
        return Response(200, {"shard": shard, "task": self.index,
                              "incarnation": self.incarnation})

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        task = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # (headers and body are written apart: without this, Nagle's algorithm holds
            # the body back for the peer's delayed ack, about 40 ms a keep-alive request)
            disable_nagle_algorithm = True

            def _serve(self) -> None:
                url = urlsplit(self.path)
                size = int(self.headers.get("Content-Length") or 0)
                if size > MAX_BODY:
                    self._send(Response(413, {"error": f"bodies are at most {MAX_BODY} B"}))
                    return
                body = self.rfile.read(size) if size else b""
                if task.gone is not None:  # (an orphan copy: nobody's to call)
                    self._send(Response(410, {"error": task.gone}))
                    return
                if url.path.startswith("/sm/"):
                    self._send(task._sm(self.command, url.path, body,
                                        self.headers.get(credentials.SIGNATURE_HEADER)))
                    return
                request = Request(self.command, url.path, parse_qs(url.query), body,
                                  {k.lower(): v for k, v in self.headers.items()})
                try:
                    self._send(task.impl.handle(request))
                except Exception as exc:  # (an application's bug answers 500, not a hang)
                    self._send(Response(500, {"error": f"{type(exc).__name__}: {exc}"}))

            do_GET = do_PUT = do_POST = do_DELETE = _serve

            def _send(self, r: Response) -> None:
                body = r.body
                ctype = "application/octet-stream"
                if isinstance(body, (dict, list)):
                    body, ctype = json.dumps(body).encode(), "application/json"
                elif isinstance(body, str):
                    body, ctype = body.encode(), "text/plain; charset=utf-8"
                self.send_response(r.status)
                self.send_header("Content-Type", r.headers.get("Content-Type", ctype))
                self.send_header("Content-Length", str(len(body)))
                for k, v in r.headers.items():
                    if k != "Content-Type":
                        self.send_header(k, v)
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        return Handler

    def _sm(self, method: str, path: str, body: bytes, signature: str | None) -> Response:
        now = time.time()
        try:
            credentials.verify(self.key, signature,
                               credentials.call_message(method, path, body), now)
        except ValidationError as exc:
            return Response(401, {"error": f"{exc} (Shard Manager signs its calls with "
                                           "this process's key)"})
        if method == "GET" and path == "/sm/shards":
            return Response(200, {"task": self.index, "incarnation": self.incarnation,
                                  "shards": sorted(self.shards)})
        op = {"/sm/add": "add", "/sm/drop": "drop"}.get(path)
        if method != "POST" or op is None:
            return Response(404, {"error": f"{method} {path}: not found"})
        try:
            data = json.loads(body or b"{}")
        except ValueError:
            return Response(422, {"error": "the body is not JSON"})
        if not isinstance(data, dict):
            return Response(422, {"error": "the body is a JSON object"})
        nonce = data.get("nonce")
        if not isinstance(nonce, str) or not 16 <= len(nonce) <= 64:
            return Response(422, {"error": "nonce: a string of 16-64 characters"})
        with self._nonce_lock:
            while self._nonces:  # (oldest first: forget those past the window)
                oldest = next(iter(self._nonces))
                if now - self._nonces[oldest] <= 2 * credentials.TOLERANCE:
                    break
                del self._nonces[oldest]
            if nonce in self._nonces:
                return Response(401, {"error": "nonce: this call was made already (a "
                                               "replay)"})
            self._nonces[nonce] = now
        try:
            return self._call(op, data)
        except Exception as exc:  # the application could not load or drop it
            return Response(503, {"error": f"{op}_shard failed: {type(exc).__name__}: {exc}"})


def _detail(r: httpx.Response) -> str:
    try:
        said = r.json()
    except ValueError:
        return r.text[:500]
    return str(said.get("detail", said))[:500] if isinstance(said, dict) else str(said)[:500]


def watch(manager: str, app: str, token: str, after: int = -1, wait: float = 20.0,
          client: httpx.Client | None = None) -> dict[str, Any]:
    """The application's shard map once its generation is past ``after`` (a long
    poll of ``GET /v1/apps/{app}/map``): ``{"generation", "replication", "shards":
    {shard: [endpoints of its ready replicas]}}``. ``token``: the application's read
    token (``plait shardmanager token APP --reader``). A generation only grows, across
    restarts of Shard Manager too."""
    own = client is None
    c = client or httpx.Client(timeout=wait + 10)
    try:
        r = c.get(f"{manager.rstrip('/')}/v1/apps/{app}/map",
                  params={"after": after, "wait": wait},
                  headers={"Authorization": f"Bearer {token}"})
        r.raise_for_status()
        data: dict[str, Any] = r.json()
        return data
    finally:
        if own:
            c.close()


def shard_for(key: str, shards: Sequence[str]) -> str:
    """The shard a key belongs to: ``shards`` sorted, indexed by the key's CRC-32."""
    ordered = sorted(shards)
    return ordered[zlib.crc32(key.encode()) % len(ordered)]
