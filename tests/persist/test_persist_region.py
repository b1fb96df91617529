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


def test_a_deposed_leader_writes_no_binding_and_no_event(tmp_path):
    """Every write checks the election's fence in its transaction: a leader paused
    past its lease, then woken with a stale view of heartbeats, fails no machine."""
    store = SqliteStore(str(tmp_path / "plait.db"))
    store.create("/election/leader", b"a")
    c = cluster(store)
    c.region.fence = ("/election/leader", 0)
    c.region.claim(0, "e", c.region.version(0))  # while it leads: stored
    c.region.add_event(UnavailabilityEvent("mx", EventKind.MAINTENANCE, (FLEET.name(3),),
                                           start=10, end=20), 0)
    store.set("/election/leader", b"b", 0)  # another replica was elected meanwhile
    with pytest.raises(Conflict):
        c.region.add_event(UnavailabilityEvent("health-m", EventKind.FAILURE,
                                               (FLEET.name(1),), 0), 0)
    with pytest.raises(Conflict):
        c.region.claim(2, "e", c.region.version(2))
    with pytest.raises(Conflict):
        c.region.set_cordon(4, True)
    assert c.region.record(1).state.value == "healthy"  # (nothing taken in memory)
    assert not store.exists("/broker/events/health-m")
    again = cluster(SqliteStore(str(tmp_path / "plait.db")))  # as the new leader reads it
    assert [again.region.record(m).entitlement for m in (0, 2)] == ["e", None]
    assert not again.region.record(4).cordoned
    assert {e.id for e in again.region.events()} == {"mx"}
