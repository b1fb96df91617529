"""The index: memory per machine, partitions kept in step with the brokers."""

import numpy as np

from plait.allocator import MachineIndex
from plait.broker import Region
from plait.model import RegionSpec, generate
from plait.testing import Cluster, check_invariants


def test_index_memory_stays_under_300_bytes_per_machine():
    fleet = generate(RegionSpec.sized(50_000))
    index = MachineIndex(fleet, Region(fleet))
    assert index.nbytes() / len(fleet) <= 300


def test_index_built_over_a_region_with_history_matches_it():
    c = Cluster.generated(dcs=2, msbs_per_dc=2, rows_per_msb=1, racks_per_row=2,
                          machines_per_rack=2)
    c.give("e1", "m0000000", "m0000003")
    c.region.claim(5, "e2", c.region.version(5))
    c.region.release(5, "e2", c.region.version(5))
    late = MachineIndex(c.fleet, c.region)  # a new allocator (restart, other shard)
    assert sorted(late.machines_of(c.region.entitlements.code("e1")).tolist()) == [0, 3]
    assert late.is_free(5) and not late.is_free(0)
    assert int(late.version[5]) == c.region.version(5)
    check_invariants(Cluster(c.fleet, c.region, late, c.allocator))


def test_tie_break_rank_of_racks_alternates_over_dcs_then_msbs_then_rows():
    fleet = generate(RegionSpec(dcs=2, msbs_per_dc=3, rows_per_msb=2, racks_per_row=2,
                                machines_per_rack=1))
    index = MachineIndex(fleet, Region(fleet))
    racks = np.argsort(index.interleave["rack"])
    row = fleet.parent["rack"][racks]
    msb = fleet.parent["row"][row]
    dc = fleet.parent["msb"][msb]
    assert dc[:2].tolist() in ([0, 1], [1, 0])  # first one rack in each DC
    assert len(set(msb[:6].tolist())) == 6  # then one in each MSB
    assert len(set(row[:12].tolist())) == 12  # then one in each row
    # MSBs: the first of every DC, then the second of every DC (as before)
    msbs = np.argsort(index.interleave["msb"])
    assert fleet.parent["msb"][msbs].tolist() == [0, 1, 0, 1, 0, 1]
