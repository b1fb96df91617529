"""Property test: random claim/release sequences against a simple model."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from plait.broker import BrokerChange, ChangeKind, Region
from plait.errors import Conflict
from plait.model import RegionSpec, generate

SPEC = RegionSpec(dcs=2, msbs_per_dc=2, rows_per_msb=1, racks_per_row=2, machines_per_rack=3)
FLEET = generate(SPEC)
N = len(FLEET)
ENTS = ("ads", "web", "db")

op = st.tuples(
    st.sampled_from(["claim", "release"]),
    st.integers(0, N - 1),
    st.sampled_from(ENTS),
    st.integers(-1, 1),  # version skew: 0 = read the current version
)


@settings(max_examples=150, deadline=None)
@given(st.lists(op, max_size=80))
def test_random_claims_and_releases(ops: list[tuple[str, int, str, int]]) -> None:
    region = Region(FLEET)
    changes: list[BrokerChange] = []
    region.subscribe(changes.append)
    owner: dict[int, str | None] = dict.fromkeys(range(N))
    version = dict.fromkeys(range(N), 0)

    for kind, m, ent, skew in ops:
        expected = region.version(m) + skew
        should_succeed = skew == 0 and (
            owner[m] is None if kind == "claim" else owner[m] == ent)
        before = len(changes)
        try:
            if kind == "claim":
                new = region.claim(m, ent, expected)
            else:
                new = region.release(m, ent, expected)
        except Conflict:
            assert not should_succeed
            assert len(changes) == before
            assert region.version(m) == version[m]
            continue
        assert should_succeed
        # versions strictly increase, by one per change
        assert new == version[m] + 1
        version[m] = new
        owner[m] = ent if kind == "claim" else None
        assert changes[before:] == [BrokerChange(
            ChangeKind.CLAIMED if kind == "claim" else ChangeKind.RELEASED, m, owner[m], new,
            region.record(m).state)]

    for m in range(N):
        rec = region.record(m)
        assert rec.entitlement == owner[m]
        assert rec.version == version[m]
    # per DC: free machines and each entitlement's machines partition the DC
    for broker in region.brokers.values():
        parts = [broker.free_machines(), *(broker.machines_of(e) for e in ENTS)]
        together = np.concatenate(parts)
        assert together.size == broker.machines.size  # nothing counted twice
        np.testing.assert_array_equal(np.sort(together), np.sort(broker.machines))
        for e in ENTS:
            assert sorted(broker.machines_of(e).tolist()) == sorted(
                m for m in broker.machines.tolist() if owner[m] == e)
