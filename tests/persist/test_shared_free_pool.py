"""Two allocators in two processes (two scheduler shards) share one region's free pool
through compare-and-swap claims on the broker records in one store. Racing for the
same free machine, exactly one wins and the other places its task elsewhere; racing
for the whole pool, no machine is ever bound to both."""

from __future__ import annotations

import multiprocessing as mp
from typing import Any

from plait.allocator import AllocationRequest, Allocator, MachineIndex
from plait.errors import Conflict
from plait.model import Entitlement, Quota, RegionSpec, Resources, generate, parse
from plait.model.policy import AllocationPolicy
from plait.persist.region import PersistentRegion
from plait.store import SqliteStore

SPEC = RegionSpec.sized(12, dcs=1, msbs_per_dc=2, rows_per_msb=1, racks_per_row=2)
ONE = parse(AllocationPolicy, {"requirements": {"max_tasks_per_machine": 1}})


def _shard(path: str, name: str, barrier: Any, jobs: int, out: Any) -> None:
    """One shard: its own store connection, brokers, index and allocator."""
    fleet = generate(SPEC)
    store = SqliteStore(path)
    region = PersistentRegion.load(fleet, store, now=0.0)
    allocator = Allocator(MachineIndex(fleet, region))
    allocator.define(Entitlement(name=name, owner="o", quota=Quota(machines=12)))
    res = Resources(cpu=1, memory_gb=1)
    # 1. both decide on the same free machine (the first one: same region, same policy),
    #    then commit at the same moment
    plan = allocator.propose(AllocationRequest.of(f"{name}-0", name, res, allocate=[0],
                                                  policy=ONE))
    first = plan.claims[0][0]
    barrier.wait()
    try:
        won = list(allocator.commit(plan).machines)
        lost = False
    except Conflict:
        lost = True
        won = list(allocator.allocate(AllocationRequest.of(
            f"{name}-0", name, res, allocate=[0], policy=ONE)).machines)
    # 2. then both grow a job of one task a machine past what the pool holds
    barrier.wait()
    placed = {f"{name}-0": won}
    conflicts = 0
    for k in range(jobs):  # one more task a time of a job of one task a machine
        r = allocator.allocate(AllocationRequest.of(f"{name}-1", name, res, allocate=[k],
                                                    policy=ONE))
        conflicts += r.attempts - 1
        placed[f"{name}-1.{k}"] = list(r.machines)
    out.put({"name": name, "first": fleet.name(first), "lost": lost,
             "placed": {j: [fleet.name(m) for m in ms] for j, ms in placed.items()},
             "conflicts": conflicts})
    store.close()


def test_two_shards_race_for_the_free_pool(tmp_path):
    path = str(tmp_path / "plait.db")
    SqliteStore(path).close()  # the schema, once
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_shard, args=(path, name, barrier, 9, out))
             for name in ("a", "b")]
    for p in procs:
        p.start()
    got = []
    while len(got) < 2:  # (a liveness bound; a shard that died fails the test at once)
        try:
            got.append(out.get(timeout=1))
        except Exception:
            assert all(p.is_alive() or p.exitcode == 0 for p in procs), "a shard died"
    results = {r["name"]: r for r in got}
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    a, b = results["a"], results["b"]
    # both wanted the same machine; exactly one got it, the other placed elsewhere
    assert a["first"] == b["first"]
    assert sorted([a["lost"], b["lost"]]) == [False, True]
    winner, loser = (a, b) if b["lost"] else (b, a)
    assert winner["placed"][f"{winner['name']}-0"] == [winner["first"]]
    assert loser["placed"][f"{loser['name']}-0"] not in ([], [loser["first"]])
    # no machine is used by both shards, and the store binds each to its user's shard
    used = {s["name"]: {m for ms in s["placed"].values() for m in ms} for s in (a, b)}
    assert not used["a"] & used["b"]
    assert len(used["a"]) + len(used["b"]) == 12  # the whole pool: 20 tasks wanted it
    fleet = generate(SPEC)
    region = PersistentRegion.load(fleet, SqliteStore(path), now=0.0)
    for name, machines in used.items():
        assert {fleet.name(m) for m in range(len(fleet))
                if region.record(m).entitlement == name} == machines
