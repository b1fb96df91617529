"""The allocator's entitlements and job placements survive a restart."""

import pytest

from plait.allocator import AllocationRequest, MachineIndex
from plait.model import Entitlement, Quota, RegionSpec, Resources, generate
from plait.persist import PersistentAllocator, PersistentRegion
from plait.store import SqliteStore
from plait.store.protocol import Transaction
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


def test_a_crash_between_a_binding_and_the_placements_is_mended_on_load(tmp_path):
    """Bindings are written at once, placements at the end of a pass (deferred): a
    crash in between leaves them apart, and ``load`` puts them back together."""
    path = str(tmp_path / "plait.db")
    store, c = start(path)
    c.allocator.defer()
    c.allocator.define(Entitlement(name="web", owner="o", quota=Quota(machines=8)))
    c.allocator.define(Entitlement(name="db", owner="o", quota=Quota(machines=8)))
    c.allocator.allocate(AllocationRequest.of("a", "web", TASK, allocate=range(4)))
    txn = Transaction()
    c.allocator.flush_into(txn)()  # the pass's placements are written...
    store.commit(txn)
    held = set(c.allocator.placement("a").values())
    # ...then a freed (its machines released at once) and b placed (machines claimed
    # at once), and the process dies before the pass writes its placements
    c.allocator.allocate(AllocationRequest.of("a", "web", TASK, free=range(4)))
    c.allocator.allocate(AllocationRequest.of("b", "db", TASK, allocate=range(3)))
    claimed_for_b = set(c.allocator.placement("b").values())
    assert claimed_for_b and all(c.region.record(c.fleet.index_of(m)).entitlement == "db"
                                 for m in claimed_for_b)
    store.close()

    store, d = start(path)
    # a's stored placements stand, and their machines are web's again
    assert set(d.allocator.placement("a").values()) == held
    for m in held:
        assert d.region.record(d.fleet.index_of(m)).entitlement == "web"
    # b was never stored: the machines claimed for it are free again
    assert "b" not in d.allocator.jobs
    for m in claimed_for_b - held:
        assert d.region.record(d.fleet.index_of(m)).entitlement is None
    check_invariants(d)
    store.close()
    store, e = start(path)  # the repair was written through
    assert {m: e.region.record(e.fleet.index_of(m)).entitlement for m in held | claimed_for_b} \
        == {m: d.region.record(d.fleet.index_of(m)).entitlement for m in held | claimed_for_b}
    store.close()


def _flush(store, allocator):
    """What a control plane's pass does with a deferring allocator: its changed
    placements written in one transaction."""
    txn = Transaction()
    done = allocator.flush_into(txn)
    store.commit(txn)
    done()


@pytest.mark.parametrize("deferred", [False, True])
def test_a_job_whose_placements_pass_the_record_limit_is_stored_in_parts(
        tmp_path, monkeypatch, deferred):
    """A job's placements past ``PART_BYTES`` are stored as a header and parts (one
    record of 32,000 tasks passed the store's limit: the pass's whole transaction was
    refused, for every job of the region), read back whole after a restart; parts it
    no longer needs go, and every key with the job."""
    from plait.persist import allocator as module

    monkeypatch.setattr(module, "PART_BYTES", 700)
    path = str(tmp_path / "plait.db")
    store, c = start(path)
    if deferred:
        c.allocator.defer()

    def write():
        if deferred:
            _flush(store, c.allocator)

    small = Resources(cpu=0.5, memory_gb=0.5)
    c.allocator.define(Entitlement(name="web", owner="o", quota=Quota(machines=8)))
    c.allocator.allocate(AllocationRequest.of("big", "web", small, allocate=range(60)))
    write()
    keys = store.children("/allocator/jobs")
    parts = c.allocator.part_keys("big")
    assert len(parts) >= 3 and sorted(keys) == sorted(["big", *(k[6:] for k in parts)])
    assert all(len(store.get(f"/allocator{k}")[0]) <= 700 for k in parts)
    before, free_before = c.allocator.placement("big"), c.index.free_cpu.copy()
    store.close()

    store, d = start(path)  # a restart reads the parts back
    c = d
    if deferred:
        d.allocator.defer()
    assert d.allocator.placement("big") == before and len(before) == 60
    assert (d.index.free_cpu == free_before).all()
    check_invariants(d)
    d.allocator.allocate(AllocationRequest.of("big", "web", small, free=range(5, 60)))
    write()
    assert store.children("/allocator/jobs") == ["big"]  # (whole again: no part left)
    assert d.allocator.part_keys("big") == []
    d.allocator.allocate(AllocationRequest.of("big", "web", small, allocate=range(5, 60)))
    write()
    assert len(store.children("/allocator/jobs")) >= 4
    d.allocator.allocate(AllocationRequest.of("big", "web", small, free=range(60)))
    write()
    assert store.children("/allocator/jobs") == []
    store.close()


def test_a_change_to_one_task_of_a_big_job_rewrites_the_part_that_holds_it(
        tmp_path, monkeypatch):
    """A job of more than ``PART_TASKS`` tasks is kept in parts by index: freeing one
    task rewrites its part (and no other) in the pass's transaction; a restart reads
    every part back."""
    from plait.persist import allocator as module

    monkeypatch.setattr(module, "PART_TASKS", 20)
    path = str(tmp_path / "plait.db")
    store, c = start(path)
    c.allocator.defer()

    small = Resources(cpu=0.5, memory_gb=0.5)
    c.allocator.define(Entitlement(name="web", owner="o", quota=Quota(machines=8)))
    c.allocator.allocate(AllocationRequest.of("big", "web", small, allocate=range(60)))
    _flush(store, c.allocator)
    keys = ["/allocator/jobs/big", *(f"/allocator{k}" for k in c.allocator.part_keys("big"))]
    assert len(keys) == 4  # a header and three parts of 20 tasks

    def versions():
        return [store.get(k)[1] for k in keys]

    before = versions()
    c.allocator.allocate(AllocationRequest.of("big", "web", small, free=[25]))
    _flush(store, c.allocator)
    after = versions()
    assert [a != b for a, b in zip(before, after, strict=True)] == [False, False, True, False]
    placed = c.allocator.placement("big")
    assert len(placed) == 59
    store.close()

    store, d = start(path)  # a restart reads the parts back
    assert d.allocator.placement("big") == placed
    check_invariants(d)
    store.close()
