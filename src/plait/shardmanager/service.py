"""The Shard Manager service (shell): owns each sharded application's shard map,
calls ``add_shard``/``drop_shard`` on its tasks, publishes the map, and is the
application's TaskController for plait.

```
  task (client library) --register/heartbeat--> POST /v1/apps/A/tasks
  reconcile (a thread, every 0.5 s and after every change), per application:
     layout = assign(shards, replication, registered tasks but evacuated ones)  (pure)
              then rebalance (at most REBALANCE_MOVES replicas a round)
     adds:  a replica the layout wants and no task serves yet -> POST task/sm/add
            (peers: the shard's ready replicas), ready once it answers
     drops: a replica the layout no longer wants -> POST task/sm/drop, only once every
            replica the layout wants for that shard is ready (add first, drop second)
  plait's scheduler --signed TaskControlRequest--> POST /v1/apps/A/taskcontrol
     tasks it reports unhealthy lose their ready replicas (a restarted task starts
     empty and is loaded again when it registers anew); ShardController (pure)
     answers from the ready map; the tasks it wants emptied are left out of the layout
  clients --> GET /v1/apps/A/map?after=G&wait=S   (long poll: ready replicas per shard)
```

Two processes of one task index (plait replaced a task whose machine failed or was
cut off, and the first runs on, an orphan) both register: the one that started later
is plait's, and the other's registrations are refused (409) from then on, so the
published map never flips between them (``register``).

Defining an application and reading its view need the service's token; registering
a task and reading the map also take the application's own token (``app_token``,
derived from the service's: a task of one application can touch nothing else), which
Shard Manager's calls to the tasks carry; the TaskControl route needs plait's
signature with the job's controller key (``plait job controller-key JOB``), given when
the application is defined, and a sequence number no older than the last (a replay
is refused). Calls to tasks are made off the lock, each within ``CALL_TIMEOUT`` and
``CALL_BYTES``, and applied as each answers. The maps are saved to
``DATA_DIR/shardmanager.json`` (written whole, mode 0600, then renamed) at most once a
second, and the acked operations to ``in-flight.json`` before plait hears of them, so
a restarted service goes on with the replicas its tasks hold and still counts the
tasks it let go as going down.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import hmac
import json
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import httpx
import pydantic
from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from plait import logconfig
from plait.errors import ValidationError
from plait.model.base import Value
from plait.model.policy import Name
from plait.shardmanager.controller import ShardController, ShardView
from plait.shardmanager.layout import Layout, TaskPlace, assign, rebalance
from plait.taskcontrol.protocol import (
    op_from_wire,
    op_to_wire,
    request_from_wire,
    response_to_wire,
)
from plait.taskcontrol.signing import JOB_HEADER, SIGNATURE_HEADER, verify

log = logconfig.get("plait.shardmanager")

#: a task that has not registered for this long is gone: its replicas go elsewhere
TASK_TIMEOUT = 15.0
#: how often the reconciler looks without being woken
EVERY = 0.5
#: the most replicas moved to balance load in one round
REBALANCE_MOVES = 50
#: a call to a task: its deadline, and the most of its answer read
CALL_TIMEOUT = 10.0
CALL_BYTES = 64 * 1024
#: the largest TaskControl request read (1,000 tasks' operations are about 200 kB)
MAX_TASKCONTROL = 8 * 1024 * 1024
MAX_SHARDS = 100_000


def app_token(token: str, app: str) -> str:
    """The token of one application's tasks and clients (register, read its map; Shard
    Manager's calls to its tasks carry it too), derived from the service's token: a
    task of one application can neither define applications nor touch another's."""
    digest = hmac.new(token.encode(), b"plait shardmanager app\0" + app.encode(),
                      hashlib.sha256).hexdigest()
    return f"smt_{digest}"


class AppSpec(Value):
    """A sharded application: the plait job whose tasks serve it and its shards."""

    job: Name
    #: how many shards (named s00000, s00001, ...) or their names
    shards: int | list[Annotated[str, pydantic.StringConstraints(
        min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._-]+$")]]
    replication: int = pydantic.Field(default=3, ge=1, le=9)
    #: the most replicas of a shard an operation may leave down (the batch rule)
    max_down: int = pydantic.Field(default=1, ge=1, le=8)
    #: maintenance at most this long is waited out when every shard is served elsewhere
    short_maintenance_seconds: float = pydantic.Field(default=600.0, ge=0, le=86_400)
    #: the job's TaskControl key (``plait job controller-key JOB``): required to be the
    #: job's controller
    controller_key: str | None = pydantic.Field(default=None, pattern=r"^[0-9a-f]{64}$")

    @pydantic.field_validator("shards")
    @classmethod
    def _shards(cls, value: int | list[str]) -> int | list[str]:
        n = value if isinstance(value, int) else len(value)
        if not 1 <= n <= MAX_SHARDS:
            raise ValueError(f"1 to {MAX_SHARDS} shards")
        if isinstance(value, list) and len(set(value)) != len(value):
            raise ValueError("a shard is named twice")
        return value

    def names(self) -> list[str]:
        if isinstance(self.shards, int):
            return [f"s{i:05d}" for i in range(self.shards)]
        return sorted(self.shards)


class Registration(Value):
    index: int = pydantic.Field(ge=0, le=1_000_000)
    endpoint: str = pydantic.Field(max_length=512, pattern=r"^https?://")
    job: Name
    incarnation: str = pydantic.Field(min_length=1, max_length=64)
    domains: tuple[Annotated[str, pydantic.StringConstraints(max_length=512)], ...] = (
        pydantic.Field(default=(), max_length=8))
    #: the shards the task says it serves (after a restart of the service)
    shards: tuple[Annotated[str, pydantic.StringConstraints(max_length=128)], ...] = (
        pydantic.Field(default=(), max_length=MAX_SHARDS))
    #: when the process started (Unix time, its host's clock): of two processes of
    #: one task index, the one started later is plait's (``ShardManager.register``);
    #: absent, the time Shard Manager first heard of it
    started: Annotated[float, pydantic.Strict()] | None = pydantic.Field(
        default=None, ge=0, le=1e11, allow_inf_nan=False)


@dataclass
class TaskInfo:
    endpoint: str
    incarnation: str
    domains: tuple[str, ...]
    seen: float
    #: when its process started (``Registration.started``)
    started: float = 0.0


#: the superseded incarnations remembered per task index (the latest ones)
SUPERSEDED_KEPT = 8


class Superseded(HTTPException):
    """A registration of a process another one of its task index replaced (409)."""

    def __init__(self, app: str, index: int, incarnation: str, by: TaskInfo | None) -> None:
        newer = ("" if by is None else
                 f" (incarnation {by.incarnation} at {by.endpoint}, started "
                 f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(by.started))} UTC)")
        super().__init__(409, f"task {index} of application {app}: incarnation "
                              f"{incarnation} is superseded by a newer process{newer}; "
                              "this copy is an orphan and serves no shard")


@dataclass
class App:
    name: str
    spec: AppSpec
    shards: list[str]
    controller: ShardController
    tasks: dict[int, TaskInfo] = field(default_factory=dict)
    layout: Layout | None = None
    #: shard -> the tasks serving it now
    ready: dict[str, set[int]] = field(default_factory=dict)
    #: (shard, task) being added or dropped now
    busy: set[tuple[str, int]] = field(default_factory=set)
    load: dict[str, float] = field(default_factory=dict)
    generation: int = 0
    #: the latest TaskControl sequence number seen (an older request is refused)
    sequence: int = -1
    #: per task index, incarnations a newer process replaced (never registered again)
    superseded: dict[int, list[str]] = field(default_factory=dict)
    shard_set: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        self.shard_set = frozenset(self.shards)

    def view(self) -> ShardView:
        return ShardView({s: tuple(sorted(ts)) for s, ts in self.ready.items()},
                         self.spec.replication)


class ShardManager:
    def __init__(self, token: str, data_dir: str | Path | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.token = token
        self.clock = clock
        self.apps: dict[str, App] = {}
        self.lock = threading.RLock()
        self.path = None if data_dir is None else Path(data_dir) / "shardmanager.json"
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(max_workers=16, thread_name_prefix="sm-call")
        self.http = httpx.Client(timeout=CALL_TIMEOUT)
        self._saved_at = 0.0
        self._dirty = False
        self._thread: threading.Thread | None = None
        #: the server's event loop (set at its first watch) and the event watchers wait on
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tick = asyncio.Event()
        self.server: Any = None
        self.url = ""
        self._load()

    # -- applications ------------------------------------------------------------------------
    def _make(self, name: str, spec: AppSpec) -> App:
        app: App

        def view() -> ShardView:
            return app.view()
        app = App(name, spec, spec.names(), ShardController(
            view, max_down=spec.max_down, short_maintenance=spec.short_maintenance_seconds))
        return app

    def define(self, name: str, spec: AppSpec) -> App:
        with self.lock:
            app = self.apps.get(name)
            if app is not None and app.spec.job != spec.job:
                raise ValidationError("job", f"application {name} serves job "
                                             f"{app.spec.job}; its job does not change")
            if app is None:
                app = self.apps[name] = self._make(name, spec)
            else:
                old = app
                app = self._make(name, spec)
                app.tasks, app.layout, app.load = old.tasks, old.layout, old.load
                app.superseded = old.superseded
                app.ready = {s: ts for s, ts in old.ready.items() if s in app.shard_set}
                app.generation = old.generation + 1
                if spec.controller_key == old.spec.controller_key:
                    app.sequence = old.sequence  # (a new key: a new job, numbered anew)
                app.controller.in_flight = old.controller.in_flight
                app.controller.evacuate = old.controller.evacuate
                self.apps[name] = app
            self._changed(app)
        return app

    def app(self, name: str) -> App:
        app = self.apps.get(name)
        if app is None:
            raise HTTPException(404, f"application {name!r} not found")
        return app

    def register(self, name: str, reg: Registration) -> dict[str, Any]:
        with self.lock:
            app = self.app(name)
            if reg.job != app.spec.job:
                raise ValidationError("job", f"application {name} is served by job "
                                             f"{app.spec.job}, not {reg.job}")
            have = app.tasks.get(reg.index)
            now = self.clock()
            if reg.incarnation in app.superseded.get(reg.index, ()):
                raise Superseded(name, reg.index, reg.incarnation, have)
            fresh = have is None or have.incarnation != reg.incarnation
            started = (reg.started if reg.started is not None
                       else have.started if have is not None and not fresh else now)
            if have is not None and fresh:
                # two processes of one task index: plait replaced the one that started
                # first (its machine failed or was cut off, so it runs on, an orphan);
                # the other is plait's. Neither registers again as the other beats
                older, newer = ((reg.incarnation, have) if started < have.started
                                else (have.incarnation, None))
                kept = app.superseded.setdefault(reg.index, [])
                kept.append(older)
                del kept[:-SUPERSEDED_KEPT]
                self._dirty = True
                log.warning("task superseded", app=name, task=reg.index, incarnation=older)
                if newer is not None:
                    raise Superseded(name, reg.index, reg.incarnation, newer)
            app.tasks[reg.index] = TaskInfo(reg.endpoint, reg.incarnation, reg.domains,
                                            now, started)
            if fresh:
                # a new process: it serves what it says (a service restarted under it
                # learns its replicas back), nothing else
                says = set(reg.shards)
                for shard, tasks in app.ready.items():
                    if reg.index in tasks and shard not in says:
                        tasks.discard(reg.index)
                for shard in says:
                    if shard in app.shard_set:
                        app.ready.setdefault(shard, set()).add(reg.index)
                self._changed(app)
            return {"app": name, "index": reg.index, "generation": app.generation}

    def taskcontrol(self, name: str, body: bytes, job: str | None,
                    signature: str | None) -> dict[str, Any]:
        with self.lock:
            app = self.app(name)
            key = app.spec.controller_key
        if key is None:
            raise HTTPException(403, f"application {name} has no controller_key: it is "
                                     "not the TaskController of its job")
        if job != app.spec.job:
            raise HTTPException(403, f"{JOB_HEADER}: this is the controller of job "
                                     f"{app.spec.job}")
        verify(key, signature, body, self.clock())
        try:
            request = request_from_wire(json.loads(body))
        except ValueError as exc:
            raise ValidationError("body", f"not a TaskControl request: {exc}") from None
        with self.lock:
            if request.job_handle != app.spec.job:
                raise ValidationError("job_handle", f"this is the controller of job "
                                                    f"{app.spec.job}")
            if request.sequence_number < app.sequence:
                raise ValidationError("sequence_number", f"{request.sequence_number} is "
                                      f"older than {app.sequence}, already answered (a replay)")
            app.sequence = request.sequence_number
            changed = False
            for ref in request.all_unhealthy_tasks:
                for tasks in app.ready.values():
                    if ref.index in tasks:
                        tasks.discard(ref.index)
                        changed = True
            before = dict(app.controller.in_flight)
            response = app.controller.process(request)
            if app.controller.in_flight != before:
                # (what is acked is on disk before plait hears of it: a restarted
                # service still counts those tasks as going down)
                self._save_in_flight()
            # a task acked away is out of the published map at once (clients stop
            # sending it requests); it is loaded again when it comes back
            acked = set(response.ack)
            for op in request.request:
                if op.op_id in acked:
                    for tasks in app.ready.values():
                        if op.task.index in tasks:
                            tasks.discard(op.task.index)
                            changed = True
            if changed or app.controller.evacuate:
                self._changed(app)
        return response_to_wire(response)

    async def watch(self, name: str, after: int, wait: float) -> dict[str, Any]:
        """``map_view`` once the application's generation is past ``after``, or after
        ``wait`` seconds: a watcher holds no thread while it waits (woken by
        ``_changed`` through the event loop)."""
        deadline = time.monotonic() + wait
        while True:  # (no lock on the event loop: plain reads of two attributes)
            tick = self._tick
            if self.app(name).generation > after or self._stop.is_set():
                break
            left = deadline - time.monotonic()
            if left <= 0:
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(tick.wait(), left)
        from starlette.concurrency import run_in_threadpool

        # (the map is built under the lock: never on the event loop, which every
        # request, TaskControl's too, goes through)
        return await run_in_threadpool(self.map_view, name)

    def map_view(self, name: str) -> dict[str, Any]:
        with self.lock:
            app = self.app(name)
            endpoint = {t: i.endpoint for t, i in app.tasks.items()}
            wanted = app.layout.replicas if app.layout is not None else {}
            return {
                "app": name, "generation": app.generation,
                "replication": app.spec.replication,
                "shards": {s: [endpoint[t] for t in sorted(app.ready.get(s, ())) if t in endpoint]
                           for s in app.shards},
                "adding": {s: [endpoint[t] for t in ts if t in endpoint
                               and t not in app.ready.get(s, ())]
                           for s, ts in wanted.items()
                           if any(t not in app.ready.get(s, ()) for t in ts)},
            }

    def app_view(self, name: str) -> dict[str, Any]:
        with self.lock:
            app = self.app(name)
            held: dict[int, int] = {}
            for tasks in app.ready.values():
                for t in tasks:
                    held[t] = held.get(t, 0) + 1
            ready = [len(app.ready.get(s, ())) for s in app.shards]
            return {
                "app": name, "spec": app.spec.model_dump(mode="json", exclude={"controller_key"}),
                "generation": app.generation,
                "tasks": {str(t): {"endpoint": i.endpoint, "shards": held.get(t, 0),
                                   "domains": list(i.domains)}
                          for t, i in sorted(app.tasks.items())},
                "shards": len(app.shards),
                "fully_replicated": sum(1 for n in ready if n >= app.spec.replication),
                "min_ready": min(ready, default=0),
                "evacuating": sorted(app.controller.evacuate),
                "waiting": {str(t): why for t, why in app.controller.waiting.items()},
                "controller": app.spec.controller_key is not None,
            }

    def set_load(self, name: str, load: dict[str, float]) -> dict[str, Any]:
        with self.lock:
            app = self.app(name)
            known = set(app.shards)
            bad = [s for s in load if s not in known]
            if bad:
                raise ValidationError("load", f"no shard {bad[0]!r} in application {name}")
            app.load.update(load)
            self._changed(app)
            return {"app": name, "shards": len(load)}

    def _changed(self, app: App) -> None:
        """(Under the lock.)"""
        app.generation += 1
        self._dirty = True
        self._wake.set()
        if self._loop is not None:  # (the watchers wait on the server's event loop)
            with contextlib.suppress(RuntimeError):  # (a loop that has closed)
                self._loop.call_soon_threadsafe(self._ring, self._tick)

    def _ring(self, tick: asyncio.Event) -> None:
        """(On the event loop, where watchers read ``_tick``.) Wake every watcher; the
        next ones wait on a new event."""
        if self._tick is tick:
            self._tick = asyncio.Event()
        tick.set()

    # -- the reconciler ---------------------------------------------------------------------
    def reconcile(self) -> None:
        """One round over every application: lay it out, then start its adds and drops
        (each applied when its task answers: a round never waits for a slow task)."""
        calls: list[tuple[str, str, int, str, list[str]]] = []
        with self.lock:
            now = self.clock()
            for app in self.apps.values():
                calls += self._plan(app, now)
        for call in calls:
            self._pool.submit(self._call, *call).add_done_callback(
                functools.partial(self._answered, call))
        self._save()

    def _answered(self, call: tuple[str, str, int, str, list[str]],
                  fut: Future[tuple[bool, str]]) -> None:
        name, shard, task, op, _ = call
        try:
            ok, incarnation = fut.result()
        except Exception as exc:  # (never left busy: the next round tries again)
            log.warning("task call failed", app=name, task=task, op=op, error=repr(exc))
            ok, incarnation = False, ""
        with self.lock:
            app = self.apps.get(name)
            if app is None:
                return
            app.busy.discard((shard, task))
            info = app.tasks.get(task)
            if not ok or info is None or info.incarnation != incarnation:
                return  # (failed, or answered by a process that has been replaced)
            if op == "add":
                if task in self._leaving(app):
                    return  # (acked away meanwhile: it is going down)
                app.ready.setdefault(shard, set()).add(task)
            else:
                app.ready.get(shard, set()).discard(task)
            self._changed(app)

    @staticmethod
    def _leaving(app: App) -> set[int]:
        """(Under the lock.) Tasks with an operation acked and not completed: going down,
        so nothing is loaded onto them."""
        return {op.task.index for op in app.controller.in_flight.values()}

    def _plan(self, app: App, now: float) -> list[tuple[str, str, int, str, list[str]]]:
        """(Under the lock.) The layout, and the adds and drops it asks for."""
        for t, info in list(app.tasks.items()):
            if now - info.seen > TASK_TIMEOUT:
                del app.tasks[t]
                for tasks in app.ready.values():
                    tasks.discard(t)
                log.info("task gone", app=app.name, task=t)
                self._changed(app)
        places = [TaskPlace(t, info.domains) for t, info in sorted(app.tasks.items())
                  if t not in app.controller.evacuate]
        if not places:
            return []
        layout = assign(app.shards, app.spec.replication, places, load=app.load,
                        previous=app.layout)
        layout = rebalance(layout, app.load, limit=REBALANCE_MOVES)
        if app.layout is None or layout.replicas != app.layout.replicas:
            app.layout = layout
            self._changed(app)
        calls = []
        endpoint = {t: i.endpoint for t, i in app.tasks.items()}
        leaving = self._leaving(app)
        for shard in app.shards:
            want = layout.replicas.get(shard, ())
            ready = app.ready.setdefault(shard, set())
            for t in want:
                if t not in ready and (shard, t) not in app.busy and t in endpoint and (
                        t not in leaving):
                    peers = [endpoint[p] for p in sorted(ready) if p in endpoint]
                    app.busy.add((shard, t))
                    calls.append((app.name, shard, t, "add", peers))
            if all(t in ready for t in want):
                for t in sorted(ready - set(want)):
                    if (shard, t) not in app.busy:
                        app.busy.add((shard, t))
                        if t in endpoint:
                            calls.append((app.name, shard, t, "drop", []))
                        else:
                            ready.discard(t)
                            app.busy.discard((shard, t))
        return calls

    def _call(self, name: str, shard: str, task: int, op: str,
              peers: list[str]) -> tuple[bool, str]:
        """Whether the task's process answered the call, and which process it was (its
        answer read up to ``CALL_BYTES``, the whole call within ``CALL_TIMEOUT``)."""
        with self.lock:
            info = self.apps[name].tasks.get(task) if name in self.apps else None
        if info is None:
            return False, ""
        body: dict[str, Any] = {"shard": shard}
        if op == "add":
            body["peers"] = peers
        deadline = time.monotonic() + CALL_TIMEOUT
        try:
            with self.http.stream("POST", f"{info.endpoint}/sm/{op}", json=body, headers={
                    "Authorization": f"Bearer {app_token(self.token, name)}"}) as r:
                data = b""
                for chunk in r.iter_bytes():
                    data += chunk
                    if len(data) > CALL_BYTES or time.monotonic() > deadline:
                        raise ValueError(f"answer over {CALL_BYTES} B or {CALL_TIMEOUT} s")
                status = r.status_code
        except (httpx.HTTPError, httpx.InvalidURL, ValueError, OSError) as exc:
            log.info("task call failed", app=name, task=task, op=op, shard=shard,
                     error=f"{type(exc).__name__}: {exc}")
            return False, info.incarnation
        if not 200 <= status < 300:
            log.info("task refused", app=name, task=task, op=op, shard=shard,
                     status=status, body=data[:200].decode("utf-8", "replace"))
            return False, info.incarnation
        try:  # (the process that answered: the client library says which it is)
            said = json.loads(data)
            incarnation = said.get("incarnation") if isinstance(said, dict) else None
        except ValueError:
            incarnation = None
        return True, str(incarnation or info.incarnation)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(EVERY)
            self._wake.clear()
            try:
                self.reconcile()
            except Exception as exc:  # (a round that failed is tried again)
                log.warning("reconcile failed", error=f"{type(exc).__name__}: {exc}")

    # -- the saved maps ---------------------------------------------------------------------
    def _save(self, force: bool = False) -> None:
        if self.path is None or not (self._dirty or force):
            return
        now = time.monotonic()
        if not force and now - self._saved_at < 1.0:
            return
        with self.lock:
            data = {"schema": 1, "apps": {
                name: {"spec": app.spec.model_dump(mode="json"),
                       "ready": {s: sorted(ts) for s, ts in app.ready.items() if ts},
                       "groups": {} if app.layout is None else {
                           str(t): g for t, g in app.layout.groups.items()},
                       "replicas": {} if app.layout is None else {
                           s: list(ts) for s, ts in app.layout.replicas.items()},
                       "load": app.load,
                       "evacuate": {str(t): n for t, n in app.controller.evacuate.items()},
                       "tasks": {str(t): {"endpoint": i.endpoint, "incarnation": i.incarnation,
                                          "domains": list(i.domains), "started": i.started}
                                 for t, i in app.tasks.items()},
                       "superseded": {str(t): list(i) for t, i in app.superseded.items()}}
                for name, app in self.apps.items()}}
            self._dirty = False
        self._saved_at = now
        _write(self.path, data)

    def _save_in_flight(self) -> None:
        """(Under the lock.) The acked, not completed operations of every application,
        on disk before the answer that acks them goes out (small: one per task at
        most)."""
        if self.path is None:
            return
        _write(self.path.with_name("in-flight.json"), {"schema": 1, "apps": {
            name: [op_to_wire(op) for op in app.controller.in_flight.values()]
            for name, app in self.apps.items()}})

    def _load(self) -> None:
        if self.path is None or not self.path.exists():
            return
        data = json.loads(self.path.read_text())
        flying: dict[str, Any] = {}
        with contextlib.suppress(FileNotFoundError):
            flying = json.loads(self.path.with_name("in-flight.json").read_text())["apps"]
        for name, saved in data.get("apps", {}).items():
            app = self._make(name, AppSpec.model_validate(saved["spec"]))
            app.ready = {s: set(ts) for s, ts in saved.get("ready", {}).items()}
            app.load = {s: float(v) for s, v in saved.get("load", {}).items()}
            app.controller.evacuate = {int(t): str(n)
                                       for t, n in saved.get("evacuate", {}).items()}
            for wire in flying.get(name, ()):
                op = op_from_wire(wire)
                app.controller.in_flight[op.op_id] = op
            now = self.clock()  # (each has TASK_TIMEOUT to register again)
            app.tasks = {int(t): TaskInfo(str(i["endpoint"]), str(i["incarnation"]),
                                          tuple(i["domains"]), now,
                                          float(i.get("started", 0.0)))
                         for t, i in saved.get("tasks", {}).items()}
            app.superseded = {int(t): [str(x) for x in i]
                              for t, i in saved.get("superseded", {}).items()}
            if saved.get("replicas"):
                app.layout = Layout({s: tuple(ts) for s, ts in saved["replicas"].items()},
                                    {int(t): int(g) for t, g in saved["groups"].items()})
            self.apps[name] = app

    # -- serving ----------------------------------------------------------------------------
    def start(self, host: str = "127.0.0.1", port: int = 0) -> ShardManager:
        from plait.server.serve import AsgiServer

        self._thread = threading.Thread(target=self._run, name="sm-reconcile", daemon=True)
        self._thread.start()
        self.server = AsgiServer(create_app(self), host=host, port=port).start()
        self.url = self.server.url
        return self

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._loop is not None:
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._ring, self._tick)
        if self.server is not None:
            self.server.stop()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._save(force=True)
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.http.close()


def _write(path: Path, data: Any) -> None:
    """``data`` as JSON at ``path``, whole or not at all, readable by the owner only
    (it holds the jobs' controller keys), flushed to disk."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(data))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def create_app(sm: ShardManager) -> FastAPI:
    api = FastAPI(title="plait Shard Manager", version="1")

    def authorized(request: Request) -> None:
        given = request.headers.get("Authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {sm.token}".encode()):
            raise HTTPException(401, "a valid token is required (Authorization: Bearer ...)")

    auth = [Depends(authorized)]

    def app_member(request: Request, app: str) -> None:
        """The service's token, or the application's own (``app_token``)."""
        given = request.headers.get("Authorization", "").encode()
        if not (hmac.compare_digest(given, f"Bearer {sm.token}".encode())
                or hmac.compare_digest(given, f"Bearer {app_token(sm.token, app)}".encode())):
            raise HTTPException(401, f"the service's token or application {app}'s is "
                                     "required (Authorization: Bearer ...)")

    member = [Depends(app_member)]

    @api.exception_handler(ValidationError)
    def _invalid(request: Request, exc: ValidationError) -> JSONResponse:
        return JSONResponse({"error": str(exc)}, status_code=422)

    @api.exception_handler(RequestValidationError)
    def _malformed(request: Request, exc: RequestValidationError) -> JSONResponse:
        # FastAPI's own answer echoes each refused value, and one that is not JSON
        # (NaN, 1e400) made it a 500: where and why, without the value
        return JSONResponse({"detail": [
            {"loc": list(e.get("loc", ())), "msg": str(e.get("msg", "invalid")),
             "type": str(e.get("type", ""))} for e in exc.errors()[:20]]}, status_code=422)

    @api.get("/healthz")
    def healthz() -> dict[str, Any]:
        return {"ok": True, "apps": len(sm.apps)}

    @api.put("/v1/apps/{app}", dependencies=auth)
    def put_app(app: Name, spec: AppSpec) -> dict[str, Any]:
        sm.define(app, spec)
        return sm.app_view(app)

    @api.get("/v1/apps/{app}", dependencies=auth)
    def get_app(app: str) -> dict[str, Any]:
        return sm.app_view(app)

    @api.get("/v1/apps/{app}/map", dependencies=member)
    async def get_map(app: str, after: int = -1,
                      wait: Annotated[float, Query(ge=0, le=60)] = 0.0) -> dict[str, Any]:
        if sm._loop is None:
            sm._loop = asyncio.get_running_loop()
        return await sm.watch(app, after, wait)

    @api.get("/v1/apps/{app}/token", dependencies=auth)
    def get_token(app: str) -> dict[str, Any]:
        """The application's token, for its tasks (``PLAIT_SM_TOKEN``) and clients."""
        sm.app(app)
        return {"app": app, "token": app_token(sm.token, app)}

    @api.post("/v1/apps/{app}/tasks", dependencies=member)
    def register(app: str, reg: Registration) -> dict[str, Any]:
        return sm.register(app, reg)

    @api.post("/v1/apps/{app}/load", dependencies=auth)
    def load(app: str, body: dict[str, Annotated[float, pydantic.Field(ge=0, le=1e9)]]
             ) -> dict[str, Any]:
        if len(body) > MAX_SHARDS:
            raise ValidationError("load", f"at most {MAX_SHARDS} shards")
        return sm.set_load(app, body)

    @api.post("/v1/apps/{app}/taskcontrol")
    async def taskcontrol(app: str, request: Request) -> dict[str, Any]:
        size = int(request.headers.get("Content-Length") or 0)
        if size > MAX_TASKCONTROL:
            raise HTTPException(413, f"a TaskControl request is at most {MAX_TASKCONTROL} B")
        body = b""
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_TASKCONTROL:
                raise HTTPException(413, f"a TaskControl request is at most "
                                         f"{MAX_TASKCONTROL} B")
        from starlette.concurrency import run_in_threadpool

        try:
            return await run_in_threadpool(sm.taskcontrol, app, body,
                                           request.headers.get(JOB_HEADER),
                                           request.headers.get(SIGNATURE_HEADER))
        except ValidationError as exc:
            status = 401 if exc.field == SIGNATURE_HEADER else 422
            raise HTTPException(status, str(exc)) from None

    return api


def serve(token: str, host: str, port: int, data_dir: str | None) -> None:
    """``plait shardmanager serve``: until interrupted."""
    sm = ShardManager(token, data_dir).start(host, port)
    print(f"plait Shard Manager on {sm.url}", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        while True:
            time.sleep(3600)
    sm.stop()
