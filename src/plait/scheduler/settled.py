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
