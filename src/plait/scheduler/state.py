"""The scheduler's state, and the few changes everything else is made of.

A :class:`SchedulerState` holds the jobs' records, each machine's desired set, the
events and counters. Its methods are the primitive changes (a task assigned to a
machine, taken out of one, an operation completed, a task stopped, a lifecycle
transition); ``apply`` (the stages' plans), ``reports`` (agents' statuses) and
``machines`` (failures and maintenance) are written in terms of them, so the
bookkeeping that must stay consistent (a machine's desired set and the tasks placed
on it, a controller's completed list, the idle set) lives in one place.
"""

from __future__ import annotations

import heapq
from collections.abc import Collection, Sequence

import plait.scheduler.machinesets as machinesets
import plait.scheduler.starts as starts
from plait.allocator import AllocationRequest, Allocator
from plait.broker import BrokerChange
from plait.model.task import TaskRef, TaskState
from plait.scheduler.eventrows import EventRows, TaskMessage
from plait.scheduler.lifecycle import Event, advance
from plait.scheduler.machinesets import DesiredSet, PlacedSet
from plait.scheduler.plans import DELETE, RESIZE, to_target
from plait.scheduler.ratelimit import TokenBucket
from plait.scheduler.records import Assigned, JobRecord, TaskRecord
from plait.taskcontrol.protocol import ControllerAnswer, ControllerCall, OpKind, TaskOp

#: distinct task-event messages kept at most (``task_event``; a message naming
#: something unbounded starts the table afresh now and then)
TASK_MESSAGES = 4096

class SchedulerState:
    def __init__(self, allocator: Allocator, rate: float, burst: float, event_limit: int,
                 now: float) -> None:
        self.allocator = allocator
        self.region = allocator.region
        self.fleet = allocator.index.fleet
        self.bucket = TokenBucket(rate, burst, now)
        self.event_limit = event_limit
        #: record task-level events (``task_event``)
        self.task_events = True
        #: (actor, request id) of the user operation the shell is applying, stamped on
        #: the events it raises; (None, None) otherwise
        self.acting: tuple[str | None, str | None] = (None, None)
        self.now = now
        self.jobs: dict[str, JobRecord] = {}
        #: per machine: the tasks its agent must run
        self.desired: dict[int, DesiredSet] = {}
        #: per machine: the tasks whose record names it (desired or stopping)
        self.placed: dict[int, PlacedSet] = {}
        #: what happened, oldest first (each kept as a row until it is read)
        self.events = EventRows(lambda machine: self.fleet.name(machine))
        self.counters: dict[str, int] = {
            "ops_started": 0, "ops_completed": 0, "throttled": 0, "deadline_stops": 0,
            "failure_deadline_moves": 0, "controller_errors": 0, "controller_calls": 0,
            "tasks_lost": 0, "reconcile_errors": 0, "drain_moves": 0, "drain_ops": 0,
        }
        #: per job whose tasks wait for a machine (none had room): its entitlement and
        #: the milli-RRU they need (a lender's such tasks take its loans back)
        self.short: dict[str, tuple[str, int]] = {}
        #: machines whose desired set changed since the shell last looked
        self.touched: set[int] = set()
        #: when a set (the shell that persists the scheduler sets it): the jobs whose
        #: records may have changed since the shell last emptied it
        self.changed_jobs: set[str] | None = None
        #: the jobs the next pass reconciles: every input that may change what a job's
        #: reconcile does puts it here (a job operation, an agent's report that changes
        #: a task, a machine change, a controller's answer, a timer due, a token for an
        #: operation waiting for the rate limit); a job whose reconcile leaves it with
        #: nothing to do but wait for an input leaves it. The others cost nothing per
        #: pass (``PassDriver.tick``; a periodic full pass reconciles them all anyway)
        self.dirty_jobs: set[str] = set()
        #: during a pass: the names still to reconcile in it (a heap) and the one being
        #: reconciled; a job marked meanwhile that sorts after it joins this pass
        self.queue: list[str] | None = None
        self.current = ""
        #: the region's machine changes since the last pass
        self.machine_changes: list[BrokerChange] = []
        #: maintenance event id -> the tasks parked (stopped) until it ends
        self.parked: dict[str, set[TaskRef]] = {}
        #: machine drains whose deadline came: what ran there was moved (once each)
        self.drains_forced: set[str] = set()
        #: remote controllers' requests for the shell to send (``take_calls``), and
        #: the answers it handed back, applied by the next pass
        self.outbox: list[ControllerCall] = []
        self._answers: dict[str, ControllerAnswer] = {}
        #: the distinct messages of task events, each once (``task_event``)
        self._task_messages: dict[str, TaskMessage] = {}
        #: per machine: when this scheduler last took its agent's heartbeat, and when
        #: it started (heard nothing before): what a fenced job's task waits out before
        #: it moves off a failed machine (``plait.model.fence``)
        self.heard: dict[int, float] = {}
        self.started = now

    # -- bookkeeping ---------------------------------------------------------------------------
    def mark(self, job: str) -> None:
        """Something about the job changed: reconcile it on the next pass (and tell a
        shell that persists it)."""
        if job not in self.dirty_jobs:
            self.dirty_jobs.add(job)
            if self.queue is not None and job > self.current:
                heapq.heappush(self.queue, job)
        if self.changed_jobs is not None:
            self.changed_jobs.add(job)

    def take_touched(self) -> set[int]:
        """The machines whose desired sets changed since the last call (their agents
        are to pull them again); the set starts afresh."""
        touched, self.touched = self.touched, set()
        return touched

    def drop_answer(self, job: str) -> None:
        """Forget a controller's answer handed back for the job and not applied yet."""
        self._answers.pop(job, None)

    def event(self, now: float, job: str, kind: str, message: str, *,
              task: int | None = None, machine: int | None = None, op: str | None = None,
              reason: str | None = None, decision: str | None = None,
              cause: str | None = None) -> None:
        """``cause``: the request that caused it, when not the one being applied."""
        self.mark(job)
        actor, request = self.acting
        rows = self.events.rows
        rows.append((now, job, kind, message, task, machine, op, reason, decision, actor,
                     request or cause))
        if len(rows) > 2 * self.event_limit:  # (trimmed now and then, not per event)
            del rows[: len(rows) - self.event_limit]

    def task_event(self, now: float, job: JobRecord, rec: TaskRecord, kind: str,
                   message: str, op: str | None = None, reason: str | None = None,
                   decision: str | None = None, cause: str | None = None) -> None:
        """A task-level event (what a job's ops chart draws), when they are on."""
        if self.task_events:
            # (the row shares its message, "task {index}: " prepended when it is read)
            texts = self._task_messages
            text = texts.get(message)
            if text is None:
                if len(texts) >= TASK_MESSAGES:
                    texts.clear()
                text = texts[message] = TaskMessage(message)
            self.event(now, job.name, kind, text, task=rec.index,
                       machine=rec.machine, op=op, reason=reason, decision=decision,
                       cause=cause)

    # -- the task lifecycle ------------------------------------------------------------------
    def transition(self, rec: TaskRecord, event: Event) -> bool:
        nxt = advance(rec.state, event)
        if nxt is None:
            return False
        rec.state = nxt
        return True

    def maybe_serving(self, job: JobRecord, rec: TaskRecord, now: float) -> None:
        """A task running healthy is enabled in discovery, once the operation that
        started it (if any) has seen it healthy for ``min_ready_seconds``."""
        if rec.state is not TaskState.RUNNING or not rec.healthy:
            if rec.serving:
                rec.serving = False
            return
        if rec.op is not None and rec.op.kind is not OpKind.STOP:
            ready = job.versions[rec.spec_version - 1].update.min_ready_seconds
            if rec.healthy_since is None or now - rec.healthy_since < ready:
                return  # not proven healthy yet: the operation is still in progress
            self.complete(job, rec)
        if rec.op is None and not rec.serving:
            rec.serving = True
            self.task_event(now, job, rec, "task_ready",
                            f"serving version {rec.spec_version}")
        self.rollout_done(job, now)

    def rollout_done(self, job: JobRecord, now: float) -> None:
        if not job.rollout_active:
            return
        tasks = job.tasks
        goal = job.target_of

        # (a task whose operation is still under way, in its min_ready_seconds say, is
        # not done: a crash of it then counts toward halting the rollout)
        def done(r: TaskRecord) -> bool:
            return r.spec_version == goal(r.index) and (
                (r.state is TaskState.RUNNING and r.healthy and r.op is None)
                or r.state is TaskState.SUCCEEDED)

        # the task last seen not done, then those after it, then all: each report
        # costs the tasks done since the last one, not the job's size
        seen = tasks.get(job.not_done)
        if seen is not None and not done(seen):
            return
        for index in range(job.not_done + 1, job.spec.task_count):
            r = tasks.get(index)
            if r is not None and not done(r):
                job.not_done = index
                return
        left = next((r for r in tasks.values() if not done(r)), None)
        if left is not None:
            job.not_done = left.index
            return
        job.rollout_active = False
        self.event(now, job.name, "rollout_done", f"all tasks run version {job.target}",
                   cause=job.cause)
        if job.moving_from is not None:
            job.moving_from = None
            self.event(now, job.name, "move_done",
                       f"every task runs in entitlement {job.entitlement}")




    def stopped(self, job: JobRecord, rec: TaskRecord, now: float) -> None:
        """Its agent no longer runs the task: the stop that took it out is done."""
        if not self.transition(rec, Event.STOPPED):
            return
        op = rec.op
        if op is None:
            return
        if op.kind is OpKind.STOP:
            if op.reason in (RESIZE, DELETE):
                self.free(job, [rec])  # completes the operation
            else:  # stopped for maintenance: parked until it ends, allocation kept
                event_id = op.reason.rsplit(" ", 1)[-1]
                rec.parked = event_id
                self.parked.setdefault(event_id, set()).add(job.ref(rec.index))
                self.complete(job, rec)
            return
        if to_target(op):
            rec.spec_version = job.target_of(rec.index)
        if op.kind is OpKind.RESTART:
            rec.restart = False
        self.transition(rec, Event.REPLACE)

    # -- operations --------------------------------------------------------------------------
    def complete(self, job: JobRecord, rec: TaskRecord) -> None:
        assert rec.op is not None
        if job.controller is not None:
            job.completed.append(rec.op)
        rec.op = None
        job.in_progress.discard(rec.index)
        job.dirty = True
        self.counters["ops_completed"] += 1

    def ack(self, job: JobRecord, op: TaskOp) -> None:
        job.offers.pop(op.task.index, None)
        job.serials.pop(op.task.index, None)
        job.acked[op.op_id] = op

    def drop_acked(self, job: JobRecord, index: int) -> None:
        """Acked operations of a task whose situation changed no longer apply; a
        controller is told they are over (so it does not wait for them)."""
        if job.acked:
            self.drop_acked_all(job, (index,))

    def drop_acked_all(self, job: JobRecord, indices: Collection[int]) -> None:
        """``drop_acked`` for several tasks, in one look at the acked operations (a
        delete acks a stop of each of a job's 100,000 tasks, and frees them by the
        rate limit, dozens a pass)."""
        acked = job.acked
        ids = [i for index in indices for i in acked.of_task(index)] if len(indices) < 8 else [
            k for k, op in acked.items() if op.task.index in indices]
        for op_id in ids:
            op = acked[op_id]
            del acked[op_id]
            if job.controller is not None:
                job.completed.append(op)
            job.dirty = True

    def cancel_pending(self, job: JobRecord, index: int) -> None:
        if job.offers.pop(index, None) is not None:
            job.serials.pop(index, None)
            job.dirty = True


    def start_ops(self, job: JobRecord, steps: Sequence[tuple[TaskOp, bool]],
                  now: float) -> None:
        """Carry out acked operations, in order (``starts.start_ops``)."""
        starts.start_ops(self, job, steps, now)

    # -- machines' desired sets --------------------------------------------------------------
    def assign(self, job: JobRecord, rec: TaskRecord, machine: int) -> None:
        ref = job.ref(rec.index)
        if rec.machine is not None and rec.machine != machine:
            self.unassign(ref, rec.machine)
        rec.machine = machine
        self.touched.add(machine)
        machinesets.place(self.placed, machine, ref)
        machinesets.desire(self.desired, machine, ref,
                            job.assigned(rec.spec_version))

    def assign_all(self, job: JobRecord, pairs: Sequence[tuple[TaskRecord, int]]) -> None:
        """``assign`` for many of one job's tasks, (record, machine) each: each
        machine's sets are rebuilt once, not once per task (an update of a job of
        100,000 small tasks on 8 machines re-assigns 12,500 on each)."""
        if len(pairs) <= 2:
            for rec, machine in pairs:
                self.assign(job, rec, machine)
            return
        self.unassign_all(job, [r for r, m in pairs if r.machine is not None and r.machine != m])
        by_machine: dict[int, dict[int, Assigned]] = {}
        assigned = job.assigned
        for rec, machine in pairs:
            rec.machine = machine
            items = by_machine.get(machine)
            if items is None:
                items = by_machine[machine] = {}
            items[rec.index] = assigned(rec.spec_version)
        name = job.name
        for machine, items in by_machine.items():
            self.touched.add(machine)
            machinesets.place_all(self.placed, machine, name, items.keys())
            machinesets.desire_all(self.desired, machine, name, items)

    def unassign_all(self, job: JobRecord, recs: Sequence[TaskRecord]) -> None:
        """``unassign`` for many of one job's tasks from their machines, each
        machine's sets rebuilt once."""
        by_machine: dict[int, set[int]] = {}
        for rec in recs:
            if rec.machine is not None:
                by_machine.setdefault(rec.machine, set()).add(rec.index)
        name = job.name
        for machine, indices in by_machine.items():
            self.touched.add(machine)
            machinesets.undesire_all(self.desired, machine, name, indices)
            machinesets.unplace_all(self.placed, machine, name, indices)

    def unassign(self, ref: TaskRef, machine: int) -> None:
        self.touched.add(machine)
        machinesets.undesire(self.desired, machine, ref)
        machinesets.unplace(self.placed, machine, ref)

    def take_out(self, ref: TaskRef, rec: TaskRecord) -> None:
        """Leave the machine's desired set (its agent stops the task); the record
        keeps naming the machine until the stop is seen."""
        rec.serving = False
        rec.healthy = False
        rec.healthy_since = None
        if rec.apart is not None:  # (both are kept apart: unset while it has none)
            rec.unhealthy_since, rec.served = None, False
        rec.endpoint = None
        if rec.machine is not None:
            self.touched.add(rec.machine)
            machinesets.undesire(self.desired, rec.machine, ref)

    def free(self, job: JobRecord, recs: list[TaskRecord]) -> None:
        """Tasks that are gone for good: their allocations go back; an index within
        the count starts over as a new pending task (resized back up)."""
        spec = job.spec
        indices = [r.index for r in recs]
        if indices:
            self.allocator.allocate(AllocationRequest.of(
                job.name, job.entitlement, spec.resources, free=indices, policy=spec.policy))
        self.unassign_all(job, recs)  # (each machine's sets rebuilt once)
        if job.acked:
            self.drop_acked_all(job, set(indices))
        for rec in recs:
            if rec.op is not None:
                self.complete(job, rec)
            self.task_event(self.now, job, rec, "task_removed",
                            "deleted with its job" if job.deleting else "resized away")
            job.offers.pop(rec.index, None)
            job.serials.pop(rec.index, None)
            job.lost.discard(rec.index)
            del job.tasks[rec.index]
            if rec.index < spec.task_count and not job.deleting:
                # resized back up
                job.tasks[rec.index] = TaskRecord(rec.index, job.target_of(rec.index))

