"""The allocator's entitlements and job placements survive a restart."""

from plait.allocator import AllocationRequest, MachineIndex
from plait.model import Entitlement, Quota, RegionSpec, Resources, generate
from plait.persist import PersistentAllocator, PersistentRegion
from plait.store import SqliteStore
from plait.testing import Cluster, check_invariants

FLEET = generate(RegionSpec(dcs=2, msbs_per_dc=2, rows_per_msb=1, racks_per_row=2,
                            machines_per_rack=2))
TASK = Resources(cpu=4, memory_gb=8)


def start(path):
    store = SqliteStore(path)
    region = PersistentRegion.load(FLEET, store, now=0)
    index = MachineIndex(FLEET, region)
    return store, Cluster(FLEET, region, index, PersistentAllocator.load(index, store))


def test_placements_and_usage_come_back_after_a_restart(tmp_path):
    path = str(tmp_path / "plait.db")
    store, c = start(path)
    c.allocator.define(Entitlement(name="web", owner="o", quota=Quota(machines=4)))
    c.allocator.allocate(AllocationRequest.of("a", "web", TASK, allocate=range(6)))
    c.allocator.allocate(AllocationRequest.of("b", "web", TASK, allocate=range(3)))
    c.allocator.allocate(AllocationRequest.of("b", "web", TASK, free=[2]))
    before = {j: c.allocator.placement(j) for j in ("a", "b")}
    free_before = c.index.free_cpu.copy()
    store.close()

    store, d = start(path)  # a restarted control plane
    assert d.allocator.entitlements["web"].quota.machines == 4
    assert {j: d.allocator.placement(j) for j in ("a", "b")} == before
    assert (d.index.free_cpu == free_before).all()
    check_invariants(d)
    # nothing is booked twice: the quota and the machines' room still hold
    r = d.allocator.allocate(AllocationRequest.of("c", "web", TASK, allocate=range(20)))
    # quota: 4 machines of 16 RRU, 4 tasks each; a and b hold 8 of those 16 places
    assert len(r.machines) == 8 and len(r.unplaced) == 12
    check_invariants(d)
    d.allocator.allocate(AllocationRequest.of("a", "web", TASK, free=range(6)))
    assert "a" not in store.children("/allocator/jobs")
    store.close()
