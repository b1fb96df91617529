"""The index: memory per machine, partitions kept in step with the brokers."""

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
