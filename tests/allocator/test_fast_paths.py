"""The allocator's fast paths decide exactly what the straightforward code would."""

import random

import numpy as np
import pytest

from plait.allocator import AllocationRequest, MachineIndex, placement
from plait.allocator import index as index_module
from plait.broker import Region
from plait.errors import Conflict
from plait.model import (
    SPREAD_MSB,
    SPREAD_RACK,
    STACK,
    AllocationPolicy,
    EventKind,
    Fleet,
    MachineType,
    Preference,
    Property,
    Requirements,
    Resources,
    UnavailabilityEvent,
)
from plait.testing import Cluster, check_invariants, machine

SPREAD_TYPE = Preference(strategy="spread", property=Property.TYPE)


def mixed_fleet(seed: int, n: int = 400) -> Fleet:
    rnd = random.Random(seed)
    return Fleet.from_machines([
        machine(f"x{i}", dc=f"d{rnd.randrange(2)}", msb=f"m{rnd.randrange(3)}",
                row=f"r{rnd.randrange(2)}", rack=f"k{rnd.randrange(4)}",
                resources=Resources(cpu=rnd.choice([8, 16, 32]), memory_gb=rnd.choice([32, 64]),
                                    disk_gb=rnd.choice([0, 100, 5000])),
                type=rnd.choice(["a", "b", "c"]),
                attributes={k: v for k, v in (("nic", rnd.choice(["25g", "100g", None])),
                                              ("gpu", rnd.choice(["v100", None]))) if v})
        for i in rnd.sample(range(n), n)  # machine order unrelated to the topology
    ])


def test_shapes_match_a_row_unique_over_the_whole_table():
    fleet = mixed_fleet(1)
    shape, shape_type, units, attrs = index_module._shapes(fleet)
    keys = list(fleet.attributes)
    table = np.stack([fleet.type_code, fleet.cpu, fleet.memory, fleet.disk]
                     + [fleet.attributes[k][0] for k in keys], axis=1).astype(np.int64)
    uniq, inverse = np.unique(table, axis=0, return_inverse=True)
    assert shape.tolist() == inverse.reshape(-1).tolist()
    assert shape_type.tolist() == uniq[:, 0].tolist()
    assert units.tolist() == uniq[:, 1:4].tolist()
    assert len(attrs) == uniq.shape[0]


@pytest.mark.parametrize("values", [
    [5, 3, 5, 9, 3],
    [10**12, -7, 10**12, 3, 2**40],  # a wide range: sorted, not tabled
    [4],
])
def test_factorize_numbers_values_in_order(values):
    codes, n = index_module._factorize(np.asarray(values, np.int64))
    uniq, inverse = np.unique(values, return_inverse=True)
    assert codes.tolist() == inverse.tolist() and n == uniq.size


def test_bulk_free_lists_are_in_machine_order_per_bucket():
    fleet = mixed_fleet(2)
    index = MachineIndex(fleet, Region(fleet))
    n_shapes = index.shape_type.size
    for rack in range(len(fleet.level_names["rack"])):
        for s in range(n_shapes):
            expected = np.flatnonzero((fleet.codes["rack"] == rack) & (index.shape == s))
            assert list(index.free_in_rack(rack, s)) == expected.tolist()


def test_healthy_shape_column_follows_failures_and_repairs():
    c = Cluster.generated(dcs=1, msbs_per_dc=2, rows_per_msb=1, racks_per_row=2,
                          machines_per_rack=2)
    c.region.add_event(UnavailabilityEvent("f", EventKind.FAILURE, ("m0000001",), start=0), 0)
    n_shapes = c.index.shape_type.size
    assert int(c.index.hshape[1]) == n_shapes
    assert int(c.index.hshape[0]) == int(c.index.shape[0])
    c.region.end_event("f", 1)
    assert int(c.index.hshape[1]) == int(c.index.shape[1])


def test_layout_numbers_bins_in_tie_break_order_and_cells_best_fit_first():
    c = Cluster.generated(dcs=2, msbs_per_dc=3, rows_per_msb=1, racks_per_row=2,
                          machines_per_rack=2,
                          types=[MachineType(name="big", resources=Resources(cpu=32, memory_gb=64)),
                                 MachineType(name="small", resources=Resources(cpu=8,
                                                                               memory_gb=32))])
    c.entitlement("e", machines=100)
    cp = c.allocator.compile(AllocationRequest.of("j", "e", Resources(cpu=1), allocate=[0]))
    layout = cp.layout
    msbs = [int(np.flatnonzero(layout.pos == p)[0]) for p in range(layout.n_bins)]
    assert [c.index.interleave["msb"][m] for m in msbs] == list(range(layout.n_bins))
    for p in range(layout.n_bins):
        cells = range(int(layout.cell_lo[p]), int(layout.cell_hi[p]))
        room = [(layout.cell_cpu[j], layout.cell_mem[j]) for j in cells]
        assert room == sorted(room)
        assert {layout.cell_dom[j] for j in cells} == {msbs[p]}


POLICIES = [
    AllocationPolicy(),
    AllocationPolicy(preferences=(SPREAD_RACK, STACK)),
    AllocationPolicy(preferences=(SPREAD_TYPE,)),
    AllocationPolicy(requirements=Requirements(machine_types=("skylake",))),
    AllocationPolicy(preferences=(SPREAD_MSB,), requirements=Requirements(max_tasks_per_machine=1)),
]


def run_new_jobs(monkeypatch, seed: int, one_per_bin: bool, fail_claim: int | None = None):
    """New jobs, few tasks each, tight quotas; optionally without the one-task-per-bin
    path, and with the ``fail_claim``-th claim finding no machine."""
    if not one_per_bin:
        monkeypatch.setattr(placement._Placer, "_one_per_bin", lambda self, tasks, entries: 0)
    if fail_claim is not None:
        calls = [0]
        real = MachineIndex.first_free

        def first_free(self, buckets, skip):
            calls[0] += 1
            return None if calls[0] == fail_claim else real(self, buckets, skip)

        monkeypatch.setattr(MachineIndex, "first_free", first_free)
    rnd = random.Random(seed)
    c = Cluster.generated(dcs=2, msbs_per_dc=3, rows_per_msb=2, racks_per_row=2,
                          machines_per_rack=3)
    for k, quota in enumerate([2, 5, 9, 40]):
        c.entitlement(f"e{k}", machines=quota)
    results = []
    for j in range(60):
        r = c.allocate(f"j{j}", f"e{rnd.randrange(4)}",
                       Resources(cpu=rnd.choice([1, 4, 16]), memory_gb=2),
                       allocate=range(rnd.randrange(1, 9)), policy=rnd.choice(POLICIES))
        results.append((r.tasks, r.machines, r.unplaced, r.claimed))
    check_invariants(c)
    monkeypatch.undo()
    return results


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_one_task_per_bin_matches_the_heap(monkeypatch, seed):
    assert run_new_jobs(monkeypatch, seed, True) == run_new_jobs(monkeypatch, seed, False)


@pytest.mark.parametrize("fail", [1, 4])
def test_a_claim_that_finds_no_machine_falls_back_to_the_heap(monkeypatch, fail):
    assert (run_new_jobs(monkeypatch, 5, True, fail_claim=fail)
            == run_new_jobs(monkeypatch, 5, False, fail_claim=fail))


def test_commit_still_verifies_when_the_index_changed_after_the_plan():
    c = Cluster.machines(machine("a", msb="1"), machine("b", msb="2"))
    c.entitlement("e", machines=2)
    c.give("e", "a")
    half = Resources(cpu=8, memory_gb=8)
    c.allocate("seed", "e", half, allocate=[0])
    plan = c.allocator.propose(AllocationRequest.of("x", "e", half, allocate=[0]))
    c.allocate("other", "e", half, allocate=[0])  # takes a's last room
    with pytest.raises(Conflict):
        c.allocator.commit(plan)


def run_one_task_jobs(monkeypatch, seed: int, fast: bool):
    """New one-task jobs of random shapes and policies in entitlements of every size,
    with machines failing, in maintenance and back on the way; optionally without the
    path that places a new job's one task on a member with room."""
    if not fast:
        monkeypatch.setattr(placement, "one_on_a_member", lambda index, cp: None)
    rnd = random.Random(seed)
    c = Cluster.generated(dcs=2, msbs_per_dc=3, rows_per_msb=2, racks_per_row=2,
                          machines_per_rack=3)
    for k, quota in enumerate([2, 5, 9, 40]):
        c.entitlement(f"e{k}", machines=quota)
    policies = [*POLICIES,
                AllocationPolicy(requirements=Requirements(dc="dc1")),
                AllocationPolicy(preferences=(SPREAD_TYPE, STACK)),
                AllocationPolicy(preferences=(SPREAD_MSB, SPREAD_RACK, STACK))]
    results = []
    events: list[str] = []
    for j in range(150):
        if j % 25 == 24:  # a machine fails or goes into maintenance...
            m = rnd.randrange(len(c.fleet))
            events.append(f"ev{j}")
            c.region.add_event(UnavailabilityEvent(
                events[-1], rnd.choice([EventKind.FAILURE, EventKind.MAINTENANCE]),
                (c.fleet.name(m),), start=j, end=j + 1000), j)
        if j % 25 == 12 and len(events) > 1:  # ... and an earlier one comes back
            c.region.end_event(events.pop(0), j)
        if j % 10 == 9 and results:  # a job leaves: room on a member
            gone = rnd.choice([r for r in results if r[1]])
            c.allocate(gone[0], gone[1], gone[2], free=[0], policy=gone[3])
        job, ent = f"j{j}", f"e{rnd.randrange(4)}"
        res = Resources(cpu=rnd.choice([0, 1, 2, 4, 16]), memory_gb=rnd.choice([0, 1, 8]),
                        disk_gb=rnd.choice([0, 0, 50]))
        policy = rnd.choice(policies)
        r = c.allocate(job, ent, res, allocate=[0], policy=policy)
        results.append((job, ent, res, policy, r.tasks, r.machines, r.unplaced, r.claimed))
    check_invariants(c)
    monkeypatch.undo()
    return [r[4:] for r in results]


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_a_new_jobs_one_task_on_a_member_matches_the_heap(monkeypatch, seed):
    fast = run_one_task_jobs(monkeypatch, seed, True)
    assert fast == run_one_task_jobs(monkeypatch, seed, False)
    assert sum(1 for tasks, _, _, claimed in fast if tasks and not claimed) > 50
