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
   unavailable tasks, for any reason but a want of room (tasks waiting for room are
   down already and not counted), stay below ``max_unavailable``;
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

from collections.abc import Iterable, Mapping
from typing import Any

import plait.scheduler.machinesets as machinesets
import plait.scheduler.reports as reports
from plait.allocator import Allocator
from plait.broker import BrokerChange, ChangeKind
from plait.model.hostprofile import HostProfile
from plait.model.job import JobSpec
from plait.model.task import TaskState
from plait.scheduler.config import STAGES, SchedulerConfig
from plait.scheduler.hostprofiles import HostProfiles
from plait.scheduler.jobops import JobOperations
from plait.scheduler.lifecycle import FINISHED
from plait.scheduler.loans import Loans
from plait.scheduler.passes import PassDriver
from plait.scheduler.plans import disrupted, unavailable, waiting_for_room
from plait.scheduler.records import Assignment, JobRecord, Stops, TaskStatus
from plait.scheduler.state import SchedulerState
from plait.scheduler.surging import SurgeBuffers
from plait.scheduler.wanted import Notice
from plait.sidekick.book import Applied
from plait.taskcontrol.protocol import (
    ControllerAnswer,
    ControllerCall,
    RemoteController,
    TaskController,
)

__all__ = ["STAGES", "Scheduler", "SchedulerConfig"]


def _part(part: str, name: str) -> Any:
    """An attribute of one of the scheduler's parts, read and set through the
    scheduler (the names its callers have always used)."""
    return property(lambda self: getattr(getattr(self, part), name),
                    lambda self, value: setattr(getattr(self, part), name, value))


class Scheduler(SchedulerState):
    """The scheduler's face: the records and their primitive changes
    (``SchedulerState``), and parts with their own state that it wires and delegates
    to: the job operations (``jobops``), the pass (``passes``, with the jobs waiting
    for room: ``roomwait``), host profiles and their rolls (``hostprofiles``,
    ``profileroll``), elastic loans (``loans``) and surge buffers (``surging``)."""

    # what callers read and set of the parts, by the names they always had
    profiles = _part("host", "book")
    profile_transitions = _part("rolls", "profile_transitions")
    pushing = _part("rolls", "pushing")
    stale = _part("rolls", "stale")
    rolling = _part("rolls", "rolling")
    roll_cordoned = _part("rolls", "roll_cordoned")
    roll_moved = _part("rolls", "roll_moved")
    roll_landing = _part("rolls", "roll_landing")
    revokes = _part("loans", "revokes")
    revoke_starts = _part("loans", "revoke_starts")
    loaned = _part("loans", "loaned")
    loan_events = _part("loans", "loan_events")
    elastic = _part("loans", "elastic")
    lenders = _part("loans", "lenders")
    surges = _part("surge", "surges")
    stage = _part("driver", "stage")
    passes = _part("driver", "passes")
    full_passes = _part("driver", "full_passes")
    full_pass_at = _part("driver", "full_pass_at")

    def __init__(self, allocator: Allocator, config: SchedulerConfig | None = None,
                 now: float = 0.0) -> None:
        self.config = config or SchedulerConfig()
        super().__init__(allocator, self.config.rate, self.config.burst,
                         self.config.event_limit, now)
        self.task_events = self.config.task_events
        self.ops = JobOperations(self)
        self.host = HostProfiles(self, self.config.profile_roll_at_once,
                                 self.config.profile_roll_deadline)
        self.rolls = self.host.rolls
        self.loans = Loans(self, self.config.loan_return_grace)
        self.surge = SurgeBuffers(self)
        self.driver = PassDriver(self, self.config, self.loans, self.rolls, self.surge, now)
        self.region.subscribe(self._machine_changed)

    def _machine_changed(self, change: BrokerChange) -> None:
        """The region's change notification: a machine's state change is kept for the
        next pass (``machines.on_changes``); a claim or a release is the loans' and
        the host profiles' business; the others (cordons) ask nothing of the
        scheduler, and every shard hears of every machine, so keeping them would hold
        each claim of the region once per shard until the shard's next pass."""
        kind = change.kind
        if kind is ChangeKind.STATE:
            self.machine_changes.append(change)
        elif kind is ChangeKind.CLAIMED or kind is ChangeKind.RELEASED:
            self.loans.machine_changed(change)
            self.host.machine_changed(change)

    # -- job operations (what users ask for: ``jobops``) -------------------------------------
    def create_job(self, spec: JobSpec, now: float,
                   controller: TaskController | RemoteController | None = None,
                   cause: str | None = None) -> JobRecord:
        return self.ops.create_job(spec, now, controller, cause)

    def update_job(self, spec: JobSpec, now: float) -> int:
        return self.ops.update_job(spec, now)

    def add_version(self, spec: JobSpec, now: float, revision: int | None = None) -> int:
        return self.ops.add_version(spec, now, revision)

    def retarget(self, name: str, version: int, now: float, what: str) -> None:
        self.ops.retarget(name, version, now, what)

    def pin(self, name: str, pins: dict[int, int], now: float) -> None:
        self.ops.pin(name, pins, now)

    def append_version(self, spec: JobSpec, now: float, what: str,
                       revision: int | None = None) -> int:
        return self.ops.append_version(spec, now, what, revision)

    def set_cause(self, name: str, cause: str | None) -> None:
        self.ops.set_cause(name, cause)

    def set_controller(self, name: str,
                       controller: TaskController | RemoteController | None) -> None:
        self.ops.set_controller(name, controller)

    def move_job(self, name: str, entitlement: str, now: float) -> int:
        return self.ops.move_job(name, entitlement, now)

    def check_move(self, spec: JobSpec, entitlement: str) -> JobSpec:
        return self.ops.check_move(spec, entitlement)

    def placeable(self, name: str, task_count: int) -> tuple[int, str | None]:
        return self.ops.placeable(name, task_count)

    def resize(self, name: str, task_count: int, now: float) -> int:
        return self.ops.resize(name, task_count, now)

    def rollback(self, name: str, version: int, now: float) -> int:
        return self.ops.rollback(name, version, now)

    def resume(self, name: str, now: float) -> None:
        self.ops.resume(name, now)

    def restart(self, name: str, now: float, index: int | None = None) -> None:
        self.ops.restart(name, now, index)

    def delete_job(self, name: str, now: float) -> None:
        self.ops.delete_job(name, now)

    def restore(self, job: JobRecord, desired: Iterable[int]) -> None:
        self.ops.restore(job, desired)

    # -- host profiles (Sidekick: ``hostprofiles``) ------------------------------------------
    def profile_target(self, m: int) -> HostProfile | None:
        return self.host.target(m)

    def profile_ready(self, m: int) -> bool:
        return self.host.ready(m)

    def profile_hold(self, m: int) -> bool:
        return self.host.hold(m)

    def profile_wire(self, m: int) -> dict[str, Any] | None:
        return self.host.wire(m)

    def define_profile(self, profile: HostProfile) -> None:
        self.host.define(profile)

    def notice_rolls(self) -> None:
        self.host.notice_rolls()

    def report_profile(self, machine: str, applied: Applied, now: float) -> None:
        self.host.report(machine, applied, now)

    # -- the pass (``passes``) ----------------------------------------------------------------
    def tick(self, now: float) -> None:
        self.driver.tick(now)

    def reconcile(self, job: JobRecord, notice: Notice, now: float) -> bool:
        return self.driver.reconcile(job, notice, now)

    def room_changed(self, entitlement: str) -> None:
        self.driver.rooms.room_changed(entitlement)

    def rollout_failure(self, job: JobRecord, index: int, how: str, now: float) -> None:
        reports.rollout_failure(self, job, index, how, now)

    # -- reading -----------------------------------------------------------------------------
    def job(self, name: str) -> JobRecord:
        return self.ops.job(name)

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
        if m not in self.host.book.pending or self.host.ready(m):
            return list(desired.values())
        jobs, allocated = self.jobs, TaskState.ALLOCATED
        return [a for a in desired.values()
                if jobs[a.job].tasks[a.index].state is not allocated]
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
        job = self.ops.job(name)
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
    def disrupted(self, job: JobRecord) -> int:
        """What max_unavailable bounds: the job's down tasks within its count, less
        those waiting for room (``plans.waiting_for_room``)."""
        return disrupted(job)
    def waiting_for_room(self, job: JobRecord) -> set[int]:
        """The job's tasks that wait for room (``plans.waiting_for_room``)."""
        return waiting_for_room(job)
    def report_endpoints(self, m: int,
                         endpoints: Mapping[tuple[str, int], str | None]) -> None:
        """Where the tasks on machine ``m`` listen, as its agent reported them
        (``reports.endpoints``: only the tasks placed there)."""
        reports.endpoints(self, m, endpoints)
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
