"""What the pass's stages return, and the vocabulary they share.

Each stage of a job's reconcile (``wanted``, ``acks``, ``controller``, ``execution``,
``placement``) reads a job's records and returns one of the plain results below;
``apply`` is the one place a result becomes a change. A plan names tasks by index and
operations by value, so a test can assert on it without running anything.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from plait.allocator import AllocationRequest
from plait.model.job import JobSpec
from plait.model.task import TaskState
from plait.model.topology import Fleet
from plait.scheduler.lifecycle import DOWN, FINISHED
from plait.scheduler.records import JobRecord, TaskRecord, Wanted
from plait.taskcontrol.protocol import OpKind, TaskControlRequest, TaskOp, new_op

# -- reasons (operations are told apart by kind and reason) --------------------------------
RESIZE = "resize"
DELETE = "job deleted"
FAILURE = "machine failed"
RESTART = "restart requested"
#: the reason of the ``move`` that carries a task to a job's new entitlement (followed by
#: its name); unlike other moves, it brings the task to the target version
RELOCATE = "move to entitlement "

KIND = {kind: kind.value for kind in OpKind}
#: states of a placed task that nothing but an agent's report moves on
LIVE = (TaskState.ALLOCATED, TaskState.STARTING, TaskState.RUNNING, TaskState.SUCCEEDED,
        TaskState.DEAD)


def to_target(op: TaskOp) -> bool:
    """Does the operation bring its task to the job's target version (an update, or
    the move to the job's new entitlement)?"""
    return op.kind is OpKind.UPDATE or (op.kind is OpKind.MOVE
                                        and op.reason.startswith(RELOCATE))


def is_down(rec: TaskRecord) -> bool:
    """Unavailable, for any reason (finished batch tasks are not down)."""
    if rec.state in FINISHED:
        return False
    return rec.state in DOWN or not rec.healthy or not rec.serving


def lapsed(rec: TaskRecord, now: float, grace: float) -> bool:
    """Serving until it began failing its probe less than ``grace`` seconds ago: down
    now, yet max_unavailable still counts it as serving (it may recover by itself: a
    leader election), so a planned operation takes it down only within the cap."""
    apart = rec.apart  # (both fields are kept apart: None while neither is set)
    return (apart is not None and apart.served and apart.unhealthy_since is not None
            and rec.state is TaskState.RUNNING and now - apart.unhealthy_since < grace)


def down_tasks(job: JobRecord) -> set[int]:
    """The indices of the job's tasks that are down (``is_down``, inlined: a loop over
    every task of the job), within its count or beyond it."""
    running, finished = TaskState.RUNNING, FINISHED
    return {r.index for r in job.tasks.values()
            if not (r.serving and r.healthy and r.state is running)
            and r.state not in finished}


def unavailable(job: JobRecord) -> int:
    """The job's tasks within its count that are down."""
    count = job.spec.task_count
    return sum(1 for r in job.tasks.values() if r.index < count and is_down(r))


def placed_in(spec: JobSpec, entitlement: str) -> JobSpec:
    """``spec`` as if it were bound to ``entitlement``."""
    if spec.entitlement == entitlement:
        return spec
    return spec.model_copy(update={"entitlement": entitlement})


def offered_ops(job: JobRecord, index: int, fleet: Fleet) -> list[TaskOp]:
    """The TaskOps offered for one task (made on demand; ids are stable)."""
    wanted, serial = job.offers[index], job.serials[index]
    rec = job.tasks[index]
    machine = fleet.name(rec.machine) if rec.machine is not None else None
    name = job.name
    return [new_op(f"{name}/{index}/{KIND[kind]}/{serial}", name, index, kind, reason, machine)
            for kind, reason in wanted]


def first_offered_op(job: JobRecord, index: int, fleet: Fleet) -> TaskOp:
    """``offered_ops(job, index, fleet)[0]``, the one an ack takes (a move before a
    stop, of a maintenance pair), made alone."""
    kind, reason = job.offers[index][0]
    machine = job.tasks[index].machine
    return new_op(f"{job.name}/{index}/{KIND[kind]}/{job.serials[index]}", job.name,
                  index, kind, reason, None if machine is None else fleet.name(machine))


# -- the stages' results -------------------------------------------------------------------
@dataclass(slots=True)
class WantedPlan:
    """Stage 1: the operations each task wants, and the changes that need none."""

    #: the tasks whose offer changes, in task order (each new offer gets the job's
    #: next serial), and what each wants now (an empty tuple withdraws its offer):
    #: two lists, not a list of pairs (an update of 15,000 tasks offers 15,000)
    offered: list[int] = field(default_factory=list)
    wants: list[Wanted] = field(default_factory=list)
    #: finished tasks whose version becomes the target without running again (the
    #: target differs only in count or entitlement)
    settle: list[int] = field(default_factory=list)
    #: finished tasks to run again at the target (a restart, or a new runtime)
    rerun: list[int] = field(default_factory=list)
    #: running tasks whose version becomes the target in place (a resize only)
    retag: list[int] = field(default_factory=list)
    #: tasks stopped for an update and then resized away: their operation ends, their
    #: allocation is freed
    dropped: list[int] = field(default_factory=list)
    #: tasks beyond the count that hold nothing (never placed, or finished): forgotten
    gone: list[int] = field(default_factory=list)
    #: running tasks failing their probe for the probe's ``restart_after_seconds``:
    #: to restart (liveness), as a planned operation
    liveness: list[int] = field(default_factory=list)

    @property
    def offers(self) -> list[tuple[int, Wanted]]:
        """(task index, what it wants now) for each offer that changes."""
        return list(zip(self.offered, self.wants, strict=True))

    def __bool__(self) -> bool:
        return bool(self.offered or self.settle or self.rerun or self.retag
                    or self.dropped or self.gone or self.liveness)


@dataclass(frozen=True, slots=True)
class ControllerPlan:
    """Stage 2 with a TaskController: the request to send (or to hand to an
    in-process controller), and the advance notices the job is under."""

    request: TaskControlRequest | None
    notices: tuple[str, ...]


@dataclass(slots=True)
class ExecutionPlan:
    """Stage 3: acked operations to start now, and those that no longer apply."""

    #: (operation, it takes an available task down), in task order
    start: list[tuple[TaskOp, bool]] = field(default_factory=list)
    #: acked operations whose task's situation changed: over without being carried out
    obsolete: list[TaskOp] = field(default_factory=list)
    #: the rate limit ran out before every acked operation under the cap could start
    throttled: bool = False
    #: tasks whose acked move off a failed machine waits for their job's fence
    fenced: list[int] = field(default_factory=list)


@dataclass(slots=True)
class PlacementPlan:
    """Stage 4: what to ask the allocator for, per spec version."""

    #: pending tasks of a version of an entitlement the job left: they start at the
    #: target directly
    retarget: list[int] = field(default_factory=list)
    #: (version, the allocation request for its pending tasks), oldest version first
    requests: list[tuple[int, AllocationRequest]] = field(default_factory=list)
