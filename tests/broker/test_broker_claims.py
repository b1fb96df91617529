"""Resource Broker: DC routing, compare-and-swap claims and releases, subscriptions."""

from __future__ import annotations

import numpy as np
import pytest

from plait.broker import (
    FREE,
    BrokerChange,
    ChangeKind,
    Interner,
    MachineRecord,
    Region,
    ResourceBroker,
)
from plait.errors import Conflict, NotFound
from plait.model import FaultDomain, Fleet, Machine, MachineState, RegionSpec, Resources, generate

SPEC = RegionSpec(dcs=2, msbs_per_dc=2, rows_per_msb=1, racks_per_row=2, machines_per_rack=3)


def region() -> Region:
    return Region(generate(SPEC))


# -- routing --------------------------------------------------------------------------------


def test_one_broker_per_dc_owning_exactly_its_machines() -> None:
    fleet = generate(SPEC)
    r = Region(fleet)
    assert list(r.brokers) == ["dc1", "dc2"]
    dc1, dc2 = r.brokers["dc1"], r.brokers["dc2"]
    assert dc1.dc == "dc1" and dc2.dc == "dc2"
    np.testing.assert_array_equal(dc1.machines, np.arange(0, 12))
    np.testing.assert_array_equal(dc2.machines, np.arange(12, 24))
    for i in range(len(fleet)):
        expected = "dc1" if fleet.machine(i).fault_domain.dc == "dc1" else "dc2"
        assert r.broker_of(i) is r.brokers[expected]
        assert r.brokers[expected].owns(i)
        assert not r.brokers["dc2" if expected == "dc1" else "dc1"].owns(i)


def test_routing_with_interleaved_explicit_fleet() -> None:
    # machines of the two DCs are interleaved in the table
    machines = [
        Machine(f"h{i}", "t", Resources(cpu=4),
                FaultDomain.parse(f"r/{'east' if i % 2 else 'west'}/msb1/row1/rack{i % 3}"))
        for i in range(7)
    ]
    r = Region(Fleet.from_machines(machines))
    assert set(r.brokers) == {"west", "east"}
    np.testing.assert_array_equal(r.brokers["west"].machines, [0, 2, 4, 6])
    np.testing.assert_array_equal(r.brokers["east"].machines, [1, 3, 5])
    # every broker's record columns line up with its machines
    v = r.claim(5, "ent", 0)
    assert v == 1
    east = r.brokers["east"]
    np.testing.assert_array_equal(east.versions(), [0, 0, 1])
    np.testing.assert_array_equal(east.entitlement_codes(), [FREE, FREE, 0])
    np.testing.assert_array_equal(r.brokers["west"].versions(), [0, 0, 0, 0])
    assert r.record(5) == MachineRecord("h5", "east", "ent", 1, MachineState.HEALTHY)
    assert r.record(4).entitlement is None


def test_out_of_range_machine_not_found() -> None:
    r = region()
    for bad in (-1, 24, 10**6):
        with pytest.raises(NotFound):
            r.broker_of(bad)
        with pytest.raises(NotFound):
            r.claim(bad, "ent", 0)


def test_broker_rejects_machine_of_another_dc() -> None:
    r = region()
    dc1 = r.brokers["dc1"]
    for call in (lambda: dc1.claim(12, "ent", 0), lambda: dc1.version(12),
                 lambda: dc1.record(23), lambda: dc1.state(-1),
                 lambda: dc1.release(13, "ent", 0), lambda: dc1.entitlement_of(24)):
        with pytest.raises(NotFound):
            call()
    # nothing changed in either DC
    assert r.version(12) == 0
    assert dc1.versions().sum() == 0


def test_standalone_broker_uses_region_wide_indices() -> None:
    fleet = generate(SPEC)
    broker = ResourceBroker(fleet, "dc2", Interner())
    np.testing.assert_array_equal(broker.machines, np.arange(12, 24))
    assert broker.claim(20, "ent", 0) == 1
    np.testing.assert_array_equal(broker.machines_of("ent"), [20])
    assert broker.record(20) == MachineRecord("m0000020", "dc2", "ent", 1, MachineState.HEALTHY)
    with pytest.raises(NotFound):
        broker.claim(3, "ent", 0)
    with pytest.raises(NotFound):
        ResourceBroker(fleet, "dc9", Interner())


# -- claim / release --------------------------------------------------------------------------


def test_fresh_records() -> None:
    r = region()
    for i in (0, 11, 12, 23):
        assert r.record(i) == MachineRecord(f"m{i:07d}", "dc1" if i < 12 else "dc2", None, 0,
                                            MachineState.HEALTHY)
    np.testing.assert_array_equal(np.sort(r.free_machines()), np.arange(24))
    assert r.machines_of("nobody").size == 0


def test_claim_with_current_version_bumps_version() -> None:
    r = region()
    assert r.version(3) == 0
    assert r.claim(3, "ads", 0) == 1
    assert r.version(3) == 1
    rec = r.record(3)
    assert (rec.entitlement, rec.version) == ("ads", 1)
    assert r.broker_of(3).entitlement_of(3) == "ads"
    assert 3 not in r.free_machines().tolist()
    np.testing.assert_array_equal(r.machines_of("ads"), [3])


@pytest.mark.parametrize("stale", [1, -1, 7])
def test_claim_with_wrong_version_conflicts(stale: int) -> None:
    r = region()
    with pytest.raises(Conflict) as exc:
        r.claim(3, "ads", stale)
    assert exc.value.expected == stale
    assert exc.value.actual == 0
    assert r.record(3) == MachineRecord("m0000003", "dc1", None, 0, MachineState.HEALTHY)


def test_claim_with_stale_version_after_change_conflicts() -> None:
    r = region()
    v = r.claim(3, "ads", 0)
    v = r.release(3, "ads", v)
    assert v == 2
    with pytest.raises(Conflict):
        r.claim(3, "ads", 0)
    with pytest.raises(Conflict):
        r.claim(3, "ads", 1)
    assert r.claim(3, "web", 2) == 3


def test_claim_of_bound_machine_conflicts_even_with_right_version() -> None:
    r = region()
    v = r.claim(14, "ads", 0)
    for ent in ("web", "ads"):
        with pytest.raises(Conflict) as exc:
            r.claim(14, ent, v)
        assert exc.value.actual == "ads"
    assert r.record(14).entitlement == "ads"
    assert r.version(14) == v


def test_release_needs_right_entitlement_and_version() -> None:
    r = region()
    v = r.claim(5, "ads", 0)
    with pytest.raises(Conflict):
        r.release(5, "web", v)
    with pytest.raises(Conflict):
        r.release(5, "ads", v - 1)
    with pytest.raises(Conflict):
        r.release(5, "ads", v + 1)
    assert r.record(5).entitlement == "ads"
    assert r.version(5) == v
    assert r.release(5, "ads", v) == v + 1
    rec = r.record(5)
    assert (rec.entitlement, rec.version) == (None, v + 1)
    assert 5 in r.free_machines().tolist()
    assert r.machines_of("ads").size == 0


def test_release_of_free_machine_conflicts() -> None:
    r = region()
    with pytest.raises(Conflict) as exc:
        r.release(7, "ads", 0)
    assert exc.value.actual is None
    assert r.version(7) == 0


def test_free_machines_and_machines_of_partition_the_region() -> None:
    r = region()
    for i in (0, 4, 12, 13):
        r.claim(i, "ads", 0)
    for i in (1, 22):
        r.claim(i, "web", 0)
    np.testing.assert_array_equal(np.sort(r.machines_of("ads")), [0, 4, 12, 13])
    np.testing.assert_array_equal(np.sort(r.machines_of("web")), [1, 22])
    np.testing.assert_array_equal(r.brokers["dc1"].machines_of("ads"), [0, 4])
    np.testing.assert_array_equal(r.brokers["dc2"].machines_of("ads"), [12, 13])
    np.testing.assert_array_equal(r.brokers["dc1"].machines_of("web"), [1])
    free = sorted(r.free_machines().tolist())
    assert free == sorted(set(range(24)) - {0, 1, 4, 12, 13, 22})
    assert r.brokers["dc2"].free_machines().tolist() == [
        i for i in range(12, 24) if i not in (12, 13, 22)]


def test_entitlement_codes_are_region_wide() -> None:
    r = region()
    r.claim(13, "web", 0)  # dc2 first
    r.claim(2, "ads", 0)
    assert r.entitlements.names == ["web", "ads"]
    assert r.brokers["dc1"].entitlement_codes()[2] == r.entitlements.find("ads") == 1
    assert r.brokers["dc2"].entitlement_codes()[1] == r.entitlements.find("web") == 0


def test_column_reads_are_copies() -> None:
    r = region()
    b = r.brokers["dc1"]
    b.versions()[0] = 99
    b.entitlement_codes()[0] = 5
    b.state_codes()[0] = 1
    assert r.record(0) == MachineRecord("m0000000", "dc1", None, 0, MachineState.HEALTHY)


# -- racing shards ----------------------------------------------------------------------------


def test_two_shards_race_for_one_free_machine() -> None:
    r = region()
    m = 9
    seen_by_a = r.version(m)
    seen_by_b = r.version(m)
    assert seen_by_a == seen_by_b == 0
    winner = r.claim(m, "shard-a-ent", seen_by_a)
    with pytest.raises(Conflict):
        r.claim(m, "shard-b-ent", seen_by_b)
    assert winner == 1
    assert r.record(m).entitlement == "shard-a-ent"
    assert r.machines_of("shard-b-ent").size == 0


def test_racing_on_every_machine_has_exactly_one_winner() -> None:
    r = region()
    reads = {m: (r.version(m), r.version(m)) for m in range(24)}
    wins = {"a": 0, "b": 0}
    for m, (va, vb) in reads.items():
        order = ("a", "b") if m % 2 else ("b", "a")
        versions = {"a": va, "b": vb}
        outcomes = []
        for shard in order:
            try:
                r.claim(m, shard, versions[shard])
                outcomes.append(shard)
                wins[shard] += 1
            except Conflict:
                pass
        assert outcomes == [order[0]]
    assert wins == {"a": 12, "b": 12}
    assert r.free_machines().size == 0


# -- subscriptions ------------------------------------------------------------------------------


def test_subscribers_told_of_claim_and_release() -> None:
    r = region()
    b = r.brokers["dc1"]
    seen: list[BrokerChange] = []
    also: list[BrokerChange] = []
    b.subscribe(seen.append)
    b.subscribe(also.append)
    v = b.claim(4, "ads", 0)
    assert seen == [BrokerChange(ChangeKind.CLAIMED, 4, "ads", 1, MachineState.HEALTHY)]
    b.release(4, "ads", v)
    assert seen[-1] == BrokerChange(ChangeKind.RELEASED, 4, None, 2, MachineState.HEALTHY)
    assert also == seen
    assert len(seen) == 2


def test_failed_cas_notifies_nobody() -> None:
    r = region()
    seen: list[BrokerChange] = []
    r.subscribe(seen.append)
    with pytest.raises(Conflict):
        r.claim(4, "ads", 3)
    with pytest.raises(Conflict):
        r.release(4, "ads", 0)
    assert seen == []


def test_notification_is_synchronous_and_sees_new_state() -> None:
    r = region()
    during: list[MachineRecord] = []
    r.subscribe(lambda change: during.append(r.record(change.machine)))
    r.claim(15, "ads", 0)
    assert during == [MachineRecord("m0000015", "dc2", "ads", 1, MachineState.HEALTHY)]


def test_region_subscribe_hears_every_broker() -> None:
    r = region()
    seen: list[BrokerChange] = []
    r.subscribe(seen.append)
    r.claim(1, "ads", 0)
    r.claim(20, "web", 0)
    r.release(20, "web", 1)
    assert seen == [
        BrokerChange(ChangeKind.CLAIMED, 1, "ads", 1, MachineState.HEALTHY),
        BrokerChange(ChangeKind.CLAIMED, 20, "web", 1, MachineState.HEALTHY),
        BrokerChange(ChangeKind.RELEASED, 20, None, 2, MachineState.HEALTHY),
    ]


def test_broker_subscriber_hears_only_its_dc() -> None:
    r = region()
    seen: list[BrokerChange] = []
    r.brokers["dc2"].subscribe(seen.append)
    r.claim(1, "ads", 0)
    assert seen == []
    r.claim(13, "ads", 0)
    assert [c.machine for c in seen] == [13]
