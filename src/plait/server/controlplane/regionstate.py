"""The region's core objects and their one lock: machines (``fleet``), brokers
(``region``), allocator, scheduler, their persistence (``persist``, ``jobs``), the
agents' liveness and, without real agents, the simulated ones (``sim``).

``RegionState`` is their one writer: it builds them from the store (``build``: at
start, on a takeover, when a machine registers) and answers the lookups every part
makes of them. Everything that touches them holds ``lock``; a part is handed this
object, never the objects themselves, since a rebuild replaces them.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable
from typing import Any

from plait.allocator import MachineIndex
from plait.errors import Conflict, NotFound, ValidationError
from plait.health import HealthCheck
from plait.model import Entitlement, Fleet, JobSpec, RegionSpec, Resources, generate, parse
from plait.model.machine import FaultDomain, Machine
from plait.persist import PersistentAllocator, PersistentRegion
from plait.persist.follow import SharedRecords
from plait.persist.scheduler import JobStore, PersistentScheduler
from plait.persist.warm import WarmRecords
from plait.scheduler import Scheduler
from plait.scheduler.records import Assignment
from plait.scheduler.wiring import wire
from plait.server.controlplane.config import ControlPlaneConfig
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


def shard_view(store: Store, shard: int | None) -> tuple[Store, SharedRecords | None]:
    """The store as a shard sees it (its own records under /shards/S, the region's as
    they are) and the region's shared records it follows; as is, unsharded."""
    if shard is None:
        return store, None
    store = ShardStore(store, shard)
    with contextlib.suppress(Conflict):  # the front end finds the shards here
        store.create(f"/frontend/shards/{shard}", b"{}")
    return store, SharedRecords(store)  # (before the build: no change missed)


class RegionState:
    #: built from the store by ``build``
    fleet: Fleet
    region: PersistentRegion
    allocator: PersistentAllocator
    scheduler: Scheduler
    persist: PersistentScheduler
    jobs: JobStore

    def __init__(self, store: Store, config: ControlPlaneConfig, clock: Callable[[], float],
                 shared: SharedRecords | None = None, sink: Any = None) -> None:
        self.store, self.config, self.clock = store, config, clock
        #: a shard's view of the region's shared records (None unsharded)
        self.shared = shared
        #: where the allocator counts and times its requests (the metrics)
        self.sink = sink
        self.lock = threading.RLock()
        self.meta = meta = Namespace(store, "/region")
        try:
            self.region_spec = parse(RegionSpec, json.loads(meta.get("/spec")[0]))
        except NotFound:
            self.region_spec = config.region
            try:
                meta.create("/spec", config.region.model_dump_json().encode())
            except Conflict:  # another replica starting at once stored it first
                self.region_spec = parse(RegionSpec, json.loads(meta.get("/spec")[0]))
        self.liveness = self.new_liveness()
        self.sim: Simulation | None = None

    def new_liveness(self) -> HealthCheck:
        """The agents' liveness, from nothing heard (a takeover starts it again)."""
        config = self.config
        self.liveness = HealthCheck(config.heartbeat_timeout,
                                    hold_fraction=config.silence_hold_fraction,
                                    hold_min=config.silence_hold_min)
        return self.liveness

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

    def build(self, now: float, warm: WarmRecords | None = None) -> None:
        """Brokers, allocator and scheduler over the region's machines, from the store
        (at start, and again when a machine registers: a new machine changes the index
        every part is built on). The fence of the last build is kept."""
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
        self.allocator.sink = self.sink  # (each allocation request counted and timed)
        self.allocator.defer()  # placements are written with the scheduler's state
        previous: PersistentScheduler | None = getattr(self, "persist", None)
        fence = previous.fence if previous is not None else None
        self.persist = PersistentScheduler.load(self.scheduler, store, now,
                                                _controllers, warm=warm)
        self.persist.fence = region.fence = fence
        self.persist.only_held = config.shard is not None
        self.jobs = self.persist.jobs
        self._simulate(now)

    def _simulate(self, now: float) -> None:
        """Without real agents, simulated ones run the tasks (those of a rebuild live on)."""
        if not self.config.sim_agents:
            return
        start = self.config.sim_start_seconds

        def behaviour(a: Assignment) -> Behaviour:
            if a.spec.command in ("finish", "fail"):
                return Behaviour(start_seconds=start, stop_seconds=start / 2,
                                 finish_after=start, exit_code=int(a.spec.command == "fail"))
            return Behaviour(start_seconds=start, stop_seconds=start / 2,
                             crash=a.spec.command == "crash", crash_after=start)
        old = self.sim
        self.sim = Simulation(self.fleet, behaviour, scheduler=self.scheduler, now=now)
        self.sim.output = []  # the simulated processes' output goes to the task logs
        self.sim.carry_calls = False  # the dispatcher sends TaskControl calls
        if old is not None:  # the simulated processes live on
            self.sim.agents = old.agents

    # -- lookups -------------------------------------------------------------------------
    def known(self, machine: str) -> bool:
        try:
            self.fleet.index_of(machine)
            return True
        except NotFound:
            return False

    def machine_index(self, machine: str) -> int:
        try:
            return self.fleet.index_of(machine)
        except (KeyError, ValueError, NotFound):
            raise NotFound("machine", machine) from None

    def entitlement(self, name: str) -> Entitlement:
        ent = self.allocator.entitlements.get(name)
        if ent is None:
            raise NotFound("entitlement", name)
        return ent

    def entitlement_of(self, job: str) -> str | None:
        try:
            return self.jobs.get(job).entitlement
        except NotFound:
            return None

    def held_entitlement_of(self, job: str) -> str | None:
        """A job's entitlement as the pass holds it, else as stored (None: no such job)."""
        held = self.scheduler.jobs.get(job)  # (the pass's own record: no store read)
        return held.entitlement if held is not None else self.entitlement_of(job)

    def owner_of_job(self, job: str) -> str:
        """The owner of a job's entitlement ("": unknown): whose calls a job's
        TaskController and gates are, for the bounds per tenant."""
        entitlement = self.held_entitlement_of(job)
        found = self.allocator.entitlements.get(entitlement) if entitlement else None
        return found.owner if found is not None else ""

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
