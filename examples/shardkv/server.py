"""A task of shardkv: a sharded, replicated, in-memory key-value store on Shard
Manager. Each task keeps, per shard it holds, a dict key -> (version, value); Shard
Manager decides which shards a task holds (``add_shard``/``drop_shard``), clients
route by its shard map (``client.py``) and write every ready replica.

Routes (besides Shard Manager's ``/sm/*``, served by the client library):

* ``PUT /kv/{shard}/{key}``: the body is the value (UTF-8), ``X-Version`` its version;
  stored if newer than the one held (a version no newer is left, and answered 200
  too: the write is superseded). 409 if this task neither holds the shard nor is
  being given it.
* ``GET /kv/{shard}/{key}``: the value, its version in ``X-Version``; 404 if absent.
* ``GET /kv/{shard}``: the shard as JSON ``{key: [version, value]}``, for a replica
  being added to copy.
* ``GET /health``: ``{"version", "index", "shards"}`` (plait's health probe, and which
  version of the job this task runs: ``KV_VERSION`` of its environment).

A replica being added accepts writes from the moment Shard Manager calls it, then
copies every ready replica's dump and keeps the newest version of each key: a write
held by any ready replica survives, and one acknowledged by every ready replica
while the copy runs is held by the new replica too.

Run by plait (``kv.yaml``): ``python3 examples/shardkv/server.py``; the task's
environment names Shard Manager (``PLAIT_SM_URL``) and its port, and holds the task's
own credential (``PLAIT_TASK_CREDENTIAL``, from its agent), which it signs its
registrations with.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Sequence
from urllib.parse import quote, unquote

import httpx

from plait.shardmanager.client import Request, Response, ShardApp, ShardTask

#: the application's name at Shard Manager
APP = "kv"
#: how long a replica being added keeps trying to copy one peer before it gives up
#: (the add fails, and Shard Manager tries again with the peers it knows then)
COPY_SECONDS = 3.0


class ShardKv(ShardApp):
    def __init__(self, index: int = 0, version: str = "") -> None:
        self.index = index
        self.version = version
        self._lock = threading.Lock()
        #: shard -> key -> (version, value), for the shards held or being added
        self.data: dict[str, dict[str, tuple[int, str]]] = {}
        #: the shards being added (their copy from peers not done yet)
        self.adding: set[str] = set()
        self.http = httpx.Client(timeout=5.0)

    # -- Shard Manager's calls -------------------------------------------------------------
    def add_shard(self, shard: str, peers: Sequence[str]) -> None:
        with self._lock:
            self.data.setdefault(shard, {})
            self.adding.add(shard)  # writes are taken from now on
        try:
            for peer in peers:
                self._merge(shard, self._dump(peer, shard))
        except BaseException:
            with self._lock:  # not loaded: neither held nor taking writes
                self.adding.discard(shard)
                self.data.pop(shard, None)
            raise
        with self._lock:
            self.adding.discard(shard)

    def drop_shard(self, shard: str) -> None:
        with self._lock:
            self.adding.discard(shard)
            self.data.pop(shard, None)

    def _dump(self, peer: str, shard: str) -> dict[str, list[object]]:
        """A peer's copy of ``shard``; retried for ``COPY_SECONDS``, then an error."""
        deadline = time.monotonic() + COPY_SECONDS
        while True:
            try:
                r = self.http.get(f"{peer}/kv/{quote(shard, safe='')}")
                if r.status_code == 200:
                    dump: dict[str, list[object]] = r.json()
                    return dump
                problem = f"{r.status_code} {r.text[:200]}"
            except (httpx.HTTPError, ValueError) as exc:
                problem = f"{type(exc).__name__}: {exc}"
            if time.monotonic() > deadline:
                raise RuntimeError(f"copy of {shard} from {peer}: {problem}")
            time.sleep(0.2)

    def _merge(self, shard: str, dump: dict[str, list[object]]) -> None:
        with self._lock:
            held = self.data.get(shard)
            if held is None:  # (dropped meanwhile)
                return
            for key, entry in dump.items():
                version, value = entry
                if not isinstance(version, int) or not isinstance(value, str):
                    raise ValueError(f"{shard}/{key}: a peer's entry is not [version, value]")
                if key not in held or held[key][0] < version:
                    held[key] = (version, value)

    # -- the application's requests ---------------------------------------------------------
    def handle(self, request: Request) -> Response:
        parts = request.path.split("/")
        if request.path == "/health" and request.method == "GET":
            with self._lock:
                held = sorted(s for s in self.data if s not in self.adding)
            return Response(200, {"version": self.version, "index": self.index,
                                  "shards": held})
        if len(parts) == 3 and parts[1] == "kv" and request.method == "GET":
            return self._dump_shard(unquote(parts[2]))
        if len(parts) == 4 and parts[1] == "kv":
            shard, key = unquote(parts[2]), unquote(parts[3])
            if request.method == "GET":
                return self._get(shard, key)
            if request.method == "PUT":
                return self._put(shard, key, request)
        return Response(404, {"error": f"{request.method} {request.path}: not found"})

    def _put(self, shard: str, key: str, request: Request) -> Response:
        try:
            version = int(request.headers.get("x-version", ""))
            value = request.body.decode()
        except ValueError:
            return Response(422, {"error": "X-Version: an integer; the body: UTF-8 text"})
        with self._lock:
            held = self.data.get(shard)
            if held is None:
                return Response(409, {"error": f"task {self.index} does not hold {shard}"})
            current = held.get(key)
            if current is not None and current[0] >= version:
                stored, now = False, current[0]
            else:
                held[key] = (version, value)
                stored, now = True, version
        return Response(200, {"stored": stored, "version": now},
                        {"X-Version": str(now)})

    def _get(self, shard: str, key: str) -> Response:
        with self._lock:
            held = self.data.get(shard)
            if held is None or shard in self.adding:
                return Response(409, {"error": f"task {self.index} does not serve {shard}"})
            found = held.get(key)
        if found is None:
            return Response(404, {"error": f"{key}: not found"})
        return Response(200, found[1], {"X-Version": str(found[0]),
                                        "Content-Type": "text/plain; charset=utf-8"})

    def _dump_shard(self, shard: str) -> Response:
        with self._lock:
            held = self.data.get(shard)
            if held is None or shard in self.adding:
                return Response(409, {"error": f"task {self.index} does not serve {shard}"})
            dump = {k: [v, value] for k, (v, value) in held.items()}
        return Response(200, dump)


def main() -> None:
    impl = ShardKv(int(os.environ.get("PLAIT_TASK_INDEX", "0")),
                   os.environ.get("KV_VERSION", ""))
    task = ShardTask.from_env(impl, app=os.environ.get("KV_APP", APP))
    print(json.dumps({"serving": task.endpoint, "app": task.app, "job": task.job,
                      "index": task.index, "version": impl.version}), flush=True)
    task.serve_forever()


if __name__ == "__main__":
    main()
