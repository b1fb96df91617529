"""The scheduler's records and the data it exchanges with agents."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NoReturn

from plait.model.agentmachine import Phase as Phase  # (what an agent reports: its wire's)
from plait.model.job import JobSpec, UpdatePolicy
from plait.model.task import TaskRef, TaskState
from plait.taskcontrol.protocol import (
    OpKind,
    RemoteController,
    TaskController,
    TaskControlRequest,
    TaskOp,
)

#: TaskControl sequence numbers are stored reserved in blocks of this many (a call
#: changes a job's stored record once per block; a scheduler that loads it goes on
#: from the end of the block, so it never reuses a number its predecessor sent)
SEQUENCE_BLOCK = 1000

#: what the scheduler wants done to one task: one (kind, reason), or for maintenance
#: a move and a stop to choose from
Wanted = tuple[tuple[OpKind, str], ...]


@dataclass(frozen=True, slots=True)
class Assignment:
    """One entry of a machine's desired task set: what its agent must run."""

    job: str
    index: int
    spec_version: int
    #: the first version that runs the same way (versions that differ only in task
    #: count share a revision); agents restart a task only when this changes
    revision: int
    spec: JobSpec
    #: the id of the API request that caused it (its job's ``cause`` when it was
    #: assigned), for the agent's log lines about the task
    cause: str | None = None


@dataclass(frozen=True, slots=True)
class Assigned:
    """An ``Assignment`` without its task's index: what a machine's desired set holds
    per task, shared by every task of a job assigned at one version under one
    ``cause`` (a region's desired sets hold two million assignments, a few thousand
    distinct ones)."""

    job: str
    spec_version: int
    revision: int
    spec: JobSpec
    cause: str | None = None

    def at(self, index: int) -> Assignment:
        return Assignment(self.job, index, self.spec_version, self.revision, self.spec,
                          self.cause)


#: tasks being stopped on a machine (they left its desired set), each with the id of
#: the request that last changed its job (``Scheduler.stops_for``)
Stops = list[tuple[TaskRef, str | None]]


@dataclass(frozen=True, slots=True)
class TaskStatus:
    """What an agent reports about one task on its machine."""

    job: str
    index: int
    #: the revision of the assignment the process was started from
    revision: int
    phase: Phase
    healthy: bool = True
    exit_code: int | None = None
    #: the process exited and its agent will not start it again (restart policy
    #: on-failure after exit 0 or with no retries left, or never)
    final: bool = False
    #: the process was SIGKILLed from outside: neither by its agent nor by the
    #: kernel's out-of-memory killer (its memory cgroup counted no kill)
    killed: bool = False


class _Apart:
    """The fields of a ``TaskRecord`` that are seldom anything but their default,
    kept apart: a record holds one of these only while one of them is set."""

    __slots__ = ("exit_code", "lost_since", "parked", "served", "unhealthy_since")

    def __init__(self) -> None:
        self.parked: str | None = None
        self.lost_since: float | None = None
        self.exit_code: int | None = None
        self.unhealthy_since: float | None = None
        self.served: bool = False

    def unset(self) -> bool:
        """Is every field back at its default?"""
        return (self.parked is None and self.lost_since is None and self.exit_code is None
                and self.unhealthy_since is None and self.served is False)


def _kept_apart(name: str, default: object) -> property:
    """A ``TaskRecord`` field held in its ``_Apart`` (``default`` while it has none)."""
    member = getattr(_Apart, name)
    get_member, set_member = member.__get__, member.__set__

    def get(rec: TaskRecord) -> object:
        apart = rec.apart
        return default if apart is None else get_member(apart)

    def put(rec: TaskRecord, value: object) -> None:
        apart = rec.apart
        if apart is None:
            if value is default:
                return
            apart = rec.apart = _Apart()
        set_member(apart, value)
        if value is default and apart.unset():
            rec.apart = None

    return property(get, put)


class TaskRecord:
    """One task of a job, as the scheduler knows it.

    The fields read and written on every pass are slots of the record; those that are
    seldom set (parked for maintenance, lost, finished with an exit code, failing its
    probe) live in an ``_Apart`` made when one is set and dropped when all are back at
    their defaults. They read and write like the others: a region holds two million
    records, and four slots fewer save 32 bytes on each (128 bytes a record, not 160).
    Passes over every task test ``apart is None`` first where they read them.
    """

    __slots__ = (
        "apart",
        "endpoint",
        "healthy",
        "healthy_since",
        "index",
        "machine",
        "op",
        "op_costly",
        "restart",
        "serving",
        "spec_version",
        "state",
    )

    if TYPE_CHECKING:
        #: id of the maintenance event it is parked for (stopped, restarts after)
        @property
        def parked(self) -> str | None: ...
        @parked.setter
        def parked(self, value: str | None) -> None: ...
        @property
        def lost_since(self) -> float | None: ...
        @lost_since.setter
        def lost_since(self, value: float | None) -> None: ...
        #: the exit code of a finished batch task
        @property
        def exit_code(self) -> int | None: ...
        @exit_code.setter
        def exit_code(self, value: int | None) -> None: ...
        #: running and failing its health probe since then (or never passed it since
        #: it started running)
        @property
        def unhealthy_since(self) -> float | None: ...
        @unhealthy_since.setter
        def unhealthy_since(self, value: float | None) -> None: ...
        #: it was serving when it began failing its probe (so it still counts as
        #: serving, for max_unavailable, for ``serving_grace_seconds``)
        @property
        def served(self) -> bool: ...
        @served.setter
        def served(self, value: bool) -> None: ...
    else:
        parked = _kept_apart("parked", None)
        lost_since = _kept_apart("lost_since", None)
        exit_code = _kept_apart("exit_code", None)
        unhealthy_since = _kept_apart("unhealthy_since", None)
        served = _kept_apart("served", False)

    def __init__(self, index: int, spec_version: int, state: TaskState = TaskState.PENDING,
                 machine: int | None = None, serving: bool = False, healthy: bool = False,
                 op: TaskOp | None = None, op_costly: bool = False, restart: bool = False,
                 parked: str | None = None, lost_since: float | None = None,
                 healthy_since: float | None = None, exit_code: int | None = None,
                 unhealthy_since: float | None = None, served: bool = False,
                 endpoint: str | None = None) -> None:
        self.index = index
        self.spec_version = spec_version
        self.state = state
        #: region-wide machine index, once allocated
        self.machine = machine
        #: enabled in service discovery
        self.serving = serving
        self.healthy = healthy
        #: the acked operation being carried out on this task
        self.op = op
        #: the operation took the task down (it was available when it started); such
        #: operations are what max_unavailable bounds
        self.op_costly = op_costly
        self.restart = restart
        self.healthy_since = healthy_since
        #: where it listens ("host:port"), as its agent last reported; kept with the
        #: record, so discovery is right from the first moment after a restart
        self.endpoint = endpoint
        #: the fields kept apart (``_Apart``), None while all are at their defaults
        self.apart: _Apart | None = None
        if (parked is not None or lost_since is not None or exit_code is not None
                or unhealthy_since is not None or served is not False):
            apart = self.apart = _Apart()
            apart.parked, apart.lost_since, apart.exit_code = parked, lost_since, exit_code
            apart.unhealthy_since, apart.served = unhealthy_since, served

    def _fields(self) -> tuple[object, ...]:
        return (self.index, self.spec_version, self.state, self.machine, self.serving,
                self.healthy, self.op, self.op_costly, self.restart, self.parked,
                self.lost_since, self.healthy_since, self.exit_code, self.unhealthy_since,
                self.served, self.endpoint)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        assert isinstance(other, TaskRecord)
        return self._fields() == other._fields()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        names = ("index", "spec_version", "state", "machine", "serving", "healthy", "op",
                 "op_costly", "restart", "parked", "lost_since", "healthy_since",
                 "exit_code", "unhealthy_since", "served", "endpoint")
        return "TaskRecord(" + ", ".join(
            f"{n}={v!r}" for n, v in zip(names, self._fields(), strict=True)) + ")"


@dataclass(frozen=True, slots=True)
class SchedulerEvent:
    time: float
    job: str
    kind: str
    message: str
    #: a task's event: its index, its machine, the operation on it (a bar of the
    #: job's ops chart: start, update, restart, move, stop, maintenance, failure)
    task: int | None = None
    machine: str | None = None
    op: str | None = None
    reason: str | None = None
    #: the TaskControl decision that let the operation go ahead
    decision: str | None = None
    #: who asked for what caused it, and the API request (None: the scheduler's own)
    actor: str | None = None
    request: str | None = None


class _NoTasks(set[int]):
    """The one empty set every job's task sets (``lost``, ``in_progress``,
    ``failed_tasks``) start as: read like any empty set, never added to (a set of its
    own, 216 bytes even empty, is made at the first ``JobRecord.add_*``; a region has
    seventy thousand jobs, three such sets each, nearly all empty)."""

    __slots__ = ()

    def _shared(self, *args: object) -> NoReturn:
        raise TypeError("the shared empty task set is never changed: use JobRecord.add_*")

    add = update = __ior__ = __ixor__ = _shared

    def __reduce__(self) -> str:
        return "NO_TASKS"  # (a copy or a pickle of it is the shared set itself)


#: the shared empty task set (``_NoTasks``)
NO_TASKS: set[int] = _NoTasks()


def _no_tasks() -> set[int]:
    return NO_TASKS


class Acked(dict[str, TaskOp]):
    """A job's acked operations by id, that also finds a task's (``of_task``): a
    task that stops or goes drops its acked ones, and a delete acks a stop of each of
    a job's 100,000 tasks and sees them stop by the rate limit, dozens a pass: a scan
    of all for each cost every pass a second. The index by task is made at the first
    ``of_task`` and kept from then on; changes go through ``[]=``, ``del`` and
    ``pop`` (the others that would pass it by are refused)."""

    __slots__ = ("_by_task",)

    def __init__(self, ops: Mapping[str, TaskOp] | None = None) -> None:
        super().__init__()
        self._by_task: dict[int, dict[str, None]] | None = None
        for op_id, op in (ops or {}).items():
            self[op_id] = op

    def __setitem__(self, op_id: str, op: TaskOp) -> None:
        by = self._by_task
        if by is not None:
            old = dict.get(self, op_id)
            if old is not None:
                self._unindex(by, op_id, old)
            by.setdefault(op.task.index, {})[op_id] = None
        dict.__setitem__(self, op_id, op)

    def __delitem__(self, op_id: str) -> None:
        op = dict.pop(self, op_id)
        if self._by_task is not None:
            self._unindex(self._by_task, op_id, op)

    def pop(self, op_id: str, *default: TaskOp | None) -> TaskOp | None:  # type: ignore[override]
        if op_id not in self:
            return dict.pop(self, op_id, *default)
        op = dict.pop(self, op_id)
        if self._by_task is not None:
            self._unindex(self._by_task, op_id, op)
        return op

    @staticmethod
    def _unindex(by: dict[int, dict[str, None]], op_id: str, op: TaskOp) -> None:
        ids = by.get(op.task.index)
        if ids is not None:
            ids.pop(op_id, None)
            if not ids:
                del by[op.task.index]

    def of_task(self, index: int) -> list[str]:
        """The ids of the task's acked operations, in the order they were acked."""
        by = self._by_task
        if by is None:
            by = self._by_task = {}
            for op_id, op in self.items():
                by.setdefault(op.task.index, {})[op_id] = None
        return list(by.get(index, ()))

    def clear(self) -> None:
        dict.clear(self)
        self._by_task = None

    def copy(self) -> Acked:
        return Acked(self)

    def __copy__(self) -> Acked:
        return Acked(self)

    def __reduce__(self) -> tuple[type[Acked], tuple[dict[str, TaskOp]]]:
        return Acked, (dict(self),)

    def __ior__(self, other: object) -> NoReturn:  # type: ignore[misc]
        raise TypeError("Acked: set operations one at a time")

    def update(self, *args: object, **kwargs: object) -> None:
        raise TypeError("Acked: set operations one at a time")

    def setdefault(self, *args: object) -> NoReturn:
        raise TypeError("Acked: set operations one at a time")

    def popitem(self) -> NoReturn:
        raise TypeError("Acked: drop operations by id")


@dataclass(eq=False, slots=True)
class JobRecord:
    name: str
    entitlement: str
    #: every spec version, version ``v`` at ``versions[v - 1]``
    versions: list[JobSpec]
    target: int
    controller: TaskController | RemoteController | None = None
    tasks: dict[int, TaskRecord] = field(default_factory=dict)
    #: operations offered and not yet acked, per task: the (kind, reason) pairs (a
    #: shared tuple); TaskOp objects are made only when sent or acked (a 15,000-task
    #: update offers 15,000 of them)
    offers: dict[int, Wanted] = field(default_factory=dict)
    #: the serial of each offer (kept apart: ints are not tracked by the cyclic GC,
    #: so offering 15,000 operations allocates nothing it has to scan)
    serials: dict[int, int] = field(default_factory=dict)
    #: tasks currently lost (on a failed machine)
    lost: set[int] = field(default_factory=_no_tasks)
    #: acked operations waiting for a token or for the safety cap
    acked: Acked = field(default_factory=Acked)
    #: operations completed since the controller was last called
    completed: list[TaskOp] = field(default_factory=list)
    sequence_number: int = 0
    last_call: float | None = None
    #: a remote controller's request sent and not answered yet (one at a time per
    #: job), and when it was handed to the shell
    in_flight: TaskControlRequest | None = None
    in_flight_since: float = 0.0
    #: the controller's last "ask again after" (None: the default re-check)
    recheck: float | None = None
    #: acked operations wait for the rate limit (reported once, when it begins)
    throttled: bool = False
    #: something the controller should hear about happened
    dirty: bool = True
    #: why the rollout halted, if it did
    halted: str | None = None
    #: tasks of the target version that exited during the rollout
    failed_tasks: set[int] = field(default_factory=_no_tasks)
    rollout_failures: int = 0
    rollout_active: bool = False
    #: the entitlement the job is moving away from, until every task runs in
    #: ``entitlement`` (a move is a rollout: it ends with it)
    moving_from: str | None = None
    deleting: bool = False
    op_counter: int = 0
    unplaced_reason: str | None = None
    #: why the last reconcile of this job failed, if it did
    error: str | None = None
    #: why its remote TaskController's last call acked nothing (no answer within the
    #: deadline, a refused connection, garbage), until a call is answered
    controller_error: str | None = None
    notices: tuple[str, ...] = ()
    #: the id of the API request whose command last changed the job (None: a change
    #: no request made); the shell passes it in with the command, as data
    cause: str | None = None
    #: indices of tasks with an operation in progress
    in_progress: set[int] = field(default_factory=_no_tasks)
    #: per version, its revision (``revision``; None while none is kept: an empty
    #: dict costs 64 bytes a job)
    _revisions: dict[int, int] | None = None
    #: the target ``_same`` is for, and {version: runs the same way as it}, kept across
    #: reconciles
    _same_target: int = 0
    _same: dict[int, bool] | None = None
    #: per version, the ``Assigned`` its tasks' assignments share (``assigned``): the
    #: first version asked for in ``_assigned_first``, any other in ``_assigned`` (a
    #: one-entry dict costs 232 bytes, and most jobs have one version)
    _assigned_first: Assigned | None = None
    _assigned: dict[int, Assigned] | None = None
    #: tasks whose goal is another version than ``target`` (the Job Control Plane's
    #: unified spec: a push, a canary), by index; None: every task's goal is ``target``
    pins: dict[int, int] | None = None
    #: the surge tasks kept (``plait.scheduler.surge``): surge task index -> the index
    #: of the task it covers; None for jobs without one
    surges: dict[int, int] | None = None
    #: the index of a task last seen not done with the rollout (``rollout_done``
    #: looks there first, and scans on from it: a report per task would otherwise
    #: scan the job's tasks each, and a rollout cost its square)
    not_done: int = 0

    def target_of(self, index: int) -> int:
        """The version task ``index`` is to run."""
        pins = self.pins
        if pins is None:
            return self.target
        return pins.get(index, self.target)

    def add_lost(self, index: int) -> None:
        if self.lost is NO_TASKS:
            self.lost = set()
        self.lost.add(index)

    def add_in_progress(self, index: int) -> None:
        if self.in_progress is NO_TASKS:
            self.in_progress = set()
        self.in_progress.add(index)

    def add_failed(self, index: int) -> None:
        if self.failed_tasks is NO_TASKS:
            self.failed_tasks = set()
        self.failed_tasks.add(index)

    def revision(self, version: int) -> int:
        """The first version that runs the same way as ``version``."""
        kept = self._revisions
        found = None if kept is None else kept.get(version)
        if found is None:
            if version == 1:  # (always its own: not kept, most jobs have no other)
                return 1
            spec = self.versions[version - 1]
            found = next((v for v in range(1, version)
                          if same_runtime(self.versions[v - 1], spec)), version)
            if kept is None:
                kept = self._revisions = {}
            kept[version] = found
        return found

    def assigned(self, version: int) -> Assigned:
        """What a task of ``version`` assigned now gets (shared while the job's cause,
        the version's spec and its revision stay the same)."""
        spec, cause = self.versions[version - 1], self.cause
        first = self._assigned_first
        mine = first is None or first.spec_version == version
        have = first if mine else (self._assigned or {}).get(version)
        if have is not None and have.spec is spec and have.cause == cause and (
                have.revision == self.revision(version)):
            return have
        have = Assigned(self.name, version, self.revision(version), spec, cause)
        if mine:
            self._assigned_first = have
        else:
            if self._assigned is None:
                self._assigned = {}
            self._assigned[version] = have
        return have

    def pin_revision(self, version: int, revision: int) -> None:
        """Take ``version``'s revision from the job's record (which keeps it when the
        versions it was computed from are trimmed) rather than computing it."""
        if self._revisions is None:
            self._revisions = {}
        self._revisions[version] = revision

    def same_as(self, target: int) -> dict[int, bool]:
        """Per version, whether it runs the same way as ``target`` (filled in by the
        caller; versions never change, so it holds until the target does)."""
        same = self._same
        if same is None or self._same_target != target:
            self._same_target, same = target, {}
            self._same = same
        return same

    @property
    def spec(self) -> JobSpec:
        return self.versions[self.target - 1]

    def ref(self, index: int) -> TaskRef:
        return TaskRef(self.name, index)


#: the spec fields that do not change how a task runs: a version that differs from
#: another only in these restarts nothing
NOT_RUNTIME = {"task_count": 0, "task_controller": None, "update": UpdatePolicy(),
               "kill_timeout_seconds": 10.0, "keep_versions": 10}


def same_runtime(a: JobSpec, b: JobSpec) -> bool:
    """Do two versions run the same way (they differ at most in task count, pacing
    or TaskController)?"""
    return a.model_copy(update=NOT_RUNTIME) == b.model_copy(update=NOT_RUNTIME)
