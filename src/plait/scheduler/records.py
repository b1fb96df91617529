"""The scheduler's records and the data it exchanges with agents."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

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


class Phase(enum.StrEnum):
    STARTING = "starting"
    RUNNING = "running"
    #: exited on its own (crashed or finished)
    EXITED = "exited"
    #: stopped because it left the machine's desired set
    STOPPED = "stopped"
    #: being stopped by its agent (SIGTERM sent, within the job's kill timeout)
    STOPPING = "stopping"


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


@dataclass(slots=True)
class TaskRecord:
    index: int
    spec_version: int
    state: TaskState = TaskState.PENDING
    #: region-wide machine index, once allocated
    machine: int | None = None
    #: enabled in service discovery
    serving: bool = False
    healthy: bool = False
    #: the acked operation being carried out on this task
    op: TaskOp | None = None
    #: the operation took the task down (it was available when it started); such
    #: operations are what max_unavailable bounds
    op_costly: bool = False
    restart: bool = False
    #: id of the maintenance event it is parked for (stopped, restarts after)
    parked: str | None = None
    lost_since: float | None = None
    healthy_since: float | None = None
    #: the exit code of a finished batch task
    exit_code: int | None = None
    #: running and failing its health probe since then (or never passed it since it
    #: started running)
    unhealthy_since: float | None = None
    #: it was serving when it began failing its probe (so it still counts as serving,
    #: for max_unavailable, for ``serving_grace_seconds``)
    served: bool = False
    #: where it listens ("host:port"), as its agent last reported; kept with the
    #: record, so discovery is right from the first moment after a restart
    endpoint: str | None = None


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
    lost: set[int] = field(default_factory=set)
    #: acked operations waiting for a token or for the safety cap
    acked: dict[str, TaskOp] = field(default_factory=dict)
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
    failed_tasks: set[int] = field(default_factory=set)
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
    notices: tuple[str, ...] = ()
    #: the id of the API request whose command last changed the job (None: a change
    #: no request made); the shell passes it in with the command, as data
    cause: str | None = None
    #: indices of tasks with an operation in progress
    in_progress: set[int] = field(default_factory=set)
    _revisions: dict[int, int] = field(default_factory=dict)
    #: (target, {version: runs the same way as the target}), kept across reconciles
    _same: tuple[int, dict[int, bool]] = (0, {})
    #: per version, the ``Assigned`` its tasks' assignments share (``assigned``)
    _assigned: dict[int, Assigned] = field(default_factory=dict)

    def revision(self, version: int) -> int:
        """The first version that runs the same way as ``version``."""
        found = self._revisions.get(version)
        if found is None:
            spec = self.versions[version - 1]
            found = next((v for v in range(1, version)
                          if same_runtime(self.versions[v - 1], spec)), version)
            self._revisions[version] = found
        return found

    def assigned(self, version: int) -> Assigned:
        """What a task of ``version`` assigned now gets (shared while the job's cause,
        the version's spec and its revision stay the same)."""
        spec, cause = self.versions[version - 1], self.cause
        have = self._assigned.get(version)
        if have is not None and have.spec is spec and have.cause == cause and (
                have.revision == self.revision(version)):
            return have
        have = self._assigned[version] = Assigned(self.name, version, self.revision(version),
                                                  spec, cause)
        return have

    def pin_revision(self, version: int, revision: int) -> None:
        """Take ``version``'s revision from the job's record (which keeps it when the
        versions it was computed from are trimmed) rather than computing it."""
        self._revisions[version] = revision

    def same_as(self, target: int) -> dict[int, bool]:
        """Per version, whether it runs the same way as ``target`` (filled in by the
        caller; versions never change, so it holds until the target does)."""
        if self._same[0] != target:
            self._same = (target, {})
        return self._same[1]

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
