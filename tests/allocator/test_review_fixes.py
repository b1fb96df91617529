"""Kept tasks meet the policy, quotas count machines being released, the cache
never outlives what it cached, and commits really retry on broker races."""

import pytest

from plait.allocator import AllocationRequest
from plait.broker import ChangeKind
from plait.errors import Conflict
from plait.model import (
    AllocationPolicy,
    EventKind,
    Requirements,
    Resources,
    UnavailabilityEvent,
)
from plait.testing import Cluster, check_invariants, machine

ONE = Resources(cpu=1, memory_gb=1)
WHOLE = Resources(cpu=16, memory_gb=64)


def two_dcs():
    return Cluster.machines(machine("a", dc="dc1", msb="1"), machine("b", dc="dc2", msb="2"),
                            machine("c", dc="dc2", msb="3"))


def test_a_contradicting_pin_moves_nothing_in_place_and_says_why():
    c = two_dcs()
    c.entitlement("p", machines=3, pin_dc="dc1")
    assert c.allocate("k", "p", ONE, allocate=[0]).placements == {0: "a"}
    r = c.allocate("k", "p", ONE, allocate=[0],
                   policy=AllocationPolicy(requirements=Requirements(dc="dc2")))
    assert r.machines == () and "conflicting data center pins" in r.unplaced[0][1]
    assert r.moved == (0,)
    check_invariants(c)


def test_max_tasks_per_machine_applies_to_tasks_already_placed():
    c = two_dcs()
    c.entitlement("e", machines=3)
    c.give("e", "a")
    c.allocate("j", "e", ONE, allocate=[0, 1],
               policy=AllocationPolicy(requirements=Requirements(dc="dc1")))
    assert set(c.allocator.placement("j").values()) == {"a"}
    spread = AllocationPolicy(requirements=Requirements(max_tasks_per_machine=1))
    r = c.allocate("j", "e", ONE, allocate=[0, 1], policy=spread)
    assert len(set(r.machines)) == 2 and r.moved == (1,)
    check_invariants(c)


def test_contradicting_type_requirements_place_nothing():
    c = two_dcs()
    c.entitlement("e", machines=3)
    policy = AllocationPolicy(requirements=Requirements(machine_types=("small",),
                                                        attributes={"type": "big"}))
    r = c.allocate("j", "e", ONE, allocate=[0, 1], policy=policy)
    assert r.machines == () and "contradicts" in r.unplaced[0][1]


def test_moving_off_a_failed_machine_at_quota_uses_the_machine_it_gives_back():
    c = two_dcs()
    c.entitlement("e", machines=1)
    first = c.allocate("j", "e", WHOLE, allocate=[0])
    victim = first.machines[0]
    c.region.add_event(UnavailabilityEvent("f", EventKind.FAILURE, (c.fleet.name(victim),),
                                           start=0), now=0)
    r = c.allocate("j", "e", WHOLE, allocate=[0])
    assert r.complete and r.moved == (0,) and r.machines[0] != victim
    assert r.released == (victim,)
    assert len(c.machines_of("e")) == 1
    check_invariants(c)


def test_redefining_an_entitlement_invalidates_cached_placements():
    c = two_dcs()
    c.entitlement("e", machines=3)
    assert c.allocate("j", "e", ONE, allocate=[0]).placements == {0: "a"}
    c.entitlement("e", machines=3, pin_dc="dc2")
    r = c.allocate("j", "e", ONE, allocate=[0])
    assert not r.cached and r.placements[0] in {"b", "c"}


def test_a_direct_commit_invalidates_the_jobs_cache_entry():
    c = two_dcs()
    c.entitlement("e", machines=3)
    request = AllocationRequest.of("j", "e", ONE, allocate=[0, 1])
    c.allocator.allocate(request)
    c.allocator.commit(c.allocator.propose(AllocationRequest.of("j", "e", ONE, free=[0, 1])))
    again = c.allocator.allocate(request)
    assert not again.cached and again.complete
    assert set(c.allocator.placement("j")) == {0, 1}
    check_invariants(c)


def test_a_job_moving_between_entitlements_keeps_every_task_accounted():
    c = Cluster.machines(*[machine(f"m{i}", msb=f"s{i}") for i in range(6)])
    c.entitlement("old", machines=3)
    c.entitlement("new", machines=3)
    c.allocate("j", "old", ONE, allocate=[0, 1, 2])
    r = c.allocate("j", "new", ONE, allocate=[0])
    assert r.moved == (0,) and r.complete
    check_invariants(c)  # tasks 1 and 2 still in "old", task 0 in "new"
    assert c.allocator.jobs["j"].ents[1] != c.allocator.jobs["j"].ents[0]


def test_commit_refuses_a_plan_whose_kept_machine_failed_meanwhile():
    c = two_dcs()
    c.entitlement("e", machines=3)
    c.allocate("j", "e", ONE, allocate=[0])
    plan = c.allocator.propose(AllocationRequest.of("j", "e", ONE, allocate=[0, 1]))
    kept = plan.keep[0][1]
    c.region.add_event(UnavailabilityEvent("f", EventKind.FAILURE, (c.fleet.name(kept),),
                                           start=0), now=0)
    with pytest.raises(Conflict):
        c.allocator.commit(plan)


def steal_on_claim(c, times):
    """A racing shard: each time this allocator claims a machine, it grabs the next
    free one for entitlement "other" before this allocator's next claim."""
    left = [times]

    def race(change):
        if change.kind is ChangeKind.CLAIMED and change.entitlement == "e" and left[0] > 0:
            left[0] -= 1
            free = [m for m in range(len(c.fleet)) if c.region.record(m).entitlement is None]
            if free:
                c.region.claim(free[0], "other", c.region.version(free[0]))

    c.region.subscribe(race)


def test_a_lost_broker_race_rolls_back_partial_claims_and_retries():
    c = Cluster.machines(*[machine(f"m{i}", msb=f"s{i}") for i in range(6)])
    c.entitlement("e", machines=6)
    c.entitlement("other", machines=6)
    steal_on_claim(c, times=1)
    r = c.allocate("j", "e", WHOLE, allocate=[0, 1])
    assert r.complete and r.attempts == 2 and c.allocator.conflicts == 1
    assert len(c.machines_of("e")) == 2  # the first attempt's claim was undone
    check_invariants(c)


def test_endless_races_end_in_a_clear_give_up():
    c = Cluster.machines(*[machine(f"m{i}", msb=f"s{i}") for i in range(12)])
    c.entitlement("e", machines=12)
    c.entitlement("other", machines=12)
    steal_on_claim(c, times=100)
    r = c.allocate("j", "e", WHOLE, allocate=[0, 1])
    assert r.machines == () and "gave up after 3 conflicting attempts" in r.unplaced[0][1]
    assert c.machines_of("e") == set()
    check_invariants(c)
