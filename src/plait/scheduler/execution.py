"""Stage 3 of a job's reconcile: which acked operations start now.

Each acked operation is checked again first: it may no longer apply (the task
recovered, moved or was updated meanwhile). Whether it takes an available task down
is decided now, against ``max_unavailable`` (a safety cap under a controller, the
pacing itself without one); one that would waits, acked, until the job is back
under its cap. Each start takes a token of the shard's rate limit: ``tokens`` is how
many are left. ``apply`` starts them (the task leaves discovery first, then its
machine's desired set).
"""

from __future__ import annotations

from collections.abc import Mapping
from operator import attrgetter

from plait.model import fence
from plait.model.task import TaskState
from plait.scheduler.lifecycle import FINISHED
from plait.scheduler.plans import (
    DELETE,
    FAILURE,
    RESIZE,
    ExecutionPlan,
    lapsed,
    to_target,
)
from plait.scheduler.records import JobRecord, TaskRecord
from plait.taskcontrol.protocol import OpKind, TaskOp

#: an operation's task index (the sort key of acked operations)
_task_index = attrgetter("task.index")


def still_applies(job: JobRecord, rec: TaskRecord, op: TaskOp) -> bool:
    """Is an acked operation still what its task needs?"""
    if op.kind is OpKind.MOVE and op.reason == FAILURE:
        return rec.state is TaskState.LOST
    if rec.state is TaskState.LOST:
        return op.kind is OpKind.STOP and op.reason in (RESIZE, DELETE)
    if to_target(op):
        return rec.spec_version != job.target_of(rec.index) and job.halted is None
    if op.kind is OpKind.RESTART:
        return rec.restart
    return True


def fenced(job: JobRecord, rec: TaskRecord, op: TaskOp, now: float,
           heard: Mapping[int, float], started: float | None) -> bool:
    """Does an acked move of a task off its failed machine wait for the fence of its
    job (``plait.model.fence``): its copy there may still run?"""
    if op.kind is not OpKind.MOVE or op.reason != FAILURE or rec.state is not TaskState.LOST:
        return False
    policy = job.versions[rec.spec_version - 1].fence
    if policy is None:
        return False
    lost_since = rec.lost_since if rec.lost_since is not None else now
    machine = rec.machine
    return not fence.may_replace(policy.seconds, None if machine is None else heard.get(machine),
                                 lost_since, started, now)


def plan_execution(job: JobRecord, tokens: int, now: float,
                   down_now: set[int] | None = None, heard: Mapping[int, float] | None = None,
                   started: float | None = None) -> ExecutionPlan:
    """The job's acked operations to start with at most ``tokens`` starts, in task
    order, and those that no longer apply. An operation on a task that serves waits
    while the job is at its cap; one on a task that was serving and fails its probe
    (``plans.lapsed``) waits while the job is past it; a move off a failed machine of
    a job with a fence waits until its copy there is surely gone (``fenced``:
    ``heard``, each machine's last heartbeat, and ``started``, when the scheduler
    started). ``down_now``: ``plans.down_tasks(job)``, when the caller has it."""
    plan = ExecutionPlan()
    if not job.acked:
        return plan
    guard = job.lost and any(v.fence is not None for v in job.versions)
    count = job.spec.task_count
    cap = job.spec.update.resolve(count)
    grace = job.spec.update.serving_grace_seconds
    if cap is None and job.controller is None:
        cap = 1
    down = 0
    if cap is not None and down_now is not None:
        down = sum(1 for i in down_now if i < count)
    elif cap is not None:  # (``is_down``, inlined: this loop reads every task of the job)
        running, finished = TaskState.RUNNING, FINISHED
        for r in job.tasks.values():
            state = r.state
            if r.index < count and state not in finished and (
                    state is not running or not r.healthy or not r.serving):
                down += 1
    # (``still_applies`` and ``is_down`` inlined for an update, the common case: a
    # wave of a 15,000-task update checks 1,500 operations)
    tasks, deleting, target, halted = job.tasks, job.deleting, job.target, job.halted
    pins = job.pins
    update, lost, running, finished = OpKind.UPDATE, TaskState.LOST, TaskState.RUNNING, FINISHED
    start, obsolete = plan.start.append, plan.obsolete.append
    for op in sorted(job.acked.values(), key=_task_index):
        rec = tasks.get(op.task.index)
        if rec is None or rec.op is not None:
            obsolete(op)
            continue
        state = rec.state
        if op.kind is update and state is not lost:
            applies = rec.spec_version != (target if pins is None else pins.get(
                rec.index, target)) and halted is None
        else:
            applies = still_applies(job, rec, op)
        if not applies:
            obsolete(op)
            continue
        if guard and fenced(job, rec, op, now, heard or {}, started):
            plan.fenced.append(op.task.index)
            continue  # waits, acked, until its copy on the failed machine is gone
        counted = rec.index < count and not deleting
        available = counted and ((state is running and rec.healthy and rec.serving)
                                 or state in finished)  # (not down)
        recent = counted and not available and lapsed(rec, now, grace)
        if cap is not None and ((available and down >= cap) or (recent and down > cap)):
            continue  # waits, acked, until the job is back within its cap
        if tokens < 1:
            plan.throttled = True
            break
        tokens -= 1
        start((op, available or recent))
        if available:
            down += 1
    return plan
