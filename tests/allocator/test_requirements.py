"""Hard requirements rule machines out; soft preferences rank the rest."""

import pytest

from plait.allocator import NO_MACHINE
from plait.errors import NotFound, ValidationError
from plait.model import (
    SPREAD_DC,
    SPREAD_MSB,
    SPREAD_RACK,
    STACK,
    AllocationPolicy,
    MachineType,
    Preference,
    Property,
    Requirements,
    Resources,
    Strategy,
    parse,
)
from plait.testing import Cluster, machine

ONE = Resources(cpu=1, memory_gb=2)
BIG = Resources(cpu=16, memory_gb=64, disk_gb=1024)
SMALLER = Resources(cpu=8, memory_gb=32, disk_gb=512)


def two_type_region():
    return Cluster.generated(
        dcs=2, msbs_per_dc=2, rows_per_msb=1, racks_per_row=4, machines_per_rack=2,
        types=[MachineType(name="skylake", resources=BIG),
               MachineType(name="milan", resources=SMALLER)],
    )


def test_machine_type_requirement_is_never_violated():
    c = two_type_region()
    c.entitlement("e", machines=100)
    policy = AllocationPolicy(requirements=Requirements(machine_types=("milan",)))
    r = c.allocate("j", "e", ONE, allocate=range(40), policy=policy)
    assert r.complete
    assert {c.fleet.machine(m).type for m in r.machines} == {"milan"}


def test_type_attribute_is_the_same_as_a_type_requirement():
    c = two_type_region()
    c.entitlement("e", machines=100)
    policy = AllocationPolicy(requirements=Requirements(attributes={"type": "skylake"}))
    r = c.allocate("j", "e", ONE, allocate=range(10), policy=policy)
    assert {c.fleet.machine(m).type for m in r.machines} == {"skylake"}


def test_dc_pin_from_requirement_and_from_entitlement():
    c = two_type_region()
    c.entitlement("free", machines=100)
    c.entitlement("pinned", machines=100, pin_dc="dc2")
    r1 = c.allocate("a", "free", ONE, allocate=range(8),
                    policy=AllocationPolicy(requirements=Requirements(dc="dc1")))
    r2 = c.allocate("b", "pinned", ONE, allocate=range(8))
    assert {c.fleet.fault_domain(m).dc for m in r1.machines} == {"dc1"}
    assert {c.fleet.fault_domain(m).dc for m in r2.machines} == {"dc2"}
    assert all(c.fleet.fault_domain(c.fleet.index_of(m)).dc == "dc2"
               for m in c.machines_of("pinned"))


def test_conflicting_dc_pins_place_nothing_and_say_why():
    c = two_type_region()
    c.entitlement("pinned", machines=100, pin_dc="dc2")
    r = c.allocate("a", "pinned", ONE, allocate=[0, 1],
                   policy=AllocationPolicy(requirements=Requirements(dc="dc1")))
    assert r.machines == ()
    assert [t for t, _ in r.unplaced] == [0, 1]
    assert "conflicting data center pins" in r.unplaced[0][1]
    assert c.machines_of("pinned") == set()


def test_unknown_dc_is_reported_as_unplaceable():
    c = two_type_region()
    c.entitlement("e", machines=10)
    r = c.allocate("a", "e", ONE, allocate=[0],
                   policy=AllocationPolicy(requirements=Requirements(dc="dc9")))
    assert "dc9" in r.unplaced[0][1]


def test_attribute_equality_on_machine_attributes():
    c = Cluster.machines(
        machine("a", msb="m1", attributes={"nic": "100g"}),
        machine("b", msb="m2", attributes={"nic": "25g"}),
        machine("c", msb="m3"),
        machine("d", msb="m4", attributes={"nic": "100g"}),
    )
    c.entitlement("e", machines=4)
    policy = AllocationPolicy(requirements=Requirements(attributes={"nic": "100g"}))
    r = c.allocate("j", "e", ONE, allocate=range(6), policy=policy)
    assert set(r.placements.values()) == {"a", "d"}


def test_fault_domain_attributes_below_dc_are_rejected_with_the_field():
    with pytest.raises(ValidationError) as err:
        parse(AllocationPolicy, {"requirements": {"attributes": {"msb": "dc1/msb1"}}})
    assert err.value.field == "requirements.attributes"
    assert "msb" in err.value.message


def test_min_free_keeps_headroom_on_every_machine():
    c = Cluster.machines(machine("a", msb="1"), machine("b", msb="2"))
    c.entitlement("e", machines=2)
    policy = AllocationPolicy(requirements=Requirements(min_free=Resources(cpu=4)))
    r = c.allocate("j", "e", Resources(cpu=4), allocate=range(10), policy=policy)
    # 16 RRU per machine, 4 RRU kept free: 3 tasks per machine
    assert len(r.machines) == 6
    assert [t for t, _ in r.unplaced] == [6, 7, 8, 9]
    assert all(int(c.index.free_cpu[m]) >= 4000 for m in r.machines)


def test_max_tasks_per_machine_spreads_over_machines():
    c = Cluster.machines(*[machine(f"m{i}", msb="1", rack=f"r{i}") for i in range(4)])
    c.entitlement("e", machines=4)
    policy = AllocationPolicy(requirements=Requirements(max_tasks_per_machine=1))
    r = c.allocate("j", "e", ONE, allocate=range(5), policy=policy)
    assert len(set(r.machines)) == 4 == len(r.machines)
    assert [t for t, _ in r.unplaced] == [4]
    assert r.unplaced[0][1] == NO_MACHINE + (
        " (the entitlement's 4 machines have no room for it; the free pool has no machine "
        "that meets the requirements)")
    # growing later respects the existing tasks too
    c.allocate("j", "e", ONE, free=[0])
    again = c.allocate("j", "e", ONE, allocate=[0, 1, 2, 3, 9], policy=policy)
    assert len(set(again.machines)) == len(again.machines) == 4


def test_unknown_entitlement_is_not_found():
    c = two_type_region()
    with pytest.raises(NotFound):
        c.allocate("j", "nope", ONE, allocate=[0])


def test_stack_prefers_entitlement_machines_best_fit():
    c = Cluster.machines(*[machine(f"m{i}", msb="1", rack="r1") for i in range(4)])
    c.entitlement("e", machines=4)
    c.allocate("big", "e", Resources(cpu=12), allocate=[0])  # m? gets 4 RRU left
    c.allocate("mid", "e", Resources(cpu=8), allocate=[0])  # another gets 8 left
    big, mid = c.allocator.placement("big")[0], c.allocator.placement("mid")[0]
    assert big != mid  # 12 + 8 > 16
    small = c.allocate("small", "e", Resources(cpu=4), allocate=[0])
    assert small.placements[0] == big  # best fit: the machine with the least room
    assert small.claimed == ()
    two = c.allocate("two", "e", Resources(cpu=4), allocate=[0])
    assert two.placements[0] == mid


def test_spread_rack_then_stack():
    c = Cluster.machines(*[machine(f"m{r}{i}", msb="1", rack=f"r{r}")
                           for r in range(3) for i in range(2)])
    c.entitlement("e", machines=6)
    policy = AllocationPolicy(preferences=(SPREAD_RACK, STACK))
    r = c.allocate("j", "e", ONE, allocate=range(6), policy=policy)
    racks = [c.fleet.fault_domain(m).rack for m in r.machines]
    assert sorted(racks) == ["r0", "r0", "r1", "r1", "r2", "r2"]
    # stack: within each rack both tasks share one machine
    assert len(set(r.machines)) == 3


def test_stack_first_packs_regardless_of_spread():
    c = Cluster.machines(*[machine(f"m{i}", msb=f"msb{i}") for i in range(3)])
    c.entitlement("e", machines=3)
    policy = AllocationPolicy(preferences=(STACK, SPREAD_MSB))
    r = c.allocate("j", "e", ONE, allocate=range(5), policy=policy)
    assert len(set(r.machines)) == 1  # all five on the first machine claimed


def test_spread_dc_then_msb_balances_dcs_exactly_for_an_existing_job():
    c = Cluster.generated(dcs=3, msbs_per_dc=3, rows_per_msb=1, racks_per_row=1,
                          machines_per_rack=4)
    c.entitlement("e", machines=36)
    policy = AllocationPolicy(preferences=(SPREAD_DC, SPREAD_MSB, STACK))
    c.allocate("j", "e", ONE, allocate=range(4), policy=policy)
    r = c.allocate("j", "e", ONE, allocate=range(10), policy=policy)
    dcs = sorted([c.fleet.fault_domain(m).dc for m in r.machines])
    assert [dcs.count(d) for d in ("dc1", "dc2", "dc3")] in ([4, 3, 3], [3, 4, 3], [3, 3, 4])


def test_spread_by_type_alternates_machine_types():
    c = two_type_region()
    c.entitlement("e", machines=100)
    policy = AllocationPolicy(preferences=(Preference(strategy=Strategy.SPREAD,
                                                      property=Property.TYPE), STACK))
    r = c.allocate("j", "e", ONE, allocate=range(10), policy=policy)
    types = [c.fleet.machine(m).type for m in r.machines]
    assert types.count("skylake") == types.count("milan") == 5


def test_no_room_anywhere_is_a_result_not_an_exception():
    c = Cluster.machines(machine("a"))
    c.entitlement("e", machines=1)
    r = c.allocate("j", "e", Resources(cpu=8), allocate=[0, 1, 2])
    assert len(r.machines) == 2 and r.unplaced == ((2, NO_MACHINE + (
        " (the entitlement's 1 machine has no room for it; the free pool has no machine "
        "that meets the requirements)")),)
    r = c.allocate("k", "e", Resources(cpu=17), allocate=[0])
    assert r.machines == () and r.unplaced == ((0, (
        "no machine of the region is big enough for one task: cpu 17 > the largest "
        "machine's 16")),)


def test_a_task_no_machine_could_ever_hold_says_what_it_lacks():
    # it said "no machine satisfies the hard requirements with room for the task", as
    # if it waited for room: it waits for a machine that does not exist
    c = Cluster.machines(machine("a"), machine("b", type="milan"))
    c.entitlement("e", machines=2)
    big = c.allocate("j", "e", Resources(cpu=4, memory_gb=1000), allocate=[0])
    assert big.unplaced[0][1].startswith("no machine of the region is big enough for one "
                                         "task: memory 1000 GB > the largest machine's ")
    floor = AllocationPolicy(requirements=Requirements(min_free=Resources(cpu=14)))
    kept = c.allocate("k", "e", Resources(cpu=4), allocate=[0], policy=floor)
    assert kept.unplaced[0][1] == (
        "no machine of the region is big enough for one task: cpu 18 (4 + 14 kept free) "
        "> the largest machine's 16")
    typed = AllocationPolicy(requirements=Requirements(machine_types=["graviton"]))
    none = c.allocate("l", "e", ONE, allocate=[0], policy=typed)
    assert none.unplaced[0][1] == (
        "no machine of the region matches the requirements (type in ['graviton']): the "
        "task cannot be placed until such machines join")
    assert c.machines_of("e") == set()


def test_no_room_says_whether_the_free_pool_could_have_helped():
    c = Cluster.machines(machine("a"), machine("b"), machine("c"))
    c.entitlement("e", machines=3)
    c.entitlement("f", machines=1)
    assert c.allocate("j", "f", Resources(cpu=16), allocate=[0]).machines  # (takes one)
    # every machine bound: the free pool could not help either
    r = c.allocate("k", "e", Resources(cpu=16), allocate=[0, 1, 2])
    assert r.unplaced == ((2, NO_MACHINE + (
        " (the entitlement's 2 machines have no room for it; the free pool has no machine "
        "that meets the requirements)")),)
    r = c.allocate("l", "e", Resources(cpu=1), allocate=[0])
    assert r.unplaced == ((0, NO_MACHINE + (
        " (the entitlement's 2 machines have no room for it; the free pool has no machine "
        "that meets the requirements)")),)
    c.entitlement("g", machines=1)
    r = c.allocate("m", "g", Resources(cpu=1), allocate=[0])
    assert r.unplaced == ((0, NO_MACHINE + (
        " (the entitlement has no machine, and the free pool none that meets the "
        "requirements)")),)
