"""The control plane of one region in one process: the composition root.

``ControlPlane`` builds the region's state owners and the parts that serve them, and
wires each part with just the collaborators it uses; it holds no state of its own but
a follower's copy of the job records (``warm``). The state owners, each the one
writer of its state:

* ``state`` (``RegionState``): the region's core objects (fleet, brokers, allocator,
  scheduler, their persistence, the agents' liveness) and their one lock, built from
  the store (at start, on a takeover, when a machine registers);
* ``inbox`` (``Inbox``): what arrives between passes (jobs whose records changed,
  agents' reports and heartbeats, TaskControl answers) and the pass's wake-up;
* ``published`` (``Published``): what the last pass published for lock-free readers
  (desired sets, generations, the long-polls waiting for them);
* ``recorder`` (``EventRecorder``): the events not stored yet.

The parts, one module per concern:

* ``passes`` (``Pass``): one pass over what arrived, and what follows it off the lock,
  the same for the real loop and the simulator;
* ``loop`` (``Loop``): drives the passes, acts on their outcome, counts them and says
  whether they are passing;
* ``commands`` (``JobCommands``): job and entitlement writes;
* ``creates`` (``CreateCommitter``): job creates, stored in batches;
* ``views`` (``Views``): every read, from what the last pass published;
* ``gateway`` (``AgentGateway``): what agents call;
* ``machine_ops`` (``MachineOps``): registration, failure, cordon, drain, maintenance;
* ``membership`` (``Membership``): a scheduler shard's machines and handoffs;
* ``controllers`` (``Controllers``): TaskControl calls, off the pass;
* ``profiles``, ``owners``, ``autoscaling``, ``jcp``: host profiles, owners' limits,
  the autoscaler and the Job Control Plane.

Requests and the loop meet in the state owners. A job operation is a durable write of
the job record (``JobStore``), acknowledged once stored; the loop then applies it to
the scheduler (``PersistentScheduler.sync``), reconciles (``tick``), and writes back
the tasks' state. Everything that touches the in-memory core holds ``state.lock``;
reads, heartbeats and job writes do not, so none waits for a long pass (decision 45).

The attributes of the state owners and the loop's counters are reachable here under
their old names too (``cp.scheduler``, ``cp.lock``, ``cp.wake``, ``cp.steps``...), for
the HTTP layer; no part uses them.

Without real agents (``sim_agents``), simulated agents run the tasks, so a region can
be tried on one box before any machine joins.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from plait.health import HealthCheck
from plait.metrics import metrics_for
from plait.model import Fleet, RegionSpec
from plait.persist import PersistentAllocator, PersistentRegion
from plait.persist.follow import SharedRecords
from plait.persist.scheduler import JobStore, PersistentScheduler
from plait.persist.warm import WarmRecords
from plait.scheduler import Scheduler
from plait.server.auth import Role, TokenStore
from plait.server.controlplane.autoscaling import Autoscaling
from plait.server.controlplane.collector import ControlPlaneCollector
from plait.server.controlplane.commands import JobCommands
from plait.server.controlplane.config import ControlPlaneConfig
from plait.server.controlplane.controllers import Controllers
from plait.server.controlplane.creates import CreateCommitter
from plait.server.controlplane.gateway import AgentGateway
from plait.server.controlplane.inbox import Inbox, Wake
from plait.server.controlplane.jcp import JobControlPlane
from plait.server.controlplane.loop import Loop
from plait.server.controlplane.machine_ops import MachineOps
from plait.server.controlplane.membership import Membership
from plait.server.controlplane.owners import Owners
from plait.server.controlplane.passes import Pass
from plait.server.controlplane.profiles import HostProfiles
from plait.server.controlplane.published import Kept, Published
from plait.server.controlplane.recorder import EventRecorder
from plait.server.controlplane.regionstate import RegionState, shard_view
from plait.server.controlplane.views import Views
from plait.server.events import EventLog
from plait.server.logs import TaskLogs
from plait.sim import Simulation
from plait.store.protocol import Namespace, Store

__all__ = ["ControlPlane", "Wake"]


class ControlPlane:
    def __init__(self, store: Store, config: ControlPlaneConfig | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.config = config = config or ControlPlaneConfig()
        #: this process's Prometheus metrics (``plait.metrics``; served at /metrics),
        #: its gauges read from this control plane when scraped; a ``NullMetrics``
        #: when they are off (``config.metrics``)
        self.metrics = metrics_for(config.metrics)
        #: whether this replica leads (the API of a replica says; alone, it always does)
        self.leading: Callable[[], bool] = lambda: True
        # (its operations timed, as is when off; a shard sees its own records under
        # /shards/S, and the region's as they are)
        self.store, shared = shard_view(self.metrics.metered(store), config.shard)
        now = clock()
        self.state = state = RegionState(self.store, config, clock, shared, sink=self.metrics)
        self.events = EventLog(self.store, config.retention)
        self.tokens = TokenStore(self.store)
        self.logs = TaskLogs()
        self.incoming = inbox = Inbox()
        self.published = published = Published()
        self.recorder = recorder = EventRecorder(
            self.events, lambda: state.clock(), self.metrics, config.retention.max_count,
            state.held_entitlement_of)
        self._created = time.monotonic()
        #: a follower's copy of the job records (``keep_warm``), for a fast takeover
        self.warm: WarmRecords | None = None
        self.owners = Owners(state, recorder)
        self.profiles = HostProfiles(state, inbox, recorder)
        self.controllers = Controllers(state, inbox, self.metrics)
        self.creates = CreateCommitter(state, inbox)
        self.membership = Membership(state, inbox, published, recorder, self.creates,
                                     rebuild=self._rebuild, read_all=self._read_all)
        self.views = Views(state, self.membership, self.controllers)
        inbox.touch = self.views.index.touch  # (a job put: listed anew)
        self.commands = JobCommands(state, inbox, recorder, self.views, self.creates,
                                    self.controllers, self.profiles)
        self.gateway = AgentGateway(state, inbox, published, self.membership,
                                    self.controllers, self.logs)
        self.machine_ops = MachineOps(state, inbox, recorder, self.views,
                                      rebuild=self._rebuild)
        self.jcp = JobControlPlane(state, inbox, recorder, self.commands, self.controllers,
                                   self.profiles, self.owners)
        self.autoscaling = Autoscaling(state, inbox, recorder, self.owners, self.jcp)
        self.pass_ = Pass(state, recorder, self.membership, self.profiles, self.machine_ops,
                          self.jcp, self.autoscaling, rebuild=self._rebuild,
                          read_all=self._read_all)
        self.loop = Loop(state, inbox, published, recorder, self.pass_, self.controllers,
                         self.creates, self.membership, self.views, self.logs, self.metrics,
                         forget_warm=self._forget_warm)
        self.metrics.registry.register(ControlPlaneCollector(
            lambda: self.leading(), self.views.snapshot, state, self.metrics,
            config.metrics_jobs))
        # (the state owners' methods, under their old names)
        self.known, self.machine_index = state.known, state.machine_index
        self.entitlement, self.entitlement_of = state.entitlement, state.entitlement_of
        self.owner_of_job, self.check_job = state.owner_of_job, state.check_job
        self.check_dc = state.check_dc
        self.notify, self.notify_many = inbox.notify, inbox.notify_many
        self.record = recorder.record
        self.record_scheduler_events = recorder.record_scheduler_events
        self.drop_pending_events, self.flush_events = recorder.drop, recorder.flush
        self.build(now)

    # -- building ------------------------------------------------------------------------
    def build(self, now: float, grace: float | None = None,
              warm: WarmRecords | None = None) -> None:
        """The region's state from the store, and what is built on it: the published
        views, the host profiles, the owners' limits on job writes, the agents'
        liveness (at start, on a takeover, when a machine registers)."""
        state = self.state
        state.build(now, warm=warm)
        self.published.forget_sets()
        self.views.publish(None)
        self.profiles.load()
        state.jobs.admit = self.owners.admit  # (each write checked against the limits)
        if state.sim is None:  # real agents: a machine is up only while its agent beats
            self.membership.watch(now, self.config.startup_grace if grace is None else grace)

    def _rebuild(self, now: float) -> None:
        self.build(now)  # (looked up at each call: a test may stand in for it)

    def _read_all(self) -> None:
        self.loop.steps = 0

    def _forget_warm(self) -> None:
        if self.warm is not None:
            self.warm.forget()

    def take_over(self, fence: tuple[str, int] | None = None) -> None:
        """This replica was elected leader: everything from the store as the previous
        leader left it (jobs, tasks, placements, machine bindings, events), the loop not
        yet running. Agents keep beating (they follow the leader by themselves), so a
        machine has one heartbeat timeout to be heard from; or what is left of the
        start-up grace, when this replica has just started (a cold start of the whole
        control plane, its agents maybe starting too)."""
        with self.lock:
            now = self.clock()
            self.events.refresh()
            config = self.config
            self.state.new_liveness()
            grace = max(config.heartbeat_timeout, config.startup_grace
                        - (time.monotonic() - self._created))
            if self.warm is not None:
                self.warm.refresh()  # what changed since the follower last looked
            self.build(now, grace=grace, warm=self.warm)
            # (a rebuild on registration keeps it: RegionState.build)
            self.persist.fence = self.region.fence = self.events.fence = fence
            self.published.renumber()
            self.loop.steps = 0  # the first pass reads every stored job
        self.published.waiters.notify_all()

    def keep_warm(self) -> None:
        """A follower's chore: catch up with the leader's event log and job records now
        and then, so a takeover reads only what is new."""
        self.events.refresh()
        if self.warm is None:
            self.warm = WarmRecords(self.store)
        self.warm.refresh()

    def bootstrap_admin(self) -> str | None:
        """At first start, an admin token (returned once); None if one exists."""
        if any(t.role is Role.ADMIN and not t.revoked for t in self.tokens.list()):
            return None
        _, token = self.tokens.create(Role.ADMIN, "admin", self.clock(), "created at first start")
        self.record("auth", "token_created", "admin token created at first start")
        self.flush_events()
        return token

    # -- the loop's counters (``Loop``), for the HTTP layer -------------------------------
    @property
    def steps(self) -> int:
        """Passes since this replica began leading (0: the next reads every stored job)."""
        return self.loop.steps

    @property
    def failures(self) -> int:
        """Passes that failed."""
        return self.loop.failures

    @property
    def last_step(self) -> float | None:
        """When the last pass ended (monotonic; None: none yet)."""
        return self.loop.last_step

    @last_step.setter
    def last_step(self, at: float | None) -> None:
        self.loop.last_step = at

    # -- the state owners' attributes, under their old names -----------------------------
    @property
    def clock(self) -> Callable[[], float]:
        """The region's clock (``RegionState.clock``: every part reads it there)."""
        return self.state.clock

    @clock.setter
    def clock(self, clock: Callable[[], float]) -> None:
        self.state.clock = clock

    @property
    def lock(self) -> Any:
        """The region's one lock (``RegionState.lock``)."""
        return self.state.lock

    @property
    def fleet(self) -> Fleet:
        return self.state.fleet

    @property
    def region(self) -> PersistentRegion:
        return self.state.region

    @property
    def allocator(self) -> PersistentAllocator:
        return self.state.allocator

    @property
    def scheduler(self) -> Scheduler:
        return self.state.scheduler

    @property
    def persist(self) -> PersistentScheduler:
        return self.state.persist

    @property
    def jobs(self) -> JobStore:
        return self.state.jobs

    @property
    def meta(self) -> Namespace:
        return self.state.meta

    @property
    def region_spec(self) -> RegionSpec:
        return self.state.region_spec

    @property
    def shared(self) -> SharedRecords | None:
        return self.state.shared

    @property
    def sim(self) -> Simulation | None:
        return self.state.sim

    @property
    def liveness(self) -> HealthCheck:
        return self.state.liveness

    @property
    def pending_lock(self) -> Any:
        """What arrives between passes is put under this lock (``Inbox.lock``)."""
        return self.incoming.lock

    @property
    def inbox(self) -> set[str]:
        """The jobs whose records changed since the last pass (``Inbox.jobs``)."""
        return self.incoming.jobs

    @inbox.setter
    def inbox(self, jobs: set[str]) -> None:
        self.incoming.jobs = jobs

    @property
    def wake(self) -> Wake:
        return self.incoming.wake

    @property
    def desired_view(self) -> dict[str, Kept]:
        return self.published.desired_view

    @property
    def generation(self) -> dict[str, int]:
        return self.published.generation

    @property
    def gen_base(self) -> int:
        return self.published.gen_base
