"""The shardkv client: routes each key to its shard's replicas by Shard Manager's
map, kept fresh by a long poll in a thread.

* ``put(key, value)`` gives the write a version (strictly increasing per client:
  microseconds since the epoch, at least one more than the last, with the client's
  own tag in the low 10 bits) and sends it to every ready replica of the key's shard,
  and to the replicas being added; it is acknowledged only when every ready replica
  took it and there were at least ``MIN_REPLICAS`` of them. Otherwise the client
  waits for a newer map and tries again (the same version: a retry is idempotent)
  until its deadline, then raises ``Unavailable``.
* ``get(key)`` reads every ready replica and returns the newest version; a replica
  that does not answer makes it try again with a newer map, as a write does.

As a program (one JSON object on stdout)::

    python3 examples/shardkv/client.py --manager URL --token-file F map
    python3 examples/shardkv/client.py --manager URL --token-file F put KEY VALUE
    python3 examples/shardkv/client.py --manager URL --token-file F get KEY
    python3 examples/shardkv/client.py --manager URL --token-file F load --seconds 60

``load`` runs writer and reader threads over a key space for a while, then reads
back every key: what was acknowledged, what failed, whether any acknowledged write
was lost or any read returned less than a write acknowledged before it began, and
the fewest ready replicas any shard had in the maps the client saw.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import quote

import httpx

from plait.shardmanager.client import shard_for, watch

#: an acknowledged write is held by at least this many replicas
MIN_REPLICAS = 2
#: how long a put or get keeps trying before it raises
DEADLINE_SECONDS = 30.0
#: the long poll's wait for a newer map
WATCH_SECONDS = 10.0


class Unavailable(Exception):
    """A put or get that could not be done within its deadline."""


class KvClient:
    """``token``: the application's read token (``plait shardmanager token APP
    --reader``): the client reads the map, and changes nothing at Shard Manager."""

    def __init__(self, manager: str, token: str, app: str = "kv", *,
                 deadline: float = DEADLINE_SECONDS, request_timeout: float = 3.0) -> None:
        self.manager, self.token, self.app = manager.rstrip("/"), token, app
        self.deadline = deadline
        self.http = httpx.Client(timeout=request_timeout)
        self._sm = httpx.Client(timeout=WATCH_SECONDS + 10)
        self._changed = threading.Condition()
        self.map: dict[str, Any] = {"generation": -1, "replication": 0, "shards": {},
                                    "adding": {}}
        #: maps installed, and per shard the fewest ready replicas in any of them
        self.maps_seen = 0
        self.min_ready: dict[str, int] = {}
        #: (generation, shard, ready replicas) for each map where a shard had fewer
        #: ready replicas than its replication factor
        self.short: list[tuple[int, str, int]] = []
        self._tag = random.getrandbits(10)
        self._last = 0
        self._version_lock = threading.Lock()
        self._stop = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name="kv-map", daemon=True)
        self._watcher.start()

    def close(self) -> None:
        self._stop.set()
        self._sm.close()
        # (a daemon thread: a long poll in flight ends with its wait or with the
        # process, and what it brings after this is not read; a one-off command waited
        # up to 5 s here for nothing)
        self._watcher.join(timeout=0.2)
        self.http.close()

    def __enter__(self) -> KvClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the map ---------------------------------------------------------------------------
    def _watch(self) -> None:
        while not self._stop.is_set():
            try:
                self._install(watch(self.manager, self.app, self.token,
                                    after=self.map["generation"], wait=WATCH_SECONDS,
                                    client=self._sm))
            except (httpx.HTTPError, ValueError, RuntimeError):
                self._stop.wait(0.5)

    def _install(self, new: dict[str, Any]) -> None:
        with self._changed:
            if new["generation"] <= self.map["generation"]:
                return
            self.map = new
            self.maps_seen += 1
            want = int(new.get("replication") or 0)
            for shard, ready in new["shards"].items():
                n = len(ready)
                self.min_ready[shard] = min(self.min_ready.get(shard, n), n)
                if n < want:
                    self.short.append((new["generation"], shard, n))
            self._changed.notify_all()

    def refresh(self) -> dict[str, Any]:
        """Fetch the current map now (besides the long poll)."""
        self._install(watch(self.manager, self.app, self.token, after=-1, wait=0,
                            client=self.http))
        return self.map

    def wait_for_map(self, check: Callable[[dict[str, Any]], bool], timeout: float) -> bool:
        """Wait until the map satisfies ``check``; whether it did within ``timeout``."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while not check(self.map):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(left)
            return True

    def _newer(self, generation: int, timeout: float) -> None:
        """Wait at most ``timeout`` for a map past ``generation`` (the long poll's),
        then fetch the current one anyway."""
        self.wait_for_map(lambda m: m["generation"] > generation, timeout)
        with contextlib.suppress(httpx.HTTPError, ValueError):
            self.refresh()

    def route(self, key: str) -> tuple[int, str, list[str], list[str]]:
        """(generation, shard, ready replicas, replicas being added) of a key."""
        m = self.map
        shards = m["shards"]
        if not shards:
            return m["generation"], "", [], []
        shard = shard_for(key, list(shards))
        ready = list(shards[shard])
        adding = [e for e in m.get("adding", {}).get(shard, []) if e not in ready]
        return m["generation"], shard, ready, adding

    # -- writes and reads ------------------------------------------------------------------
    def next_version(self) -> int:
        with self._version_lock:
            self._last = max(time.time_ns() // 1000, self._last + 1)
            return self._last << 10 | self._tag

    def put(self, key: str, value: str) -> int:
        """Write ``value`` to every ready replica of the key's shard; its version once
        acknowledged (``Unavailable`` if not within the deadline)."""
        version = self.next_version()
        deadline = time.monotonic() + self.deadline
        pause = 0.05
        while True:
            generation, shard, ready, adding = self.route(key)
            if len(ready) < MIN_REPLICAS:
                problem = f"{shard or 'no shard'}: {len(ready)} ready replicas"
            else:
                failed = [e for e in ready if not self._put_one(e, shard, key, value, version)]
                for e in adding:  # (best effort: not ready, not needed for the ack)
                    self._put_one(e, shard, key, value, version)
                if not failed:
                    return version
                problem = f"{shard}: not taken by {failed}"
            if time.monotonic() + pause > deadline:
                raise Unavailable(f"put {key}: {problem}")
            self._newer(generation, pause)
            pause = min(pause * 2, 1.0)

    def _put_one(self, endpoint: str, shard: str, key: str, value: str, version: int) -> bool:
        try:
            r = self.http.put(f"{endpoint}/kv/{quote(shard, safe='')}/{quote(key, safe='')}",
                              content=value.encode(), headers={"X-Version": str(version)})
        except httpx.HTTPError:
            return False
        return r.status_code == 200

    def get(self, key: str) -> tuple[int, str] | None:
        """The newest (version, value) of ``key`` over every ready replica of its
        shard; None if none has it (``Unavailable`` if they do not all answer within
        the deadline)."""
        deadline = time.monotonic() + self.deadline
        pause = 0.05
        while True:
            generation, shard, ready, _ = self.route(key)
            found: list[tuple[int, str]] = []
            failed = []
            for endpoint in ready:
                try:
                    r = self.http.get(
                        f"{endpoint}/kv/{quote(shard, safe='')}/{quote(key, safe='')}")
                except httpx.HTTPError:
                    failed.append(endpoint)
                    continue
                if r.status_code == 200:
                    found.append((int(r.headers["X-Version"]), r.text))
                elif r.status_code != 404:
                    failed.append(endpoint)
            if ready and not failed:
                return max(found) if found else None
            problem = f"{shard}: no answer from {failed}" if ready else "no ready replica"
            if time.monotonic() + pause > deadline:
                raise Unavailable(f"get {key}: {problem}")
            self._newer(generation, pause)
            pause = min(pause * 2, 1.0)


class Load:
    """Writers and readers over ``keys`` keys, in threads, until stopped. Each writer
    owns the keys whose number is its own modulo the writers, so a key's writes are
    in order and its last acknowledged one is the one to read back."""

    def __init__(self, client: KvClient, *, writers: int = 2, readers: int = 2,
                 keys: int = 500, pause: float = 0.0) -> None:
        self.client, self.writers, self.readers = client, writers, readers
        self.keys, self.pause = keys, pause
        self._lock = threading.Lock()
        #: key -> (version, value) of its last acknowledged write
        self.acked: dict[str, tuple[int, str]] = {}
        self.writes_acked = self.writes_failed = 0
        self.reads = self.read_errors = self.stale_reads = 0
        #: the first few failures, for a diagnosis
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.started = self.stopped = 0.0

    def _note(self, text: str) -> None:
        with self._lock:
            if len(self.errors) < 20:
                self.errors.append(f"{time.time():.3f} {text}")

    def _write(self, writer: int) -> None:
        rng = random.Random(writer)
        mine = [f"k{n:06d}" for n in range(writer, self.keys, self.writers)]
        count = 0
        while not self._stop.is_set():
            key = rng.choice(mine)
            value = f"w{writer}-{count}"
            count += 1
            try:
                version = self.client.put(key, value)
            except Unavailable as exc:
                with self._lock:
                    self.writes_failed += 1
                self._note(str(exc))
                continue
            with self._lock:
                self.writes_acked += 1
                self.acked[key] = (version, value)
            if self.pause:
                self._stop.wait(self.pause)

    def _read(self, reader: int) -> None:
        rng = random.Random(1000 + reader)
        while not self._stop.is_set():
            key = f"k{rng.randrange(self.keys):06d}"
            with self._lock:
                before = self.acked.get(key)
            try:
                got = self.client.get(key)
            except Unavailable as exc:
                with self._lock:
                    self.read_errors += 1
                self._note(str(exc))
                continue
            with self._lock:
                self.reads += 1
                if before is not None and (got is None or got[0] < before[0]):
                    self.stale_reads += 1
                    stale = True
                else:
                    stale = False
            if stale:
                self._note(f"get {key}: {got} older than the acknowledged {before}")
            if self.pause:
                self._stop.wait(self.pause)

    def start(self) -> Load:
        self.started = time.monotonic()
        for i in range(self.writers):
            self._threads.append(threading.Thread(target=self._write, args=(i,),
                                                  name=f"kv-writer-{i}", daemon=True))
        for i in range(self.readers):
            self._threads.append(threading.Thread(target=self._read, args=(i,),
                                                  name=f"kv-reader-{i}", daemon=True))
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=self.client.deadline + 10)
        self.stopped = time.monotonic()

    def verify(self, threads: int = 8) -> dict[str, Any]:
        """Read back every key written (``threads`` at a time): ``lost`` are those whose
        newest version is older than the last acknowledged one (or gone), ``wrong``
        those with the acknowledged version and another value."""
        def check(item: tuple[str, tuple[int, str]]) -> tuple[str, str] | None:
            key, (version, value) = item
            try:
                got = self.client.get(key)
            except Unavailable as exc:
                return "unreadable", str(exc)
            if got is None or got[0] < version:
                return "lost", f"{key}: acknowledged {version}, read {got}"
            if got[0] == version and got[1] != value:
                return "wrong", f"{key}: {version} is {value!r}, read {got[1]!r}"
            return None

        with self._lock:
            acked = sorted(self.acked.items())
        found: dict[str, list[str]] = {"lost": [], "wrong": [], "unreadable": []}
        with ThreadPoolExecutor(threads, thread_name_prefix="kv-verify") as pool:
            for result in pool.map(check, acked):
                if result is not None:
                    found[result[0]].append(result[1])
        return {"keys": len(acked), **{k: len(v) for k, v in found.items()},
                "examples": [e for v in found.values() for e in v][:10]}

    def report(self) -> dict[str, Any]:
        c = self.client
        with c._changed:
            low = min(c.min_ready.values(), default=None)
            short = len(c.short)
            generation = c.map["generation"]
        return {"seconds": round((self.stopped or time.monotonic()) - self.started, 1),
                "writers": self.writers, "readers": self.readers,
                "writes_acked": self.writes_acked, "writes_failed": self.writes_failed,
                "reads": self.reads, "read_errors": self.read_errors,
                "stale_reads": self.stale_reads, "keys_written": len(self.acked),
                "maps_seen": c.maps_seen, "generation": generation,
                "min_ready_replicas": low, "maps_with_a_shard_short": short,
                "errors": self.errors[:10]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="shardkv's routing client")
    p.add_argument("--manager", default=os.environ.get("PLAIT_SM_URL",
                                                       "http://127.0.0.1:7090"))
    p.add_argument("--token-file", help="the application's read-only token (plait "
                   "shardmanager token APP --reader; or PLAIT_SM_READ_TOKEN)")
    p.add_argument("--app", default="kv")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("map", help="the shard map")
    put = sub.add_parser("put", help="write a key")
    put.add_argument("key")
    put.add_argument("value")
    get = sub.add_parser("get", help="read a key")
    get.add_argument("key")
    load = sub.add_parser("load", help="writers and readers, then a read-back of every key")
    load.add_argument("--seconds", type=float, default=30.0)
    load.add_argument("--writers", type=int, default=2)
    load.add_argument("--readers", type=int, default=2)
    load.add_argument("--keys", type=int, default=1000)
    args = p.parse_args(argv)
    if args.token_file:
        with open(args.token_file) as f:
            token = f.read().strip()
    else:
        token = os.environ.get("PLAIT_SM_READ_TOKEN", "")
    if not token:
        p.error("--token-file or PLAIT_SM_READ_TOKEN: the application's read token")
    with KvClient(args.manager, token, args.app) as client:
        if not client.wait_for_map(lambda m: bool(m["shards"]), 30):
            print(json.dumps({"error": f"no shard map of {args.app} within 30 s"}))
            return 1
        out: dict[str, Any]
        try:
            if args.command == "map":
                out = client.map
            elif args.command == "put":
                out = {"key": args.key, "version": client.put(args.key, args.value)}
            elif args.command == "get":
                got = client.get(args.key)
                out = {"key": args.key, "version": got and got[0], "value": got and got[1]}
            else:
                run = Load(client, writers=args.writers, readers=args.readers,
                           keys=args.keys).start()
                time.sleep(args.seconds)
                run.stop()
                out = {**run.report(), "verify": run.verify()}
        except Unavailable as exc:
            print(json.dumps({"error": str(exc)}))
            return 1
    print(json.dumps(out))
    if args.command == "load":
        return 1 if out["verify"]["lost"] or out["verify"]["wrong"] else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
