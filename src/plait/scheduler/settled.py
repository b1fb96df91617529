"""Jobs whose reconcile would change nothing, told apart in one look at their tasks.

A region's pass reconciles the jobs that changed since the last one (the shard's
dirty set) and, now and then, every job (the periodic full pass). Most of those
jobs are settled: an agent's report just took their tasks to running, or nothing
happened to them at all. Running the four stages on such a job reads every task
five times over to conclude there is nothing to do; ``no_op`` reads each once and
says so up front, so a full pass over a settled shard costs one loop per task.

It answers True only where every stage is provably a no-op (see the conditions in
``no_op``); anything else, including every job with a TaskController (whose calls
depend on time), takes the full reconcile. This is a purely computational function
with no side effects.
"""

from __future__ import annotations

from plait.model.task import TaskState
from plait.scheduler.lifecycle import FINISHED
from plait.scheduler.plans import LIVE
from plait.scheduler.records import JobRecord
from plait.scheduler.wanted import Notice


def no_op(job: JobRecord, notice: Notice) -> bool:
    """Would reconciling ``job`` now change nothing at all (no record, no event, no
    counter, no allocation)?

    True when the job has no controller, nothing offered, acked, lost or under way,
    is not being deleted, not waiting for the rate limit and has no reconcile error;
    it holds exactly its count of tasks, each within the count, at the target
    version, in a state only an agent's report moves on (``LIVE``), not asked to
    restart, not failing its probe, and none on a machine under maintenance notice.
    Then stage 1 wants nothing (no offer, retag, rerun, liveness restart), stage 2
    has nothing to ack, stage 3 nothing to start and stage 4 nothing to place.
    """
    if (job.controller is not None or job.offers or job.acked or job.in_progress
            or job.lost or job.deleting or job.throttled or job.error is not None
            or job.pins):
        return False  # (a job with pinned tasks takes the full reconcile)
    tasks = job.tasks
    count = job.versions[job.target - 1].task_count
    if not tasks or len(tasks) != count:
        return False
    target, live, running = job.target, LIVE, TaskState.RUNNING
    for r in tasks.values():
        state = r.state
        if (r.op is not None or r.spec_version != target or r.restart
                or (r.apart is not None and r.apart.unhealthy_since is not None)
                or r.index >= count
                or state not in live or (state is running and not r.healthy)):
            return False
    if notice:
        return not any(r.machine in notice for r in tasks.values())
    return True


def quiet(job: JobRecord) -> bool:
    """Nothing under way: every task runs the target, serving, with nothing
    offered or acked; such a job changes only through an outside input."""
    if job.offers or job.acked or job.in_progress or job.lost or job.deleting or (
            len(job.tasks) != job.spec.task_count):
        return False
    running, finished = TaskState.RUNNING, FINISHED
    return all(((r.state is running and r.serving) or r.state in finished)
               and r.op is None for r in job.tasks.values())


def quiet_only_ops(job: JobRecord) -> tuple[bool, bool]:
    """``(quiet(job), only_ops(job))`` in one look at the tasks."""
    if job.in_progress or job.lost or job.deleting or (
            len(job.tasks) != job.spec.task_count):
        return False, False
    quiet = not (job.offers or job.acked)
    running, finished, live = TaskState.RUNNING, FINISHED, LIVE
    for r in job.tasks.values():
        state = r.state
        if r.op is not None or state not in live:
            return False, False
        if quiet and not ((state is running and r.serving) or state in finished):
            quiet = False
    return quiet, True


def waiting(job: JobRecord) -> bool:
    """Nothing for the scheduler to do until an input arrives (an agent's report, a
    machine change, a job operation): every task is placed at the target version
    and runs or is being started by its agent, with nothing offered or under way."""
    if job.offers or job.acked or job.in_progress or job.lost or job.deleting or (
            len(job.tasks) != job.spec.task_count):
        return False
    target, live, goal = job.target, LIVE, job.target_of
    if job.pins:
        return all(r.state in live and r.op is None and not r.restart
                   and r.spec_version == goal(r.index) for r in job.tasks.values())
    return all(r.state in live and r.op is None and not r.restart
               and r.spec_version == target for r in job.tasks.values())


def waiting_for_controller(job: JobRecord) -> bool:
    """Operations offered to the job's controller, and nothing else under way:
    only its answer (or its re-check) can move the job on."""
    return not job.acked and only_ops(job)


def only_ops(job: JobRecord) -> bool:
    """Every task placed, with no operation under way and none lost: a reconcile
    can only offer, ack (or call about) and start operations."""
    if job.in_progress or job.lost or job.deleting or (
            len(job.tasks) != job.spec.task_count):
        return False
    live = LIVE
    return all(r.state in live and r.op is None for r in job.tasks.values())
