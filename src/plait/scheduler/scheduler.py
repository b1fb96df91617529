"""The scheduler: jobs and tasks, their lifecycle, pacing, TaskControl calls, rate
limits, failures and planned maintenance (paper sections 2.4, 2.5 and 4).

A pure core object driven by its caller: ``tick(now)`` runs a pass, ``report`` takes
agents' statuses, the job operations change desired state. Time is always passed in;
the only outside calls are to the allocator, the region's in-memory state and
in-process TaskControllers (a remote controller's requests go to ``outbox`` for the
shell, which hands the answers back with ``answer``).

A pass records what happened to machines (``machines``: failures, maintenance), then
reconciles each job that changed since the last pass (the dirty set: every input
marks the job it concerns), top-down, in stages; every job now and then (the periodic
full pass). A job whose reconcile would change nothing is told apart in one look at
its tasks (``settled``). Each stage is a module that reads the job's records and
returns a plan (``plans``), which ``apply`` commits:

1. ``wanted``: per task, what should happen (update to the target version, restart,
   move off a failed machine, stop for a resize, move or stop for announced
   maintenance); kept as offered operations with stable ids;
2. ``acks`` / ``controller``: which offered operations may proceed. The job's
   TaskController decides (called when something it should hear about happened, or
   every ``recheck_interval``); without one, the built-in policy acks while the job's
   unavailable tasks, for any reason, stay below ``max_unavailable``;
3. ``execution``: each acked destructive operation takes a token from the shard's
   bucket; with ``max_unavailable`` set, it is a safety cap even under a controller.
   The task is disabled in service discovery first, then stopped;
4. ``placement``: tasks without a machine go to the allocator, then into their
   machine's desired set, which agents pull and converge to.

Exceptions to "never proceed without an ack": a maintenance deadline (what still
runs is stopped, counted apart from the rate limit), and ``failure_deadline`` for
tasks already down on a failed machine.

``stage`` is told as a pass enters each of its stages (``STAGES``), so the shell can
time them (the control plane's ``plait_pass_stage_duration_seconds``); nobody is told
unless the shell sets it.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from plait.allocator import AllocationRequest, Allocator
from plait.broker import BrokerChange, ChangeKind
from plait.errors import Conflict, NotFound, ValidationError
from plait.model.events import EventKind, UnavailabilityEvent
from plait.model.hostprofile import HostProfile
from plait.model.job import JobSpec
from plait.model.task import TaskState
from plait.scheduler import (
    acks,
    apply,
    controller,
    execution,
    loans,
    machines,
    machinesets,
    placement,
    profileroll,
    readiness,
    reports,
    settled,
    surge,
)
from plait.scheduler.lifecycle import FINISHED
from plait.scheduler.plans import LIVE, down_tasks, to_target, unavailable
from plait.scheduler.records import (
    SEQUENCE_BLOCK,
    Assigned,
    Assignment,
    JobRecord,
    Stops,
    TaskRecord,
    TaskStatus,
    same_runtime,
)
from plait.scheduler.state import (
    ROOM_RECONCILE_EVERY,
    ROOM_RETRY,
    ROOM_RETRY_MAX,
    RoomWait,
    SchedulerState,
)
from plait.scheduler.wanted import Notice, plan_wanted
from plait.sidekick.book import Applied, ProfileBook, Transition
from plait.taskcontrol.protocol import (
    ControllerAnswer,
    ControllerCall,
    OpKind,
    RemoteController,
    TaskController,
)

#: the stages of a pass, as ``Scheduler.stage`` is told of them: machine changes and
#: maintenance, then for each job reconciled its four stages (1-4 above), with
#: ``jobs`` for choosing the jobs and settling each one's idleness after its stages
STAGES = ("machines", "jobs", "wanted", "acks", "execution", "placement")


def _untold(stage: str) -> None:
    """The default ``Scheduler.stage``: nobody is told."""


@dataclass(frozen=True)
class SchedulerConfig:
    #: destructive operations per second, and the bucket's size
    rate: float = 20.0
    burst: float = 40.0
    #: most operations offered to a controller in one call
    controller_batch: int = 1000
    #: call a controller again after this long even if nothing changed (unless it
    #: asked to be called again sooner or later: ``ask_again_after``)
    recheck_interval: float = 30.0
    #: a remote controller's request with no answer from the shell after this long
    #: is taken as failed (the shell's own hard deadline is much shorter)
    controller_lost_after: float = 60.0
    #: move a task off a failed machine without an ack after this long
    failure_deadline: float = 300.0
    #: events kept
    event_limit: int = 10_000
    #: the periodic full pass: every job is reconciled, changed or not, every this
    #: many passes (0: never) and at least every this many seconds (0: never); a
    #: safety net for an input that failed to mark its job (a settled job's
    #: reconcile costs one look at each of its tasks: ``settled.no_op``)
    full_pass_every: int = 0
    full_pass_interval: float = 60.0
    #: record each task's operations (started, placed, ready, removed): the events a
    #: job's ops chart is drawn from; off, only job-level events are recorded
    task_events: bool = True
    #: a changed host profile rolls over an entitlement's busy machines this many at a
    #: time, each drained within this many seconds at the latest (``profileroll``)
    profile_roll_at_once: int = 1
    profile_roll_deadline: float = 3600.0
    #: a revoked loan's machine is due back in the free pool this long after the
    #: revoke's deadline (its agent's stop of what still ran there; ``loans``)
    loan_return_grace: float = 30.0


class Scheduler(SchedulerState):
    def __init__(self, allocator: Allocator, config: SchedulerConfig | None = None,
                 now: float = 0.0) -> None:
        self.config = config or SchedulerConfig()
        super().__init__(allocator, self.config.rate, self.config.burst,
                         self.config.event_limit, now)
        self.task_events = self.config.task_events
        #: host profiles: each machine's target and what its agent applied (Sidekick)
        self.profiles = ProfileBook()
        #: what the profile reports changed (the shell records them as events)
        self.profile_transitions: list[Transition] = []
        #: jobs whose push is under way (the Job Control Plane keeps it): a profile
        #: roll waits for them (``profileroll``, decision 104)
        self.pushing: set[str] = set()
        #: per entitlement, how many stale machines the roll leaves for pushes
        self.roll_waiting: dict[str, int] = {}
        #: rolls of changed profiles (``profileroll``): each entitlement's target as
        #: last seen, its busy machines still to drain, the machines draining (their
        #: event and entitlement), the ones the roll cordoned
        self.roll_targets: dict[str, tuple[str, int] | None] = {}
        self.stale: dict[str, set[int]] = {}
        self.rolling: dict[int, tuple[str, str]] = {}
        self.roll_cordoned: set[int] = set()
        self.roll_seq = 0
        #: the drains of rolls begun before this scheduler took over were looked for
        self.rolls_found = False
        #: when each draining machine's roll deadline comes (its tasks are moved then)
        self.roll_deadlines: dict[int, float] = {}
        #: elastic loans (``loans``): revokes under way by machine, when each
        #: borrower's recent revokes began, what the shell records as events
        self.revokes: dict[int, loans.Revoke] = {}
        self.revoke_starts: dict[str, list[float]] = {}
        self.revoke_seq = 0
        #: machines on loan this scheduler saw claimed: borrower and since when
        self.loaned: dict[int, tuple[str, float]] = {}
        self.loan_events: list[loans.LoanEvent] = []
        self.elastic: set[str] = set()
        self.lenders: set[str] = set()
        self.loan_mark = -1
        self.loans_found = False
        self.counters.update(loan_revokes=0, loan_revokes_late=0, surge_started=0,
                             surge_waits=0)
        #: per entitlement: its surge tasks, (job, index), and the jobs waiting for
        #: room in its surge buffer (``plait.scheduler.surge``)
        self.surges: dict[str, set[tuple[str, int]]] = {}
        self.surge_waiters: dict[str, set[str]] = {}
        #: per entitlement: jobs whose maintenance moves wait for the buffer, and how
        #: many (room that frees up goes to them before any update)
        self.surge_urgent: dict[str, dict[str, int]] = {}
        self.roll_mark: tuple[int, int] = (-1, -1)
        self._wires: dict[tuple[str, int, bool], dict[str, Any]] = {}
        self.region.subscribe(self._machine_changed)
        #: called with a stage's name (``STAGES``) as a pass enters it
        self.stage: Callable[[str], None] = _untold
        #: passes run, full passes among them, and when the last full pass ran
        self.passes = 0
        self.full_passes = 0
        self.full_pass_at = now

    def _machine_changed(self, change: BrokerChange) -> None:
        """The region's change notification: a machine's state change is kept for the
        next pass (``machines.on_changes``); the others (claims, releases, cordons)
        ask nothing of the scheduler, and every shard hears of every machine, so
        keeping them would hold each claim of the region once per shard until the
        shard's next pass."""
        if change.kind is ChangeKind.STATE:
            self.machine_changes.append(change)
        elif change.kind is ChangeKind.CLAIMED:
            if change.entitlement in self.elastic:
                self.loaned[change.machine] = (change.entitlement, self.now)
                self.loan_events.append(loans.LoanEvent(
                    self.now, change.machine, "loan_started", change.entitlement))
            if change.entitlement in self.allocator.entitlements:
                # it must carry the entitlement's profile before a task starts there
                self.profiles.joined(change.machine, self.profile_target(change.machine))
                self.touched.add(change.machine)
        elif change.kind is ChangeKind.RELEASED and change.machine in self.loaned:
            borrower, _ = self.loaned.pop(change.machine)
            if change.machine not in self.revokes:
                self.loan_events.append(loans.LoanEvent(
                    self.now, change.machine, "loan_ended", borrower, "empty"))
        if change.kind is ChangeKind.RELEASED and change.machine in self.profiles.applied:
            self.profiles.left(change.machine)
            self.touched.add(change.machine)  # back to ``default``

    # -- job operations (what users ask for) -------------------------------------------------
    def create_job(self, spec: JobSpec, now: float,
                   controller: TaskController | RemoteController | None = None,
                   cause: str | None = None) -> JobRecord:
        """Persist a job at version 1; its tasks are placed on the next ``tick``.
        Creating the same spec again is a no-op; a different spec is a conflict.
        ``cause``: the id of the request that created it (``JobRecord.cause``)."""
        existing = self.jobs.get(spec.name)
        if existing is not None:
            if existing.spec == spec and not existing.deleting:
                return existing
            raise Conflict(f"job {spec.name}", "absent or identical", "exists")
        if spec.entitlement not in self.allocator.entitlements:
            raise ValidationError("entitlement", f"entitlement {spec.entitlement!r} does not exist")
        job = JobRecord(spec.name, spec.entitlement, [spec], 1, controller, cause=cause)
        for i in range(spec.task_count):
            job.tasks[i] = TaskRecord(i, 1)
        self.jobs[spec.name] = job
        self.event(now, job.name, "created", f"{spec.task_count} tasks, version 1")
        return job

    def update_job(self, spec: JobSpec, now: float) -> int:
        """A new spec version, rolled out with pacing. Returns the version number."""
        job = self._job(spec.name)
        if spec.entitlement != job.entitlement:
            raise ValidationError("entitlement", f"job {spec.name} runs in entitlement "
                                  f"{job.entitlement!r}; update cannot move it (move it to "
                                  "another entitlement with a move)")
        if spec == job.spec:
            return job.target
        return self.append_version(spec, now, f"version {len(job.versions) + 1}")

    def add_version(self, spec: JobSpec, now: float) -> int:
        """Keep ``spec`` as the job's next version without rolling it out: tasks run it
        only once pinned to it (``pin``). Returns the version number."""
        job = self._job(spec.name)
        if not self._bound_here(job, spec.entitlement):
            raise ValidationError("entitlement", f"job {spec.name} runs in entitlement "
                                  f"{job.entitlement!r}; a pinned version stays there "
                                  "(or in one of its canary entitlements)")
        job.versions.append(spec)
        self.event(now, job.name, "version_added",
                   f"version {len(job.versions)} kept for pinned tasks")
        return len(job.versions)

    def _bound_here(self, job: JobRecord, entitlement: str) -> bool:
        """A version of the job may run in ``entitlement``: the job's own, or one of
        its canary entitlements (decision 103)."""
        return entitlement == job.entitlement or entitlement in self.allocator.canaries.get(
            job.entitlement, ())

    def retarget(self, name: str, version: int, now: float, what: str) -> None:
        """Make version ``version``, kept already, the job's target (its record's
        target moved back past versions kept for pinned tasks)."""
        job = self._job(name)
        if not 1 <= version <= len(job.versions):
            raise ValidationError("version", f"job {name} has no version {version}")
        if version != job.target:
            self._retarget(job, version, now, what)

    def pin(self, name: str, pins: dict[int, int], now: float) -> None:
        """Set which tasks run a version other than the job's target (the Job Control
        Plane's unified spec: ``plait.jcp.unify``); every other task's goal is the
        target. A pinned task moves to its version by the same paced, TaskControl-acked
        operations as an update."""
        job = self._job(name)
        for version in pins.values():
            if not 1 <= version <= len(job.versions):
                raise ValidationError("version", f"job {name} has no version {version}")
            if not self._bound_here(job, job.versions[version - 1].entitlement):
                raise ValidationError("version", f"version {version} of job {name} runs "
                                      "in another entitlement")
        clean = {i: v for i, v in pins.items() if v != job.target}
        if clean == (job.pins or {}):
            return
        before = {i: job.target_of(i) for i in job.in_progress}
        job.pins = clean or None
        # an update to a goal the task no longer has is over (a push rolled back while
        # its task ran the pushed version, unhealthy: the update would wait for a health
        # that never comes, and the task never went back): it is offered its new goal
        for index, goal in before.items():
            rec = job.tasks.get(index)
            if rec is not None and rec.op is not None and to_target(rec.op) and (
                    rec.state is not TaskState.STOPPING) and job.target_of(index) != goal:
                self.complete(job, rec)
                if rec.state is TaskState.PENDING:  # stopped, waiting for a machine: it
                    rec.spec_version = job.target_of(index)  # starts at its new goal
        job.rollout_active = True
        job.dirty = True
        self.mark(name)
        self.event(now, name, "pinned", f"{len(clean)} tasks pinned to other versions "
                   f"than {job.target}")

    def append_version(self, spec: JobSpec, now: float, what: str) -> int:
        """Add ``spec`` as the job's next version and roll it out, even when it equals
        the current one (a rollback, or an operation replayed from the store). A spec
        of another entitlement moves the job there: ``move_job`` checks a move first,
        a move replayed from the store is applied as it was stored."""
        job = self._job(spec.name)
        if spec.entitlement != job.entitlement:
            if spec.entitlement not in self.allocator.entitlements:
                raise ValidationError("entitlement",
                                      f"entitlement {spec.entitlement!r} does not exist")
            job.moving_from = job.entitlement
            job.entitlement = spec.entitlement
        job.versions.append(spec)
        self._retarget(job, len(job.versions), now, what)
        return job.target

    def move_job(self, name: str, entitlement: str, now: float) -> int:
        """Move a job to another entitlement (paper section 3.1): a new version bound to
        ``entitlement``, rolled out like an update. Each task is stopped and placed again
        on machines of the new entitlement (claimed from the free pool as usual) by a
        ``move`` operation, paced by max_unavailable or the job's TaskController; tasks
        keep their indices. A move while another is under way redirects it. Returns
        the version number."""
        job = self._job(name)
        spec = self.check_move(job.spec, entitlement)
        return self.append_version(spec, now, f"version {len(job.versions) + 1}: move from "
                                              f"{job.entitlement} to {entitlement}")

    def check_move(self, spec: JobSpec, entitlement: str) -> JobSpec:
        """``spec`` (a job's latest version) bound to ``entitlement``, once that move is
        possible; otherwise an error that names the problem. Changes nothing: room is
        checked with a placement the allocator proposes and does not commit.

        Refused: an unknown entitlement or the job's own (``ValidationError``), a job
        being deleted, or an entitlement whose machines and quota cannot hold the job's
        tasks right now (``Conflict``). Finished batch tasks need no room."""
        job = self.jobs.get(spec.name)
        if job is not None and job.deleting:
            raise Conflict(f"job {spec.name}", "a live job", "being deleted")
        if entitlement not in self.allocator.entitlements:
            raise ValidationError("entitlement", f"entitlement {entitlement!r} does not exist")
        if entitlement == spec.entitlement:
            raise ValidationError("entitlement", f"job {spec.name} already runs in entitlement "
                                                 f"{entitlement!r}")
        moved = spec.model_copy(update={"entitlement": entitlement})
        done = set() if job is None else {i for i, r in job.tasks.items() if r.state in FINISHED}
        need = [i for i in range(spec.task_count) if i not in done]
        if need:
            plan = self.allocator.propose(AllocationRequest.of(
                spec.name, entitlement, spec.resources, allocate=need, policy=spec.policy))
            if plan.unplaced:
                raise Conflict(f"entitlement {entitlement}",
                               f"room for the {len(need)} tasks of job {spec.name}",
                               f"room for {len(need) - len(plan.unplaced)} "
                               f"({plan.unplaced[0][1]})")
        return moved

    def resize(self, name: str, task_count: int, now: float) -> int:
        job = self._job(name)
        if task_count < 0:
            raise ValidationError("task_count", "must be >= 0")
        return self.update_job(job.spec.model_copy(update={"task_count": task_count}), now)

    def rollback(self, name: str, version: int, now: float) -> int:
        """Return to an earlier version, as a new version rolled out like any update."""
        job = self._job(name)
        if not 1 <= version <= len(job.versions):
            raise ValidationError("version", f"job {name} has versions 1..{len(job.versions)}")
        spec = job.versions[version - 1]
        if spec.entitlement != job.entitlement:  # a rollback stays where the job is
            spec = spec.model_copy(update={"entitlement": job.entitlement})
        return self.append_version(spec, now,
                                   f"version {len(job.versions) + 1}: rollback to version "
                                   f"{version}")

    def resume(self, name: str, now: float) -> None:
        job = self._job(name)
        job.halted = None
        job.rollout_failures = 0
        job.failed_tasks.clear()
        job.dirty = True
        self.event(now, name, "rollout_resumed", f"rollout of version {job.target} resumed")

    def restart(self, name: str, now: float, index: int | None = None) -> None:
        """Restart the whole job or one task, through TaskControl like any operation."""
        job = self._job(name)
        targets = job.tasks.values() if index is None else [self._task(job, index)]
        for rec in targets:
            rec.restart = True
        job.dirty = True
        self.event(now, name, "restart", "whole job" if index is None else f"task {index}")

    def delete_job(self, name: str, now: float) -> None:
        job = self._job(name)
        job.deleting = True
        # what was under way for the job's tasks is over (an update a halted rollout
        # left on a task that never started would keep the delete's stop from ever
        # being offered): each task is offered its stop, stops under way go on
        for index in list(job.in_progress):
            rec = job.tasks.get(index)
            if rec is None:
                job.in_progress.discard(index)
            elif rec.op is not None and rec.op.kind is not OpKind.STOP and (
                    rec.state is not TaskState.STOPPING):
                self.complete(job, rec)
        for index in {op.task.index for op in job.acked.values()}:
            self.drop_acked(job, index)
        for index in list(job.offers):
            self.cancel_pending(job, index)
        job.dirty = True
        self.event(now, name, "deleting", f"stopping {len(job.tasks)} tasks")

    def _retarget(self, job: JobRecord, version: int, now: float, what: str) -> None:
        old = job.versions[job.target - 1]
        job.target = version
        spec = job.spec
        for i in range(spec.task_count):
            if i not in job.tasks:
                job.tasks[i] = TaskRecord(i, job.target_of(i))
        # an update that already restarted its task but is not proven healthy yet
        # is over: the task is offered the new target like any other
        for index in list(job.in_progress):
            rec = job.tasks.get(index)
            if rec is None:
                job.in_progress.discard(index)
            elif rec.op is not None and (
                    to_target(rec.op) or rec.op.kind is OpKind.RESTART) and (
                    rec.state is not TaskState.STOPPING):
                self.complete(job, rec)
        if not same_runtime(old, spec):  # a new runtime: a new rollout
            job.halted = None
            job.rollout_failures = 0
            job.failed_tasks.clear()
            job.rollout_active = True
        job.dirty = True
        self.event(now, job.name, "updated", what)

    def restore(self, job: JobRecord, desired: Iterable[int]) -> None:
        """Take back a job rebuilt from a store: its tasks' machines, operations under
        way, losses and parking come from the records; ``desired`` lists the tasks
        that were in their machine's desired set."""
        if job.name in self.jobs:
            raise Conflict(f"job {job.name}", "absent", "exists")
        self.jobs[job.name] = job
        self.mark(job.name)
        wanted = set(desired)
        by_machine: dict[int, dict[int, Assigned | None]] = {}
        for rec in job.tasks.values():
            if rec.op is not None:
                job.add_in_progress(rec.index)
            if rec.state is TaskState.LOST:
                job.add_lost(rec.index)
            if rec.parked is not None:
                self.parked.setdefault(rec.parked, set()).add(job.ref(rec.index))
            if rec.machine is None:
                continue
            on = by_machine.get(rec.machine)
            if on is None:
                on = by_machine[rec.machine] = {}
            on[rec.index] = job.assigned(rec.spec_version) if rec.index in wanted else None
        # (each machine's sets made once: a job of small tasks has thousands on one)
        for machine, on in by_machine.items():
            self.touched.add(machine)
            machinesets.place_all(self.placed, machine, job.name, on.keys())
            machinesets.desire_all(self.desired, machine, job.name,
                                   {i: a for i, a in on.items() if a is not None})
        job.dirty = True

    # -- reading -----------------------------------------------------------------------------
    def job(self, name: str) -> JobRecord:
        return self._job(name)

    def desired_for(self, machine: str) -> list[Assignment]:
        return sorted(self.desired_of(self.fleet.index_of(machine)),
                      key=lambda a: (a.job, a.index))

    def desired_of(self, m: int) -> list[Assignment]:
        """What machine ``m``'s agent is given to run: its desired set, less the tasks
        not started yet while the machine does not carry its entitlement's host profile
        (they start once its agent reports the profile applied)."""
        desired = self.desired.get(m)
        if desired is None:
            return []
        if m not in self.profiles.pending or self.profile_ready(m):
            return list(desired.values())
        jobs, allocated = self.jobs, TaskState.ALLOCATED
        return [a for a in desired.values()
                if jobs[a.job].tasks[a.index].state is not allocated]

    # -- host profiles (Sidekick) -------------------------------------------------------------
    def profile_target(self, m: int) -> HostProfile | None:
        """The profile machine ``m`` must carry: its entitlement's (``default`` while
        free, or bound to an entitlement another shard manages); None if the profile
        its entitlement names is not known here."""
        ent = self.region.broker_of(m).entitlement_of(m)
        found = None if ent is None else self.allocator.entitlements.get(ent)
        return self.profiles.target(None if found is None else found.host_profile)

    def profile_ready(self, m: int) -> bool:
        return self.profiles.ready(m, self.profile_target(m))

    def profile_hold(self, m: int) -> bool:
        """Whether machine ``m``'s agent must not begin a switch: while a roll drains
        it (it goes back to the free pool), and while it is in the free pool: it keeps
        the profile it carries until an entitlement with another one claims it
        (decision 95: no switch to ``default`` and back per loan or shrink), or may
        carry one (its agent has not reported since this control plane started or took
        over). Only a free machine whose agent said it carries none yet (a new agent)
        takes ``default``. (Held or not, an agent carrying its target switches nothing:
        a free ``default`` machine is held, so its desired set does not change when its
        agent is first heard.)"""
        if m in self.rolling:
            return True
        if self.region.broker_of(m).entitlement_of(m) is not None:
            return False
        if not self.profiles.heard(m):
            return True
        seen = self.profiles.applied.get(m)  # (no entry: it carries ``default``)
        return seen is None or seen.name is not None

    def profile_wire(self, m: int) -> dict[str, Any] | None:
        """What machine ``m``'s agent is told of its profile: the one it must carry
        (wire form), and whether to switch to it once idle (``switch``: not while
        ``profile_hold``)."""
        target = self.profile_target(m)
        if target is None:
            return None
        key = (target.name, target.version, not self.profile_hold(m))
        wire = self._wires.get(key)
        if wire is None:  # (one per version: shared, never changed)
            if len(self._wires) > 4096:
                self._wires.clear()
            wire = self._wires[key] = {**target.wire(), "switch": key[2]}
        return wire

    def define_profile(self, profile: HostProfile) -> None:
        """A profile's new version: the machines that must carry it are told (their
        agents switch once nothing runs there)."""
        if not self.profiles.define(profile):
            return
        for m in list(self.profiles.applied):
            self.touched.add(m)
        for name, ent in self.allocator.entitlements.items():
            if ent.host_profile == profile.name:
                self.touched.update(int(m) for m in self.region.machines_of(name))
        self.notice_rolls()

    def notice_rolls(self) -> None:
        """A profile or an entitlement was defined: the machines whose target moved are
        pending now, not at the next pass (an agent that asks for its tasks before it
        must not start one on the profile it carries). Only once a pass has looked:
        what a control plane defines as it starts, one by one, is its first look's,
        and no roll."""
        if self.rolls_found:
            profileroll.notice_changes(self)

    def report_profile(self, machine: str, applied: Applied, now: float) -> None:
        """An agent's report of the profile it applied (or why its switch fails). A
        failed switch takes the machine out of service (a failure event in its broker,
        ``sidekick-{machine}-{n}``: its tasks are replaced as on any failure) for
        ``book.out_for(n)`` seconds after the n-th failure in a row, or until the
        profile that failed is applied; its agent tries again with its own backoff."""
        m = self.fleet.index_of(machine)
        target = self.profile_target(m)
        was = self.profiles.ready(m, target)
        held = self.profile_hold(m)
        change = self.profiles.report(m, applied, target)
        if (self.profiles.ready(m, target) != was and self.desired.get(m)) or (
                held and not self.profile_hold(m) and not profileroll.carries(self, m, target)):
            # (the tasks its agent is given change; or it may switch now, held until
            # its first report said what it carries, and does not carry its target)
            self.touched.add(m)
        if applied.name is not None and not profileroll.carries(self, m, target):
            profileroll.found_stale(self, m, target)
        if change is None:
            return
        self.profile_transitions.append(change)
        if change.kind == "profile_switch_failed":
            self.region.add_event(UnavailabilityEvent(
                f"sidekick-{machine}-{change.failures}", EventKind.FAILURE, (machine,), now,
                now + change.out_for,
                f"host profile {change.profile} v{change.version}: {change.reason}"), now)
        elif change.kind == "profile_switch_retried":
            for n in range(1, change.failures + 1):
                with contextlib.suppress(NotFound):
                    self.region.end_event(f"sidekick-{machine}-{n}", now)

    def stops_for(self, machine: str) -> Stops:
        """The tasks whose records still name the machine but that left its desired
        set (its agent stops them), each with its job's ``cause``: the request that
        last changed the job (an update, a resize, a delete, ...)."""
        m = self.fleet.index_of(machine)
        desired = self.desired.get(m, machinesets.DesiredSet())
        stops: Stops = []
        for ref in self.placed.get(m, ()):
            if desired.get(ref) is None:
                job = self.jobs.get(ref.job)
                stops.append((ref, None if job is None else job.cause))
        return sorted(stops, key=lambda s: (s[0].job, s[0].index))

    def discovery(self, name: str) -> list[tuple[int, str]]:
        """(task index, machine) of the tasks enabled in service discovery."""
        job = self._job(name)
        return [(r.index, self.fleet.name(r.machine)) for r in sorted(
            job.tasks.values(), key=lambda r: r.index) if r.serving and r.machine is not None]

    def on_entitlement(self, job: JobRecord) -> int:
        """Tasks of the job, within its count, running healthy (or finished) at a version
        of its entitlement: the progress of a move (the allocator places a task only
        on machines of the entitlement its request names)."""
        count, versions, ent = job.spec.task_count, job.versions, job.entitlement
        return sum(1 for r in job.tasks.values() if r.index < count and (
            (r.state is TaskState.RUNNING and r.healthy) or r.state in FINISHED)
            and versions[r.spec_version - 1].entitlement == ent)

    def unavailable(self, job: JobRecord) -> int:
        """The job's tasks within its count that are down, for any reason."""
        return unavailable(job)

    def _job(self, name: str) -> JobRecord:
        job = self.jobs.get(name)
        if job is None:
            raise NotFound("job", name)
        return job

    def _task(self, job: JobRecord, index: int) -> TaskRecord:
        rec = job.tasks.get(index)
        if rec is None:
            raise NotFound("task", f"{job.name}/{index}")
        return rec

    def _quiet(self, job: JobRecord) -> bool:
        """Nothing under way: every task runs the target, serving, with nothing
        offered or acked; such a job changes only through an outside input."""
        if job.offers or job.acked or job.in_progress or job.lost or job.deleting or (
                len(job.tasks) != job.spec.task_count):
            return False
        running, finished = TaskState.RUNNING, FINISHED
        return all(((r.state is running and r.serving) or r.state in finished)
                   and r.op is None for r in job.tasks.values())

    def _quiet_only_ops(self, job: JobRecord) -> tuple[bool, bool]:
        """``(_quiet(job), _only_ops(job))`` in one look at the tasks."""
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

    def _waiting(self, job: JobRecord) -> bool:
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

    def _waiting_for_controller(self, job: JobRecord) -> bool:
        """Operations offered to the job's controller, and nothing else under way:
        only its answer (or its re-check) can move the job on."""
        return not job.acked and self._only_ops(job)

    def _only_ops(self, job: JobRecord) -> bool:
        """Every task placed, with no operation under way and none lost: a reconcile
        can only offer, ack (or call about) and start operations."""
        if job.in_progress or job.lost or job.deleting or (
                len(job.tasks) != job.spec.task_count):
            return False
        live = LIVE
        return all(r.state in live and r.op is None for r in job.tasks.values())

    def _room_wait(self, job: JobRecord, now: float) -> tuple[float, bool] | None:
        """After a reconcile: None unless all the job has left to do is place pending
        tasks for which no machine had room, then (when to try again, whether this
        reconcile changed nothing since the last such one: then nothing is stored or
        shown). Every other task is placed at its goal version with nothing under
        way, or waits with an operation offered that the built-in policy cannot ack
        until a pending task runs, or offered to its TaskController (told all there
        is: its re-check wakes the job too), or acked and held by max_unavailable (a
        rollout whose new tasks found no room, its max_unavailable spent on them).
        The job waits, out of the dirty set, for its timer (1 s, doubled after each
        try that changed nothing, up to 8 s), for an input of its own, or for a change
        of its entitlement (``room_changed``): a job of 100,000 tasks that can never
        be placed cost every pass 0.6 s of reconcile, save and view, and so did one
        whose update could not be placed."""
        name = job.name
        ctl = job.controller is not None
        if (job.unplaced_reason is None or job.lost or job.deleting
                or job.in_flight is not None
                or (ctl and (job.dirty or job.completed))):
            self._room.pop(name, None)
            return None
        pending_state, goal = TaskState.PENDING, job.target_of
        running, finished = TaskState.RUNNING, FINISHED
        offers = job.offers
        acked = {op.task.index for op in job.acked.values()} if job.acked else offers
        pending = 0
        for r in job.tasks.values():
            state = r.state
            if state is pending_state:
                pending += 1
            # (every other task serves, or finished: one starting, failing its probe or
            # within its grace changes by time alone, its ready timeout, its grace)
            elif not ((state is running and r.serving and r.healthy) or state in finished) or (
                    r.op is not None or r.restart or (
                        r.spec_version != goal(r.index) and r.index not in offers
                        and r.index not in acked)):
                self._room.pop(name, None)
                return None
        tasks = job.tasks
        if not pending or any(tasks[i].state is not pending_state for i in job.in_progress
                              if i in tasks):
            # (an operation waiting on a running task)
            self._room.pop(name, None)
            return None
        if offers or job.acked:
            down = down_tasks(job)
            if offers and not ctl and acks.builtin_acks(job, now, down):
                self._room.pop(name, None)  # (an operation the policy acks now)
                return None
            if job.acked:  # (one acked that would start now, or no longer applies)
                ready = execution.plan_execution(job, 1 << 30, now, down)
                if ready.start or ready.obsolete:
                    self._room.pop(name, None)
                    return None
        seen = (pending, len(job.tasks), job.unplaced_reason, self._unchanged(job))
        had = self._room.get(name)
        same = had is not None and had.seen == seen
        backoff = min(ROOM_RETRY_MAX, had.backoff * 2) if same and had else ROOM_RETRY
        # the requests the next reconcile's placement would make (each version and
        # entitlement its pending tasks are placed at), one task of each: room for
        # any of them brings the reconcile back
        plan = placement.plan_placement(job, self.allocator.canaries.get(job.entitlement, ()))
        probes = tuple(AllocationRequest.of(name, request.entitlement, request.resources,
                                            allocate=[request.tasks[0][0]],
                                            policy=request.policy)
                       for _, request in plan.requests if request.tasks)
        self._room[name] = RoomWait(seen, now + backoff, backoff, probes or None)
        return now + backoff, same

    def _room_now(self, name: str, now: float) -> bool:
        """Whether a job woken by its timer is reconciled: yes, unless it waits for
        room and the allocator finds none for one of its tasks (then it is tried
        again after a longer backoff, its reconcile skipped: a job of many pending
        tasks costs a try what one task costs)."""
        wait = self._room.get(name)
        job = self.jobs.get(name)
        if wait is None or wait.probes is None or job is None:
            return True
        asks = self._controller_timer(job)
        if asks <= now:
            return True  # (its controller's re-check is due)
        wait.skipped += 1
        if wait.skipped >= ROOM_RECONCILE_EVERY:  # (whatever the probes say, now and then)
            wait.skipped = 0
            return True
        try:
            if any(self.allocator.propose(probe).assign for probe in wait.probes):
                return True
        except Exception:  # (an entitlement gone, say: the reconcile says what it is)
            return True
        wait.backoff = min(ROOM_RETRY_MAX, wait.backoff * 2)
        wait.at = now + wait.backoff
        self._wake_at[name] = min(wait.at, asks)
        return False

    def _controller_timer(self, job: JobRecord) -> float:
        """When the job's controller is to be asked again by itself (``inf``: never,
        or no controller)."""
        if job.controller is None:
            return float("inf")
        return controller.timer(job, self.config.recheck_interval,
                                self.config.controller_lost_after)

    def room_changed(self, entitlement: str) -> None:
        """The entitlement's quota or settings changed: its jobs waiting for room are
        tried at the next pass."""
        for name, wait in self._room.items():
            job = self.jobs.get(name)
            if job is not None and job.entitlement == entitlement:
                wait.backoff = ROOM_RETRY / 2
                self._wake_at[name] = self.now

    def _unchanged(self, job: JobRecord) -> tuple[object, ...]:
        """What a reconcile of a job of ``_only_ops`` changes when it changes anything
        worth storing or showing (compared around it)."""
        return (job.op_counter, job.target, len(job.offers), len(job.acked),
                len(job.completed), job.notices, job.halted, job.error,
                job.sequence_number // SEQUENCE_BLOCK, self.counters["ops_started"])

    # -- agents and controllers (inputs the shell hands over) -----------------------------------
    def report(self, machine: str, statuses: Iterable[TaskStatus], now: float) -> None:
        """An agent's heartbeat: the statuses of the tasks on its machine."""
        self.now = now
        reports.record(self, self.fleet.index_of(machine), statuses, now)

    def answer(self, answer: ControllerAnswer) -> None:
        """The shell's delivery of a remote controller's answer (or of why there is
        none); applied to the job by the next pass. An answer to a request the job
        no longer waits for (an older sequence number) is dropped there."""
        job = self.jobs.get(answer.job)
        if job is None or job.in_flight is None or (
                job.in_flight.sequence_number != answer.sequence_number):
            return
        self._answers[answer.job] = answer
        self.mark(answer.job)

    def take_calls(self) -> list[ControllerCall]:
        """The remote controllers' requests planned since the last call (the shell
        sends them)."""
        calls, self.outbox = self.outbox, []
        return calls

    # -- the pass ----------------------------------------------------------------------------
    def tick(self, now: float) -> None:
        """One pass: machine changes and maintenance, then the jobs that changed since
        the last pass (the dirty set), in name order; every job now and then (the
        periodic full pass, ``full_pass_every`` / ``full_pass_interval``)."""
        self.now = now
        self.stage("machines")
        self.bucket.refill(now)
        profileroll.roll(self, now)
        loans.step(self, now)
        machines.on_changes(self, now)
        notice = machines.maintenance(self, now)
        self.stage("jobs")
        dirty = self._dirty
        if self._wake_at:
            for name in [n for n, at in self._wake_at.items() if at <= now]:
                del self._wake_at[name]
                if not self._room_now(name, now):
                    continue  # (waiting for room, and none yet: tried again later)
                dirty.add(name)
        if self._for_tokens:
            dirty.update(itertools.islice(self._for_tokens, int(self.bucket.tokens)))
        if notice:  # jobs with a task on a machine under notice: looked at every pass
            placed = self.placed
            for m in notice:
                dirty.update(ref.job for ref in placed.get(m, ()))
        self.passes += 1
        config = self.config
        if (config.full_pass_every and self.passes % config.full_pass_every == 0) or (
                config.full_pass_interval and now - self.full_pass_at
                >= config.full_pass_interval):
            self.full_pass_at = now
            self.full_passes += 1
            # (jobs waiting for room have their own timer: a full pass would reconcile
            # every one of their pending tasks to find no room again)
            room = self._room
            dirty.update(n for n in self.jobs if n not in room) if room else dirty.update(
                self.jobs)
        queue = self._queue = sorted(dirty)  # (a sorted list is a heap)
        jobs = self.jobs
        try:
            while queue:
                name = heapq.heappop(queue)
                self._current = name
                job = jobs.get(name)
                if job is None:
                    dirty.discard(name)
                    continue
                self._pass_job(job, notice, now)
        finally:
            self._queue = None
            self._current = ""

    def _pass_job(self, job: JobRecord, notice: Notice, now: float) -> None:
        """Reconcile one job, then decide whether it waits for an input (it leaves
        the dirty set) or the next pass must look at it again."""
        name, dirty = job.name, self._dirty
        if settled.no_op(job, notice):
            # its reconcile would change nothing; it leaves the dirty set, as below
            self._for_tokens.pop(name, None)
            dirty.discard(name)
            return
        # whether the reconcile changed the job matters only to a shell that persists
        # it (``changed_jobs``): the pass keeps or drops the job from the dirty set
        # below whatever the answer. A job waiting for its controller's answer or for
        # the rate limit, whose reconcile changed nothing but a call's own
        # bookkeeping, is not marked changed (nothing to store or show)
        persisted = self.changed_jobs is not None
        quiet, only_ops = self._quiet_only_ops(job) if persisted else (False, False)
        before = self._unchanged(job) if only_ops else None
        started = self.counters["ops_started"]
        try:
            throttled = self.reconcile(job, notice, now)
        except Exception as exc:  # one job's failure must not stall the region
            self.counters["reconcile_errors"] += 1
            error = f"{type(exc).__name__}: {exc}"
            self.mark(name)
            if error != job.error:
                job.error = error
                self.event(now, name, "reconcile_failed", error)
            return
        finally:
            self.stage("jobs")
        job.error = None
        quiet_now = self._quiet(job)
        room = self._room_wait(job, now)
        if persisted and not (quiet and quiet_now) and not (
                before is not None and self._only_ops(job)
                and before == self._unchanged(job)) and not (room is not None and room[1]):
            self.mark(name)
        for_tokens = throttled and not job.dirty and self._only_ops(job)
        if not for_tokens:
            self._for_tokens.pop(name, None)
        elif name not in self._for_tokens or self.counters["ops_started"] > started:
            self._for_tokens.pop(name, None)  # its turn is over: to the back
            self._for_tokens[name] = None
        waits = False
        if job.controller is None:
            waits = quiet_now or self._waiting(job) or for_tokens
        elif not job.dirty and (quiet_now or self._waiting(job) or for_tokens
                                or self._waiting_for_controller(job)):
            # only an answer, an input or its timer can move it on
            waits = True
            at = controller.timer(job, self.config.recheck_interval,
                                  self.config.controller_lost_after)
            if at < float("inf"):
                self._wake_at[name] = at
            else:
                self._wake_at.pop(name, None)
        if room is not None:  # (tried again by its timer, or by an input)
            waits = True
            at = min(room[0], self._controller_timer(job))  # (its controller's re-check)
            self._wake_at[name] = min(self._wake_at.get(name, at), at)
        if waits:
            dirty.discard(name)
        else:
            dirty.add(name)  # (still something to do: the next pass looks again)
        if job.deleting and not job.tasks:
            del self.jobs[name]
            dirty.discard(name)
            self._wake_at.pop(name, None)
            self._for_tokens.pop(name, None)
            self._room.pop(name, None)
            self.allocator.cache.drop(name)
            self.event(now, name, "deleted", "all tasks stopped")

    def reconcile(self, job: JobRecord, notice: Notice, now: float) -> bool:
        """One job's stages, each planned then applied; whether its acked operations
        ran out of tokens."""
        self.stage("wanted")
        for index in list(job.in_progress):  # operations waiting for min_ready_seconds
            rec = job.tasks.get(index)
            if rec is None:
                job.in_progress.discard(index)
            elif rec.state is TaskState.RUNNING and rec.healthy:
                self.maybe_serving(job, rec, now)
        for index in readiness.not_ready(job, now):
            self.rollout_failure(job, index, "ran without passing its health probe for "
                                 f"{job.spec.update.ready_timeout_seconds:g}s", now)
        surging = self._surge(job, notice, now) if job.spec.update.surge else None
        apply.wanted(self, job, plan_wanted(job, notice, now), now)
        self.stage("acks")
        # the tasks down: acks and the failure deadline change no task's state, so
        # the built-in policy's count holds for execution too (one loop, not two)
        down: set[int] | None = None
        if job.controller is not None and not job.deleting:
            self._ask_controller(job, job.controller, notice, now)
        elif job.offers:
            down = down_tasks(job)
            apply.acks(self, job, acks.builtin_acks(job, now, down))
        deadline = self.config.failure_deadline
        apply.failure_deadline(self, job, acks.failure_deadline_acks(job, now, deadline),
                               deadline, now)
        self.stage("execution")
        plan = execution.plan_execution(job, int(self.bucket.tokens), now, down, self.heard,
                                        self.started)
        apply.execution(self, job, plan, now)
        self.stage("placement")
        apply.placement(self, job, placement.plan_placement(
            job, self.allocator.canaries.get(job.entitlement, ())), now)
        if job.rollout_active and not job.tasks:
            self.rollout_done(job, now)  # no task left to report running
        if surging is not None and sum(
                1 for i in job.tasks if i >= job.spec.task_count) < surging:
            for name in self.surge_waiters.get(job.entitlement, ()):
                self.mark(name)  # room in the buffer: the jobs waiting for it look again
        return plan.throttled

    def _surge(self, job: JobRecord, notice: Notice, now: float) -> int:
        """Start and keep the job's surge tasks (``plait.scheduler.surge``); returns
        how many tasks it had past its count."""
        ent, count = job.entitlement, job.spec.task_count
        have = sum(1 for i in job.tasks if i >= count)
        used = self.surges.setdefault(ent, set())
        jobs = self.jobs
        for key in [k for k in used if k[0] not in jobs or k[1] not in jobs[k[0]].tasks
                    or k[1] < jobs[k[0]].spec.task_count]:
            used.discard(key)  # (stopped and gone, resized into the job, or its job is)
        used.update((job.name, i) for i in job.tasks if i >= count)  # (after a restore)
        found = self.allocator.entitlements.get(ent)
        urgent = self.surge_urgent.setdefault(ent, {})
        urgent.pop(job.name, None)
        plan = surge.plan_surge(job, (found.surge_buffer if found else 0) - len(used),
                                sum(urgent.values()), notice)
        if plan.maintenance:
            urgent[job.name] = len(plan.maintenance)  # (updates leave them the room)
        for i in plan.start:
            index = max(max(job.tasks, default=-1) + 1, count)
            job.tasks[index] = TaskRecord(index, job.target_of(i))
            plan.keep[index] = i
            used.add((job.name, index))
            self.counters["surge_started"] += 1
            self.event(now, job.name, "surge_started",
                       f"task {i}: surge task {index} starts on the shared buffer; task {i}'s "
                       "operation waits until it serves")
        for index, i in sorted((job.surges or {}).items()):
            if index not in plan.keep:
                self.event(now, job.name, "surge_released",
                           f"task {i} is back: surge task {index} stops")
        if (job.surges or {}) != plan.keep:
            job.surges = plan.keep or None
            self.mark(job.name)
        waiters = self.surge_waiters.setdefault(ent, set())
        if plan.waiting:
            if job.name not in waiters:
                self.counters["surge_waits"] += 1
                self.event(now, job.name, "surge_waiting",
                           f"{plan.waiting} operations wait for room in the surge buffer of "
                           f"{ent} ({found.surge_buffer if found else 0} surge tasks)")
            waiters.add(job.name)
        else:
            waiters.discard(job.name)
        return have

    def _ask_controller(self, job: JobRecord, ctl: TaskController | RemoteController,
                        notice: Notice, now: float) -> None:
        """Apply the answer the job waits for, if it came; then plan its next request
        when the controller should hear of something (or its re-check is due). A
        remote controller's request goes to ``outbox`` for the shell: the pass never
        waits on a tenant."""
        notices = controller.advance_notices(job, notice, self.fleet)
        apply.notices(job, notices)
        remote = isinstance(ctl, RemoteController)
        if remote and job.in_flight is not None:
            got = self._answers.pop(job.name, None)
            if got is not None:
                apply.answered(self, job, job.in_flight, got.response, got.error, now)
                job.in_flight = None
            elif now - job.in_flight_since >= self.config.controller_lost_after:
                # the shell enforces a hard deadline, so this is a safety net: a
                # request it lost (a restart of the dispatcher) must not hold the job
                lost = job.in_flight
                job.in_flight = None
                apply.answered(self, job, lost, None, "no answer came back from the shell",
                               now)
            else:
                return  # one call at a time per job; the answer is applied when it comes
        request = controller.plan_request(job, notices, now, self.config.recheck_interval,
                                          self.config.controller_batch, self.fleet)
        if request is None:
            return
        apply.sent(self, job, request, now)
        if isinstance(ctl, RemoteController):
            job.in_flight = request
            job.in_flight_since = now
            self._answers.pop(job.name, None)  # (a stale answer of a forgotten call)
            self.outbox.append(ControllerCall(job.name, ctl.url, request, ctl.key_name))
        else:
            apply.call_in_process(self, job, ctl, request, now)
