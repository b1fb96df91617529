"""Shard Manager's applications as it keeps them: an application's spec, its tasks'
registrations, its layout and published map (``App``), and the views of them it
serves; what the reconciler decides for one (``plan``), and how a failed call is
retried (``failed``, ``backoff``)."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any

import pydantic
from fastapi import HTTPException

from plait import logconfig
from plait.model.base import Value
from plait.model.job import MAX_TASKS
from plait.model.policy import Name
from plait.shardmanager.controller import ShardController, ShardView
from plait.shardmanager.credentials import task_secret
from plait.shardmanager.layout import Layout, TaskPlace, assign, rebalance

log = logconfig.get("plait.shardmanager")

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


def backoff(failures: int) -> float:
    """How long after its ``failures``-th failure in a row a task is called again
    (doubling, capped, with a little jitter so tasks do not fall in step)."""
    delay: float = min(BACKOFF_CAP, BACKOFF_BASE * 2.0 ** min(failures - 1, 16))
    return delay * (1 + random.random() / 4)



def going_down(app: App) -> set[int]:
    """(Under the lock.) Tasks with an operation acked and not completed: going down,
    so nothing is loaded onto them."""
    return {op.task.index for op in app.controller.in_flight.values()}

def failed(app: App, task: int, info: TaskInfo, op: str, shard: str, error: str,
            now: float) -> None:
    """(Under the app's lock.) A call the task did not answer: it is called again
    after a backoff (the calls of one round fail together: one step each round),
    and logged at most once in ``LOG_EVERY``."""
    if now >= info.next_try:
        info.failures += 1
        info.next_try = now + backoff(info.failures)
    if now - info.logged_at >= LOG_EVERY:
        log.info("task call failed", app=app.name, task=task, op=op, shard=shard,
                 error=error[:300], failures=info.failures, not_logged=info.quiet,
                 retry_in=round(info.next_try - now, 1))
        info.logged_at, info.quiet = now, 0
    else:
        info.quiet += 1


def plan(app: App, now: float, changed: Callable[[App], None]
         ) -> list[tuple[str, str, int, str, list[str]]]:
    """(Under the app's lock.) The layout, and the adds and drops it asks for."""
    for t, info in list(app.tasks.items()):
        if now - info.seen > TASK_TIMEOUT:
            del app.tasks[t]
            app.restored.pop(t, None)
            for tasks in app.ready.values():
                tasks.discard(t)
            log.info("task gone", app=app.name, task=t)
            changed(app)
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
        changed(app)
    # (a restored task is called once it confirms, and one that did not answer
    # once its backoff is over)
    endpoint = {t: i.endpoint for t, i in app.tasks.items()
                if now >= i.next_try and t not in app.restored}
    leaving = going_down(app)
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

def map_of(app: App) -> dict[str, Any]:
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

def view_of(app: App) -> dict[str, Any]:
    """(Under the app's lock.) The application as ``GET /v1/apps/{app}`` shows it."""
    held: dict[int, int] = {}
    for tasks in app.ready.values():
        for t in tasks:
            held[t] = held.get(t, 0) + 1
    ready = [len(app.ready.get(s, ())) for s in app.shards]
    return {
        "app": app.name, "spec": app.spec.model_dump(mode="json", exclude={"controller_key"}),
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
