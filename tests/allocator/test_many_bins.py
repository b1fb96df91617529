"""Placement over many bins (``MANY_BINS``: a spread over thousands of racks) builds
keys in NumPy and heaps only the least of them; it decides exactly as the per-bin
path does, whatever the policy and the job's history."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plait.allocator import AllocationRequest, placement
from plait.model import Preference, Property, Resources, Strategy
from plait.model.policy import AllocationPolicy
from plait.testing import Cluster, check_invariants

PREFS = {
    "rack": (Preference(strategy=Strategy.SPREAD, property=Property.RACK),),
    "msb-rack": (Preference(strategy=Strategy.SPREAD, property=Property.MSB),
                 Preference(strategy=Strategy.SPREAD, property=Property.RACK)),
    "stack-first": (Preference(strategy=Strategy.STACK),
                    Preference(strategy=Strategy.SPREAD, property=Property.RACK)),
    "type-rack": (Preference(strategy=Strategy.SPREAD, property=Property.TYPE),
                  Preference(strategy=Strategy.SPREAD, property=Property.RACK)),
    "default": None,
}

ops = st.lists(
    st.tuples(st.integers(0, 3), st.integers(0, 30), st.integers(0, 8),
              st.sampled_from([1, 2, 4, 8]), st.sampled_from(sorted(PREFS))),
    min_size=1, max_size=12,
)


QUOTAS = {"m30": {"machines": 30}, "m18": {"machines": 18}, "rru300": {"rru": 300.0},
          "rru100": {"rru": 100.0}}


def _replay(ops, many_bins: int, monkeypatch: pytest.MonkeyPatch,
            quota: str = "m30") -> list[tuple[object, ...]]:
    monkeypatch.setattr(placement, "MANY_BINS", many_bins)
    c = Cluster.generated(dcs=2, msbs_per_dc=2, rows_per_msb=2, racks_per_row=3,
                          machines_per_rack=2)
    c.entitlement("e", **QUOTAS[quota])
    c.give("e", *c.fleet.names(range(0, 12 if quota == "rru100" else 48, 3)))
    out = []
    for j, n, free, cpu, prefs in ops:
        policy = AllocationPolicy(preferences=PREFS[prefs])
        r = c.allocator.allocate(AllocationRequest.of(
            f"j{j}", "e", Resources(cpu=cpu, memory_gb=cpu), allocate=range(free, free + n),
            free=range(free), policy=policy))
        out.append((*r.machines, -1, *r.unplaced))
        check_invariants(c)
    return out


@settings(max_examples=120, deadline=None)
@given(ops=ops, quota=st.sampled_from(sorted(QUOTAS)))
def test_many_bins_path_decides_as_the_per_bin_path(ops, quota):
    """Same placements and same reasons for what is left unplaced (the quota's too),
    whether the entitlement has room under its quota or not."""
    with pytest.MonkeyPatch.context() as mp:
        per_bin = _replay(ops, 10**9, mp, quota)
    with pytest.MonkeyPatch.context() as mp:
        many = _replay(ops, 0, mp, quota)
    assert many == per_bin


def test_many_bins_with_an_empty_entitlement_claims_one_machine_per_rack(monkeypatch):
    monkeypatch.setattr(placement, "MANY_BINS", 0)
    c = Cluster.generated(dcs=2, msbs_per_dc=2, rows_per_msb=2, racks_per_row=3,
                          machines_per_rack=2)
    c.entitlement("e", machines=30)
    r = c.allocator.allocate(AllocationRequest.of(
        "j", "e", Resources(cpu=1), allocate=range(5),
        policy=AllocationPolicy(preferences=PREFS["rack"])))
    assert r.complete and len(r.claimed) == 5
    racks = c.index.loc["rack"][list(r.machines)]
    assert len(set(racks.tolist())) == 5
    check_invariants(c)
