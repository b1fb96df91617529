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

Who may do what (``credentials``): the service's token defines applications and
reads their state; an application's tasks sign their registrations with a key of
their own process, derived from the task's own credential (``PLAIT_TASK_CREDENTIAL``,
which Shard Manager derives from the job's controller key; an application without
one: from the application's task secret), never sent, and Shard Manager signs its
calls to them with the same key; its clients read the map with a read-only token.
A registration names an index under the job's task count (``AppSpec.tasks``), its
own endpoint when the application has a controller key (the one its credential is
bound to: the host:port plait's discovery has for it, its ``PLAIT_TASK_ENDPOINT``), an
endpoint the address policy allows (``--task-networks``;
never a cloud metadata address, nor this service), and a start time no later than
``START_SKEW`` past this clock. The TaskControl route needs plait's signature with
the job's controller key (``plait job controller-key JOB``), given when the
application is defined, within ``TASKCONTROL_TOLERANCE`` of this clock, and a
sequence number greater than the last one accepted (a replay is refused).

Each application has a lock of its own (one application's layout never holds up
another's map), and its map is serialized once a generation, off the event loop. An
application holds at most ``MAX_REPLICAS`` replicas (shards x replication), and has
at most ``CALLS_PER_APP`` calls under way or queued. Calls to tasks are made off the
locks, each within ``CALL_TIMEOUT`` and ``CALL_BYTES``, and
applied as each answers; a task that does not answer is called again after a
backoff (doubling to ``BACKOFF_CAP``), and its failures are logged at most once per
``LOG_EVERY``.

The maps are saved to ``DATA_DIR/shardmanager.json`` (written whole, mode 0600, then
renamed) at most once a second, and the acked operations to ``in-flight.json``
before plait hears of them, so a restarted service goes on with the replicas its
tasks hold and still counts the tasks it let go as going down. Generations are
reserved ``GENERATION_BLOCK`` at a time in ``generations.json`` before they are
published, and an application's generation starts at least at the clock in
milliseconds: a restarted service never publishes a map older than one a client
holds. A restored task's replicas are published only once it confirms them (asked
at once with ``GET /sm/shards``, or at its next registration).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import json
import os
import random
import secrets
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import httpx
import pydantic
from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response

from plait import logconfig
from plait.errors import ValidationError
from plait.model.base import Value
from plait.model.job import MAX_TASKS
from plait.model.policy import Name
from plait.shardmanager import credentials
from plait.shardmanager.controller import ShardController, ShardView
from plait.shardmanager.credentials import read_token, registration_secret, task_key, task_secret
from plait.shardmanager.layout import Layout, TaskPlace, assign, rebalance
from plait.taskcontrol.protocol import (
    op_from_wire,
    op_to_wire,
    request_from_wire,
    response_to_wire,
)
from plait.taskcontrol.signing import JOB_HEADER, SIGNATURE_HEADER, verify
from plait.taskcontrol.urlpolicy import EVERYWHERE, LOOPBACK, UrlPolicy, networks, own_addresses

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
#: the most calls to its tasks one application has under way or queued (the callers'
#: pool is shared: one application's volume waits behind its own calls, not others')
CALLS_PER_APP = 64
#: the largest TaskControl request read (1,000 tasks' operations are about 200 kB)
MAX_TASKCONTROL = 8 * 1024 * 1024
#: the largest registration read (100,000 shard names)
MAX_REGISTRATION = 16 * 1024 * 1024
MAX_SHARDS = 100_000
#: the most replicas (shards x replication) one application holds: its layout and
#: map are computed and kept per application, and this bounds their cost
MAX_REPLICAS = 300_000
#: how far past this clock a task's start time may be (its host's clock may be ahead)
START_SKEW = 60.0
#: how far a TaskControl signature's timestamp may be from this clock
TASKCONTROL_TOLERANCE = 60.0
#: an unanswered task is called again after BACKOFF_BASE, doubling up to BACKOFF_CAP
BACKOFF_BASE = 0.5
BACKOFF_CAP = 30.0
#: a task's failed calls are logged at most once in this many seconds
LOG_EVERY = 60.0
#: generations reserved on disk at a time (a restart goes on past the reservation)
GENERATION_BLOCK = 10_000


def app_token(token: str, app: str) -> str:
    """The application's task secret (``credentials.task_secret``; the name it had when
    tasks and clients shared it)."""
    return task_secret(token, app)


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
    #: the job's task count: a task registers an index under it (none: any index a
    #: job may have, under ``MAX_TASKS``); define the application again after a resize
    tasks: int | None = pydantic.Field(default=None, ge=1, le=MAX_TASKS)

    @pydantic.field_validator("shards")
    @classmethod
    def _shards(cls, value: int | list[str]) -> int | list[str]:
        n = value if isinstance(value, int) else len(value)
        if not 1 <= n <= MAX_SHARDS:
            raise ValueError(f"1 to {MAX_SHARDS} shards")
        if isinstance(value, list) and len(set(value)) != len(value):
            raise ValueError("a shard is named twice")
        return value

    @pydantic.field_validator("replication")
    @classmethod
    def _replicas(cls, value: int, info: pydantic.ValidationInfo) -> int:
        shards = info.data.get("shards")
        n = shards if isinstance(shards, int) else len(shards or ())
        if n * value > MAX_REPLICAS:
            raise ValueError(f"{n} shards x {value} replicas is {n * value} replicas; an "
                             f"application holds at most {MAX_REPLICAS} (MAX_REPLICAS)")
        return value

    def names(self) -> list[str]:
        if isinstance(self.shards, int):
            return [f"s{i:05d}" for i in range(self.shards)]
        return sorted(self.shards)

    def task_limit(self) -> int:
        return MAX_TASKS if self.tasks is None else self.tasks


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
    #: the timestamp of its last registration's signature (an older one is a replay)
    signed: int = 0
    #: restored from disk and not heard from since: its replicas are not published
    confirmed: bool = True
    #: calls that failed in a row, and when it may be called again
    failures: int = 0
    next_try: float = 0.0
    #: when a failure was last logged, and how many were not logged since
    logged_at: float = float("-inf")
    quiet: int = 0


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
    #: the generations up to this one are reserved on disk (``generations.json``)
    reserved: int = 0
    #: the latest TaskControl sequence number accepted (one no greater is refused)
    sequence: int = -1
    #: per task index, incarnations a newer process replaced (never registered again)
    superseded: dict[int, list[str]] = field(default_factory=dict)
    #: restored tasks not confirmed yet -> the shards the saved map gave them
    restored: dict[int, set[str]] = field(default_factory=dict)
    shard_set: frozenset[str] = frozenset()
    #: this application's own lock (shared with the App that replaces it on a define)
    lock: threading.RLock = field(default_factory=threading.RLock)
    #: (generation, the map as JSON): serialized once a generation
    map_cache: tuple[int, bytes] | None = None
    #: the acked operations, as saved in in-flight.json
    in_flight_wire: list[Any] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.shard_set = frozenset(self.shards)

    def view(self) -> ShardView:
        """What the controller reads: the ready replicas, and those of restored tasks
        not confirmed yet (a task that may hold a shard is never taken for an empty
        one; a task that is down plait reports as unhealthy)."""
        ready = {s: set(ts) for s, ts in self.ready.items()}
        for t, shards in self.restored.items():
            for s in shards:
                ready.setdefault(s, set()).add(t)
        return ShardView({s: tuple(sorted(ts)) for s, ts in ready.items()},
                         self.spec.replication)


def _backoff(failures: int) -> float:
    """How long after its ``failures``-th failure in a row a task is called again
    (doubling, capped, with a little jitter so tasks do not fall in step)."""
    delay: float = min(BACKOFF_CAP, BACKOFF_BASE * 2.0 ** min(failures - 1, 16))
    return delay * (1 + random.random() / 4)


class ShardManager:
    def __init__(self, token: str, data_dir: str | Path | None = None,
                 clock: Callable[[], float] = time.time,
                 task_networks: Sequence[str] | None = None) -> None:
        self.token = token
        self.clock = clock
        self.apps: dict[str, App] = {}
        #: held to add or replace an application (before any application's lock)
        self.lock = threading.RLock()
        self._file_lock = threading.Lock()
        self.path = None if data_dir is None else Path(data_dir) / "shardmanager.json"
        #: where task endpoints may be (``start`` adds loopback on a loopback host)
        self.task_networks = None if task_networks is None else networks(task_networks)
        self.policy = UrlPolicy(self.task_networks or EVERYWHERE)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(max_workers=16, thread_name_prefix="sm-call")
        self.http = httpx.Client(timeout=CALL_TIMEOUT, trust_env=False)
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
        # (at least the clock in milliseconds: a service that lost its data dir still
        # publishes maps newer than those of its previous run)
        app.generation = int(self.clock() * 1000)
        return app

    def define(self, name: str, spec: AppSpec) -> App:
        with self.lock:
            app = self.apps.get(name)
            if app is not None and app.spec.job != spec.job:
                raise ValidationError("job", f"application {name} serves job "
                                             f"{app.spec.job}; its job does not change")
            if app is None:
                app = self._make(name, spec)
                with app.lock:
                    self.apps[name] = app
                    self._changed(app)
                return app
            old = app
            with old.lock:
                app = self._make(name, spec)
                app.lock = old.lock
                app.tasks, app.layout, app.load = old.tasks, old.layout, old.load
                app.superseded, app.reserved = old.superseded, old.reserved
                app.restored = old.restored
                app.ready = {s: ts for s, ts in old.ready.items() if s in app.shard_set}
                app.generation = max(old.generation, app.generation)
                if spec.controller_key == old.spec.controller_key:
                    app.sequence = old.sequence  # (a new key: a new job, numbered anew)
                app.controller.in_flight = old.controller.in_flight
                app.controller.evacuate = old.controller.evacuate
                app.in_flight_wire = old.in_flight_wire
                self.apps[name] = app
                self._changed(app)
        return app

    def app(self, name: str) -> App:
        app = self.apps.get(name)
        if app is None:
            raise HTTPException(404, f"application {name!r} not found")
        return app

    @contextlib.contextmanager
    def hold(self, name: str) -> Iterator[App]:
        """The application, under its lock (the one current once the lock is held: a
        define may replace it meanwhile)."""
        while True:
            app = self.app(name)
            with app.lock:
                if self.apps.get(name) is app:
                    yield app
                    return

    def register_signed(self, name: str, body: bytes, signature: str | None) -> dict[str, Any]:
        """A registration as sent: its body signed with the key of the process it names
        (``credentials``); what ``register`` answers."""
        try:
            reg = Registration.model_validate_json(body)
        except pydantic.ValidationError as exc:
            raise RequestValidationError([
                {"loc": ("body", *e.get("loc", ())), "msg": e.get("msg", "invalid"),
                 "type": e.get("type", "")} for e in exc.errors()[:20]]) from None
        # (an application not defined: checked as one without a controller key, so
        # that a caller without its secret cannot tell it from a bad signature)
        app = self.apps.get(name)
        controller_key = app.spec.controller_key if app is not None else None
        key = task_key(registration_secret(self.token, name, controller_key, reg.job,
                                           reg.index, reg.endpoint), name, reg.job,
                       reg.index, reg.incarnation)
        try:
            stamp = credentials.verify(key, signature, body, self.clock())
        except ValidationError as exc:
            how = (f"application {name} has its job's controller key: a task signs with "
                   "its own PLAIT_TASK_CREDENTIAL (set by plait's agent), good for its "
                   "own job and index, and its own endpoint (its PLAIT_TASK_ENDPOINT) "
                   f"only; this registration names endpoint "
                   f"{credentials.host_port(reg.endpoint)}"
                   if controller_key is not None else
                   "a registration is signed with the task's key, from the "
                   "application's task secret (plait shardmanager token APP)")
            raise HTTPException(401, f"{exc}: {how}") from None
        return self.register(name, reg, stamp, verified=True,
                             controller_key=controller_key)

    def register(self, name: str, reg: Registration, signed: int = 0, verified: bool = False,
                 controller_key: str | None = None) -> dict[str, Any]:
        """(``signed``: the signature's timestamp; a registration signed before the
        last one of the same process is a replay. ``verified``: its signature was
        checked with ``controller_key``, which the application must still have.)"""
        now = self.clock()
        if reg.started is not None and reg.started > now + START_SKEW:
            raise ValidationError("started", f"{reg.started:.0f} is "
                                  f"{reg.started - now:.0f}s past this service's clock (at "
                                  f"most {START_SKEW:g}s ahead: a process starts before it "
                                  "registers)")
        self._check_endpoint(reg.endpoint)
        with self.hold(name) as app:
            if verified and app.spec.controller_key != controller_key:
                raise HTTPException(409, f"application {name} was defined again meanwhile "
                                         "with another controller key: register again")
            if reg.job != app.spec.job:
                raise ValidationError("job", f"application {name} is served by job "
                                             f"{app.spec.job}, not {reg.job}")
            if reg.index >= app.spec.task_limit():
                raise ValidationError("index", f"task {reg.index}: job {app.spec.job} has "
                                      f"{app.spec.task_limit()} tasks (AppSpec.tasks; "
                                      "define the application again after a resize)")
            have = app.tasks.get(reg.index)
            if reg.incarnation in app.superseded.get(reg.index, ()):
                raise Superseded(name, reg.index, reg.incarnation, have)
            fresh = have is None or have.incarnation != reg.incarnation
            if not fresh and have is not None and signed < have.signed:
                raise HTTPException(401, f"{credentials.SIGNATURE_HEADER}: signed before "
                                         "this process's last registration (a replay)")
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
            info = TaskInfo(reg.endpoint, reg.incarnation, reg.domains, now, started,
                            signed)
            if have is not None and not fresh:
                info.failures, info.next_try = have.failures, have.next_try
                info.logged_at, info.quiet = have.logged_at, have.quiet
                if have.endpoint != reg.endpoint:
                    info.failures = info.next_try = 0  # (somewhere new: tried at once)
            app.tasks[reg.index] = info
            if fresh:
                # a new process starts empty; a process Shard Manager had no record of
                # (a service that kept no data dir) serves what it says
                app.restored.pop(reg.index, None)
                says = set(reg.shards) if have is None else set()
                for shard, tasks in app.ready.items():
                    if reg.index in tasks and shard not in says:
                        tasks.discard(reg.index)
                for shard in says:
                    if shard in app.shard_set:
                        app.ready.setdefault(shard, set()).add(reg.index)
                self._changed(app)
            elif reg.index in app.restored:
                self._confirm(app, reg.index, reg.shards)
            return {"app": name, "index": reg.index, "generation": app.generation}

    def _confirm(self, app: App, task: int, says: Sequence[str]) -> None:
        """(Under the app's lock.) A restored task said which shards it serves: those
        the saved map gave it are published again."""
        had = app.restored.pop(task, set())
        info = app.tasks.get(task)
        if info is not None:
            info.confirmed = True
        leaving = self._leaving(app)
        for shard in had & set(says):
            if task not in leaving:
                app.ready.setdefault(shard, set()).add(task)
        log.info("task confirmed", app=app.name, task=task,
                 replicas=len(had & set(says)), of=len(had))
        self._changed(app)

    def _check_endpoint(self, url: str) -> None:
        """Refuse an endpoint the address policy refuses (a literal address, or a
        metadata name; a name is checked on what it resolves to at each call)."""
        try:
            host, _ = self.policy.host(url)
            literal = self.policy.literal(host)
            if literal is not None:
                self.policy.check(url, [str(literal)])
        except ValidationError as exc:
            raise ValidationError("endpoint", exc.message.replace(
                "controller URL", "task endpoint").replace(
                "plait serve --controller-networks",
                "plait shardmanager serve --task-networks")) from None
        except ValueError as exc:  # (urlsplit's: a bracket not closed, say)
            raise ValidationError("endpoint", f"{url!r} is not a URL: {exc}") from None

    def taskcontrol(self, name: str, body: bytes, job: str | None,
                    signature: str | None) -> dict[str, Any]:
        with self.hold(name) as app:
            key = app.spec.controller_key
            wanted = app.spec.job
        if key is None:
            raise HTTPException(403, f"application {name} has no controller_key: it is "
                                     "not the TaskController of its job")
        if job != wanted:
            raise HTTPException(403, f"{JOB_HEADER}: this is the controller of job {wanted}")
        verify(key, signature, body, self.clock(), tolerance=TASKCONTROL_TOLERANCE)
        try:
            request = request_from_wire(json.loads(body))
        except ValueError as exc:
            raise ValidationError("body", f"not a TaskControl request: {exc}") from None
        with self.hold(name) as app:
            if app.spec.controller_key != key:
                raise HTTPException(409, f"application {name} was defined again meanwhile")
            if request.job_handle != app.spec.job:
                raise ValidationError("job_handle", f"this is the controller of job "
                                                    f"{app.spec.job}")
            if request.sequence_number <= app.sequence:
                raise ValidationError("sequence_number", f"{request.sequence_number} is not "
                                      f"past {app.sequence}, the last accepted (a replay)")
            app.sequence = request.sequence_number
            self._dirty = True
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
                app.in_flight_wire = [op_to_wire(op)
                                      for op in app.controller.in_flight.values()]
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

    async def watch(self, name: str, after: int, wait: float) -> bytes:
        """``map_view`` (as JSON) once the application's generation is past ``after``,
        or after ``wait`` seconds: a watcher holds no thread while it waits (woken by
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

        # (the map is built under the application's lock and serialized there, once a
        # generation: never on the event loop, which every request goes through)
        return await run_in_threadpool(self.map_json, name)

    def map_json(self, name: str) -> bytes:
        with self.hold(name) as app:
            cached = app.map_cache
            if cached is None or cached[0] != app.generation:
                cached = app.map_cache = (app.generation, json.dumps(
                    self._map(app), separators=(",", ":")).encode())
            return cached[1]

    def map_view(self, name: str) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self.map_json(name))
        return data

    @staticmethod
    def _map(app: App) -> dict[str, Any]:
        """(Under the app's lock.)"""
        endpoint = {t: i.endpoint for t, i in app.tasks.items()}
        wanted = app.layout.replicas if app.layout is not None else {}
        return {
            "app": app.name, "generation": app.generation,
            "replication": app.spec.replication,
            "shards": {s: [endpoint[t] for t in sorted(app.ready.get(s, ())) if t in endpoint]
                       for s in app.shards},
            "adding": {s: [endpoint[t] for t in ts if t in endpoint
                           and t not in app.ready.get(s, ()) and t not in app.restored]
                       for s, ts in wanted.items()
                       if any(t not in app.ready.get(s, ()) for t in ts)},
        }

    def app_view(self, name: str) -> dict[str, Any]:
        with self.hold(name) as app:
            held: dict[int, int] = {}
            for tasks in app.ready.values():
                for t in tasks:
                    held[t] = held.get(t, 0) + 1
            ready = [len(app.ready.get(s, ())) for s in app.shards]
            return {
                "app": name, "spec": app.spec.model_dump(mode="json", exclude={"controller_key"}),
                "generation": app.generation,
                "tasks": {str(t): {"endpoint": i.endpoint, "shards": held.get(t, 0),
                                   "domains": list(i.domains), "confirmed": i.confirmed,
                                   "failures": i.failures}
                          for t, i in sorted(app.tasks.items())},
                "shards": len(app.shards),
                "fully_replicated": sum(1 for n in ready if n >= app.spec.replication),
                "min_ready": min(ready, default=0),
                "evacuating": sorted(app.controller.evacuate),
                "waiting": {str(t): why for t, why in app.controller.waiting.items()},
                "controller": app.spec.controller_key is not None,
            }

    def set_load(self, name: str, load: dict[str, float]) -> dict[str, Any]:
        with self.hold(name) as app:
            known = app.shard_set
            bad = [s for s in load if s not in known]
            if bad:
                raise ValidationError("load", f"no shard {bad[0]!r} in application {name}")
            app.load.update(load)
            self._changed(app)
            return {"app": name, "shards": len(load)}

    def _changed(self, app: App) -> None:
        """(Under the app's lock.) A new generation: reserved on disk first."""
        app.generation += 1
        if app.generation > app.reserved:
            app.reserved = app.generation + GENERATION_BLOCK
            self._save_generations()
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
        for name in list(self.apps):
            with self.hold(name) as app:
                calls += self._plan(app, self.clock())
        for call in calls:
            self._pool.submit(self._call, *call).add_done_callback(
                functools.partial(self._answered, call))
        self._save()

    def _answered(self, call: tuple[str, str, int, str, list[str]],
                  fut: Future[tuple[bool, str, Any]]) -> None:
        name, shard, task, op, _ = call
        try:
            ok, incarnation, said = fut.result()
        except Exception as exc:  # (never left busy: the next round tries again)
            ok, incarnation, said = False, "", f"{type(exc).__name__}: {exc}"
        app = self.apps.get(name)
        if app is None:
            return
        with self.hold(name) as app:
            app.busy.discard((shard, task))
            info = app.tasks.get(task)
            if info is None:
                return
            now = self.clock()
            if not ok:
                self._failed(app, task, info, op, shard, str(said), now)
                return
            if info.failures:
                log.info("task answers again", app=name, task=task, failures=info.failures)
            info.failures, info.next_try, info.quiet = 0, 0.0, 0
            if info.incarnation != incarnation:
                return  # (answered by a process that has been replaced)
            if op == "probe":
                if task in app.restored:
                    shards = said.get("shards") if isinstance(said, dict) else None
                    self._confirm(app, task, [s for s in shards or () if isinstance(s, str)])
                return
            if op == "add":
                if task in self._leaving(app):
                    return  # (acked away meanwhile: it is going down)
                app.ready.setdefault(shard, set()).add(task)
            else:
                app.ready.get(shard, set()).discard(task)
            self._changed(app)

    @staticmethod
    def _failed(app: App, task: int, info: TaskInfo, op: str, shard: str, error: str,
                now: float) -> None:
        """(Under the app's lock.) A call the task did not answer: it is called again
        after a backoff (the calls of one round fail together: one step each round),
        and logged at most once in ``LOG_EVERY``."""
        if now >= info.next_try:
            info.failures += 1
            info.next_try = now + _backoff(info.failures)
        if now - info.logged_at >= LOG_EVERY:
            log.info("task call failed", app=app.name, task=task, op=op, shard=shard,
                     error=error[:300], failures=info.failures, not_logged=info.quiet,
                     retry_in=round(info.next_try - now, 1))
            info.logged_at, info.quiet = now, 0
        else:
            info.quiet += 1

    @staticmethod
    def _leaving(app: App) -> set[int]:
        """(Under the lock.) Tasks with an operation acked and not completed: going down,
        so nothing is loaded onto them."""
        return {op.task.index for op in app.controller.in_flight.values()}

    def _plan(self, app: App, now: float) -> list[tuple[str, str, int, str, list[str]]]:
        """(Under the app's lock.) The layout, and the adds and drops it asks for."""
        for t, info in list(app.tasks.items()):
            if now - info.seen > TASK_TIMEOUT:
                del app.tasks[t]
                app.restored.pop(t, None)
                for tasks in app.ready.values():
                    tasks.discard(t)
                log.info("task gone", app=app.name, task=t)
                self._changed(app)
        calls: list[tuple[str, str, int, str, list[str]]] = []
        # a restored task is asked which shards it serves (until it says, or registers)
        for t in sorted(app.restored):
            info = app.tasks[t]
            if ("", t) not in app.busy and now >= info.next_try:
                app.busy.add(("", t))
                calls.append((app.name, "", t, "probe", []))
        places = [TaskPlace(t, info.domains) for t, info in sorted(app.tasks.items())
                  if t not in app.controller.evacuate]
        if not places:
            return calls
        layout = assign(app.shards, app.spec.replication, places, load=app.load,
                        previous=app.layout)
        layout = rebalance(layout, app.load, limit=REBALANCE_MOVES)
        if app.layout is None or layout.replicas != app.layout.replicas:
            app.layout = layout
            self._changed(app)
        # (a restored task is called once it confirms, and one that did not answer
        # once its backoff is over)
        endpoint = {t: i.endpoint for t, i in app.tasks.items()
                    if now >= i.next_try and t not in app.restored}
        leaving = self._leaving(app)
        # (a shard only restored tasks may hold waits for them: an add now would copy
        # from no replica)
        unsure = {s for shards in app.restored.values() for s in shards
                  if not app.ready.get(s)}
        for shard in app.shards:
            if len(app.busy) >= CALLS_PER_APP:
                break  # (the rest next round)
            if shard in unsure:
                continue
            want = layout.replicas.get(shard, ())
            ready = app.ready.setdefault(shard, set())
            for t in want:
                if t not in ready and (shard, t) not in app.busy and t in endpoint and (
                        t not in leaving):
                    peers = [app.tasks[p].endpoint for p in sorted(ready) if p in app.tasks]
                    app.busy.add((shard, t))
                    calls.append((app.name, shard, t, "add", peers))
            if all(t in ready for t in want):
                for t in sorted(ready - set(want)):
                    if (shard, t) not in app.busy:
                        if t in endpoint:
                            app.busy.add((shard, t))
                            calls.append((app.name, shard, t, "drop", []))
                        elif t not in app.tasks:
                            ready.discard(t)
        return calls

    def _call(self, name: str, shard: str, task: int, op: str,
              peers: list[str]) -> tuple[bool, str, Any]:
        """Whether the task's process answered the call, which process it was, and
        what it said or why it did not answer (its answer read up to ``CALL_BYTES``,
        the whole call within ``CALL_TIMEOUT``; signed with the process's key, to an
        address the policy allows)."""
        app = self.apps.get(name)
        with app.lock if app is not None else contextlib.nullcontext():
            info = app.tasks.get(task) if app is not None else None
            job = app.spec.job if app is not None else ""
            controller_key = app.spec.controller_key if app is not None else None
        if info is None:
            return False, "", "no such task"
        if op == "probe":
            method, path, body = "GET", "/sm/shards", b""
        else:
            data: dict[str, Any] = {"shard": shard, "nonce": secrets.token_hex(16)}
            if op == "add":
                data["peers"] = peers
            method, path, body = "POST", f"/sm/{op}", json.dumps(data).encode()
        deadline = time.monotonic() + CALL_TIMEOUT
        limit = MAX_REGISTRATION if op == "probe" else CALL_BYTES  # (a list of shards)
        try:
            key = task_key(registration_secret(self.token, name, controller_key, job, task,
                                               info.endpoint), name, job, task,
                           info.incarnation)
            self._check_resolved(info.endpoint)  # (each call: a name may resolve anew)
            signature = credentials.sign(key, credentials.call_message(method, path, body),
                                         self.clock())
            with self.http.stream(method, f"{info.endpoint}{path}", content=body, headers={
                    credentials.SIGNATURE_HEADER: signature,
                    "Content-Type": "application/json"}) as r:
                answer = b""
                for chunk in r.iter_bytes():
                    answer += chunk
                    if len(answer) > limit or time.monotonic() > deadline:
                        raise ValueError(f"answer over {limit} B or {CALL_TIMEOUT} s")
                status = r.status_code
        except (httpx.HTTPError, httpx.InvalidURL, ValueError, OSError, ValidationError) as exc:
            return False, info.incarnation, f"{type(exc).__name__}: {exc}"
        if not 200 <= status < 300:
            return False, info.incarnation, (
                f"HTTP {status}: {answer[:200].decode('utf-8', 'replace')}")
        try:  # (the process that answered: the client library says which it is)
            said = json.loads(answer)
            incarnation = said.get("incarnation") if isinstance(said, dict) else None
        except ValueError:
            said, incarnation = None, None
        return True, str(incarnation or info.incarnation), said

    def _check_resolved(self, url: str) -> None:
        """(Off the locks: it may resolve a name.) A ``ValidationError`` unless every
        address the endpoint's host has now is one the policy allows."""
        host, port = self.policy.host(url)
        literal = self.policy.literal(host)
        if literal is not None:
            addresses = [str(literal)]
        else:
            try:
                infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            except OSError as exc:
                raise ValidationError("endpoint", f"{host} does not resolve: {exc}") from None
            addresses = sorted({str(i[4][0]) for i in infos})
        self.policy.check(url, addresses)

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
        self._dirty = False
        apps: dict[str, Any] = {}
        for name in list(self.apps):
            with self.hold(name) as app:
                ready = {s: set(ts) for s, ts in app.ready.items()}
                for t, shards in app.restored.items():  # (not confirmed: still theirs)
                    for s in shards:
                        ready.setdefault(s, set()).add(t)
                apps[name] = {
                    "spec": app.spec.model_dump(mode="json"),
                    "generation": app.generation, "sequence": app.sequence,
                    "ready": {s: sorted(ts) for s, ts in ready.items() if ts},
                    "groups": {} if app.layout is None else {
                        str(t): g for t, g in app.layout.groups.items()},
                    "replicas": {} if app.layout is None else {
                        s: list(ts) for s, ts in app.layout.replicas.items()},
                    "load": dict(app.load),
                    "evacuate": {str(t): n for t, n in app.controller.evacuate.items()},
                    "tasks": {str(t): {"endpoint": i.endpoint, "incarnation": i.incarnation,
                                       "domains": list(i.domains), "started": i.started,
                                       "signed": i.signed}
                              for t, i in app.tasks.items()},
                    "superseded": {str(t): list(i) for t, i in app.superseded.items()}}
        self._saved_at = now
        with self._file_lock:
            _write(self.path, {"schema": 1, "apps": apps})

    def _save_in_flight(self) -> None:
        """(Under an app's lock.) The acked, not completed operations of every
        application, on disk before the answer that acks them goes out (small: one per
        task at most)."""
        if self.path is None:
            return
        with self._file_lock:
            _write(self.path.with_name("in-flight.json"), {"schema": 1, "apps": {
                name: list(app.in_flight_wire) for name, app in list(self.apps.items())}})

    def _save_generations(self) -> None:
        """(Under an app's lock.) Every application's reserved generation, on disk
        before a generation past the last reservation is published."""
        if self.path is None:
            return
        with self._file_lock:
            _write(self.path.with_name("generations.json"), {"schema": 1, "apps": {
                name: app.reserved for name, app in list(self.apps.items())}})

    def _load(self) -> None:
        if self.path is None or not self.path.exists():
            return
        data = json.loads(self.path.read_text())
        flying: dict[str, Any] = {}
        with contextlib.suppress(FileNotFoundError):
            flying = json.loads(self.path.with_name("in-flight.json").read_text())["apps"]
        reserved: dict[str, Any] = {}
        with contextlib.suppress(FileNotFoundError):
            reserved = json.loads(self.path.with_name("generations.json").read_text())["apps"]
        for name, saved in data.get("apps", {}).items():
            app = self._make(name, AppSpec.model_validate(saved["spec"]))
            # past every generation it may have published (reserved before it was)
            app.generation = max(app.generation, int(saved.get("generation", 0)),
                                 int(reserved.get(name, 0)))
            app.reserved = app.generation
            app.sequence = int(saved.get("sequence", -1))
            app.load = {s: float(v) for s, v in saved.get("load", {}).items()}
            app.controller.evacuate = {int(t): str(n)
                                       for t, n in saved.get("evacuate", {}).items()}
            for wire in flying.get(name, ()):
                op = op_from_wire(wire)
                app.controller.in_flight[op.op_id] = op
            app.in_flight_wire = list(flying.get(name, ()))
            now = self.clock()  # (each has TASK_TIMEOUT to register again)
            app.tasks = {int(t): TaskInfo(str(i["endpoint"]), str(i["incarnation"]),
                                          tuple(i["domains"]), now,
                                          float(i.get("started", 0.0)),
                                          int(i.get("signed", 0)), confirmed=False)
                         for t, i in saved.get("tasks", {}).items()}
            # the replicas the saved map gave each task: published once it confirms them
            app.restored = {t: set() for t in app.tasks}
            for s, ts in saved.get("ready", {}).items():
                for t in ts:
                    if t in app.restored and s in app.shard_set:
                        app.restored[t].add(s)
            app.superseded = {int(t): [str(x) for x in i]
                              for t, i in saved.get("superseded", {}).items()}
            if saved.get("replicas"):
                app.layout = Layout({s: tuple(ts) for s, ts in saved["replicas"].items()},
                                    {int(t): int(g) for t, g in saved["groups"].items()})
            self.apps[name] = app
        for app in self.apps.values():
            with app.lock:
                self._changed(app)

    # -- serving ----------------------------------------------------------------------------
    def start(self, host: str = "127.0.0.1", port: int = 0) -> ShardManager:
        from plait.server.serve import AsgiServer

        self.server = AsgiServer(create_app(self), host=host, port=port).start()
        self.url = self.server.url
        allow = self.task_networks
        if allow is None:  # (a service on loopback calls tasks on its own host)
            literal = self.policy.literal(host)
            allow = (*EVERYWHERE, *(LOOPBACK if host == "localhost" or (
                literal is not None and (literal.is_loopback or literal.is_unspecified))
                else ()))
        self.policy = UrlPolicy(allow, own_addresses([self.url]))
        self._thread = threading.Thread(target=self._run, name="sm-reconcile", daemon=True)
        self._thread.start()
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


async def _body(request: Request, limit: int, what: str) -> bytes:
    """The request's body, at most ``limit`` bytes (413 past it)."""
    if int(request.headers.get("Content-Length") or 0) > limit:
        raise HTTPException(413, f"{what} is at most {limit} B")
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise HTTPException(413, f"{what} is at most {limit} B")
    return body


def create_app(sm: ShardManager) -> FastAPI:
    api = FastAPI(title="plait Shard Manager", version="1")

    def authorized(request: Request) -> None:
        given = request.headers.get("Authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {sm.token}".encode()):
            raise HTTPException(401, "a valid token is required (Authorization: Bearer ...)")

    auth = [Depends(authorized)]

    def reader(request: Request, app: str) -> None:
        """The service's token, or the application's read token (``read_token``)."""
        given = request.headers.get("Authorization", "").encode()
        if not (hmac.compare_digest(given, f"Bearer {sm.token}".encode())
                or hmac.compare_digest(given, f"Bearer {read_token(sm.token, app)}".encode())):
            raise HTTPException(401, f"the service's token or application {app}'s read "
                                     "token (plait shardmanager token APP --reader) is "
                                     "required (Authorization: Bearer ...)")

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

    @api.get("/v1/apps/{app}/map", dependencies=[Depends(reader)])
    async def get_map(app: str, after: int = -1,
                      wait: Annotated[float, Query(ge=0, le=60)] = 0.0) -> Response:
        if sm._loop is None:
            sm._loop = asyncio.get_running_loop()
        return Response(await sm.watch(app, after, wait), media_type="application/json")

    @api.get("/v1/apps/{app}/token", dependencies=auth)
    def get_token(app: str) -> dict[str, Any]:
        """The application's task secret (``PLAIT_SM_TOKEN`` of its tasks) and its read
        token (its clients')."""
        sm.app(app)
        return {"app": app, "token": task_secret(sm.token, app),
                "read_token": read_token(sm.token, app)}

    @api.post("/v1/apps/{app}/tasks")
    async def register(app: str, request: Request) -> dict[str, Any]:
        body = await _body(request, MAX_REGISTRATION, "a registration")
        from starlette.concurrency import run_in_threadpool

        result: dict[str, Any] = await run_in_threadpool(
            sm.register_signed, app, body,
            request.headers.get(credentials.SIGNATURE_HEADER))
        return result

    @api.post("/v1/apps/{app}/load", dependencies=auth)
    def load(app: str, body: dict[str, Annotated[float, pydantic.Field(ge=0, le=1e9)]]
             ) -> dict[str, Any]:
        if len(body) > MAX_SHARDS:
            raise ValidationError("load", f"at most {MAX_SHARDS} shards")
        return sm.set_load(app, body)

    @api.post("/v1/apps/{app}/taskcontrol")
    async def taskcontrol(app: str, request: Request) -> dict[str, Any]:
        body = await _body(request, MAX_TASKCONTROL, "a TaskControl request")
        from starlette.concurrency import run_in_threadpool

        try:
            result: dict[str, Any] = await run_in_threadpool(
                sm.taskcontrol, app, body, request.headers.get(JOB_HEADER),
                request.headers.get(SIGNATURE_HEADER))
        except ValidationError as exc:
            status = 401 if exc.field == SIGNATURE_HEADER else 422
            raise HTTPException(status, str(exc)) from None
        return result

    return api


def serve(token: str, host: str, port: int, data_dir: str | None,
          task_networks: Sequence[str] | None = None) -> None:
    """``plait shardmanager serve``: until SIGINT or SIGTERM (handled explicitly: a
    background job of a non-interactive shell starts with SIGINT ignored), then a clean
    stop (the maps saved)."""
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    sm = ShardManager(token, data_dir, task_networks=task_networks).start(host, port)
    print(f"plait Shard Manager on {sm.url}", flush=True)
    try:
        while not stop.wait(3600):
            pass
    finally:
        sm.stop()
        log.info("stopped")
