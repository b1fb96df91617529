"""Draining a machine that leaves its entitlement (a host-profile roll, a revoked
loan): the deadline of such a drain moves tasks, it does not park them.

Planned maintenance parks what still runs at its start (stopped, allocation kept) and
starts it again where it was when the window ends. A drained machine does not come
back to its entitlement: its event stays open until the machine is empty. So at the
deadline what still runs there is moved without an ack (stopped by its agent and
placed elsewhere once the stop is seen, so no task runs twice), and a task its
controller chose to stop is placed elsewhere at once.
"""

from __future__ import annotations

from plait.model.events import DRAIN_PREFIXES
from plait.model.task import TaskRef, TaskState
from plait.scheduler.lifecycle import Event
from plait.scheduler.machinesets import NOTHING_PLACED
from plait.scheduler.state import SchedulerState
from plait.taskcontrol.protocol import OpKind, new_op


def is_drain(event_id: str) -> bool:
    return event_id.startswith(DRAIN_PREFIXES)


def occupied(s: SchedulerState, m: int) -> bool:
    """Does something still run, or wait to start, on machine ``m``? A task that was
    stopped there and waits for a machine (pending: its process is gone) does not
    hold it: the drain of the last machine it could go to would wait for it, and it
    for the drain (a host-profile roll of an entitlement with no spare machine)."""
    if s.allocator.index.tasks[m]:
        return True
    placed = s.placed.get(m)
    if not placed:
        return False
    pending, jobs = TaskState.PENDING, s.jobs
    for ref in placed.refs():
        job = jobs.get(ref.job)
        rec = job.tasks.get(ref.index) if job else None
        if rec is not None and rec.state is not pending:
            return True
    return False


def unpark(s: SchedulerState, ref: TaskRef, event_id: str | None) -> None:
    """A task stopped for a drain wants a machine again (not this one: it is cordoned
    or in maintenance, so the allocator moves it)."""
    if event_id is not None:
        s.parked.get(event_id, set()).discard(ref)
    job = s.jobs.get(ref.job)
    rec = job.tasks.get(ref.index) if job else None
    if job is None or rec is None or rec.state is not TaskState.STOPPED:
        return
    rec.parked = None
    s.transition(rec, Event.REPLACE)
    s.mark(job.name)


def unpark_all(s: SchedulerState, event_id: str) -> None:
    for ref in list(s.parked.get(event_id, ())):
        unpark(s, ref, event_id)


def unstarted(s: SchedulerState, m: int, event_id: str, now: float) -> None:
    """Tasks placed on draining machine ``m`` that have not started (waiting for its
    profile switch, which a drain holds back) move at once: nothing runs to stop."""
    placed = s.placed.get(m)
    if not placed:
        return
    allocated = TaskState.ALLOCATED
    for ref in placed.refs():
        job = s.jobs.get(ref.job)
        rec = job.tasks.get(ref.index) if job else None
        if rec is not None and rec.state is allocated:
            force_move(s, ref, event_id, m, now, "it had not started on a machine being "
                       "drained", at_deadline=False)


def deadline(s: SchedulerState, m: int, event_id: str, now: float, why: str) -> None:
    """The drain's deadline: everything on machine ``m`` moves."""
    unpark_all(s, event_id)
    for ref in s.placed.get(m, NOTHING_PLACED).refs():
        force_move(s, ref, event_id, m, now, f"the drain's deadline came ({why})")


def force_move(s: SchedulerState, ref: TaskRef, event_id: str, m: int, now: float,
               why: str, at_deadline: bool = True) -> None:
    """Move the task off machine ``m`` without an ack (a drain's deadline, or a task
    that never started there)."""
    job = s.jobs.get(ref.job)
    rec = job.tasks.get(ref.index) if job else None
    if job is None or rec is None:
        return
    s.mark(job.name)
    state = rec.state
    if state in (TaskState.STOPPING, TaskState.LOST, TaskState.PENDING):
        return  # already on its way off (or placed again once its machine is known)
    if state is TaskState.STOPPED:
        unpark(s, ref, event_id)
        return
    if rec.op is not None:
        s.complete(job, rec)  # an update or restart under way ends here
    s.drop_acked(job, rec.index)
    s.cancel_pending(job, rec.index)
    s.counters["deadline_stops" if at_deadline else "drain_moves"] += 1
    s.counters["drain_ops"] += 1
    op = new_op(f"{job.name}/{rec.index}/move/drain-{s.counters['drain_ops']}", job.name,
                rec.index, OpKind.MOVE, f"drain {event_id}", s.fleet.name(m))
    job.acked[op.op_id] = op
    s.start_ops(job, [(op, at_deadline)], now)
    s.event(now, job.name, "deadline_stop" if at_deadline else "drain_move",
            f"task {rec.index} moved off {s.fleet.name(m)} without an ack: {why}",
            task=rec.index, machine=m, op="maintenance", reason=f"drain {event_id}",
            decision="forced (no ack)")
