"""Test harness: small regions, explicit machines and a wired allocator, so a test
of the core reads like the scenario it checks (no servers, no clocks, no sleeps); and
the two helpers every live test and the process harness share: :func:`wait_for` (a
condition within a liveness bound) and :func:`free_port`."""

from __future__ import annotations

import contextlib
import inspect
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from plait.allocator import AllocationRequest, AllocationResult, Allocator, MachineIndex
from plait.broker import Region
from plait.model import (
    AllocationPolicy,
    Entitlement,
    FaultDomain,
    Fleet,
    Machine,
    Quota,
    RegionSpec,
    Resources,
    generate,
)
from plait.scheduler.wiring import wire

SMALL = Resources(cpu=16, memory_gb=64, disk_gb=1024)

T = TypeVar("T")

#: how long a live test waits for a condition by default: a liveness bound on a
#: shared, loaded machine, never a speed assertion
WAIT = 60.0


class WaitTimeout(AssertionError, TimeoutError):
    """A condition waited on did not hold within its liveness bound (a test failure to
    pytest, a ``TimeoutError`` to the harness and the benchmarks)."""


def _describe(check: Callable[[], object]) -> str:
    """What ``check`` waits for, from its source: a lambda's line, or a function's name."""
    name = getattr(check, "__qualname__", None) or repr(check)
    if "<lambda>" not in name:
        return name
    with contextlib.suppress(OSError, TypeError):
        line = " ".join(inspect.getsource(check).split())
        return line if len(line) <= 300 else line[:297] + "..."
    return name


def wait_for(check: Callable[[], T], timeout: float = WAIT, what: str | None = None, *,
             poll: float = 0.05,
             ignore: tuple[type[BaseException], ...] = ()) -> T:
    """Poll ``check`` until it returns something truthy, and return that.

    ``timeout`` is a liveness bound (generous: the machine is shared), never a speed
    assertion. Exceptions of the types in ``ignore`` count as "not yet" (a server
    still starting). On timeout this raises :class:`WaitTimeout` naming ``what`` (by
    default the check's source), the last value seen and the last exception ignored.
    """
    deadline = time.monotonic() + timeout
    got: T | None = None
    error: BaseException | None = None
    while True:
        try:
            got = check()
        except ignore as exc:
            error = exc
        else:
            if got:
                return got
        if time.monotonic() > deadline:
            break
        time.sleep(poll)
    last = f"; last error {error!r}" if error is not None else ""
    raise WaitTimeout(f"not within {timeout:g}s: {what or _describe(check)} "
                      f"(last value {got!r}{last})")


def free_port(host: str = "127.0.0.1", size: int = 1) -> int:
    """A free port on ``host`` (the first of ``size`` consecutive ones) outside the
    ephemeral range, so that no outgoing connection takes it before its server listens."""
    from plait.localprocs import free_port_block

    return free_port_block(size, host)


def machine(
    machine_id: str, dc: str = "dc1", msb: str = "msb1", row: str = "row1", rack: str = "rack1",
    resources: Resources = SMALL, type: str = "small", attributes: Mapping[str, str] | None = None,
) -> Machine:
    return Machine(id=machine_id, type=type, resources=resources,
                   fault_domain=FaultDomain("region1", dc, msb, row, rack),
                   attributes=dict(attributes or {}))


@dataclass
class Cluster:
    """A fleet with its brokers, index and allocator, wired as in production."""

    fleet: Fleet
    region: Region
    index: MachineIndex
    allocator: Allocator

    @classmethod
    def of(cls, fleet: Fleet) -> Cluster:
        core = wire(fleet)
        return cls(fleet, core.region, core.index, core.allocator)

    @classmethod
    def generated(cls, seed: int = 0, **spec: object) -> Cluster:
        from plait.model import parse

        return cls.of(generate(parse(RegionSpec, spec), seed=seed))

    @classmethod
    def machines(cls, *machines: Machine) -> Cluster:
        return cls.of(Fleet.from_machines(machines))

    def entitlement(self, name: str, machines: int | None = None, rru: float | None = None,
                    **kw: object) -> Entitlement:
        ent = Entitlement(name=name, owner=str(kw.pop("owner", "owner")),
                          quota=Quota(machines=machines, rru=rru), **kw)
        self.allocator.define(ent)
        return ent

    def give(self, entitlement: str, *machine_ids: str) -> None:
        """Bind free machines to an entitlement through the broker (as a past claim)."""
        for name in machine_ids:
            i = self.fleet.index_of(name)
            self.region.claim(i, entitlement, self.region.version(i))

    def allocate(self, job: str, entitlement: str, resources: Resources,
                 allocate: Iterable[int] = (), free: Iterable[int] = (),
                 policy: AllocationPolicy | None = None) -> AllocationResult:
        request = AllocationRequest.of(job, entitlement, resources, allocate=allocate, free=free,
                                       **({"policy": policy} if policy is not None else {}))
        return self.allocator.allocate(request)

    def machines_of(self, entitlement: str) -> set[str]:
        return set(self.allocator.machines_of(entitlement))

    def msb_of(self, machine_id: str) -> str:
        i = self.fleet.index_of(machine_id)
        return self.fleet.level_names["msb"][int(self.fleet.codes["msb"][i])]


def check_invariants(c: Cluster) -> None:
    """Assert the allocator's invariants (DESIGN.md) on a cluster; used after every
    step of the property tests.

    * a machine's committed resources never exceed its capacity, and the index's
      free resources are exactly capacity minus the tasks placed there;
    * every task sits on a machine of its job's entitlement;
    * a machine belongs to at most one entitlement, the index agrees with the
      brokers, and no entitlement holds more than its quota;
    * the free pool is exactly the healthy, unbound machines.
    """
    import numpy as np

    from plait.allocator.index import cpu_class
    from plait.broker import FREE

    ix, alloc = c.index, c.allocator
    n = len(c.fleet)
    used = np.zeros((n, 3), np.int64)
    tasks = np.zeros(n, np.int64)
    for job in alloc.jobs.values():
        assert set(job.ents) == set(job.placement) == set(job.units)
        for t, m in job.placement.items():
            used[m] += job.units[t]
            tasks[m] += 1
            assert ix.ent[m] == job.ents[t], f"task {t} outside its entitlement"
    totals = np.stack([ix.total_cpu, ix.total_mem, ix.total_disk], axis=1).astype(np.int64)
    free = np.stack([ix.free_cpu, ix.free_mem, ix.free_disk], axis=1).astype(np.int64)
    assert (free >= 0).all(), "a machine is over-committed"
    assert (free == totals - used).all(), "free resources disagree with the placements"
    assert (ix.tasks == tasks).all()
    seen: set[int] = set()
    for broker in c.region.brokers.values():
        assert (ix.ent[broker.machines] == broker.entitlement_codes()).all()
        assert (ix.state[broker.machines] == broker.state_codes()).all()
        assert (ix.cordoned[broker.machines] == broker.cordon_flags()).all()
    for code, members in ix.members.items():
        ids = set(members.ids.tolist())
        assert ids == set(np.flatnonzero(ix.ent == code).tolist())
        assert ids.isdisjoint(seen), "a machine in two entitlements"
        seen |= ids
        assert members.machines_rru == int(ix.total_cpu[sorted(ids)].sum())
        name = c.region.entitlements.names[code]
        ent = alloc.entitlements.get(name)
        if ent is not None and ent.quota.machines is not None:
            assert members.size <= ent.quota.machines, f"{name} above its machine quota"
        if ent is not None and ent.quota.rru is not None:
            assert members.machines_rru <= round(ent.quota.rru * 1000), f"{name} above RRU"
    expected_free = (ix.ent == FREE) & (ix.state == 0) & ~ix.cordoned & (ix.tasks == 0)
    in_free = np.array([ix.is_free(m) for m in range(n)])
    assert (in_free == expected_free).all(), "free pool out of step"
    for lvl, counts in ix.free_count.items():
        recount = np.zeros_like(counts)
        np.add.at(recount, (ix.loc[lvl][expected_free], ix.shape[expected_free]), 1)
        assert (recount == counts).all(), f"free counts at {lvl} out of step"
    # the pools' lists hold exactly their machines, each once, in its (rack, shape) bucket
    def listed(head: np.ndarray) -> list[int]:
        out = []
        for b in np.flatnonzero(head != -1).tolist():
            m = int(head[b])
            while m != -1:
                assert int(ix.loc["rack"][m]) * ix.shape_type.size + int(ix.shape[m]) == b
                out.append(m)
                m = int(ix._next[m])
        return out

    in_list = listed(ix.free_pool.head)
    assert sorted(in_list) == np.flatnonzero(expected_free).tolist(), "free pool lists"
    # a large entitlement's members: idle (available, no task) in its pool, the rest busy
    available = (ix.state == 0) & ~ix.cordoned
    for code, pool in ix.idle.items():
        mine = ix.ent == code
        idle = mine & available & (ix.tasks == 0)
        assert sorted(listed(pool.head)) == np.flatnonzero(idle).tolist(), "idle pool lists"
        assert (np.array([ix.is_idle(m) for m in range(n)]) & mine == idle).all(), (
            "idle pool out of step")
        assert set(ix.busy[code].ids.tolist()) == set(np.flatnonzero(mine & ~idle).tolist())
        for m in np.flatnonzero(mine & ~idle).tolist():
            assert ix.busy[code].klass[m] == cpu_class(int(ix.free_cpu[m])), "busy class"
        for lvl, counts in pool.count.items():
            recount = np.zeros_like(counts)
            np.add.at(recount, (ix.loc[lvl][idle], ix.shape[idle]), 1)
            assert (recount == counts).all(), f"idle counts at {lvl} out of step"
