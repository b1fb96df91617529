"""Machines that fail, come back, or go into planned maintenance.

The region's brokers report machine state changes; a failed machine's tasks are
lost (moved once their controller acks, or at ``failure_deadline``), a machine that
comes back before its tasks moved gets them back. Planned maintenance (paper 4.2):
before an event's start its machines are under notice (the tasks there are offered a
move or a stop, and their controllers get an advance notice); at the start, what
still runs is stopped, counted apart from the rate limit; when the event is over,
tasks parked for it start again where they were.
"""

from __future__ import annotations

import plait.scheduler.drain as drain
import plait.scheduler.machinesets as machinesets
from plait.broker import ChangeKind
from plait.model import fence
from plait.model.events import DRAIN_PREFIXES, MACHINE_DRAIN_PREFIX, EventKind
from plait.model.machine import MachineState
from plait.model.task import TaskRef, TaskState
from plait.scheduler.lifecycle import Event
from plait.scheduler.machinesets import NOTHING_PLACED
from plait.scheduler.plans import DELETE, RESIZE
from plait.scheduler.records import TaskRecord
from plait.scheduler.state import SchedulerState
from plait.scheduler.wanted import Notice
from plait.taskcontrol.protocol import OpKind


def on_changes(s: SchedulerState, now: float) -> None:
    """Apply the machine state changes the region reported since the last pass."""
    changes, s.machine_changes[:] = list(s.machine_changes), []
    for change in changes:
        if change.kind is not ChangeKind.STATE:
            continue
        m = change.machine
        refs = s.placed.get(m, NOTHING_PLACED).refs()
        if change.state is MachineState.FAILED:
            for ref in refs:
                lose(s, ref, now)
        elif change.state is MachineState.HEALTHY:
            back: dict[str, list[tuple[TaskRecord, int]]] = {}
            for ref in refs:
                job = s.jobs.get(ref.job)
                rec = job.tasks.get(ref.index) if job else None
                if job is None or rec is None or rec.state is not TaskState.LOST:
                    continue
                s.mark(job.name)
                if rec.op is None and s.transition(rec, Event.RECOVERED):
                    back.setdefault(job.name, []).append((rec, m))
                    rec.lost_since = None
                    job.lost.discard(rec.index)
                    s.cancel_pending(job, rec.index)
                    s.drop_acked(job, rec.index)
            for name, pairs in back.items():  # (the machine's sets rebuilt once a job)
                s.assign_all(s.jobs[name], pairs)


def lose(s: SchedulerState, ref: TaskRef, now: float) -> None:
    """The task's machine failed: whatever was under way on it is over."""
    job = s.jobs.get(ref.job)
    rec = job.tasks.get(ref.index) if job else None
    if job is None or rec is None:
        return
    s.mark(job.name)
    if rec.state is TaskState.STOPPING:
        op = rec.op
        if op is not None and op.kind is OpKind.STOP and op.reason in (RESIZE, DELETE):
            s.stopped(job, rec, now)  # its machine is gone: nothing left to stop
            return
        # stopping to restart, move or wait out maintenance: its machine is gone, so
        # whatever it was doing is over and it needs a new home
        if op is not None:
            s.complete(job, rec)
        rec.state = TaskState.LOST
        rec.parked = None
        rec.lost_since = now
        job.add_lost(rec.index)
        s.drop_acked(job, rec.index)
        s.cancel_pending(job, rec.index)
        s.counters["tasks_lost"] += 1
        return
    if rec.op is not None and rec.state is not TaskState.PENDING:
        s.complete(job, rec)  # whatever was under way is over: it is down now
    s.drop_acked(job, rec.index)
    if s.transition(rec, Event.LOST):
        job.add_lost(rec.index)
        rec.serving = False
        rec.healthy = False
        rec.unhealthy_since, rec.served = None, False
        rec.endpoint = None
        rec.lost_since = now
        rec.parked = None
        job.dirty = True
        s.counters["tasks_lost"] += 1
        s.cancel_pending(job, rec.index)
        policy = job.versions[rec.spec_version - 1].fence
        if policy is not None and rec.machine is not None:
            # at most one copy: out of its machine's desired set now, so an agent that
            # hears the control plane again stops it, and never starts it again from a
            # set read before its move (``plait.model.fence``); back in if the machine
            # comes back first (``on_changes``)
            s.touched.add(rec.machine)
            machinesets.undesire(s.desired, rec.machine, ref)
        where = s.fleet.name(rec.machine) if rec.machine is not None else "?"
        s.event(now, job.name, "task_lost", f"task {rec.index}: machine {where} is down" + (
                "" if policy is None else f" (fenced: it moves {policy.seconds:g}s + "
                f"{fence.FENCE_KILL_GRACE + fence.FENCE_MARGIN:g}s after the machine's "
                "last heartbeat, once its copy there is surely gone)"),
                task=rec.index, machine=rec.machine, op="failure", reason="machine down")


def maintenance(s: SchedulerState, now: float) -> Notice:
    """Stop what still runs at a maintenance deadline; bring parked tasks back when
    their maintenance is over. Returns the machines under notice."""
    notice: Notice = {}
    live: set[str] = set()
    fleet = s.fleet
    for ev in s.region.events():
        if ev.kind is not EventKind.MAINTENANCE:
            continue
        live.add(ev.id)
        machines = [fleet.index_of(name) for name in ev.machines]
        drained = ev.id.startswith(MACHINE_DRAIN_PREFIX)
        if drained:
            # an operator's drain: what its controller stopped goes elsewhere at once
            # (the machine is cordoned), and so does what never started there
            drain.unpark_all(s, ev.id)
            for m in machines:
                drain.unstarted(s, m, ev.id, now)
        if now < ev.start:
            for m in machines:
                notice.setdefault(m, (ev.id, ev.start, ev.end))
            continue
        if drained:
            # its deadline: what still runs there moves, once (its window is held open
            # until the machine is empty: ``machine_ops.finish_drains``)
            if ev.id not in s.drains_forced:
                s.drains_forced.add(ev.id)
                for m in machines:
                    drain.deadline(s, m, ev.id, now, "the machine's drain deadline came")
            continue
        if ev.id.startswith(DRAIN_PREFIXES):
            continue  # a drain's deadline: its tasks move (``drain``), not park
        for m in machines:  # deadline reached: stop what still runs
            for ref in s.placed.get(m, NOTHING_PLACED).refs():
                deadline_stop(s, ref, ev.id, now)
    s.drains_forced &= live
    for event_id in [e for e in s.parked if e not in live]:
        back: dict[str, list[tuple[TaskRecord, int]]] = {}
        for ref in s.parked.pop(event_id):
            job = s.jobs.get(ref.job)
            rec = job.tasks.get(ref.index) if job else None
            if job is None or rec is None or rec.parked != event_id:
                continue
            rec.parked = None
            s.mark(job.name)
            if rec.machine is not None and s.transition(rec, Event.ALLOCATED):
                back.setdefault(job.name, []).append((rec, rec.machine))
        for name, pairs in back.items():  # (each machine's sets rebuilt once a job)
            s.assign_all(s.jobs[name], pairs)
    return notice


def deadline_stop(s: SchedulerState, ref: TaskRef, event_id: str, now: float) -> None:
    """A maintenance event started: its task still on the machine is stopped, without
    an ack and without a token, and parked until the event is over."""
    job = s.jobs.get(ref.job)
    rec = job.tasks.get(ref.index) if job else None
    if job is None or rec is None or rec.parked == event_id:
        return
    if rec.state in (TaskState.STOPPED, TaskState.LOST, TaskState.PENDING):
        return
    if rec.op is not None:
        if rec.op.kind is OpKind.STOP or rec.state is TaskState.STOPPING:
            return  # already being stopped
        s.complete(job, rec)  # an update or move under way ends here
    s.drop_acked(job, rec.index)
    s.take_out(ref, rec)
    rec.state = TaskState.STOPPED
    rec.healthy = False
    rec.parked = event_id
    s.parked.setdefault(event_id, set()).add(ref)
    s.cancel_pending(job, rec.index)
    job.dirty = True
    s.counters["deadline_stops"] += 1
    s.event(now, job.name, "deadline_stop",
            f"task {rec.index} stopped for maintenance {event_id} at its deadline",
            task=rec.index, machine=rec.machine, op="maintenance",
            reason=f"maintenance {event_id}",
            decision="forced at the maintenance deadline (no ack)")
