"""Optimistic concurrency: decide against a snapshot, verify at commit, retry."""

import pytest

from plait.allocator import AllocationRequest, Allocator, MachineIndex
from plait.errors import Conflict
from plait.model import Entitlement, Fleet, Quota, Resources
from plait.testing import Cluster, machine

HALF = Resources(cpu=8, memory_gb=8)


def test_second_plan_from_the_same_snapshot_conflicts_and_allocate_retries():
    c = Cluster.machines(machine("a", msb="1"), machine("b", msb="2"))
    c.entitlement("e", machines=2)
    c.give("e", "a")
    c.allocate("seed", "e", HALF, allocate=[0])  # a has room for exactly one more
    alloc = c.allocator
    p1 = alloc.propose(AllocationRequest.of("x", "e", HALF, allocate=[0]))
    p2 = alloc.propose(AllocationRequest.of("y", "e", HALF, allocate=[0]))
    assert p1.assign[0][1] == p2.assign[0][1] == c.fleet.index_of("a")
    alloc.commit(p1)
    with pytest.raises(Conflict):
        alloc.commit(p2)
    assert "y" not in alloc.jobs  # a lost commit changes nothing
    assert int(c.index.free_cpu[c.fleet.index_of("a")]) == 0
    r = alloc.allocate(AllocationRequest.of("y", "e", HALF, allocate=[0]))
    assert r.placements == {0: "b"}


def test_a_stale_claim_changes_nothing():
    c = Cluster.machines(machine("a", msb="1"), machine("b", msb="2"))
    c.entitlement("e1", machines=1)
    c.entitlement("e2", machines=1)
    plan = c.allocator.propose(AllocationRequest.of("x", "e1", HALF, allocate=[0]))
    claimed = plan.claims[0][0]
    c.give("e2", c.fleet.name(claimed))  # someone else took it meanwhile
    with pytest.raises(Conflict):
        c.allocator.commit(plan)
    assert c.machines_of("e1") == set()
    assert int(c.index.tasks.sum()) == 0


def test_two_shards_race_for_the_last_free_machine_exactly_one_wins():
    fleet = Fleet.from_machines([machine("only", msb="1")])
    shared = Cluster.of(fleet)  # shard 1: its own index and allocator
    index2 = MachineIndex(fleet, shared.region)  # shard 2, same brokers (free pool)
    shard2 = Allocator(index2)
    shared.allocator.define(Entitlement(name="e1", owner="o", quota=Quota(machines=1)))
    shard2.define(Entitlement(name="e2", owner="o", quota=Quota(machines=1)))
    p1 = shared.allocator.propose(AllocationRequest.of("x", "e1", HALF, allocate=[0]))
    p2 = shard2.propose(AllocationRequest.of("y", "e2", HALF, allocate=[0]))
    assert p1.claims and p2.claims  # both saw the machine free
    shared.allocator.commit(p1)
    with pytest.raises(Conflict):
        shard2.commit(p2)
    assert shared.region.record(0).entitlement == "e1"
    r = shard2.allocate(AllocationRequest.of("y", "e2", HALF, allocate=[0]))
    assert r.machines == () and r.unplaced  # nothing left: a result, not a crash


def test_two_shards_interleaving_many_requests_never_share_a_machine():
    fleet = Fleet.from_machines([machine(f"m{i}", msb=f"s{i % 4}") for i in range(12)])
    c = Cluster.of(fleet)
    other = Allocator(MachineIndex(fleet, c.region))
    c.allocator.define(Entitlement(name="e1", owner="o", quota=Quota(machines=12)))
    other.define(Entitlement(name="e2", owner="o", quota=Quota(machines=12)))
    for k in range(8):
        r1 = c.allocator.propose(AllocationRequest.of(f"a{k}", "e1", HALF, allocate=[0, 1]))
        r2 = other.propose(AllocationRequest.of(f"b{k}", "e2", HALF, allocate=[0, 1]))
        for alloc, plan in ((c.allocator, r1), (other, r2)):
            try:
                alloc.commit(plan)
            except Conflict:
                alloc.allocate(plan.request)
    e1 = set(c.allocator.machines_of("e1"))
    e2 = set(other.machines_of("e2"))
    assert e1.isdisjoint(e2)
    assert len(e1) + len(e2) <= 12
