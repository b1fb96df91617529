"""Stage 1 of a job's reconcile: the operations wanted.

Per task, what should happen: update to the target version, restart, move off a
failed machine, stop for a resize or a delete, move or stop for announced
maintenance. The result is a :class:`~plait.scheduler.plans.WantedPlan`: the offers
that change (``apply`` gives each a stable serial, so an operation keeps its id while
it waits for an ack), and the changes that need no operation (a finished task run
again, a resize that only retags a version). This is a computation over the job's
records; it changes none of them (``JobRecord.same_as`` memoises a comparison).
"""

from __future__ import annotations

from plait.model.task import TaskState
from plait.scheduler.lifecycle import FINISHED
from plait.scheduler.plans import DELETE, FAILURE, RELOCATE, RESIZE, RESTART, WantedPlan, placed_in
from plait.scheduler.records import JobRecord, Wanted, same_runtime
from plait.taskcontrol.protocol import OpKind

#: machine index -> (maintenance event id, its start, its end or None), for machines
#: under notice
Notice = dict[int, tuple[str, float, float | None]]


def plan_wanted(job: JobRecord, notice: Notice, now: float) -> WantedPlan:
    """What each task of ``job`` wants now; tasks with an operation under way or an
    acked one keep it."""
    plan = WantedPlan()
    spec = job.spec
    count = 0 if job.deleting else spec.task_count
    target = job.target
    pins = job.pins  # (tasks whose goal is another version: None for most jobs)
    runtime_same: dict[int, bool] | None = None  # (``job.same_as``, when first needed)
    acked_tasks = {op.task.index for op in job.acked.values()}
    # the wanted tuples are shared, so "unchanged" is a cheap comparison
    stop: Wanted = ((OpKind.STOP, DELETE if job.deleting else RESIZE),)
    move: Wanted = ((OpKind.MOVE, FAILURE),)
    restart: Wanted = ((OpKind.RESTART, RESTART),)
    update: Wanted = ((OpKind.UPDATE, f"update to version {target}"),)
    relocate: Wanted = ((OpKind.MOVE, f"{RELOCATE}{job.entitlement}"),)
    #: per version: the operation that brings a running task of it to the target (an
    #: update, or a move for a version of another entitlement; none while the rollout
    #: is halted), or ``retag`` when the two run the same way (a resize only)
    to_target: dict[int, Wanted] = {}
    retag: Wanted = ((OpKind.UPDATE, "retag"),)  # (a marker, never offered)
    maintenance: dict[str, Wanted] = {}
    none: Wanted = ()
    offers, versions = job.offers, job.versions
    offered, wants = plan.offered.append, plan.wants.append
    # one pass over the tasks, with everything it touches in locals: this loop is
    # most of the cost of planning a 15,000-task update
    pending, lost, finished = TaskState.PENDING, TaskState.LOST, FINISHED
    halted = job.halted is not None
    probe = spec.health
    live_after = None if probe is None else probe.restart_after_seconds
    keep = job.surges  # (surge tasks kept past the count: None for most jobs)
    for rec in job.tasks.values():
        i = rec.index
        state = rec.state
        beyond = i >= count and not (keep is not None and i in keep)
        if rec.op is not None:
            if beyond and state is pending:
                plan.dropped.append(i)  # stopped for an update, then resized away
            continue
        if i in acked_tasks:
            continue
        wanted = none
        if beyond:
            if rec.machine is not None or not (state is pending or state in finished):
                wanted = stop
            else:
                plan.gone.append(i)  # never placed, or finished: it just goes away
                continue
        elif state in finished:
            version = rec.spec_version
            goal = target if pins is None else pins.get(i, target)
            if version != goal and same_runtime(
                    placed_in(versions[version - 1], spec.entitlement), versions[goal - 1]):
                # a resize or a move only: it stays finished (a move relocates what
                # runs; a finished task has nothing to move)
                plan.settle.append(i)
                version = goal
            if rec.restart or version != goal:
                # run it again, at the target version: it holds no machine, so this
                # takes nothing down and needs no operation
                plan.rerun.append(i)
            continue
        elif state is lost:
            wanted = move
        elif (rec.apart is not None and rec.apart.parked is not None) or state is pending:
            pass
        elif rec.restart:
            wanted = restart
        elif live_after is not None and rec.unhealthy_since is not None and (
                now - rec.unhealthy_since >= live_after):
            plan.liveness.append(i)  # restarted from the next pass, like a restart
        elif pins is not None and i in pins:  # its goal is another version
            if rec.spec_version != pins[i]:
                wanted = _to_goal(job, rec.spec_version, pins[i], halted, relocate, retag,
                                  none)
                if wanted is retag:
                    plan.retag.append(i)  # a resize only: nothing to restart
                    wanted = none
        elif rec.spec_version != target:
            version = rec.spec_version
            wanted = to_target.get(version)  # type: ignore[assignment]
            if wanted is None:
                if runtime_same is None:
                    runtime_same = job.same_as(target)
                same = runtime_same.get(version)
                if same is None:
                    same = runtime_same[version] = same_runtime(versions[version - 1], spec)
                wanted = to_target[version] = (
                    retag if same else none if halted else relocate
                    if versions[version - 1].entitlement != spec.entitlement else update)
            if wanted is retag:
                plan.retag.append(i)  # a resize only: nothing to restart
                wanted = none
        if notice and not wanted and rec.machine is not None and rec.machine in notice:
            event_id = notice[rec.machine][0]
            wanted = maintenance.get(event_id) or maintenance.setdefault(
                event_id, ((OpKind.MOVE, f"maintenance {event_id}"),
                           (OpKind.STOP, f"maintenance {event_id}")))
        have = offers.get(i) if offers else None
        if have is None:
            if wanted:
                offered(i)
                wants(wanted)
        elif have is not wanted and have != wanted:
            offered(i)
            wants(wanted)
    return plan


def _to_goal(job: JobRecord, version: int, goal: int, halted: bool, relocate: Wanted,
             retag: Wanted, none: Wanted) -> Wanted:
    """The operation that brings a running task of ``version`` to ``goal``, a version
    other than the job's target (a pinned task: a push or a canary)."""
    have, want = job.versions[version - 1], job.versions[goal - 1]
    if same_runtime(have, want):
        return retag
    if halted:
        return none
    if have.entitlement != want.entitlement:
        # (into or out of a canary entitlement: decision 103)
        return relocate if want.entitlement == job.entitlement else (
            (OpKind.MOVE, f"{RELOCATE}{want.entitlement}"),)
    return ((OpKind.UPDATE, f"update to version {goal}"),)
