"""Stage 2 with a TaskController: the request a job's controller should get now.

The paper's calling sequence: a controller is called when something it should hear
about happened (an offer, a completion, an advance notice: the job is ``dirty``) or
when its re-check is due (``recheck_interval``, or the ``ask_again_after`` of its
last answer), with the pending operations, the completed ones, the advance notices
and every unhealthy task. This module plans that request from the job's records;
``apply`` sends it (a remote controller's goes to the shell's outbox: the pass never
waits on a tenant) and applies the answer.
"""

from __future__ import annotations

from plait.model.events import LOAN_REVOKE_PREFIX
from plait.model.topology import Fleet
from plait.scheduler.plans import is_down, offered_ops
from plait.scheduler.records import JobRecord
from plait.scheduler.wanted import Notice
from plait.taskcontrol.protocol import AdvanceNotice, NoticeKind, TaskControlRequest


def advance_notices(job: JobRecord, notice: Notice, fleet: Fleet) -> tuple[AdvanceNotice, ...]:
    """The maintenance notices that concern the job's tasks, one per event (a revoked
    loan's is of kind ``loan_revoke``)."""
    by_event: dict[str, tuple[float, float | None, set[int], list[int]]] = {}
    for rec in job.tasks.values():
        if rec.machine is not None and rec.machine in notice:
            event_id, start, end = notice[rec.machine]
            entry = by_event.setdefault(event_id, (start, end, set(), []))
            entry[2].add(rec.machine)
            entry[3].append(rec.index)
    return tuple(
        AdvanceNotice(eid, NoticeKind.LOAN_REVOKE if eid.startswith(LOAN_REVOKE_PREFIX)
                      else NoticeKind.MAINTENANCE, tuple(fleet.names(sorted(ms))),
                      tuple(job.ref(i) for i in sorted(indices)), start, start, end)
        for eid, (start, end, ms, indices) in sorted(by_event.items()))


def plan_request(job: JobRecord, notices: tuple[AdvanceNotice, ...], now: float,
                 recheck_interval: float, batch: int, fleet: Fleet) -> TaskControlRequest | None:
    """The request to send the job's controller now, or None when it has nothing to
    hear and its re-check is not due. At most ``batch`` tasks' operations per call."""
    recheck = recheck_interval if job.recheck is None else job.recheck
    due = job.offers and (job.last_call is None or now - job.last_call >= recheck)
    if not (job.dirty or due):
        return None
    pending = [op for index in sorted(job.offers)[:batch]
               for op in offered_ops(job, index, fleet)]
    return TaskControlRequest(
        job_handle=job.name,
        request=tuple(pending),
        completed=tuple(job.completed),
        advance_notices=notices,
        all_unhealthy_tasks=tuple(job.ref(r.index) for r in sorted(
            job.tasks.values(), key=lambda r: r.index) if is_down(r)),
        sequence_number=job.sequence_number + 1,
    )


def timer(job: JobRecord, recheck_interval: float, lost_after: float) -> float:
    """When an idle job with a controller must be looked at again by itself: its
    answer given up for lost, or its re-check due (never when nothing is offered:
    nothing to ask about)."""
    if job.in_flight is not None:
        return job.in_flight_since + lost_after
    if not job.offers or job.last_call is None:
        return float("inf")
    recheck = recheck_interval if job.recheck is None else job.recheck
    return job.last_call + recheck
