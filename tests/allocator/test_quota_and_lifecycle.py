"""Quota, freeing, moving off unusable machines, idempotent retries."""

from plait.model import (
    AllocationPolicy,
    EventKind,
    Requirements,
    Resources,
    UnavailabilityEvent,
)
from plait.testing import Cluster, check_invariants, machine

ONE = Resources(cpu=1, memory_gb=2)
WHOLE = Resources(cpu=16, memory_gb=64)


def six_msbs():
    return Cluster.machines(*[machine(f"m{i}", msb=f"msb{i}") for i in range(6)])


def test_machine_quota_is_never_exceeded_and_the_reason_says_quota():
    c = six_msbs()
    c.entitlement("e", machines=2)
    r = c.allocate("j", "e", WHOLE, allocate=range(4))
    assert len(r.machines) == 2 and len(r.claimed) == 2
    assert [t for t, _ in r.unplaced] == [2, 3]
    assert "quota" in r.unplaced[0][1]
    assert len(c.machines_of("e")) == 2


def test_rru_quota_counts_machine_capacity():
    c = six_msbs()
    c.entitlement("e", rru=40)  # two 16-RRU machines fit, a third would make 48
    r = c.allocate("j", "e", WHOLE, allocate=range(3))
    assert len(r.claimed) == 2 and len(r.unplaced) == 1
    assert c.allocator.usage("e").rru == 32


def test_lowered_quota_stops_claims_but_evicts_nothing():
    c = six_msbs()
    c.entitlement("e", machines=4)
    c.allocate("j", "e", WHOLE, allocate=range(3))
    c.entitlement("e", machines=1)
    assert len(c.machines_of("e")) == 3
    r = c.allocate("k", "e", WHOLE, allocate=[0])
    assert r.machines == () and "quota" in r.unplaced[0][1]


def test_free_returns_emptied_machines_and_keeps_shared_ones():
    c = six_msbs()
    c.entitlement("e", machines=6)
    a = c.allocate("a", "e", ONE, allocate=range(2))
    b = c.allocate("b", "e", ONE, allocate=range(3))
    assert set(a.machines) <= set(b.machines)  # b stacked on a's machines first
    done = c.allocate("b", "e", ONE, free=range(3))
    assert set(done.released) == set(b.machines) - set(a.machines)
    assert c.machines_of("e") == {c.fleet.name(m) for m in a.machines}
    assert "b" not in c.allocator.jobs
    # everything b held is back: the free resources equal totals minus a's tasks
    for m in b.machines:
        held = sum(1 for x in a.machines if x == m)
        assert int(c.index.free_cpu[m]) == 16000 - 1000 * held


def test_freeing_an_unknown_task_is_a_no_op():
    c = six_msbs()
    c.entitlement("e", machines=6)
    r = c.allocate("ghost", "e", ONE, free=[0, 1])
    assert r.freed == () and r.machines == () and r.unplaced == ()


def test_retry_returns_the_same_placement_with_and_without_the_cache():
    c = Cluster.generated(dcs=2, msbs_per_dc=3, rows_per_msb=1, racks_per_row=2,
                          machines_per_rack=3)
    c.entitlement("e", machines=20)
    first = c.allocate("j", "e", ONE, allocate=range(10))
    cached = c.allocate("j", "e", ONE, allocate=range(10))
    assert cached.cached and cached.machines == first.machines
    assert cached.claimed == () and c.allocator.cache.hits == 1
    c.allocator.cache.drop("j")
    uncached = c.allocate("j", "e", ONE, allocate=range(10))
    assert not uncached.cached and uncached.machines == first.machines
    assert uncached.claimed == ()
    # no resources were taken twice
    assert int(c.index.tasks.sum()) == 10


def test_failed_machine_invalidates_the_cache_and_its_task_moves():
    c = six_msbs()
    c.entitlement("e", machines=6)
    first = c.allocate("j", "e", ONE, allocate=range(3))
    victim = first.machines[1]
    c.region.add_event(UnavailabilityEvent("f1", EventKind.FAILURE, (c.fleet.name(victim),),
                                           start=0), now=0)
    again = c.allocate("j", "e", ONE, allocate=range(3))
    assert not again.cached
    assert again.moved == (1,)
    assert again.machines[0] == first.machines[0] and again.machines[2] == first.machines[2]
    assert again.machines[1] != victim
    # the failed machine is out of the free pool and never chosen while failed
    other = c.allocate("k", "e", ONE, allocate=range(6))
    assert victim not in other.machines
    assert int(c.index.tasks[victim]) == 0
    # it emptied, so it went back to the region; healthy again, it is usable again
    assert c.region.record(victim).entitlement is None
    c.region.end_event("f1", now=1)
    assert c.index.is_free(victim)


def test_maintenance_keeps_new_work_off_from_announcement_to_end():
    c = Cluster.machines(machine("a", msb="1"), machine("b", msb="2"))
    c.entitlement("e", machines=2)
    a = c.fleet.index_of("a")
    c.region.add_event(UnavailabilityEvent("mx", EventKind.MAINTENANCE, ("a",), start=10,
                                           end=20), now=0)
    r = c.allocate("j", "e", ONE, allocate=[0])
    assert r.placements == {0: "b"}  # announced: cordoned, though still healthy
    assert c.index.cordoned[a] and not c.index.is_free(a)
    c.region.tick(10)
    r = c.allocate("k", "e", ONE, allocate=[0])
    assert r.placements == {0: "b"}  # in maintenance
    c.region.tick(20)
    assert c.index.is_free(a) and not c.index.cordoned[a]
    spread = AllocationPolicy(requirements=Requirements(max_tasks_per_machine=1))
    r = c.allocate("l", "e", ONE, allocate=[0, 1], policy=spread)
    assert sorted(r.placements.values()) == ["a", "b"]  # usable again
    check_invariants(c)


def test_task_on_a_cordoned_machine_moves_when_allocated_again():
    c = Cluster.machines(machine("a", msb="1"), machine("b", msb="2"))
    c.entitlement("e", machines=2)
    first = c.allocate("j", "e", ONE, allocate=[0])
    where = first.placements[0]
    c.region.add_event(UnavailabilityEvent("mx", EventKind.MAINTENANCE, (where,), start=10,
                                           end=20), now=0)
    again = c.allocate("j", "e", ONE, allocate=[0])
    assert not again.cached and again.moved == (0,)
    assert again.placements[0] != where


def test_changed_task_resources_move_the_task_when_needed():
    c = Cluster.machines(machine("a", msb="1"), machine("b", msb="2"))
    c.entitlement("e", machines=2)
    c.allocate("j", "e", Resources(cpu=8), allocate=[0])
    c.allocate("k", "e", Resources(cpu=8), allocate=[0])
    bigger = c.allocate("j", "e", Resources(cpu=12), allocate=[0])
    assert bigger.moved == (0,)
    assert int(c.index.free_cpu.min()) >= 0
    assert int(c.index.tasks.sum()) == 2


def test_a_job_can_move_to_another_entitlement():
    c = six_msbs()
    c.entitlement("old", machines=6)
    c.entitlement("new", machines=6)
    c.allocate("j", "old", ONE, allocate=range(3))
    r = c.allocate("j", "new", ONE, allocate=range(3))
    assert r.moved == (0, 1, 2)
    assert c.machines_of("old") == set()
    assert {c.fleet.name(m) for m in r.machines} <= c.machines_of("new")
