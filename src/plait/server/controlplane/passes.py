"""One pass of the region, for both worlds: what arrived in, one outcome out.

``Pass.run(given)`` is the pass: it takes a frozen ``PassInput`` (the time, the job
names to look at, the agents' reports and heartbeats, the TaskControllers' answers,
the records this process stored itself), applies it to the region's core (brokers,
allocator, scheduler, each job's reconcile, pacing, placement and TaskControl
requests; or, with simulated agents, steps them), and returns one ``PassOutcome``:
the machines whose desired sets changed, the scheduler's events, the TaskControl
calls to make, the jobs whose records are to be saved. The caller holds the region's
lock and acts on the outcome (``Loop.step``: publish the desired sets and wake the
long-polls, record the events, save, send the calls off the lock).

``Pass.after(now)`` is what follows each pass off the lock: the autoscaler's
decisions and the Job Control Plane's reconcile (intents into pins and sizes), both
stored writes. The real loop (``plait.server.controlplane.loop``) and the simulator
(``plait.sim.controlplane``) drive exactly these two; in the simulator the pass steps
the simulated agents and its gates are stand-ins, answered at once.

A ``Pass`` is built with the state owners and the parts it drives, nothing else.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from plait import logconfig, tracing
from plait.errors import Conflict, NotFound, TransientError
from plait.model.events import EventKind, UnavailabilityEvent

log = logconfig.get("plait.controlplane.passes")

if TYPE_CHECKING:
    from plait.persist.scheduler import JobDoc
    from plait.scheduler.eventrows import Fields
    from plait.server.controlplane.autoscaling import Autoscaling
    from plait.server.controlplane.inbox import Report
    from plait.server.controlplane.jcp import JobControlPlane
    from plait.server.controlplane.machine_ops import MachineOps
    from plait.server.controlplane.membership import Membership
    from plait.server.controlplane.profiles import HostProfiles
    from plait.server.controlplane.recorder import EventRecorder
    from plait.server.controlplane.regionstate import RegionState
    from plait.taskcontrol.protocol import ControllerAnswer, ControllerCall

#: an inbox entry that asks for every stored job
RESYNC = "/all"


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


class Pass:
    def __init__(self, state: RegionState, recorder: EventRecorder, membership: Membership,
                 profiles: HostProfiles, machine_ops: MachineOps, jcp: JobControlPlane,
                 autoscaling: Autoscaling, rebuild: Callable[[float], None],
                 read_all: Callable[[], None]) -> None:
        """``rebuild``: the region's state and what is built on it, from the store
        again; ``read_all``: the next pass reads every stored job."""
        self.state, self.recorder, self.membership = state, recorder, membership
        self.profiles, self.machine_ops = profiles, machine_ops
        self.jcp, self.autoscaling = jcp, autoscaling
        self.rebuild, self.read_all = rebuild, read_all

    def run(self, given: PassInput, phase: Callable[..., None] = _nothing,
            stage: Stage = lambda name: None) -> PassOutcome:
        """One pass over ``given`` (the caller holds ``state.lock``). ``phase`` and
        ``stage`` mark its phases for the trace and the metrics."""
        state, now, out = self.state, given.now, PassOutcome()
        names = None if given.names is None else list(given.names)
        phase("membership")
        if self.membership.stale:  # a handoff's rebuild failed, or a save found the
            # stored records other than this memory of them: read everything again
            self.rebuild(now)
            self.membership.stale = False
            self.read_all()
            names = None  # (every stored job)
        state.scheduler.stage = stage  # (its own stages, for the metrics)
        if state.shared is not None:
            self.membership.follow(now)
        phase("reports")
        self.take_reports(given)
        self.profiles.sync(now)
        phase("operations")
        self.jcp.touch(names)  # (a job's record changed: its intents may move on)
        try:
            out.errors = state.persist.sync(now, names, known=dict(given.stored))
        finally:  # what could not be read or applied is tried again next pass
            out.failed = set(state.persist.failed)
        phase("answers")
        for answer in given.answers:
            state.scheduler.answer(answer)
        sim = state.sim
        if sim is None:  # (real agents: a machine is up while its agent beats)
            phase("health")
            self.check_health(now)
        phase("brokers")
        state.region.tick(now)
        if sim is not None:  # (simulated agents: stepped here, as real ones report)
            phase("simulate")
            sim.step_agents(now)
            # (the simulated agents' reports of their tasks' CPU: as the real agents')
            for m, usage, at in sim.take_usage():
                self.take_usage(m, usage, at)
            stage("simulate")
        # (the metrics time the scheduler's stages, which it marks itself)
        tracing.phase("scheduler", jobs=len(state.scheduler.jobs))
        state.scheduler.tick(now)
        stage("desired")
        if sim is None:  # desired sets to publish to the agents' long-polls (simulated
            # agents read theirs at their next step)
            out.touched = sorted(state.scheduler.take_touched())
        self.machine_ops.finish_drains()
        out.calls = state.scheduler.take_calls()
        phase("events")
        out.events = state.scheduler.events.take()
        changed = state.scheduler.changed_jobs
        out.changed = None if changed is None else set(changed)
        self.jcp.touch(out.changed)  # (its tasks changed: so may its push's health)
        return out

    def take_reports(self, given: PassInput) -> None:
        """Apply the agents' reports, in order, and their heartbeats."""
        state = self.state
        liveness = state.liveness
        # a shard hears only the machines it watches (``Membership.track_owned``): a beat
        # taken just before one left this shard must not bring it back here, to be failed
        # by this shard once its agent beats elsewhere
        sharded = state.shared is not None
        for machine, at in given.beats.items():
            if (machine in liveness.last) if sharded else state.known(machine):
                liveness.beat(machine, at)
        for machine, statuses, endpoints, at, profile, usage in given.reports:
            try:
                m = self.membership.check_owned(machine)
            except (NotFound, TransientError):
                continue  # (the machine left this shard since it reported)
            when = max(at, state.scheduler.now)
            state.scheduler.report(machine, statuses, when)
            if profile is not None:
                state.scheduler.report_profile(machine, profile, when)
            if endpoints:  # (only where the task is placed; stored with its record)
                state.scheduler.report_endpoints(m, endpoints)
            if usage:
                self.take_usage(m, usage, at)

    def take_usage(self, m: int, usage: Mapping[tuple[str, int], float], at: float) -> None:
        """The cores the tasks on machine ``m`` used, as its agent reported them, to the
        autoscaler: only the tasks placed there (a machine speaks for its own tasks, no
        other job's autoscaler)."""
        jobs = self.state.scheduler.jobs
        placed = {}
        for (job, index), cores in usage.items():
            found = jobs.get(job)
            rec = found.tasks.get(index) if found is not None else None
            if rec is not None and rec.machine == m:
                placed[job, index] = cores
        if placed:
            self.autoscaling.record_cpu(placed, at)

    def after(self, now: float) -> None:
        """After a pass, off the lock: the autoscaler's decisions (sizing intents) and
        the Job Control Plane's reconcile (intents into pins and sizes): stored writes."""
        if self.autoscaling.policies or self.autoscaling.due(now):
            self.autoscaling.decide(now)
        if self.jcp.records or self.jcp.due(now):
            self.jcp.reconcile(now)

    def check_health(self, now: float) -> None:
        """Flow 2: a machine whose agent stopped heartbeating fails in its broker (its
        tasks are disabled in discovery and replaced per TaskControl); one that is back
        is healthy again. Most machines silent at once fail none of them
        (``plait.health.service``): one event says so when it starts and ends."""
        state = self.state
        if state.shared is not None:
            self.membership.track_owned(now)
        liveness = state.liveness
        went, came = liveness.check(now)
        if liveness.held and not liveness.was_held:
            self.recorder.record("health", "heartbeats_lost", (
                f"{liveness.silent} of {len(liveness.heard)} machines stopped heartbeating "
                f"together: none of them is failed while more than "
                f"{liveness.hold_fraction:.0%} are silent (the path from the agents to this "
                "control plane is the likelier fault: a front end down, this process "
                "paused or cut off)"))
            log.warning("most machines silent at once: none failed", silent=liveness.silent,
                        heard=len(liveness.heard))
        elif liveness.was_held and not liveness.held:
            self.recorder.record("health", "heartbeats_resumed", (
                f"{liveness.silent} of {len(liveness.heard)} machines silent now: those "
                f"still silent past {liveness.timeout:g}s are failed"))
        for i, machine in enumerate(went):
            try:
                self._fail(machine, now)
            except BaseException:  # (not failed: the next pass finds them late again)
                liveness.down.difference_update(went[i:])
                raise
        for machine in came:
            with contextlib.suppress(NotFound):
                state.region.end_event(f"health-{machine}", now)
            self.recorder.record("health", "machine_back", f"{machine}: heartbeating again",
                          machine=machine)

    def _fail(self, machine: str, now: float) -> None:
        state = self.state
        liveness = state.liveness
        event = UnavailabilityEvent(
            f"health-{machine}", EventKind.FAILURE, (machine,), now, None,
            f"no heartbeat for {liveness.timeout:g}s")
        try:
            state.region.add_event(event, now)
        except Conflict:
            # stored already (another shard failed it as it moved here): the same
            # failure, taken as it is; else (this replica no longer leads) the error
            if not state.region.ns.exists(f"/events/{event.id}"):
                raise
            state.region.adopt_event(event.id, now)
        self.recorder.record("health", "machine_unreachable",
                      f"{machine}: no heartbeat for {liveness.timeout:g}s", machine=machine)
