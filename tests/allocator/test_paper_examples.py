"""The paper's own examples: Figures 6 and 7, and the buffer arithmetic of 2.2."""

import math

import numpy as np
import pytest

from plait.model import Resources
from plait.testing import Cluster, machine

HALF = Resources(cpu=8, memory_gb=16)
QUARTER = Resources(cpu=4, memory_gb=8)
WHOLE = Resources(cpu=16, memory_gb=64)


def test_figure7_entitlement_grows_and_shrinks_with_its_jobs():
    # the figure's region has three free machines; the entitlement starts empty
    c = Cluster.machines(machine("M7", msb="msb1"), machine("M8", msb="msb2"),
                         machine("M9", msb="msb3"))
    c.entitlement("ent", machines=10)
    assert c.machines_of("ent") == set()
    assert len(c.region.free_machines()) == 3

    d = c.allocate("D", "ent", HALF, allocate=[0])
    assert d.placements == {0: "M7"}
    assert d.machine_ids(d.claimed) == ["M7"]  # M7 joins the entitlement
    assert c.machines_of("ent") == {"M7"}

    e = c.allocate("E", "ent", HALF, allocate=[0, 1])
    assert sorted(e.placements.values()) == ["M7", "M8"]  # one task stacks on M7
    assert e.machine_ids(e.claimed) == ["M8"]  # M8 joins for the other
    assert c.machines_of("ent") == {"M7", "M8"}

    stop = c.allocate("E", "ent", HALF, free=[0, 1])
    assert stop.freed == (0, 1)
    assert stop.machine_ids(stop.released) == ["M8"]  # M8 returns to the free pool
    assert c.machines_of("ent") == {"M7"}  # D still runs on M7
    assert c.allocator.placement("D") == {0: "M7"}
    assert c.region.record(c.fleet.index_of("M8")).entitlement is None
    assert len(c.region.free_machines()) == 2  # (2) free machines again, as in the figure


def test_figure6_jobs_of_one_entitlement_stack_and_another_grows():
    c = Cluster.machines(*[machine(f"M{i}", msb=f"msb{i}") for i in range(1, 7)])
    c.entitlement("ent1", machines=3)
    c.entitlement("ent2", machines=3)
    c.give("ent1", "M1", "M3", "M4")
    c.give("ent2", "M2", "M5")
    c1 = c.allocate("C", "ent2", WHOLE, allocate=[0, 1])
    assert sorted(c1.placements.values()) == ["M2", "M5"] and c1.claimed == ()

    a = c.allocate("A", "ent1", QUARTER, allocate=[0, 1])
    b = c.allocate("B", "ent1", QUARTER, allocate=[0, 1])
    # both jobs stay on the entitlement's own machines and share one of them
    assert set(a.placements.values()) | set(b.placements.values()) <= {"M1", "M3", "M4"}
    assert "M3" in set(a.placements.values()) & set(b.placements.values())
    assert a.claimed == b.claimed == ()

    grown = c.allocate("C", "ent2", WHOLE, allocate=[0, 1, 2])
    assert grown.placements == {0: c1.placements[0], 1: c1.placements[1], 2: "M6"}
    assert grown.machine_ids(grown.claimed) == ["M6"]  # ent2 grows by M6
    assert c.machines_of("ent2") == {"M2", "M5", "M6"}
    assert c.machines_of("ent1") == {"M1", "M3", "M4"}


def _worst_msb_share(c, job):
    placement = c.allocator.jobs[job].placement
    msbs = c.index.loc["msb"][np.fromiter(placement.values(), np.int64)]
    return np.bincount(msbs).max(), len(placement)


@pytest.mark.parametrize("n", [1, 11, 12, 13, 36, 100, 500])
def test_spread_over_12_msbs_of_one_dc_loses_at_most_ceil_n_over_12(n):
    c = Cluster.generated(dcs=2, msbs_per_dc=12, rows_per_msb=2, racks_per_row=2,
                          machines_per_rack=4)
    c.entitlement("pinned", machines=1000, pin_dc="dc1")
    result = c.allocate("job", "pinned", Resources(cpu=1, memory_gb=1), allocate=range(n))
    assert result.complete
    assert {c.fleet.fault_domain(m).dc for m in result.machines} == {"dc1"}
    worst, total = _worst_msb_share(c, "job")
    assert total == n
    assert worst <= math.ceil(n / 12)


@pytest.mark.parametrize("n", [1, 59, 60, 61, 120, 1000])
def test_spread_over_60_msbs_of_5_dcs_loses_at_most_ceil_n_over_60(n):
    c = Cluster.generated(dcs=5, msbs_per_dc=12, rows_per_msb=1, racks_per_row=2,
                          machines_per_rack=4)
    c.entitlement("region-wide", machines=10_000)
    result = c.allocate("job", "region-wide", Resources(cpu=1, memory_gb=1), allocate=range(n))
    assert result.complete
    worst, _ = _worst_msb_share(c, "job")
    assert worst <= math.ceil(n / 60)
    # ties between MSBs alternate DCs, so a fresh job is balanced over DCs as well
    dcs = np.bincount(c.index.loc["dc"][np.asarray(result.machines)], minlength=5)
    assert dcs.max() - dcs.min() <= 1
