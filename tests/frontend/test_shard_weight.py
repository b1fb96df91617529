"""One rule places entitlements on scheduler shards: the front end's map and the
simulated region give the same shard to the same entitlements, RRU quotas included."""

from __future__ import annotations

from plait.frontend.router import ShardMap
from plait.model import Entitlement, Quota, RegionSpec, generate
from plait.sim.shards import ShardedRegion
from plait.store import SqliteStore

QUOTAS = [Quota(machines=30), Quota(rru=160), Quota(machines=5), Quota(rru=800),
          Quota(machines=12), Quota(rru=16.5), Quota(machines=0), Quota(rru=40)]


def test_the_front_end_and_the_simulator_place_entitlements_alike(tmp_path):
    spec = RegionSpec.sized(96, dcs=2, msbs_per_dc=2)
    store = SqliteStore(str(tmp_path / "plait.db"))
    store.create("/region/spec", spec.model_dump_json().encode())
    for shard in range(3):
        store.create(f"/frontend/shards/{shard}", b"{}")
    front = ShardMap(store)
    sim = ShardedRegion(generate(spec), shards=3)
    placed_front, placed_sim = [], []
    for k, quota in enumerate(QUOTAS):
        name = f"e{k}"
        ent = Entitlement(name=name, owner="o", quota=quota)
        placed_front.append(front.place(name, front.weight(quota.model_dump(mode="json")))[
            "shard"])
        placed_sim.append(sim.define(ent).number)
        assert front.entry(name)[0]["machines"] == sim.weight(ent)
    assert placed_front == placed_sim
    assert len(set(placed_front)) == 3  # (the loads really were balanced)
    assert front.weight({"rru": "lots"}) == 0  # a malformed quota: the shard says why
    store.close()
