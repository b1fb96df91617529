"""The control plane of one region in one process: brokers, allocator and scheduler
over a store, the event log, tokens, and the loop that drives them.

Requests and the loop meet here. A job operation is a durable write of the job
record (``JobStore``), acknowledged once stored; the loop then applies it to the
scheduler (``PersistentScheduler.sync``), reconciles (``tick``), and writes back the
tasks' state. Machine operations (fail, cordon, drain, maintenance) go to the brokers,
which write them through. Everything that touches the in-memory core holds
``self.lock``; job creates do not, so they are not slowed by a long reconcile.

Without real agents (``sim_agents``), simulated agents run the tasks, so a region
can be tried on one box before any machine joins.
"""

from __future__ import annotations

import contextlib
import gc
import json
import secrets
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from plait.allocator import AllocationRequest, MachineIndex
from plait.errors import Conflict, NotFound, TransientError, ValidationError
from plait.health import HealthCheck
from plait.model import Entitlement, Fleet, JobSpec, RegionSpec, Resources, generate, parse
from plait.model.entitlement import NAME_RE
from plait.model.events import EventKind, UnavailabilityEvent
from plait.model.machine import FaultDomain, Machine, MachineState
from plait.model.task import TaskRef, TaskState
from plait.persist import PersistentAllocator, PersistentRegion
from plait.persist.follow import SharedRecords
from plait.persist.scheduler import JobDoc, JobStore, PersistentScheduler
from plait.persist.warm import WarmRecords
from plait.scheduler import Scheduler, SchedulerConfig
from plait.scheduler.records import Assignment, JobRecord, TaskStatus
from plait.server.auth import Role, TokenStore
from plait.server.events import EventLog, Retention
from plait.server.logs import TaskLogs
from plait.sim import Behaviour, Simulation
from plait.store.protocol import Namespace, Store, Transaction
from plait.store.shard import ShardStore, shard_prefix
from plait.taskcontrol import signing
from plait.taskcontrol.dispatch import DEFAULT_DEADLINE, DEFAULT_MAX_REPLY, Dispatcher
from plait.taskcontrol.protocol import ControllerAnswer, RemoteController
from plait.taskcontrol.urlpolicy import UrlPolicy, networks, own_addresses
from plait.taskcontrol.worker import DispatcherProcess, Settings
from plait.tls import verify as tls_verify

#: a drained machine stays out of service until uncordoned (at most this long)
DRAIN_HOLD = 365 * 86400.0

#: the interpreter's thread switch interval while a loop runs (seconds)
SWITCH_INTERVAL = 0.001

#: gen-1 collections between two automatic full ones: never, in effect (the loop runs
#: them itself, ``ControlPlane._collect``)
FULL_COLLECTIONS_NEVER = 1 << 30

#: an inbox entry that asks for every stored job
_RESYNC = "/all"

EventTuple = tuple[float, str, str, str, str | None, str | None, str | None]


@dataclass(frozen=True)
class JobState:
    """What readers see of a job's tasks: made by a pass under the lock, read
    without it."""

    entitlement: str
    target: int
    records: int
    counts: dict[str, int]
    serving: int
    updated: int
    halted: str | None
    rollout_active: bool
    moving_from: str | None
    on_entitlement: int
    unplaced_reason: str | None
    error: str | None
    unavailable: int
    tasks: tuple[dict[str, Any], ...]
    #: (index, machine) of the tasks enabled in service discovery
    serving_on: tuple[tuple[int, str], ...]
    #: the last operation of the job's log the scheduler has applied
    applied_operation: int
    #: operations wanted, acked or under way (a restart, an update, a move...)
    busy: bool

    @classmethod
    def of(cls, sched: Scheduler, job: JobRecord, fleet: Fleet,
           applied: int) -> JobState:
        counts: dict[str, int] = {}
        serving = updated = 0
        target, running = job.target, TaskState.RUNNING
        tasks = []
        serving_on = []
        for r in sorted(job.tasks.values(), key=lambda r: r.index):
            counts[r.state.value] = counts.get(r.state.value, 0) + 1
            serving += r.serving
            updated += r.spec_version == target and r.state is running and r.healthy
            machine = None if r.machine is None else fleet.name(r.machine)
            tasks.append({"index": r.index, "state": r.state.value, "version": r.spec_version,
                          "machine": machine, "serving": r.serving, "healthy": r.healthy,
                          "exit_code": r.exit_code,
                          "operation": None if r.op is None else r.op.kind.value})
            if r.serving and machine is not None:
                serving_on.append((r.index, machine))
        return cls(job.entitlement, target, len(job.tasks), counts, serving, updated, job.halted,
                   job.rollout_active, job.moving_from, sched.on_entitlement(job),
                   job.unplaced_reason, job.error, sched.unavailable(job), tuple(tasks),
                   tuple(serving_on), applied,
                   bool(job.offers or job.acked or job.in_progress
                        or any(r.restart for r in job.tasks.values())))


@dataclass(frozen=True)
class ControlPlaneConfig:
    #: the region's machines on first start (later starts use the stored one)
    region: RegionSpec = field(default_factory=lambda: RegionSpec.sized(
        48, dcs=2, msbs_per_dc=3, rows_per_msb=1, racks_per_row=2))
    #: seconds between reconcile passes (a job operation wakes the loop at once)
    tick_seconds: float = 0.5
    #: but passes start at least this far apart
    min_pass_gap: float = 0.05
    #: every this many passes, look at every stored job (a safety net for a missed
    #: wake-up)
    resync_passes: int = 600
    #: move long-lived objects out of the garbage collector's reach this often, and
    #: run a full collection this often (see ``ControlPlane._collect``)
    gc_freeze_seconds: float = 5.0
    gc_full_seconds: float = 600.0
    #: run simulated agents on every machine (no real agents needed)
    sim_agents: bool = False
    #: seconds a simulated task takes to start (half that to stop)
    sim_start_seconds: float = 2.0
    retention: Retention = field(default_factory=Retention)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    #: how long a drain leaves TaskControl to move tasks before they are stopped
    drain_deadline_seconds: float = 300.0
    #: a machine whose agent has not heartbeated this long is unavailable (real agents)
    heartbeat_timeout: float = 5.0
    #: after the control plane starts, a machine whose agent has not heartbeated yet
    #: is unavailable only after this long (its agent may be starting too)
    startup_grace: float = 30.0
    #: the CA certificate https TaskControllers (and a leader, for a follower) are
    #: checked against (default: the system's authorities)
    ca_file: str | None = None
    #: run as this scheduler shard of the region (None: the whole region in one
    #: control plane); see ``plait.store.shard`` and decision 43
    shard: int | None = None
    #: TaskController calls (decision 45): the hard deadline of one call (connect to
    #: the reply's last byte), the largest reply read, how many calls at once
    controller_deadline: float = DEFAULT_DEADLINE
    controller_reply_bytes: int = DEFAULT_MAX_REPLY
    controller_concurrency: int = 64
    #: the networks controller URLs may point into (``plait.taskcontrol.urlpolicy``;
    #: ``loopback`` and ``any`` are shorthands); loopback and link-local only when
    #: named explicitly
    controller_networks: tuple[str, ...] = ("any",)
    #: send them from a process of its own (``plait.taskcontrol.worker``), so their
    #: HTTP work never competes with the pass and the API for this process's
    #: interpreter; else from a thread of this process
    controller_process: bool = True


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


class ControlPlane:
    def __init__(self, store: Store, config: ControlPlaneConfig | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.config = config = config or ControlPlaneConfig()
        #: a shard sees its own records under /shards/S, and the region's as they are
        self.shared: SharedRecords | None = None
        if config.shard is not None:
            store = ShardStore(store, config.shard)
            with contextlib.suppress(Conflict):  # the front end finds the shards here
                store.create(f"/frontend/shards/{config.shard}", b"{}")
            self.shared = SharedRecords(store)  # (before the build: no change missed)
        self.store = store
        #: a shard's machines: bound to its entitlements (and, for shard 0, the free
        #: ones); the others' agents are answered by their shards
        self._owned: set[str] = set()
        self._stale = False
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
        #: (job, index) -> "host:port" the task's agent reported
        self.endpoints: dict[tuple[str, int], str] = {}
        self.liveness = HealthCheck(config.heartbeat_timeout)
        self.sim: Simulation | None = None
        #: per machine: bumped whenever its desired set changes (agents long-poll it),
        #: counted from a base set when this replica starts leading (a generation an
        #: agent got from the previous leader is never taken for the current one)
        self._generation: dict[str, int] = {}
        self._gen_base = 0
        self._created = time.monotonic()
        #: a follower's copy of the job records (``keep_warm``), for a fast takeover
        self.warm: WarmRecords | None = None
        self._sync_errors: dict[str, None] = {}
        self._pending: list[EventTuple] = []
        self._pending_lock = threading.Lock()
        self._inbox: set[str] = set()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.steps = 0
        self.failures = 0
        self.last_step: float | None = None
        self._drains = 0
        self._last_full = self._last_freeze = 0.0
        #: agents' reports taken by the API and applied by the next pass (a heartbeat
        #: never waits for a pass), and the heartbeats' times, read by the next pass
        self._reports: list[tuple[str, list[TaskStatus], dict[tuple[str, int], str],
                                  float]] = []
        self._beats: dict[str, float] = {}
        #: per machine: (generation, desired set) as the last pass left it; an agent's
        #: long-poll reads it without the lock
        self._desired_view: dict[str, tuple[int, list[Assignment]]] = {}
        #: TaskControl off the pass: answers handed back by the dispatcher
        self._answers: list[ControllerAnswer] = []
        self.url_policy = UrlPolicy(allow=networks(config.controller_networks))
        self._signing_secret: bytes | None = None
        self.dispatcher: Dispatcher | DispatcherProcess | None = None
        #: per job: what readers see of its tasks, as the last pass left them
        self._views: dict[str, JobState] = {}
        self._build(now)

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
            self.liveness = HealthCheck(config.heartbeat_timeout)
            self.endpoints.clear()  # (reported again by the agents within a step)
            grace = max(config.heartbeat_timeout, config.startup_grace
                        - (time.monotonic() - self._created))
            if self.warm is not None:
                self.warm.refresh()  # what changed since the follower last looked
            self._build(now, grace=grace, warm=self.warm)
            self.persist.fence = fence  # (a rebuild on registration keeps it: _build)
            self._generation.clear()
            self._gen_base = int(time.time() * 1000)
            self.steps = 0  # the first pass reads every stored job

    def keep_warm(self) -> None:
        """A follower's chore: catch up with the leader's event log and job records now
        and then, so a takeover reads only what is new."""
        self.events.refresh()
        if self.warm is None:
            self.warm = WarmRecords(self.store)
        self.warm.refresh()

    def _build(self, now: float, grace: float | None = None,
               warm: WarmRecords | None = None) -> None:
        """Brokers, allocator and scheduler over the region's machines, from the store
        (at start, and again when a machine registers: a new machine changes the index
        every part is built on)."""
        store, config = self.store, self.config
        self.fleet = self._fleet()
        self.region = PersistentRegion.load(self.fleet, store, now)
        self.allocator = PersistentAllocator.load(MachineIndex(self.fleet, self.region), store,
                                                  shared_pool=config.shard is not None)
        self.allocator.defer()  # placements are written with the scheduler's state
        self.scheduler = Scheduler(self.allocator, config.scheduler, now)
        previous: PersistentScheduler | None = getattr(self, "persist", None)
        fence = previous.fence if previous is not None else None
        self.persist = PersistentScheduler.load(self.scheduler, store, now,
                                                _controllers, warm=warm)
        self._desired_view = {}
        self.persist.fence = fence
        self.persist.only_held = config.shard is not None
        self._publish(None)
        self.jobs: JobStore = self.persist.jobs
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
            owned = {self.fleet.name(m) for m in range(len(self.fleet)) if self._owns(m)}
            for name in set(self.liveness.last) - owned:
                self._disown(name)
            self._owned = owned
        for m in range(len(self.fleet)):
            name = self.fleet.name(m)
            if name in self.liveness.last:
                continue  # (a rebuild: known already)
            if self.shared is not None and name not in self._owned:
                continue
            if name in down:
                self.liveness.last[name] = float("-inf")
                self.liveness.down.add(name)
            else:
                # its agent has a while to come back (it may be starting too)
                self.liveness.watch(name, now, self.config.startup_grace
                                    if grace is None else grace)

    # -- the loop --------------------------------------------------------------------------
    def step(self) -> None:
        """One pass: apply stored job operations, reconcile, store the outcome."""
        with self.lock:
            now = self.clock()
            if self._stale:  # a handoff's rebuild failed: read everything again
                self._build(now)
                self._stale = False
                self.steps = 0
            if self.shared is not None:
                self._follow(now)
            self._take_reports(now)
            names = self._take_inbox()
            try:
                errors = self.persist.sync(now, names)
            finally:  # what could not be read or applied is tried again next pass
                with self._pending_lock:
                    self._inbox |= self.persist.failed
            for error in errors:
                if error not in self._sync_errors:  # once, not on every pass
                    self._sync_errors[error] = None
                    while len(self._sync_errors) > 1000:
                        del self._sync_errors[next(iter(self._sync_errors))]
                    self.record("scheduler", "operation_failed", error)
            with self._pending_lock:
                answers, self._answers = self._answers, []
            for answer in answers:
                self.scheduler.answer(answer)
            if self.sim is not None:
                self.sim.step(now)
                self._sim_output()
            else:
                self._check_health(now)
                self.region.tick(now)
                self.scheduler.tick(now)
                # desired sets that changed (in this pass, or by reports since the
                # last): wake the agents long-polling them (simulated agents are
                # stepped by the simulation, which reads the same set); the set is
                # kept first, then the generation bumped, so a long-poll never reads
                # a generation newer than the set
                touched, self.scheduler.touched = self.scheduler.touched, set()
                gen, name, view = self._generation, self.fleet.name, self._desired_view
                for m in touched:
                    key = name(m)
                    g = gen.get(key, 0) + 1
                    view[key] = (self._gen_base + g, self.scheduler.desired_for(key))
                    gen[key] = g
            calls = self.scheduler.take_calls()
            # events are attributed before the save drops the records of deleted jobs
            events, self.scheduler.events[:] = list(self.scheduler.events), []
            for ev in events:
                job = self.scheduler.jobs.get(ev.job)
                ent = job.entitlement if job is not None else self._entitlement_of(ev.job)
                self.record("scheduler", ev.kind, ev.message, job=ev.job, entitlement=ent,
                            at=ev.time)
            changed = self.scheduler.changed_jobs
            changed = None if changed is None else set(changed)
            self.persist.save(self.allocator)
            self._publish(changed)
            if self.steps % self.config.resync_passes == 0 and self.steps:
                with self._pending_lock:  # a safety net: every stored job is looked at
                    self._inbox.add(_RESYNC)
            self.steps += 1
            self.last_step = time.monotonic()
            # before the lock goes: whoever reads the outcome of this pass (a job that
            # failed) can read the events that say why
            self.flush_events()
        if calls:  # TaskControl after the pass, off the lock (decision 45)
            self._dispatcher().send(calls)

    def _take_reports(self, now: float) -> None:
        """Apply the agents' reports taken since the last pass, in order, and their
        heartbeats."""
        with self._pending_lock:
            reports, self._reports = self._reports, []
            beats, self._beats = self._beats, {}
        for machine, at in beats.items():
            if self._known(machine):
                self.liveness.beat(machine, at)
        jobs = self.scheduler.jobs
        for machine, statuses, endpoints, at in reports:
            try:
                m = self._check_owned(machine)
            except (NotFound, TransientError):
                continue  # (the machine left this shard since it reported)
            self.scheduler.report(machine, statuses, max(at, self.scheduler.now))
            for (job, index), endpoint in endpoints.items():
                found = jobs.get(job)
                rec = found.tasks.get(index) if found is not None else None
                if rec is not None and rec.machine == m:  # only where the task is placed
                    self.endpoints[(job, index)] = endpoint

    # -- TaskControl, off the pass ----------------------------------------------------------
    def _dispatcher(self) -> Dispatcher | DispatcherProcess:
        """The TaskControl dispatcher, started at the first call: in a process of its
        own (``controller_process``), or a thread of this one."""
        if self.dispatcher is None:
            config = self.config
            if config.controller_process:
                self.dispatcher = DispatcherProcess(self._deliver, Settings(
                    deadline=config.controller_deadline,
                    max_reply_bytes=config.controller_reply_bytes,
                    max_in_flight=config.controller_concurrency, policy=self.url_policy,
                    ca_file=config.ca_file, secret=self._secret()))
            else:
                self.dispatcher = Dispatcher(
                    self._deliver, deadline=config.controller_deadline,
                    max_reply_bytes=config.controller_reply_bytes,
                    max_in_flight=config.controller_concurrency, policy=self.url_policy,
                    verify=lambda url: tls_verify(config.ca_file, url),
                    key_for=self.controller_key, clock=self.clock)
        return self.dispatcher

    def _deliver(self, answer: ControllerAnswer) -> None:
        with self._pending_lock:
            self._answers.append(answer)
        self._wake.set()

    def serving_at(self, *urls: str) -> None:
        """The API's own URLs: a controller URL may not point at them."""
        policy = self.url_policy
        self.url_policy = UrlPolicy(allow=policy.allow, own=policy.own | own_addresses(urls))
        if self.dispatcher is not None:
            self.dispatcher.policy = self.url_policy

    def check_controller_url(self, url: str, resolve_timeout: float = 2.0) -> None:
        """Refuse a controller URL the policy does not allow (a ``ValidationError``
        naming the rule). A name is resolved with a bound; one that does not resolve
        now is left to the check at each call."""
        policy = self.url_policy
        host, port = policy.host(url)
        literal = policy.literal(host)
        if literal is not None:
            policy.check(url, [str(literal)])
            return
        found: list[str] = []

        def resolve() -> None:
            with contextlib.suppress(OSError, UnicodeError):
                found.extend(sorted({str(i[4][0]) for i in socket.getaddrinfo(
                    host, port, type=socket.SOCK_STREAM)}))
        worker = threading.Thread(target=resolve, daemon=True)
        worker.start()
        worker.join(resolve_timeout)
        if found and not worker.is_alive():
            policy.check(url, found)

    def _secret(self) -> bytes:
        """The region's TaskControl signing secret (made at first use, shared by every
        replica and shard: it lives under /auth)."""
        if self._signing_secret is None:
            key = "/auth/taskcontrol-secret"
            try:
                self._signing_secret = bytes.fromhex(self.store.get(key)[0].decode())
            except NotFound:
                fresh = secrets.token_bytes(32)
                try:
                    self.store.create(key, fresh.hex().encode())
                    self._signing_secret = fresh
                except Conflict:  # another replica made it first
                    self._signing_secret = bytes.fromhex(self.store.get(key)[0].decode())
        return self._signing_secret

    def controller_key(self, job: str) -> str:
        """The key a job's controller verifies this region's calls with."""
        return signing.job_key(self._secret(), job)

    def _check_health(self, now: float) -> None:
        """Flow 2: a machine whose agent stopped heartbeating fails in its broker (its
        tasks are disabled in discovery and replaced per TaskControl); one that is
        back is healthy again."""
        if self.shared is not None:
            self._track_owned(now)
        went, came = self.liveness.check(now)
        for machine in went:
            self.region.add_event(UnavailabilityEvent(
                f"health-{machine}", EventKind.FAILURE, (machine,), now, None,
                f"no heartbeat for {self.liveness.timeout:g}s"), now)
            self.record("health", "machine_unreachable",
                        f"{machine}: no heartbeat for {self.liveness.timeout:g}s", machine=machine)
        for machine in came:
            with contextlib.suppress(NotFound):
                self.region.end_event(f"health-{machine}", now)
            self.record("health", "machine_back", f"{machine}: heartbeating again",
                        machine=machine)

    # -- a shard among others -------------------------------------------------------------
    def _owns(self, m: int) -> bool:
        """Whether this control plane manages machine ``m`` (always, unsharded)."""
        if self.config.shard is None:
            return True
        ent = self.region.broker_of(m).entitlement_of(m)
        if ent is None:
            return self.config.shard == 0
        return ent in self.allocator.entitlements

    def _check_owned(self, machine: str) -> int:
        m = self.machine_index(machine)
        if not self._owns(m):
            raise TransientError(f"machine {machine} is not managed by scheduler shard "
                                 f"{self.config.shard} (now): ask the front end again")
        return m

    def _disown(self, name: str) -> None:
        """A machine another shard manages now: not watched here, and an agent
        long-polling its set here is answered (and sent on by the front end)."""
        self.liveness.last.pop(name, None)
        self.liveness.grace.pop(name, None)
        self.liveness.down.discard(name)
        self._generation[name] = self._generation.get(name, 0) + 1

    def _track_owned(self, now: float) -> None:
        """Machines that came to this shard (claimed from the free pool, an
        entitlement moved here) are watched from now, with one heartbeat timeout for
        their agents to be heard here; those that left are not."""
        fleet = self.fleet
        owned = {fleet.name(m) for m in range(len(fleet)) if self._owns(m)}
        if owned == self._owned:
            return
        for name in self._owned - owned:
            self._disown(name)
        down = {e.id[len("health-"):] for e in self.region.events()
                if e.id.startswith("health-")}
        for name in owned - self._owned:
            if name in down:  # failed while another shard watched it
                self.liveness.last[name] = float("-inf")
                self.liveness.down.add(name)
            else:
                self.liveness.watch(name, now, self.config.heartbeat_timeout)
        self._owned = owned

    def _known(self, machine: str) -> bool:
        try:
            self.fleet.index_of(machine)
            return True
        except NotFound:
            return False

    def _follow(self, now: float) -> None:
        """What other shards changed in the region's shared records: machines that
        registered (a rebuild), bindings and cordons (adopted), events."""
        assert self.shared is not None
        machines, events, registered = self.shared.take()
        if registered and not all(self._known(name) for name in self.meta.children("/machines")):
            self.persist.save(self.allocator)  # nothing in memory is lost by the rebuild
            self._build(now)
            return  # (the rebuild read every record)
        for name in machines:
            with contextlib.suppress(NotFound):
                self.region.adopt(self.fleet.index_of(name))
        for event_id in events:
            self.region.adopt_event(event_id, now)

    def handoff(self, entitlement: str, to_shard: int) -> int:
        """Move ``entitlement`` to scheduler shard ``to_shard``: its records (the
        entitlement, its jobs and their tasks' state and placements) go from this
        shard's part of the store to the other's in one transaction, and this shard
        stops managing them. Its tasks are untouched. Returns how many jobs moved."""
        if self.config.shard is None:
            raise ValidationError("shard", "this control plane is not sharded")
        if to_shard == self.config.shard:
            raise ValidationError("shard", f"entitlement {entitlement!r} is on shard "
                                           f"{to_shard} already")
        with self.lock:
            self.entitlement(entitlement)
            self.persist.save(self.allocator)  # what is in memory, stored first
            view = self.store
            assert isinstance(view, ShardStore)
            there = shard_prefix(to_shard)
            for name, job in self.scheduler.jobs.items():
                if job.moving_from is not None and entitlement in (job.moving_from,
                                                                   job.entitlement):
                    raise Conflict(f"entitlement {entitlement}", "no job moving in or out",
                                   f"job {name} moving from {job.moving_from} to "
                                   f"{job.entitlement}: wait for it to finish")
            # every job of the entitlement, applied or only stored (acknowledged, not
            # yet applied by the loop)
            stored = self.jobs.get_many(self.jobs.names())
            jobs = sorted({name for name, j in self.scheduler.jobs.items()
                           if j.entitlement == entitlement}
                          | {name for name, doc in stored.items()
                             if doc.entitlement == entitlement})
            names = self.region.entitlements.names
            for name, state in self.allocator.jobs.items():
                ents = {names[e] for e in state.ents.values()} | {names[state.entitlement]}
                if entitlement in ents and ents != {entitlement}:
                    raise Conflict(f"entitlement {entitlement}", "no job moving in or out",
                                   f"job {name} moving between entitlements "
                                   f"{' and '.join(sorted(ents))}: wait for it to finish")
            keys = [f"/allocator/entitlements/{entitlement}"] + [
                f"/{part}/{name}" for name in jobs
                for part in ("allocator/jobs", "scheduler/jobs", "scheduler/state")]
            txn = Transaction()
            if self.persist.fence is not None:  # only while this replica still leads
                txn.check(*self.persist.fence)
            for key, (value, version) in view.get_many(keys).items():
                txn.create(there + key, value)
                txn.delete(view.prefix + key, version)
            view.base.commit(txn)
            # the records are gone: this shard must not go on from its memory of them
            for attempt in range(3):
                try:
                    self._build(self.clock())
                    break
                except Exception:
                    if attempt == 2:
                        self._stale = True  # rebuilt by the next pass
                        raise
                    time.sleep(0.1)
        self.record("scheduler", "entitlement_moved",
                    f"{entitlement}: {len(jobs)} jobs handed to scheduler shard {to_shard}",
                    entitlement=entitlement)
        self._wake.set()
        return len(jobs)

    def reload(self, entitlement: str | None = None) -> None:
        """Read this shard's records again (``entitlement`` was moved here: until it
        is seen in the store, a TransientError): the loop goes on from them; agents'
        long-polls see a new generation."""
        if self.config.shard is None:
            raise ValidationError("shard", "this control plane is not sharded")
        if entitlement is not None and not NAME_RE.match(entitlement):
            raise ValidationError("entitlement", f"{entitlement!r} is not an entitlement name")
        with self.lock:
            now = self.clock()
            sync: Any = getattr(self.store, "sync", None)
            if sync is not None:
                sync()  # (ZooKeeper: read what the handoff wrote, not a lagging copy)
            if entitlement is not None and not self.store.exists(
                    f"/allocator/entitlements/{entitlement}"):
                raise TransientError(f"entitlement {entitlement!r} has not reached scheduler "
                                     f"shard {self.config.shard} yet: retry")
            self.persist.save(self.allocator)
            self._build(now)
            self._gen_base = int(time.time() * 1000)
            self._generation.clear()
            self.steps = 0  # the next pass reads every stored job
        self._wake.set()

    def _sim_output(self) -> None:
        assert self.sim is not None and self.sim.output is not None
        lines, self.sim.output[:] = list(self.sim.output), []
        job_of = self.scheduler.jobs.get
        for ref, at, line in lines:
            job = job_of(ref.job)
            rec = job.tasks.get(ref.index) if job is not None else None
            machine = self.fleet.name(rec.machine) if rec is not None and (
                rec.machine is not None) else "?"
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(at))
            self.logs.append(ref.job, ref.index, machine, f"{stamp} {line}\n")

    def _entitlement_of(self, job: str) -> str | None:
        try:
            return self.jobs.get(job).entitlement
        except NotFound:
            return None

    def _take_inbox(self) -> list[str] | None:
        with self._pending_lock:
            names, self._inbox = self._inbox, set()
        if self.steps == 0 or _RESYNC in names:
            return None  # every stored job
        return sorted(names)

    def notify(self, job: str) -> None:
        """A job's record changed: apply it on the next pass, which starts now."""
        with self._pending_lock:
            self._inbox.add(job)
        self._wake.set()

    def _collect(self, started: float) -> None:
        """Keep the garbage collector's full passes off the request path: the region's
        long-lived state (job records, specs) is frozen out of the collector every
        ``gc_freeze_seconds`` after a young-generation pass, and a full collection runs
        every ``gc_full_seconds`` (a full pass over 4,000 jobs' state takes about
        0.1 s, which would otherwise land on whichever request comes next)."""
        config = self.config
        if started - self._last_full >= config.gc_full_seconds:
            gc.unfreeze()
            gc.collect()
            gc.freeze()
            self._last_full = self._last_freeze = started
        elif started - self._last_freeze >= config.gc_freeze_seconds:
            gc.collect(1)
            gc.freeze()
            self._last_freeze = started

    def run(self) -> None:
        # the pass is CPU-bound Python: hand the interpreter to request threads every
        # millisecond rather than every 5 (a request that waits for the GIL a few
        # times would otherwise wait a pass's 5 ms slice each time)
        sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL))
        # full collections only from ``_collect``: an automatic one would scan what
        # survived since the last freeze, 20-70 ms under a thousand busy jobs, on
        # whichever request came next
        young, middle, _ = gc.get_threshold()
        gc.set_threshold(young, middle, FULL_COLLECTIONS_NEVER)
        self._last_full = self._last_freeze = time.monotonic()
        gc.collect()
        gc.freeze()
        while not self._stop.is_set():
            self._wake.clear()
            started = time.monotonic()
            try:
                self.step()
                self._collect(started)
            except Exception as exc:  # the loop must outlive one bad pass (a store outage)
                self.failures += 1
                self.record("controlplane", "step_failed", f"{type(exc).__name__}: {exc}")
                with contextlib.suppress(Exception):  # the store is still down: the
                    self.flush_events()                # events wait for the next flush
            self._wake.wait(self.config.tick_seconds)
            # a burst of requests is taken in batches, not one pass per request
            rest = self.config.min_pass_gap - (time.monotonic() - started)
            if rest > 0:
                self._stop.wait(rest)

    def start(self) -> None:
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self.run, name="plait-loop", daemon=True)
            self._thread.start()

    def health(self) -> tuple[bool, str]:
        """Is the loop passing? (Not if no pass ended within 20 ticks, 10 s at least.)"""
        if self._thread is None:
            return True, "loop not running in this process"
        if self.last_step is None:
            return False, "no pass finished yet"
        late = time.monotonic() - self.last_step
        limit = max(10.0, 20 * self.config.tick_seconds)
        if late > limit:
            return False, f"no pass finished for {late:.0f}s ({self.failures} passes failed)"
        return True, "ok"

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None
        if self.dispatcher is not None:
            self.dispatcher.close()
            self.dispatcher = None

    # -- events ----------------------------------------------------------------------------
    def record(self, source: str, kind: str, message: str, job: str | None = None,
               entitlement: str | None = None, machine: str | None = None,
               at: float | None = None) -> None:
        with self._pending_lock:
            self._pending.append((self.clock() if at is None else at, source, kind, message,
                                  job, entitlement, machine))

    def flush_events(self) -> None:
        with self._pending_lock:
            batch, self._pending = self._pending, []
        try:
            self.events.append(batch)
        except BaseException:
            with self._pending_lock:  # kept for the next flush
                self._pending[:0] = batch[-self.config.retention.max_count:]
            raise

    # -- tokens ----------------------------------------------------------------------------
    def bootstrap_admin(self) -> str | None:
        """At first start, an admin token (returned once); None if one exists."""
        if any(t.role is Role.ADMIN and not t.revoked for t in self.tokens.list()):
            return None
        _, token = self.tokens.create(Role.ADMIN, "admin", self.clock(), "created at first start")
        self.record("auth", "token_created", "admin token created at first start")
        self.flush_events()
        return token

    # -- entitlements ----------------------------------------------------------------------
    def define_entitlement(self, ent: Entitlement) -> bool:
        """Create an entitlement, or change its quota and settings. True if new."""
        with self.lock:
            old = self.allocator.entitlements.get(ent.name)
            if old == ent:
                return False
            if old is not None and old.owner != ent.owner:
                raise Conflict(f"entitlement {ent.name}", f"owner {old.owner}",
                               f"owner {ent.owner} (owners do not change)")
            self.allocator.define(ent)
        self.record("api", "entitlement_created" if old is None else "entitlement_changed",
                    f"{ent.name}: quota {ent.quota}, owner {ent.owner}", entitlement=ent.name)
        return old is None

    def entitlement(self, name: str) -> Entitlement:
        ent = self.allocator.entitlements.get(name)
        if ent is None:
            raise NotFound("entitlement", name)
        return ent

    def entitlement_view(self, name: str) -> dict[str, Any]:
        """(No lock: plain reads of the allocator's counters and the jobs' views.)"""
        ent = self.entitlement(name)
        usage = self.allocator.usage(name)
        jobs = sorted(n for n, v in list(self._views.items()) if v.entitlement == name)
        return {**ent.model_dump(mode="json"), "machines": usage.machines,
                "rru": round(usage.rru, 3), "jobs": jobs}

    # -- jobs: writes ----------------------------------------------------------------------
    def _check_job(self, spec: JobSpec) -> None:
        if spec.entitlement not in self.allocator.entitlements:
            raise ValidationError("entitlement",
                                  f"entitlement {spec.entitlement!r} does not exist")

    def create_job(self, spec: JobSpec) -> tuple[JobDoc, bool]:
        # a shard checks and stores under its lock, so a handoff of the entitlement
        # either carries the new record or comes first (and the check refuses it)
        if spec.task_controller is not None:  # (resolving a name: never under the lock)
            self.check_controller_url(spec.task_controller)
        with self.lock if self.config.shard is not None else contextlib.nullcontext():
            self._check_job(spec)
            doc, created = self.jobs.create(spec, self.clock())
        if created:
            self.notify(spec.name)
        return doc, created

    def _changed(self, doc: JobDoc) -> JobDoc:
        self.notify(doc.name)
        return doc

    def update_job(self, spec: JobSpec) -> JobDoc:
        if spec.task_controller is not None:
            self.check_controller_url(spec.task_controller)
        self._check_job(spec)
        return self._changed(self.jobs.update(spec, self.clock()))

    def resize_job(self, name: str, task_count: int) -> JobDoc:
        return self._changed(self.jobs.resize(name, task_count, self.clock()))

    def rollback_job(self, name: str, version: int) -> JobDoc:
        return self._changed(self.jobs.rollback(name, version, self.clock()))

    def move_job(self, name: str, entitlement: str) -> JobDoc:
        """Move a job to another entitlement (a paced rollout onto its machines); checked
        against the region as it is now, then stored."""
        doc = self.jobs.get(name)
        with self.lock:
            self.scheduler.check_move(doc.spec, entitlement)
        return self._changed(self.jobs.move(name, entitlement, self.clock()))

    def restart_job(self, name: str, index: int | None = None) -> JobDoc:
        return self._changed(self.jobs.restart(name, index, self.clock()))

    def resume_job(self, name: str) -> JobDoc:
        return self._changed(self.jobs.resume(name, self.clock()))

    def delete_job(self, name: str) -> JobDoc:
        return self._changed(self.jobs.delete(name, self.clock()))

    # -- jobs: reads -----------------------------------------------------------------------
    def job_view(self, name: str) -> dict[str, Any]:
        """The job as stored (spec, versions) and as the last pass left its tasks (no
        lock: a read never waits for a pass)."""
        doc = self.jobs.get(name)
        job = self._views.get(name)
        counts = job.counts if job is not None else {}
        spec = doc.spec
        succeeded = counts.get(TaskState.SUCCEEDED.value, 0)
        failed = counts.get(TaskState.DEAD.value, 0)
        if not spec.restart.batch:
            phase = "running"
        elif failed:
            phase = "failed"  # a task exhausted its retries (the others run on)
        elif (job is not None and job.target == len(doc.versions)
              and succeeded == spec.task_count == job.records):
            phase = "complete"
        else:
            phase = "running"
        updated = job.updated if job is not None else 0
        return {
            "name": name, "entitlement": doc.entitlement, "version": len(doc.versions),
            "applied_version": job.target if job else 0,
            "spec": doc.spec.model_dump(mode="json"), "deleting": doc.deleting,
            "task_count": doc.spec.task_count, "tasks": dict(counts),
            "serving": job.serving if job else 0,
            "updated": updated, "halted": job.halted if job else None,
            "rollout_active": bool(job and (job.rollout_active or job.busy)),
            "moving_from": job.moving_from if job else None,
            "on_entitlement": job.on_entitlement if job else 0,
            "unplaced_reason": job.unplaced_reason if job else None,
            "error": job.error if job else None,
            "unavailable": job.unavailable if job else doc.spec.task_count,
            "batch": spec.restart.batch, "phase": phase, "succeeded": succeeded,
            "failed": failed, "running": counts.get(TaskState.RUNNING.value, 0),
            # the operations stored so far are applied, and nothing is under way
            "applied_operation": job.applied_operation if job else 0,
            "settled": bool(job and job.target == len(doc.versions) and not doc.deleting
                            and job.applied_operation >= doc.seq and not job.busy
                            and updated == doc.spec.task_count
                            and job.records == doc.spec.task_count),
        }

    def job_names(self, entitlements: set[str] | None = None) -> list[str]:
        names = self.jobs.names()
        if entitlements is None:
            return names
        return [n for n in names if self._entitlement_of(n) in entitlements]

    def tasks_view(self, name: str) -> list[dict[str, Any]]:
        self.jobs.get(name)  # NotFound for an unknown job
        job = self._views.get(name)
        return [dict(t) for t in job.tasks] if job is not None else []

    def discovery(self, name: str) -> list[dict[str, Any]]:
        self.jobs.get(name)
        job = self._views.get(name)
        if job is None:
            return []
        endpoints = self.endpoints
        return [{"index": i, "machine": m, "endpoint": endpoints.get((name, i))}
                for i, m in job.serving_on]

    def _publish(self, changed: set[str] | None) -> None:
        """Keep the read views of the jobs this pass changed (``None``: every job),
        so readers never take the lock (decision 45)."""
        sched, views = self.scheduler, self._views
        for name in list(sched.jobs) if changed is None else changed:
            job = sched.jobs.get(name)
            if job is None:
                views.pop(name, None)
            else:
                views[name] = JobState.of(sched, job, self.fleet,
                                          self.persist.applied.get(name, 0))
        if changed is None:
            for name in [n for n in views if n not in sched.jobs]:
                del views[name]

    def plan(self, spec: JobSpec) -> dict[str, Any]:
        """What deploying ``spec`` would do, changing nothing: the spec fields that
        differ from the current version, and where new tasks would go."""
        self._check_job(spec)
        try:
            current: JobSpec | None = self.jobs.get(spec.name).spec
        except NotFound:
            current = None
        changes = {}
        if current is not None:
            old, new = current.model_dump(mode="json"), spec.model_dump(mode="json")
            changes = {k: {"from": old.get(k), "to": new.get(k)}
                       for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)}
        with self.lock:
            job = self.scheduler.jobs.get(spec.name)
            have = set(job.tasks) if job is not None else set()
            request = AllocationRequest.of(
                spec.name, spec.entitlement, spec.resources,
                allocate=[i for i in range(spec.task_count)], policy=spec.policy)
            plan = self.allocator.propose(request)
            fleet = self.fleet
            by_dc: dict[str, int] = {}
            for _, m in plan.assign + plan.keep:
                dc = fleet.fault_domain(m).dc
                by_dc[dc] = by_dc.get(dc, 0) + 1
            runtime_changed = current is not None and any(
                k not in ("task_count",) for k in changes)
            return {
                "job": spec.name, "action": "create" if current is None else (
                    "none" if not changes else "update"),
                "changes": changes,
                "tasks_added": max(0, spec.task_count - len(have)),
                "tasks_removed": max(0, len(have) - spec.task_count),
                "tasks_updated": min(len(have), spec.task_count) if runtime_changed else 0,
                "max_unavailable": spec.update.resolve(spec.task_count),
                "placement": {"placeable": len(plan.assign) + len(plan.keep),
                              "machines_to_claim": len(plan.claims), "by_dc": by_dc,
                              "unplaced": len(plan.unplaced),
                              "unplaced_reason": plan.unplaced[0][1] if plan.unplaced else None},
            }

    # -- machines --------------------------------------------------------------------------
    def register(self, machine: Machine) -> bool:
        """A machine as its agent describes it. A machine the region has must match
        (a conflict names what differs); a new one is stored and joins the region.
        Returns whether it was new."""
        with self.lock:
            try:
                have = self.fleet.machine(self.fleet.index_of(machine.id))
            except NotFound:
                have = None
            if have is not None:
                differs: dict[str, tuple[str, str]] = {}
                if have.fault_domain != machine.fault_domain:
                    differs["fault_domain"] = (str(have.fault_domain), str(machine.fault_domain))
                if have.type != machine.type:
                    differs["type"] = (have.type, machine.type)
                ours, theirs = have.resources.to_units(), machine.resources.to_units()
                for i, f in enumerate(("cpu", "memory_gb")):
                    if ours[i] != theirs[i]:
                        differs[f] = (f"{getattr(have.resources, f):g}",
                                      f"{getattr(machine.resources, f):g}")
                if differs:
                    raise Conflict(
                        f"machine {machine.id}",
                        ", ".join(f"{f} {a}" for f, (a, _) in differs.items()),
                        ", ".join(f"{f} {b}" for f, (_, b) in differs.items()))
                return False
            if machine.fault_domain.region != self.fleet.region:
                raise ValidationError("fault_domain", f"this control plane runs region "
                                      f"{self.fleet.region!r}, not "
                                      f"{machine.fault_domain.region!r}")
            record = {"seq": len(self.fleet), "id": machine.id, "type": machine.type,
                      "fault_domain": str(machine.fault_domain),
                      "cpu": machine.resources.cpu, "memory_gb": machine.resources.memory_gb,
                      "disk_gb": machine.resources.disk_gb}
            # (already stored by an attempt that did not finish: rebuilt below)
            with contextlib.suppress(Conflict):
                self.meta.create(f"/machines/{machine.id}", json.dumps(record).encode())
            now = self.clock()
            events, self.scheduler.events[:] = list(self.scheduler.events), []
            for ev in events:
                self.record("scheduler", ev.kind, ev.message, job=ev.job, at=ev.time)
            self.persist.save(self.allocator)  # nothing in memory is lost by the rebuild
            self._build(now)
            self.record("broker", "machine_registered",
                        f"{machine.id}: {machine.type} in {machine.fault_domain}, "
                        f"{machine.resources.cpu:g} cpu, {machine.resources.memory_gb:g} GB",
                        machine=machine.id)
        self._wake.set()
        return True

    def machine_index(self, machine: str) -> int:
        try:
            return self.fleet.index_of(machine)
        except (KeyError, ValueError, NotFound):
            raise NotFound("machine", machine) from None

    def machine_view(self, m: int) -> dict[str, Any]:
        fleet = self.fleet
        broker = self.region.broker_of(m)
        fd = fleet.fault_domain(m)
        res = fleet.resources(m)
        name = fleet.name(m)
        return {
            "id": name, "state": broker.state(m).value, "cordoned": broker.cordoned(m),
            "entitlement": broker.entitlement_of(m),
            "fault_domain": {"dc": fd.dc, "msb": fd.msb, "row": fd.row, "rack": fd.rack},
            "type": fleet.type_names[int(fleet.type_code[m])],
            "cpu": res.cpu, "memory_gb": res.memory_gb,
            "tasks": len(self.scheduler.desired.get(m, {})),
            "events": [e.id for e in broker.events_for(m)],
        }

    def machines(self, state: str | None = None, entitlement: str | None = None,
                 offset: int = 0, limit: int = 100) -> tuple[list[dict[str, Any]], int]:
        with self.lock:
            found = []
            total = 0
            for m in range(len(self.fleet)):
                broker = self.region.broker_of(m)
                if state is not None and broker.state(m).value != state:
                    continue
                if entitlement is not None and broker.entitlement_of(m) != entitlement:
                    continue
                if offset <= total < offset + limit:
                    found.append(self.machine_view(m))
                total += 1
            return found, total

    def machine(self, machine: str) -> dict[str, Any]:
        m = self.machine_index(machine)
        with self.lock:
            view = self.machine_view(m)
            view["assigned"] = [f"{a.job}/{a.index}" for a in self.scheduler.desired_for(machine)]
            return view

    def _event_id(self, prefix: str, machine: str) -> str:
        with self.lock:
            self._drains += 1
            return f"{prefix}-{machine}-{int(self.clock() * 1000)}-{self._drains}"

    def fail_machine(self, machine: str, reason: str = "marked failed by an operator") -> str:
        m = self.machine_index(machine)
        with self.lock:
            if self.region.broker_of(m).state(m) is MachineState.FAILED:
                raise Conflict(f"machine {machine}", "healthy", "failed")
            now = self.clock()
            event_id = self._event_id("failure", machine)
            self.region.add_event(UnavailabilityEvent(event_id, EventKind.FAILURE, (machine,),
                                                      now, None, reason), now)
            if self.sim is not None:
                self.sim.agent(m).fail()
        self.record("broker", "machine_failed", f"{machine}: {reason}", machine=machine)
        self._wake.set()
        return event_id

    def repair_machine(self, machine: str) -> list[str]:
        m = self.machine_index(machine)
        with self.lock:
            now = self.clock()
            ended = [e.id for e in self.region.broker_of(m).events_for(m)
                     if e.kind is EventKind.FAILURE]
            for event_id in ended:
                self.region.end_event(event_id, now)
            if self.sim is not None:
                self.sim.agent(m).repair()
                self.sim._busy.add(m)
        if not ended:
            raise Conflict(f"machine {machine}", "failed", "not failed")
        self.record("broker", "machine_repaired", machine, machine=machine)
        self._wake.set()
        return ended

    def cordon(self, machine: str, cordoned: bool) -> dict[str, Any]:
        m = self.machine_index(machine)
        with self.lock:
            self.region.set_cordon(m, cordoned)
            ended = []
            if not cordoned:  # uncordon also ends drains that have not finished
                now = self.clock()
                for event in self.region.broker_of(m).events_for(m):
                    if event.reason == "drain":
                        self.region.end_event(event.id, now)
                        ended.append(event.id)
            view = self.machine_view(m)
        self.record("broker", "machine_cordoned" if cordoned else "machine_uncordoned",
                    machine + (f" (ended {', '.join(ended)})" if ended else ""), machine=machine)
        self._wake.set()
        return view

    def drain(self, machine: str, deadline_seconds: float | None = None) -> str:
        """Move every task off the machine through TaskControl; what is left at the
        deadline is stopped. The machine stays out of service until uncordoned."""
        m = self.machine_index(machine)
        deadline = self.config.drain_deadline_seconds if deadline_seconds is None \
            else deadline_seconds
        if deadline < 0:
            raise ValidationError("deadline_seconds", "must be >= 0")
        with self.lock:
            now = self.clock()
            self.region.set_cordon(m, True)
            event_id = self._event_id("drain", machine)
            self.region.add_event(UnavailabilityEvent(event_id, EventKind.MAINTENANCE,
                                                      (machine,), now + deadline,
                                                      now + deadline + DRAIN_HOLD, "drain"),
                                  now)
        self.record("broker", "machine_drain", f"{machine}: tasks move within {deadline:g}s "
                    f"({event_id})", machine=machine)
        self._wake.set()
        return event_id

    def schedule_maintenance(self, machines: list[str], start: float, duration: float,
                             reason: str = "maintenance") -> str:
        if not machines:
            raise ValidationError("machines", "give at least one machine")
        if duration <= 0:
            raise ValidationError("duration_seconds", "must be > 0")
        for machine in machines:
            self.machine_index(machine)
        with self.lock:
            now = self.clock()
            self._drains += 1
            event_id = f"maintenance-{int(now * 1000)}-{self._drains}"
            self.region.add_event(UnavailabilityEvent(event_id, EventKind.MAINTENANCE,
                                                      tuple(machines), start, start + duration,
                                                      reason), now)
        self.record("broker", "maintenance_scheduled",
                    f"{event_id}: {len(machines)} machines from {start:.0f} for {duration:g}s "
                    f"({reason})")
        self._wake.set()
        return event_id

    def maintenance(self) -> list[dict[str, Any]]:
        with self.lock:
            events: dict[str, UnavailabilityEvent] = {}
            machines: dict[str, list[str]] = {}
            for event in self.region.events():
                events[event.id] = event
                machines.setdefault(event.id, []).extend(event.machines)
        return [{"id": e.id, "kind": e.kind.value, "machines": sorted(machines[e.id]),
                 "start": e.start, "end": e.end, "reason": e.reason}
                for e in sorted(events.values(), key=lambda e: (e.start, e.id))]

    # -- agents ----------------------------------------------------------------------------
    def desired(self, machine: str) -> list[Assignment]:
        """The machine's desired set: as the last pass left it (no lock), or read under
        the lock when no pass has touched it since this replica started leading."""
        kept = self.desired_kept(machine)
        if kept is not None:
            return kept
        with self.lock:
            self._check_owned(machine)
            found = self.scheduler.desired_for(machine)
            # kept for the next reads (the pass changes sets and generations under
            # the lock, so the two read here go together)
            self._desired_view[machine] = (self.desired_generation(machine), found)
            return found

    def desired_kept(self, machine: str) -> list[Assignment] | None:
        """The machine's desired set as kept for its current generation, or None (a
        read that never blocks: the agents' long-poll answers from it)."""
        self._check_owned(machine)
        kept = self._desired_view.get(machine)
        if kept is not None and kept[0] == self.desired_generation(machine):
            return kept[1]
        return None

    def desired_generation(self, machine: str) -> int:
        """Changes whenever the machine's desired set may have changed (a plain read:
        an agent's long-poll checks it without the lock)."""
        return self._gen_base + self._generation.get(machine, 0)

    def task_output(self, machine: str, chunks: list[tuple[str, int, str]]) -> int:
        """An agent's output of the tasks on its machine; output of a task the machine
        does not hold (any more) is refused. Returns the chunks taken."""
        with self.lock:
            m = self._check_owned(machine)
            placed = self.scheduler.placed.get(m, set())
            taken = [(job, index, text) for job, index, text in chunks
                     if TaskRef(job, index) in placed]
        for job, index, text in taken:
            self.logs.append(job, index, machine, text)
        return len(taken)

    def task_logs(self, job: str, index: int, after: int,
                  limit: int) -> tuple[str, int, bool, str | None]:
        self.jobs.get(job)
        return self.logs.read(job, index, after, limit)

    def report(self, machine: str, statuses: list[TaskStatus],
               endpoints: dict[tuple[str, int], str] | None = None) -> None:
        """An agent's heartbeat: its tasks' statuses and where they listen. Taken at
        once, without waiting for a pass (decision 45): the heartbeat counts from now,
        the statuses are applied by the next pass."""
        self._check_owned(machine)
        now = self.clock()
        with self._pending_lock:
            self._beats[machine] = now
            self._reports.append((machine, statuses, dict(endpoints or {}), now))
        self._wake.set()

    def wait_for_agents(self, machines: list[str], timeout: float) -> int:
        """Wait (at most ``timeout`` seconds) until every machine's agent has
        heartbeated since this call; returns how many have."""
        since = self.clock()
        deadline = time.monotonic() + timeout
        while True:
            with self._pending_lock:
                beats = dict(self._beats)
            with self.lock:
                beating = sum(1 for m in machines if max(
                    self.liveness.last.get(m, since), beats.get(m, since)) > since)
            if beating == len(machines) or time.monotonic() > deadline:
                return beating
            time.sleep(0.05)

    def joined(self, machine: str) -> None:
        with self.lock:
            if self._owns(self.machine_index(machine)):
                self.liveness.watch(machine, self.clock())
