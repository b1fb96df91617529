"""The brokers' records survive a restart and are shared safely between processes."""

import pytest

from plait.allocator import AllocationRequest, Allocator, MachineIndex
from plait.errors import Conflict
from plait.model import (
    Entitlement,
    EventKind,
    Quota,
    RegionSpec,
    Resources,
    UnavailabilityEvent,
    generate,
)
from plait.persist import PersistentRegion
from plait.store import SqliteStore
from plait.testing import Cluster, check_invariants

FLEET = generate(RegionSpec(dcs=2, msbs_per_dc=2, rows_per_msb=1, racks_per_row=2,
                            machines_per_rack=2))


def cluster(store, now=0.0):
    region = PersistentRegion.load(FLEET, store, now=now)
    index = MachineIndex(FLEET, region)
    allocator = Allocator(index)
    allocator.define(Entitlement(name="e", owner="o", quota=Quota(machines=8)))
    return Cluster(FLEET, region, index, allocator)


def test_bindings_and_events_survive_a_restart(tmp_path):
    store = SqliteStore(str(tmp_path / "plait.db"))
    c = cluster(store)
    r = c.allocator.allocate(AllocationRequest.of("j", "e", Resources(cpu=16), allocate=range(3)))
    claimed = set(r.machines)
    c.region.add_event(UnavailabilityEvent("f1", EventKind.FAILURE, (FLEET.name(7),), 0), 0)
    c.region.add_event(UnavailabilityEvent("mx", EventKind.MAINTENANCE, (FLEET.name(6),),
                                           start=10, end=20), 0)
    c.region.add_event(UnavailabilityEvent("old", EventKind.MAINTENANCE, (FLEET.name(5),),
                                           start=1, end=2), 0)
    store.close()

    again = SqliteStore(str(tmp_path / "plait.db"))  # a restarted control plane
    d = cluster(again, now=5)  # "old" (1-2) ended while the control plane was down
    assert {m for m in range(len(FLEET)) if d.region.record(m).entitlement == "e"} == claimed
    assert d.region.record(7).state.value == "failed"
    assert d.region.record(6).cordoned  # the announced maintenance is still ahead
    assert {e.id for e in d.region.events()} == {"f1", "mx"}  # "old" ended while down
    assert set(again.children("/broker/events")) == {"f1", "mx"}
    d.region.end_event("f1", 6)
    assert set(again.children("/broker/events")) == {"mx"}
    check_invariants(d)


def test_two_processes_cannot_both_claim_one_machine(tmp_path):
    a = cluster(SqliteStore(str(tmp_path / "plait.db")))
    b = cluster(SqliteStore(str(tmp_path / "plait.db")))  # loaded before a's claim
    version = a.region.version(0)
    a.region.claim(0, "e", version)
    with pytest.raises(Conflict):
        b.region.claim(0, "e2", b.region.version(0))  # b's view is stale; the store says no
    # b's claim is not applied; b now sees the machine as the store has it (a's claim),
    # so its next decision picks another machine
    assert b.region.record(0).entitlement == "e"
    assert b.allocator.index.ent[0] == b.region.entitlements.code("e")
    c = cluster(SqliteStore(str(tmp_path / "plait.db")))
    assert c.region.record(0).entitlement == "e"


def test_a_release_is_stored_too(tmp_path):
    store = SqliteStore(str(tmp_path / "plait.db"))
    c = cluster(store)
    c.allocator.allocate(AllocationRequest.of("j", "e", Resources(cpu=16), allocate=[0]))
    c.allocator.allocate(AllocationRequest.of("j", "e", Resources(cpu=16), free=[0]))
    d = cluster(store)
    assert all(d.region.record(m).entitlement is None for m in range(len(FLEET)))
