"""One pass of the region, for both worlds: what arrived in, one outcome out.

``run_pass(region, given)`` is the pass: it takes a frozen ``PassInput`` (the time,
the job names to look at, the agents' reports and heartbeats, the TaskControllers'
answers, the records this process stored itself), applies it to the region's core
(brokers, allocator, scheduler, each job's reconcile, pacing, placement and
TaskControl requests; or, with simulated agents, steps them), and returns one
``PassOutcome``: the machines whose desired sets changed, the scheduler's events,
the TaskControl calls to make, the jobs whose records are to be saved. The caller
holds the region's lock and acts on the outcome (``Loop.step``: publish the desired
sets and wake the long-polls, record the events, save, send the calls off the lock).

``after_pass(region, now)`` is what follows each pass off the lock: the autoscaler's
decisions and the Job Control Plane's reconcile (intents into pins and sizes), both
stored writes. The real loop (``plait.server.controlplane.loop``) and the simulator
(``plait.sim.controlplane``) drive exactly these two functions; in the simulator the
pass steps the simulated agents and its gates are stand-ins, answered at once.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from plait import logconfig, tracing
from plait.errors import Conflict, NotFound, TransientError
from plait.model.events import EventKind, UnavailabilityEvent

log = logconfig.get("plait.controlplane.passes")

if TYPE_CHECKING:
    from plait.health import HealthCheck
    from plait.model import Fleet
    from plait.persist import PersistentAllocator, PersistentRegion
    from plait.persist.follow import SharedRecords
    from plait.persist.scheduler import JobDoc, PersistentScheduler
    from plait.persist.warm import WarmRecords
    from plait.scheduler import Scheduler
    from plait.scheduler.eventrows import Fields
    from plait.server.controlplane.autoscaling import Autoscaling
    from plait.server.controlplane.config import ControlPlaneConfig
    from plait.server.controlplane.controllers import Controllers
    from plait.server.controlplane.creates import CreateCommitter
    from plait.server.controlplane.gateway import AgentGateway
    from plait.server.controlplane.inbox import Report
    from plait.server.controlplane.jcp import JobControlPlane
    from plait.server.controlplane.machine_ops import MachineOps
    from plait.server.controlplane.membership import Membership
    from plait.server.controlplane.profiles import HostProfiles
    from plait.server.controlplane.views import Views
    from plait.server.logs import TaskLogs
    from plait.sim import Simulation
    from plait.taskcontrol.protocol import ControllerAnswer, ControllerCall

#: an inbox entry that asks for every stored job
RESYNC = "/all"


class PassRegion(Protocol):
    """What a pass reads and writes of the region: its core objects and the parts
    behind the pass (the control plane is one; ``tests/server`` builds one over an
    in-memory store)."""

    @property
    def lock(self) -> threading.RLock: ...
    clock: Callable[[], float]
    config: ControlPlaneConfig
    @property
    def fleet(self) -> Fleet: ...
    @property
    def region(self) -> PersistentRegion: ...
    @property
    def allocator(self) -> PersistentAllocator: ...
    @property
    def scheduler(self) -> Scheduler: ...
    @property
    def persist(self) -> PersistentScheduler: ...
    @property
    def shared(self) -> SharedRecords | None: ...
    @property
    def sim(self) -> Simulation | None: ...
    warm: WarmRecords | None
    membership: Membership
    profiles: HostProfiles
    jcp: JobControlPlane
    autoscaling: Autoscaling
    machine_ops: MachineOps
    controllers: Controllers
    gateway: AgentGateway
    creates: CreateCommitter
    views: Views
    logs: TaskLogs
    @property
    def liveness(self) -> HealthCheck: ...
    steps: int

    def build(self, now: float) -> None: ...

    def known(self, machine: str) -> bool: ...

    def record(self, source: str, kind: str, message: str, job: str | None = None,
               entitlement: str | None = None, machine: str | None = None,
               at: float | None = None, *, actor: str | None = None,
               task: int | None = None, op: str | None = None, reason: str | None = None,
               decision: str | None = None, request: str | None = None) -> None: ...


@dataclass(frozen=True)
class PassInput:
    """What arrived since the last pass."""

    now: float
    #: the jobs whose stored records changed (None: every stored job)
    names: tuple[str, ...] | None = None
    #: agents' reports, in the order they came, and their last heartbeats
    reports: tuple[Report, ...] = ()
    beats: Mapping[str, float] = field(default_factory=dict)
    #: TaskControllers' answers
    answers: tuple[ControllerAnswer, ...] = ()
    #: the job records this process stored itself (a batch of creates), by name
    stored: Mapping[str, JobDoc] = field(default_factory=dict)


@dataclass
class PassOutcome:
    """What a pass decided, for its caller to act on."""

    #: machines whose desired sets changed (their agents' long-polls are woken)
    touched: list[int] = field(default_factory=list)
    #: the scheduler's events of the pass (``EventRows.take``)
    events: list[Fields] = field(default_factory=list)
    #: TaskControl calls to remote controllers, sent off the lock
    calls: list[ControllerCall] = field(default_factory=list)
    #: the jobs whose records changed (None: every job's), saved with the pass
    changed: set[str] | None = None
    #: job operations that could not be read or applied (tried again next pass),
    #: and what went wrong applying them
    failed: set[str] = field(default_factory=set)
    errors: list[str] = field(default_factory=list)


Stage = Callable[[str], None]


def _nothing(name: str, **attrs: Any) -> None:
    pass


def run_pass(region: PassRegion, given: PassInput, phase: Callable[..., None] = _nothing,
             stage: Stage = lambda name: None) -> PassOutcome:
    """One pass over ``given`` (the caller holds ``region.lock``). ``phase`` and
    ``stage`` mark its phases for the trace and the metrics."""
    now, out = given.now, PassOutcome()
    names = None if given.names is None else list(given.names)
    phase("membership")
    if region.membership.stale:  # a handoff's rebuild failed, or a save found the
        # stored records other than this memory of them: read everything again
        region.build(now)
        region.membership.stale = False
        region.steps = 0
        names = None  # (every stored job)
    region.scheduler.stage = stage  # (its own stages, for the metrics)
    if region.shared is not None:
        region.membership.follow(now)
    phase("reports")
    take_reports(region, given)
    region.profiles.sync(now)
    phase("operations")
    region.jcp.touch(names)  # (a job's record changed: its intents may move on)
    try:
        out.errors = region.persist.sync(now, names, known=dict(given.stored))
    finally:  # what could not be read or applied is tried again next pass
        out.failed = set(region.persist.failed)
    phase("answers")
    for answer in given.answers:
        region.scheduler.answer(answer)
    if region.sim is not None:
        phase("simulate")
        region.sim.step(now)
        # (the simulated agents' reports of their tasks' CPU: as the real agents')
        for m, usage, at in region.sim.take_usage():
            take_usage(region, m, usage, at)
        stage("simulate")  # (after the scheduler's stages within it)
    else:
        phase("health")
        check_health(region, now)
        phase("brokers")
        region.region.tick(now)
        # (the metrics time the scheduler's stages, which it marks itself)
        tracing.phase("scheduler", jobs=len(region.scheduler.jobs))
        region.scheduler.tick(now)
        stage("desired")
        out.touched = sorted(region.scheduler.touched)
        region.scheduler.touched = set()
    region.machine_ops.finish_drains()
    out.calls = region.scheduler.take_calls()
    phase("events")
    out.events = region.scheduler.events.take()
    changed = region.scheduler.changed_jobs
    out.changed = None if changed is None else set(changed)
    region.jcp.touch(out.changed)  # (its tasks changed: so may its push's health)
    return out


def take_reports(region: PassRegion, given: PassInput) -> None:
    """Apply the agents' reports, in order, and their heartbeats."""
    liveness = region.liveness
    # a shard hears only the machines it watches (``Membership.track_owned``): a beat
    # taken just before one left this shard must not bring it back here, to be failed
    # by this shard once its agent beats elsewhere
    sharded = region.shared is not None
    for machine, at in given.beats.items():
        if (machine in liveness.last) if sharded else region.known(machine):
            liveness.beat(machine, at)
    jobs = region.scheduler.jobs
    for machine, statuses, endpoints, at, profile, usage in given.reports:
        try:
            m = region.membership.check_owned(machine)
        except (NotFound, TransientError):
            continue  # (the machine left this shard since it reported)
        when = max(at, region.scheduler.now)
        region.scheduler.report(machine, statuses, when)
        if profile is not None:
            region.scheduler.report_profile(machine, profile, when)
        for (job, index), endpoint in endpoints.items():
            found = jobs.get(job)
            rec = found.tasks.get(index) if found is not None else None
            # only where the task is placed; a change is stored with the record
            if rec is not None and rec.machine == m and rec.endpoint != endpoint:
                rec.endpoint = endpoint
                region.scheduler.mark(job)
        if usage:
            take_usage(region, m, usage, at)


def take_usage(region: PassRegion, m: int, usage: Mapping[tuple[str, int], float],
               at: float) -> None:
    """The cores the tasks on machine ``m`` used, as its agent reported them, to the
    autoscaler: only the tasks placed there (a machine speaks for its own tasks, no
    other job's autoscaler)."""
    jobs = region.scheduler.jobs
    placed = {}
    for (job, index), cores in usage.items():
        found = jobs.get(job)
        rec = found.tasks.get(index) if found is not None else None
        if rec is not None and rec.machine == m:
            placed[job, index] = cores
    if placed:
        region.autoscaling.record_cpu(placed, at)


def after_pass(region: PassRegion, now: float) -> None:
    """After a pass, off the lock: the autoscaler's decisions (sizing intents) and
    the Job Control Plane's reconcile (intents into pins and sizes): stored writes."""
    if region.autoscaling.policies or region.autoscaling.due(now):
        region.autoscaling.decide(now)
    if region.jcp.records or region.jcp.due(now):
        region.jcp.reconcile(now)


def check_health(region: PassRegion, now: float) -> None:
    """Flow 2: a machine whose agent stopped heartbeating fails in its broker (its
    tasks are disabled in discovery and replaced per TaskControl); one that is back
    is healthy again. Most machines silent at once fail none of them
    (``plait.health.service``): one event says so when it starts and ends."""
    if region.shared is not None:
        region.membership.track_owned(now)
    liveness = region.liveness
    went, came = liveness.check(now)
    if liveness.held and not liveness.was_held:
        region.record("health", "heartbeats_lost", (
            f"{liveness.silent} of {len(liveness.heard)} machines stopped heartbeating "
            f"together: none of them is failed while more than "
            f"{liveness.hold_fraction:.0%} are silent (the path from the agents to this "
            "control plane is the likelier fault: a front end down, this process "
            "paused or cut off)"))
        log.warning("most machines silent at once: none failed", silent=liveness.silent,
                    heard=len(liveness.heard))
    elif liveness.was_held and not liveness.held:
        region.record("health", "heartbeats_resumed", (
            f"{liveness.silent} of {len(liveness.heard)} machines silent now: those "
            f"still silent past {liveness.timeout:g}s are failed"))
    for i, machine in enumerate(went):
        try:
            _fail(region, machine, now)
        except BaseException:  # (not failed: the next pass finds them late again)
            liveness.down.difference_update(went[i:])
            raise
    for machine in came:
        with contextlib.suppress(NotFound):
            region.region.end_event(f"health-{machine}", now)
        region.record("health", "machine_back", f"{machine}: heartbeating again",
                      machine=machine)


def _fail(region: PassRegion, machine: str, now: float) -> None:
    liveness = region.liveness
    event = UnavailabilityEvent(
        f"health-{machine}", EventKind.FAILURE, (machine,), now, None,
        f"no heartbeat for {liveness.timeout:g}s")
    try:
        region.region.add_event(event, now)
    except Conflict:
        # stored already (another shard failed it as it moved here): the same
        # failure, taken as it is; else (this replica no longer leads) the error
        if not region.region.ns.exists(f"/events/{event.id}"):
            raise
        region.region.adopt_event(event.id, now)
    region.record("health", "machine_unreachable",
                  f"{machine}: no heartbeat for {liveness.timeout:g}s", machine=machine)
