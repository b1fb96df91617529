"""Carrying out acked operations (``start_ops``): the one change the execution plan
and a drain's deadline make to tasks, written out for the common case of a wave of
an update (1,500 tasks at once)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import plait.scheduler.machinesets as machinesets
from plait.model.task import TaskRef, TaskState
from plait.scheduler.eventrows import EventRows
from plait.scheduler.lifecycle import TRANSITIONS, Event
from plait.scheduler.machinesets import DesiredSet
from plait.scheduler.plans import DELETE, FAILURE, KIND, RESIZE
from plait.scheduler.records import NO_TASKS, JobRecord, TaskRecord
from plait.taskcontrol.protocol import OpKind, TaskOp


class Starter(Protocol):
    """What ``start_ops`` uses of the scheduler's state (``SchedulerState``, whose
    method of the same name calls it)."""

    counters: dict[str, int]
    desired: dict[int, DesiredSet]
    touched: set[int]
    task_events: bool
    acting: tuple[str | None, str | None]
    events: EventRows
    event_limit: int

    def mark(self, job: str) -> None: ...
    def unassign(self, ref: TaskRef, machine: int) -> None: ...
    def transition(self, rec: TaskRecord, event: Event) -> bool: ...
    def free(self, job: JobRecord, recs: list[TaskRecord]) -> None: ...
    def stopped(self, job: JobRecord, rec: TaskRecord, now: float) -> None: ...


def start_ops(s: Starter, job: JobRecord, steps: Sequence[tuple[TaskOp, bool]],
              now: float) -> None:
    """Carry out acked operations, in order: each leaves the job's acked ones
    (``costly``: it takes an available task down), its task leaves discovery and
    its machine's desired set (a lost one is placed elsewhere at once).

    A wave of an update starts 1,500 at once: what the operations share (the
    event's decision and cause, the containers) is looked up once, and the
    common case (a placed task stopped) is written out here."""
    if steps and job.in_progress is NO_TASKS:  # (a set of its own, ``add_in_progress``)
        job.in_progress = set()
    acked, tasks, in_progress = job.acked, job.tasks, job.in_progress
    counters, desired, touched = s.counters, s.desired, s.touched
    undesire_all, transitions = machinesets.undesire_all, TRANSITIONS
    stop, lost, pending, stopped = (Event.STOP, TaskState.LOST, TaskState.PENDING,
                                    TaskState.STOPPED)
    op_stop, op_move, kinds = OpKind.STOP, OpKind.MOVE, KIND
    events = s.task_events
    name = job.name
    if events and steps:  # (a task-level event, ``task_event``, inlined)
        s.mark(name)  # (once: marking a marked job again does nothing)
        down = None
        if job.controller is not None:
            decision = "acked by the job's TaskController"
        else:
            decision = ("approved by the scheduler (no TaskController), within "
                        "max_unavailable")
            # (a move off a failed machine: its task was down already, whatever
            # the cap; "within max_unavailable" would claim otherwise)
            down = "approved by the scheduler (no TaskController): the task was down"
        actor, request = s.acting
        # an operation that carries out a user's change names its request (not one
        # forced by a machine's failure or a maintenance)
        caused, forced = request or job.cause, request or None
        rows = s.events.rows
        limit = s.event_limit
        most = 2 * limit
        append = rows.append
    # the tasks leaving each machine's desired set, taken out of it together
    # (``leave``: a wave stops a machine's tasks together, 16 at a time on a
    # machine of 16), before any other change to a desired set, and at the end
    leaving: dict[int, set[int]] = {}

    def leave() -> None:
        for machine, indices in leaving.items():
            undesire_all(desired, machine, name, indices)
        leaving.clear()

    try:
        for op, costly in steps:
            del acked[op.op_id]
            ref = op.task  # (the task's TaskRef)
            index = ref.index
            rec = tasks[index]
            rec.op_costly = costly
            counters["ops_started"] += 1
            if events:
                kind, reason = op.kind, op.reason
                # the bar it draws on the job's ops chart: a stop for maintenance
                # is ``maintenance``, a move off a failed machine ``failure``,
                # else the operation's kind
                if kind is op_stop:
                    chart = "stop" if reason in (RESIZE, DELETE) else "maintenance"
                elif kind is op_move and reason == FAILURE:
                    chart = "failure"
                else:
                    chart = kinds[kind]
                # (the message, "task {index}: {chart} ({reason})", is made when read)
                append((now, name, "op_started", None, index, rec.machine, chart, reason,
                        down if down is not None and chart == "failure" else decision,
                        actor,
                        forced if chart == "failure" or chart == "maintenance"
                        else caused))
                if len(rows) > most:
                    del rows[: len(rows) - limit]
            rec.op = op
            in_progress.add(index)
            state = rec.state
            if leaving and (state is lost or state is pending or state is stopped):
                leave()  # (these change desired sets themselves)
            if state is lost:  # its machine is gone: place it elsewhere now
                assert rec.machine is not None
                job.lost.discard(index)
                s.unassign(ref, rec.machine)
                s.transition(rec, Event.REPLACE)
            elif state is pending:
                if op.kind is op_stop:
                    s.free(job, [rec])
            elif state is stopped:  # parked: already stopped
                rec.state = TaskState.STOPPING
                s.stopped(job, rec, now)
            else:  # (``take_out`` and ``transition``, inlined)
                rec.serving = False
                rec.healthy = False
                rec.healthy_since = None
                if rec.apart is not None:  # (both kept apart: unset while it has none)
                    rec.unhealthy_since, rec.served = None, False
                rec.endpoint = None
                machine = rec.machine
                if machine is not None:
                    touched.add(machine)
                    gone = leaving.get(machine)
                    if gone is None:
                        leaving[machine] = {index}
                    else:
                        gone.add(index)
                stopping = transitions.get((state, stop))
                if stopping is not None:
                    rec.state = stopping
    finally:
        leave()
