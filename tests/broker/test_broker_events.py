"""Resource Broker: failures, planned maintenance, and machine state."""

from __future__ import annotations

import numpy as np
import pytest

from plait.broker import BrokerChange, ChangeKind, Region
from plait.errors import Conflict, NotFound, ValidationError
from plait.model import EventKind, MachineState, RegionSpec, UnavailabilityEvent, generate

SPEC = RegionSpec(dcs=2, msbs_per_dc=2, rows_per_msb=1, racks_per_row=2, machines_per_rack=3)

HEALTHY, FAILED, MAINT = MachineState.HEALTHY, MachineState.FAILED, MachineState.MAINTENANCE


def region() -> tuple[Region, list[BrokerChange]]:
    """A region and the state changes its subscribers hear (announcements apart:
    see test_announced_maintenance_cordons_until_it_starts)."""
    r = Region(generate(SPEC))
    seen: list[BrokerChange] = []
    r.subscribe(lambda c: seen.append(c) if c.kind is not ChangeKind.NOTICE else None)
    return r, seen


def mid(i: int) -> str:
    return f"m{i:07d}"


def failure(eid: str, *machines: int, start: float = 0.0,
            end: float | None = None) -> UnavailabilityEvent:
    return UnavailabilityEvent(eid, EventKind.FAILURE, tuple(mid(i) for i in machines), start, end)


def maintenance(eid: str, *machines: int, start: float, end: float) -> UnavailabilityEvent:
    return UnavailabilityEvent(eid, EventKind.MAINTENANCE, tuple(mid(i) for i in machines),
                               start, end)


def test_failure_due_now_fails_machine_at_once_and_notifies() -> None:
    r, seen = region()
    r.add_event(failure("f1", 2, 5, start=10.0), now=10.0)
    assert r.states([2, 5, 3]) == [FAILED, FAILED, HEALTHY]
    assert r.record(2).state is FAILED
    assert r.version(2) == 1 and r.version(5) == 1 and r.version(3) == 0
    assert seen == [
        BrokerChange(ChangeKind.STATE, 2, None, 1, FAILED),
        BrokerChange(ChangeKind.STATE, 5, None, 1, FAILED),
    ]
    assert [e.id for e in r.brokers["dc1"].active_events()] == ["f1"]


def test_failure_of_claimed_machine_keeps_binding_and_reports_it() -> None:
    r, seen = region()
    v = r.claim(2, "ads", 0)
    r.add_event(failure("f1", 2), now=0.0)
    assert seen[-1] == BrokerChange(ChangeKind.STATE, 2, "ads", v + 1, FAILED)
    rec = r.record(2)
    assert (rec.entitlement, rec.state, rec.version) == ("ads", FAILED, v + 1)
    # the state change bumped the version: a claim-era version is stale now
    with pytest.raises(Conflict):
        r.release(2, "ads", v)
    assert r.release(2, "ads", v + 1) == v + 2


def test_end_event_makes_machine_healthy() -> None:
    r, seen = region()
    r.add_event(failure("f1", 2), now=0.0)
    r.end_event("f1", now=5.0)
    assert r.states([2]) == [HEALTHY]
    assert r.version(2) == 2
    assert seen[-1] == BrokerChange(ChangeKind.STATE, 2, None, 2, HEALTHY)
    assert len(seen) == 2
    assert r.events() == []
    assert r.brokers["dc1"].active_events() == []


def test_failure_with_known_end_heals_on_tick() -> None:
    r, _ = region()
    r.add_event(failure("f1", 1, start=0.0, end=30.0), now=0.0)
    r.tick(29.999)
    assert r.states([1]) == [FAILED]
    r.tick(30.0)
    assert r.states([1]) == [HEALTHY]
    assert r.events() == []


def test_future_failure_waits_for_its_start() -> None:
    r, seen = region()
    r.add_event(failure("f1", 1, start=50.0), now=0.0)
    assert r.states([1]) == [HEALTHY]
    assert seen == []
    r.tick(49.0)
    assert r.states([1]) == [HEALTHY]
    r.tick(50.0)
    assert r.states([1]) == [FAILED]


def test_maintenance_window() -> None:
    r, seen = region()
    r.add_event(maintenance("mt", 3, 14, start=100.0, end=200.0), now=0.0)
    assert r.states([3, 14]) == [HEALTHY, HEALTHY]
    assert r.version(3) == 1 and seen == []  # announced: cordoned, state unchanged
    assert [e.id for e in r.events()] == ["mt", "mt"]  # one part per DC
    r.tick(99.0)
    assert r.states([3, 14]) == [HEALTHY, HEALTHY]
    r.tick(100.0)
    assert r.states([3, 14]) == [MAINT, MAINT]
    assert [(c.machine, c.state, c.version) for c in seen] == [(3, MAINT, 2), (14, MAINT, 2)]
    r.tick(150.0)
    r.tick(199.5)
    assert r.states([3, 14]) == [MAINT, MAINT]
    assert len(seen) == 2
    r.tick(200.0)
    assert r.states([3, 14]) == [HEALTHY, HEALTHY]
    assert r.version(3) == 3 and r.version(14) == 3
    assert [(c.machine, c.state) for c in seen[2:]] == [(3, HEALTHY), (14, HEALTHY)]
    assert r.events() == []


def test_maintenance_already_over_when_added() -> None:
    r, seen = region()
    r.add_event(maintenance("mt", 3, start=10.0, end=20.0), now=25.0)
    assert r.states([3]) == [HEALTHY]
    assert [c.state for c in seen] == [MAINT, HEALTHY]
    assert r.version(3) == 2
    assert r.events() == []


def test_failure_and_maintenance_overlap_failed_wins() -> None:
    r, seen = region()
    r.add_event(maintenance("mt", 4, start=10.0, end=100.0), now=0.0)  # announced: v1
    r.add_event(failure("f1", 4, start=5.0), now=5.0)
    assert r.states([4]) == [FAILED]
    assert r.version(4) == 2
    r.tick(10.0)  # maintenance starts under the failure: still FAILED, cordon lifted
    assert r.states([4]) == [FAILED]
    assert r.version(4) == 3
    assert len(seen) == 1
    assert r.brokers["dc1"].state_codes()[4] == 1
    r.end_event("f1", now=20.0)
    assert r.states([4]) == [MAINT]
    assert r.version(4) == 4
    assert seen[-1] == BrokerChange(ChangeKind.STATE, 4, None, 4, MAINT)
    r.tick(100.0)
    assert r.states([4]) == [HEALTHY]
    assert r.version(4) == 5


def test_maintenance_ends_under_failure_stays_failed() -> None:
    r, seen = region()
    r.add_event(maintenance("mt", 4, start=0.0, end=10.0), now=0.0)
    r.add_event(failure("f1", 4), now=1.0)
    assert r.states([4]) == [FAILED]
    r.tick(10.0)
    assert r.states([4]) == [FAILED]
    assert [c.state for c in seen] == [MAINT, FAILED]
    r.end_event("f1", now=11.0)
    assert r.states([4]) == [HEALTHY]
    assert r.version(4) == 3


def test_two_failures_on_one_machine_need_both_ended() -> None:
    r, seen = region()
    r.add_event(failure("f1", 6), now=0.0)
    r.add_event(failure("f2", 6, 7), now=1.0)
    assert r.version(6) == 1
    r.end_event("f1", now=2.0)
    assert r.states([6, 7]) == [FAILED, FAILED]
    assert r.version(6) == 1
    r.end_event("f2", now=3.0)
    assert r.states([6, 7]) == [HEALTHY, HEALTHY]
    assert r.version(6) == 2
    assert len(seen) == 4


def test_cancelled_maintenance_never_changes_state() -> None:
    r, seen = region()
    r.add_event(maintenance("mt", 3, 4, start=100.0, end=200.0), now=0.0)
    r.end_event("mt", now=50.0)
    assert r.events() == []
    for t in (100.0, 150.0, 200.0, 300.0):
        r.tick(t)
        assert r.states([3, 4]) == [HEALTHY, HEALTHY]
    assert seen == []
    # announced, then withdrawn: two record changes, no state change
    assert r.version(3) == 2 and r.version(4) == 2
    assert not r.record(3).cordoned
    with pytest.raises(NotFound):
        r.end_event("mt", now=400.0)


def test_event_id_reused_after_cancel_follows_its_own_times() -> None:
    r, _ = region()
    r.add_event(maintenance("mt", 3, start=10.0, end=20.0), now=0.0)
    r.end_event("mt", now=1.0)  # cancelled
    r.add_event(maintenance("mt", 3, start=100.0, end=200.0), now=2.0)
    r.tick(10.0)
    assert r.states([3]) == [HEALTHY]  # the cancelled event's start must not apply
    r.tick(100.0)
    assert r.states([3]) == [MAINT]
    r.tick(199.0)
    assert r.states([3]) == [MAINT]
    r.tick(200.0)
    assert r.states([3]) == [HEALTHY]


def test_event_id_reused_after_early_repair_is_not_ended_by_old_end() -> None:
    r, _ = region()
    r.add_event(failure("disk-m3", 3, start=0.0, end=50.0), now=0.0)
    r.end_event("disk-m3", now=10.0)  # repaired early
    r.add_event(failure("disk-m3", 3, start=20.0), now=20.0)  # fails again, no known end
    assert r.states([3]) == [FAILED]
    r.tick(50.0)  # the first failure's expected end must not end the second
    assert r.states([3]) == [FAILED]
    assert [e.id for e in r.events()] == ["disk-m3"]


def test_event_split_across_dcs() -> None:
    r, seen = region()
    r.add_event(failure("rackfail", 0, 12, 13, 1), now=0.0)
    dc1, dc2 = r.brokers["dc1"], r.brokers["dc2"]
    assert [e.machines for e in dc1.events()] == [(mid(0), mid(1))]
    assert [e.machines for e in dc2.events()] == [(mid(12), mid(13))]
    assert all(e.id == "rackfail" and e.kind is EventKind.FAILURE for e in r.events())
    assert r.states([0, 1, 12, 13, 2]) == [FAILED] * 4 + [HEALTHY]
    assert sorted(c.machine for c in seen) == [0, 1, 12, 13]
    assert dc1.events_for(0)[0].id == "rackfail"
    assert dc1.events_for(2) == []
    r.end_event("rackfail", now=1.0)
    assert r.states([0, 1, 12, 13]) == [HEALTHY] * 4
    assert r.events() == []
    assert len(seen) == 8
    with pytest.raises(NotFound):
        r.end_event("rackfail", now=2.0)


def test_duplicate_event_id_conflicts() -> None:
    r, _ = region()
    r.add_event(failure("f1", 0), now=0.0)
    with pytest.raises(Conflict):
        r.add_event(failure("f1", 1), now=0.0)
    with pytest.raises(Conflict):
        r.brokers["dc1"].add_event(failure("f1", 2), now=0.0)
    assert r.states([1, 2]) == [HEALTHY, HEALTHY]
    assert len(r.events()) == 1


def test_duplicate_event_id_in_another_dc_conflicts() -> None:
    r, _ = region()
    r.add_event(failure("f1", 0), now=0.0)
    with pytest.raises(Conflict):
        r.add_event(failure("f1", 20), now=0.0)
    assert r.states([20]) == [HEALTHY]
    assert [e.machines for e in r.events()] == [(mid(0),)]


def test_split_event_is_all_or_nothing_on_conflict() -> None:
    r, seen = region()
    r.add_event(failure("f1", 20), now=0.0)
    with pytest.raises(Conflict):
        r.add_event(failure("f1", 0, 21), now=0.0)
    assert r.states([0, 21]) == [HEALTHY, HEALTHY]
    assert r.brokers["dc1"].events() == []
    assert len(seen) == 1


def test_unknown_event_not_found() -> None:
    r, _ = region()
    with pytest.raises(NotFound) as exc:
        r.end_event("nope", now=0.0)
    assert exc.value.kind == "event"
    with pytest.raises(NotFound):
        r.brokers["dc2"].end_event("nope", now=0.0)


@pytest.mark.parametrize("bad", ["m9999999", "host-1", "m0000024"])
def test_unknown_machine_not_found_and_nothing_recorded(bad: str) -> None:
    r, seen = region()
    ev = UnavailabilityEvent("f1", EventKind.FAILURE, (mid(0), bad, mid(13)), 0.0)
    with pytest.raises(NotFound):
        r.add_event(ev, now=0.0)
    assert r.events() == []
    assert seen == []
    assert r.states([0, 13]) == [HEALTHY, HEALTHY]
    with pytest.raises(NotFound):
        r.brokers["dc1"].add_event(
            UnavailabilityEvent("f2", EventKind.FAILURE, (mid(0), bad), 0.0), now=0.0)
    assert r.brokers["dc1"].events() == []


def test_broker_rejects_event_for_another_dc() -> None:
    r, _ = region()
    with pytest.raises(ValidationError) as exc:
        r.brokers["dc1"].add_event(failure("f1", 0, 12), now=0.0)
    assert exc.value.field == "machines"
    assert r.brokers["dc1"].events() == []
    assert r.states([0]) == [HEALTHY]


def test_version_bumps_on_every_state_change() -> None:
    r, seen = region()
    versions = [r.version(8)]
    r.add_event(maintenance("mt", 8, start=10.0, end=20.0), now=0.0)
    versions.append(r.version(8))
    r.tick(10.0)
    versions.append(r.version(8))
    r.add_event(failure("f", 8), now=11.0)
    versions.append(r.version(8))
    r.end_event("f", now=12.0)
    versions.append(r.version(8))
    r.tick(20.0)
    versions.append(r.version(8))
    # the announcement bumps the version; the start (cordon lifted, maintenance
    # begins) is one change
    assert versions == [0, 1, 2, 3, 4, 5]
    assert [c.state for c in seen] == [MAINT, FAILED, MAINT, HEALTHY]
    assert [c.version for c in seen] == [2, 3, 4, 5]
    assert all(c.kind is ChangeKind.STATE for c in seen)


def test_columns_agree_with_record() -> None:
    r, _ = region()
    r.claim(0, "ads", 0)
    r.claim(13, "web", 0)
    r.claim(14, "ads", 0)
    r.add_event(failure("f", 0, 15), now=0.0)
    r.add_event(maintenance("mt", 1, 14, 15, start=0.0, end=100.0), now=0.0)
    r.add_event(maintenance("later", 2, start=50.0, end=100.0), now=0.0)
    code_of = {HEALTHY: 0, FAILED: 1, MAINT: 2}
    seen_states = set()
    for broker in r.brokers.values():
        states, versions, ents = (broker.state_codes(), broker.versions(),
                                  broker.entitlement_codes())
        assert states.dtype == np.int8
        assert states.shape == versions.shape == ents.shape == broker.machines.shape
        for p, m in enumerate(broker.machines.tolist()):
            rec = broker.record(m)
            assert rec.dc == broker.dc
            assert states[p] == code_of[rec.state]
            assert versions[p] == rec.version
            expected = -1 if rec.entitlement is None else r.entitlements.find(rec.entitlement)
            assert ents[p] == expected
            seen_states.add(rec.state)
    assert seen_states == {HEALTHY, FAILED, MAINT}
    assert r.states([0, 1, 2, 13, 14, 15]) == [FAILED, MAINT, HEALTHY, HEALTHY, MAINT, FAILED]


def test_announced_maintenance_cordons_until_it_starts() -> None:
    r = Region(generate(SPEC))
    heard: list[BrokerChange] = []
    r.subscribe(heard.append)
    r.add_event(maintenance("mt", 3, start=100.0, end=200.0), now=0.0)
    assert r.record(3).cordoned and r.states([3]) == [HEALTHY]
    assert [(c.kind, c.cordoned, c.state) for c in heard] == [
        (ChangeKind.NOTICE, True, HEALTHY)]
    r.tick(100.0)
    assert not r.record(3).cordoned and r.states([3]) == [MAINT]
    assert [(c.kind, c.cordoned, c.state) for c in heard[1:]] == [
        (ChangeKind.STATE, False, MAINT)]
    # two overlapping announcements: cordoned until the first of them starts
    r.add_event(maintenance("a", 5, start=300.0, end=400.0), now=250.0)
    r.add_event(maintenance("b", 5, start=350.0, end=450.0), now=250.0)
    r.end_event("b", now=260.0)  # withdrawn: still cordoned for "a"
    assert r.record(5).cordoned
