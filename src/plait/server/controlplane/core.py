"""The control plane of one region in one process: brokers, allocator and scheduler
over a store, the event log, tokens, and the parts that serve them.

``ControlPlane`` holds the region's state and builds it from the store (at start, on
a takeover, when a machine registers); each concern is a part of its own, built on
that state:

* ``loop`` (``Loop``): the passes, and whether they are passing;
* ``commands`` (``JobCommands``): job and entitlement writes;
* ``views`` (``Views``): every read, from what the last pass published;
* ``gateway`` (``AgentGateway``): what agents call;
* ``machine_ops`` (``MachineOps``): registration, failure, cordon, drain, maintenance;
* ``membership`` (``Membership``): a scheduler shard's machines and handoffs;
* ``controllers`` (``Controllers``): TaskControl calls, off the pass.

Requests and the loop meet here. A job operation is a durable write of the job record
(``JobStore``), acknowledged once stored; the loop then applies it to the scheduler
(``PersistentScheduler.sync``), reconciles (``tick``), and writes back the tasks'
state. Everything that touches the in-memory core holds ``self.lock``; reads,
heartbeats and job writes do not, so none waits for a long pass (decision 45).

Without real agents (``sim_agents``), simulated agents run the tasks, so a region can
be tried on one box before any machine joins.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from plait import requestid
from plait.allocator import MachineIndex
from plait.errors import Conflict, NotFound, ValidationError
from plait.health import HealthCheck
from plait.metrics import ControlPlaneCollector, metrics_for
from plait.model import Entitlement, Fleet, JobSpec, RegionSpec, Resources, generate, parse
from plait.model.machine import FaultDomain, Machine
from plait.model.redact import redact_text
from plait.persist import PersistentAllocator, PersistentRegion
from plait.persist.follow import SharedRecords
from plait.persist.scheduler import JobStore, PersistentScheduler
from plait.persist.warm import WarmRecords
from plait.scheduler import Scheduler
from plait.scheduler.eventrows import Fields
from plait.scheduler.records import Assignment, Stops
from plait.scheduler.wiring import wire
from plait.server.auth import Role, TokenStore
from plait.server.controlplane.autoscaling import Autoscaling
from plait.server.controlplane.commands import JobCommands
from plait.server.controlplane.config import ControlPlaneConfig
from plait.server.controlplane.controllers import Controllers
from plait.server.controlplane.creates import CreateCommitter
from plait.server.controlplane.gateway import AgentGateway
from plait.server.controlplane.jcp import JobControlPlane
from plait.server.controlplane.loop import Loop
from plait.server.controlplane.machine_ops import MachineOps
from plait.server.controlplane.membership import Membership
from plait.server.controlplane.owners import Owners
from plait.server.controlplane.profiles import HostProfiles
from plait.server.controlplane.views import Views
from plait.server.events import CHUNK, EventLog, NewEvent, new_event
from plait.server.logs import TaskLogs
from plait.sim import Behaviour, Simulation
from plait.store.protocol import Namespace, Store
from plait.store.shard import ShardStore
from plait.taskcontrol.protocol import RemoteController


def _machine(d: dict[str, Any]) -> Machine:
    return Machine(id=d["id"], type=d["type"], fault_domain=FaultDomain.parse(d["fault_domain"]),
                   resources=Resources(cpu=d["cpu"], memory_gb=d["memory_gb"],
                                       disk_gb=d.get("disk_gb", 0)))


def _controllers(spec: JobSpec) -> RemoteController | None:
    """A job's TaskController: a tenant's URL, never called from the pass (the
    dispatcher sends its requests)."""
    if spec.task_controller is None:
        return None
    return RemoteController(spec.task_controller)


class Wake(threading.Event):
    """The loop's wake-up: an event that also keeps when it was last set (monotonic
    seconds; ``Loop.run`` ends a burst's wait once none came for a moment)."""

    def __init__(self) -> None:
        super().__init__()
        self.at = float("-inf")

    def set(self) -> None:
        self.at = time.monotonic()
        super().set()


class ControlPlane:
    #: built from the store by ``build``
    fleet: Fleet
    region: PersistentRegion
    allocator: PersistentAllocator
    scheduler: Scheduler
    persist: PersistentScheduler
    jobs: JobStore
    #: (declared: the loop's protocol is checked against this class before they are
    #: assigned)
    controllers: Controllers
    views: Views

    def __init__(self, store: Store, config: ControlPlaneConfig | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.config = config = config or ControlPlaneConfig()
        #: this process's Prometheus metrics (``plait.metrics``; served at /metrics),
        #: its gauges read from this control plane when scraped; a ``NullMetrics``
        #: when they are off (``config.metrics``)
        self.metrics = metrics_for(config.metrics)
        #: whether this replica leads (the API of a replica says; alone, it always does)
        self.leading: Callable[[], bool] = lambda: True
        self.metrics.registry.register(ControlPlaneCollector(self))
        store = self.metrics.metered(store)  # (its operations timed; as is when off)
        #: a shard sees its own records under /shards/S, and the region's as they are
        self.shared: SharedRecords | None = None
        if config.shard is not None:
            store = ShardStore(store, config.shard)
            with contextlib.suppress(Conflict):  # the front end finds the shards here
                store.create(f"/frontend/shards/{config.shard}", b"{}")
            self.shared = SharedRecords(store)  # (before the build: no change missed)
        self.store = store
        self.clock = clock
        self.lock = threading.RLock()
        now = clock()
        self.meta = meta = Namespace(store, "/region")
        try:
            self.region_spec = parse(RegionSpec, json.loads(meta.get("/spec")[0]))
        except NotFound:
            self.region_spec = config.region
            try:
                meta.create("/spec", config.region.model_dump_json().encode())
            except Conflict:  # another replica starting at once stored it first
                self.region_spec = parse(RegionSpec, json.loads(meta.get("/spec")[0]))
        self.events = EventLog(store, config.retention)
        self.tokens = TokenStore(store)
        self.logs = TaskLogs()
        self.liveness = self._health_check()
        self.sim: Simulation | None = None
        #: per machine: bumped whenever its desired set changes (agents long-poll it),
        #: counted from a base set when this replica starts leading (a generation an
        #: agent got from the previous leader is never taken for the current one)
        self.generation: dict[str, int] = {}
        self.gen_base = 0
        #: per machine: (generation, desired set, tasks being stopped there with the
        #: request behind it, the host profile it must carry) as the last pass left
        #: it; an agent's long-poll reads it without the lock
        self.desired_view: dict[str, tuple[int, list[Assignment], Stops,
                                           dict[str, Any] | None]] = {}
        self._created = time.monotonic()
        #: a follower's copy of the job records (``keep_warm``), for a fast takeover
        self.warm: WarmRecords | None = None
        #: events recorded and not yet written, and the jobs whose records changed
        #: since the last pass; both guarded by ``pending_lock`` (never held long)
        self._pending: list[NewEvent] = []
        self.pending_lock = threading.Lock()
        self.inbox: set[str] = set()
        #: set to start the next pass now
        self.wake = Wake()
        self.steps = 0
        self.failures = 0
        self.last_step: float | None = None
        self.loop = Loop(self)
        self.commands = JobCommands(self)
        self.creates = CreateCommitter(self)
        self.views = Views(self)
        self.gateway = AgentGateway(self)
        self.machine_ops = MachineOps(self)
        self.membership = Membership(self)
        self.controllers = Controllers(self)
        self.profiles = HostProfiles(self)
        self.autoscaling = Autoscaling(self)
        self.jcp = JobControlPlane(self)
        self.owners = Owners(self)
        self.build(now)

    def _fleet(self) -> Fleet:
        """The region's machines: the generated ones of its spec, then those their
        agents registered (``/region/machines``), in the order they registered."""
        base = generate(self.region_spec)
        try:
            names = self.meta.children("/machines")
        except NotFound:
            names = []
        if not names:
            return base
        added = sorted((json.loads(self.meta.get(f"/machines/{n}")[0]) for n in names),
                       key=lambda d: (d["seq"], d["id"]))
        return Fleet.from_machines(
            [base.machine(i) for i in range(len(base))] + [_machine(d) for d in added])

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
            self.liveness = self._health_check()
            grace = max(config.heartbeat_timeout, config.startup_grace
                        - (time.monotonic() - self._created))
            if self.warm is not None:
                self.warm.refresh()  # what changed since the follower last looked
            self.build(now, grace=grace, warm=self.warm)
            # (a rebuild on registration keeps it: _build)
            self.persist.fence = self.region.fence = self.events.fence = fence
            self.generation.clear()
            self.gen_base = int(time.time() * 1000)
            self.steps = 0  # the first pass reads every stored job
        self.gateway.waiters.notify_all()

    def keep_warm(self) -> None:
        """A follower's chore: catch up with the leader's event log and job records now
        and then, so a takeover reads only what is new."""
        self.events.refresh()
        if self.warm is None:
            self.warm = WarmRecords(self.store)
        self.warm.refresh()

    def build(self, now: float, grace: float | None = None,
              warm: WarmRecords | None = None) -> None:
        """Brokers, allocator and scheduler over the region's machines, from the store
        (at start, and again when a machine registers: a new machine changes the index
        every part is built on)."""
        store, config = self.store, self.config
        self.fleet = fleet = self._fleet()
        allocators: list[PersistentAllocator] = []

        def allocator(index: MachineIndex) -> PersistentAllocator:
            allocators.append(PersistentAllocator.load(
                index, store, shared_pool=config.shard is not None))
            return allocators[0]
        region = PersistentRegion.load(fleet, store, now)
        self.scheduler = wire(fleet, config.scheduler, now, region=region,
                              allocator=allocator).scheduler
        self.region, self.allocator = region, allocators[0]
        self.allocator.sink = self.metrics  # (each allocation request counted and timed)
        self.allocator.defer()  # placements are written with the scheduler's state
        previous: PersistentScheduler | None = getattr(self, "persist", None)
        fence = previous.fence if previous is not None else None
        self.persist = PersistentScheduler.load(self.scheduler, store, now,
                                                _controllers, warm=warm)
        self.desired_view = {}
        self.persist.fence = region.fence = fence
        self.persist.only_held = config.shard is not None
        self.views.publish(None)
        self.profiles.load()
        self.jobs = self.persist.jobs
        self.jobs.admit = self.owners.admit  # (each write checked against the limits)
        start = config.sim_start_seconds

        def behaviour(a: Assignment) -> Behaviour:
            if a.spec.command in ("finish", "fail"):
                return Behaviour(start_seconds=start, stop_seconds=start / 2,
                                 finish_after=start, exit_code=int(a.spec.command == "fail"))
            return Behaviour(start_seconds=start, stop_seconds=start / 2,
                             crash=a.spec.command == "crash", crash_after=start)
        old = self.sim
        if config.sim_agents:
            self.sim = Simulation(self.fleet, behaviour, scheduler=self.scheduler, now=now)
            self.sim.output = []  # the simulated processes' output goes to the task logs
            self.sim.carry_calls = False  # the dispatcher sends TaskControl calls
            if old is not None:  # the simulated processes live on
                self.sim.agents = old.agents
            return
        # real agents: a machine is up only while its agent beats
        down = {e.id[len("health-"):] for e in self.region.events()
                if e.id.startswith("health-")}
        if self.shared is not None:  # a shard watches its own machines only
            owned = {self.fleet.name(m) for m in range(len(self.fleet)) if self.membership.owns(m)}
            for name in set(self.liveness.last) - owned:
                self.membership.disown(name)
            self.membership.owned = owned
        for m in range(len(self.fleet)):
            name = self.fleet.name(m)
            if name in self.liveness.last:
                continue  # (a rebuild: known already)
            if self.shared is not None and name not in self.membership.owned:
                continue
            if name in down:
                self.liveness.last[name] = float("-inf")
                self.liveness.down.add(name)
            else:
                # its agent has a while to come back (it may be starting too)
                self.liveness.watch(name, now, self.config.startup_grace
                                    if grace is None else grace)

    def _health_check(self) -> HealthCheck:
        config = self.config
        return HealthCheck(config.heartbeat_timeout, hold_fraction=config.silence_hold_fraction,
                           hold_min=config.silence_hold_min)

    def known(self, machine: str) -> bool:
        try:
            self.fleet.index_of(machine)
            return True
        except NotFound:
            return False

    def entitlement_of(self, job: str) -> str | None:
        try:
            return self.jobs.get(job).entitlement
        except NotFound:
            return None

    def owner_of_job(self, job: str) -> str:
        """The owner of a job's entitlement ("": unknown): whose calls a job's
        TaskController and gates are, for the bounds per tenant."""
        held = self.scheduler.jobs.get(job)  # (the pass's own record: no store read)
        entitlement = held.entitlement if held is not None else self.entitlement_of(job)
        found = self.allocator.entitlements.get(entitlement) if entitlement else None
        return found.owner if found is not None else ""

    def notify(self, job: str) -> None:
        """A job's record changed: apply it on the next pass, which starts now (and
        read it again for the next list)."""
        self.views.index.touch(job)
        with self.pending_lock:
            self.inbox.add(job)
        self.wake.set()

    def notify_many(self, jobs: list[str]) -> None:
        """Jobs' records changed (a batch of creates): one wake of the pass for all
        (and each read again for the next list)."""
        if jobs:
            for job in jobs:
                self.views.index.touch(job)
            with self.pending_lock:
                self.inbox.update(jobs)
            self.wake.set()

    def record(self, source: str, kind: str, message: str, job: str | None = None,
               entitlement: str | None = None, machine: str | None = None,
               at: float | None = None, *, actor: str | None = None,
               task: int | None = None, op: str | None = None, reason: str | None = None,
               decision: str | None = None, request: str | None = None) -> None:
        """An event for the region's log. Within an API request, its caller is the
        actor and its id the request, unless given; else the source is the actor."""
        # (a URL in a message shows no credential: a gate's, a TaskController's)
        event = NewEvent(self.clock() if at is None else at, source, kind,
                         redact_text(message), job,
                         entitlement, machine,
                         actor or requestid.actor.get() or source, task, op, reason,
                         decision, request or requestid.current.get())
        with self.pending_lock:
            self._pending.append(event)
        self.metrics.event(kind)

    def record_scheduler_events(self, drained: list[Fields]) -> None:
        """The scheduler's events of a pass (``EventRows.take``) for the region's log,
        each of its job's entitlement, as ``record`` makes them (the scheduler the
        actor of those no one asked for)."""
        if not drained:
            return
        jobs, counts = self.scheduler.jobs, Counter[str]()
        made = []
        for (at, job, kind, message, task, machine, op, reason, decision, actor,
             request) in drained:
            held = jobs.get(job)
            ent = held.entitlement if held is not None else self.entitlement_of(job)
            made.append(new_event(at, "scheduler", kind, redact_text(message), job, ent,
                                  machine,
                                  actor or "scheduler", task, op, reason, decision,
                                  request or requestid.current.get()))
            counts[kind] += 1
        with self.pending_lock:
            self._pending.extend(made)
        for kind, n in counts.items():
            self.metrics.event(kind, n)

    def drop_pending_events(self) -> int:
        """Forget the events not stored yet (a replica that stopped leading: they tell
        of decisions its last passes could not store); how many there were."""
        with self.pending_lock:
            dropped, self._pending = len(self._pending), []
        return dropped

    def flush_events(self) -> None:
        with self.pending_lock:
            batch, self._pending = self._pending, []
        for start in range(0, len(batch), CHUNK):
            try:
                self.events.append(batch[start:start + CHUNK])
            except BaseException:
                with self.pending_lock:  # what was not stored is kept for the next flush
                    self._pending[:0] = batch[start:][-self.config.retention.max_count:]
                raise

    def bootstrap_admin(self) -> str | None:
        """At first start, an admin token (returned once); None if one exists."""
        if any(t.role is Role.ADMIN and not t.revoked for t in self.tokens.list()):
            return None
        _, token = self.tokens.create(Role.ADMIN, "admin", self.clock(), "created at first start")
        self.record("auth", "token_created", "admin token created at first start")
        self.flush_events()
        return token

    def entitlement(self, name: str) -> Entitlement:
        ent = self.allocator.entitlements.get(name)
        if ent is None:
            raise NotFound("entitlement", name)
        return ent

    def check_job(self, spec: JobSpec) -> None:
        found = self.allocator.entitlements.get(spec.entitlement)
        if found is None:
            raise ValidationError("entitlement",
                                  f"entitlement {spec.entitlement!r} does not exist")
        if found.canary_of is not None:
            raise ValidationError("entitlement", f"{spec.entitlement!r} is a canary "
                                  f"entitlement of {found.canary_of!r}: it holds a canary's "
                                  f"tasks only (run the job in {found.canary_of!r})")
        req = spec.policy.requirements
        self.check_dc("policy.requirements.dc", req.dc)
        self.check_dc("policy.requirements.attributes.dc", req.attributes.get("dc"))

    def check_dc(self, field: str, dc: str | None) -> None:
        """A data center the region has (a typo would leave a job unplaceable)."""
        known = self.fleet.level_names["dc"]
        if dc is not None and dc not in known:
            raise ValidationError(field, f"unknown data center {dc!r}: this region has "
                                         f"{', '.join(known)}")

    def machine_index(self, machine: str) -> int:
        try:
            return self.fleet.index_of(machine)
        except (KeyError, ValueError, NotFound):
            raise NotFound("machine", machine) from None
