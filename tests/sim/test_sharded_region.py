"""A sharded simulated region: scheduler shards over one shared machine index
(DESIGN.md "Agents and the control plane"). Behaviour only; the figures are the
benchmark's business."""

import json
import subprocess
import sys

import numpy as np
import pytest

from plait.allocator import AllocationRequest
from plait.errors import Conflict, NotFound
from plait.model import Entitlement, Quota, RegionSpec, Resources, generate
from plait.model.entitlement import ElasticTerms
from plait.sim.jobmix import region_mix
from plait.sim.scenarios import job_spec
from plait.sim.shards import ShardedRegion

WHOLE = Resources(cpu=16, memory_gb=8)  # one task takes a whole default machine


def _ent(name, machines=None, rru=None):
    return Entitlement(name=name, owner="o", quota=Quota(machines=machines, rru=rru))


@pytest.fixture(scope="module")
def settled():
    """12,000 machines, 4 shards, the scaled-down region mix placed and running."""
    fleet = generate(RegionSpec.sized(12_000, dcs=2, msbs_per_dc=4))
    mix = region_mix(12_000, seed=3)
    region = ShardedRegion(fleet, 4)
    region.define_all(mix.entitlements)
    for spec in mix.jobs:
        region.create_job(spec, 0.0)
    region.tick(1.0)
    region.agents_report_running(2.0)
    region.tick(3.0)
    return region, mix


def _code(region, name):
    return region.region.entitlements.code(name)


# -- placement stays inside the shard -------------------------------------------------------
def test_every_task_is_placed_and_running(settled):
    region, mix = settled
    assert region.tasks == mix.tasks > 20_000
    for shard in region.shards:
        for job in shard.scheduler.jobs.values():
            assert all(r.machine is not None and r.serving for r in job.tasks.values())
    assert region.audit() == []


def test_each_shards_tasks_sit_only_on_machines_of_its_own_entitlements(settled):
    region, _ = settled
    for shard in region.shards:
        owned = {_code(region, name) for name in shard.entitlements}
        assert shard.scheduler.jobs
        for job in shard.scheduler.jobs.values():
            assert region.shard_map[job.entitlement] == shard.number
            machines = np.array([r.machine for r in job.tasks.values()])
            assert (region.index.ent[machines] == _code(region, job.entitlement)).all()
            assert set(region.index.ent[machines].tolist()) <= owned
        # and the brokers, the source of truth, say the same
        for m in list(shard.scheduler.desired)[:200]:
            assert region.shard_map[region.region.record(m).entitlement] == shard.number


def test_no_machine_is_bound_to_two_entitlements_or_two_shards(settled):
    region, mix = settled
    seen: dict[int, int] = {}
    for shard in region.shards:
        for name in shard.entitlements:
            for m in region.region.machines_of(name).tolist():
                assert m not in seen, f"machine {m} in shards {seen[m]} and {shard.number}"
                seen[m] = shard.number
    assert len(seen) == int(np.count_nonzero(region.index.ent >= 0))
    # every entitlement within its quota
    for ent in mix.entitlements:
        assert len(region.region.machines_of(ent.name)) <= ent.quota.machines


def test_the_shared_index_agrees_with_every_shards_view(settled):
    region, _ = settled
    ix = region.index
    used = np.zeros(len(region.fleet), np.int64)
    tasks = np.zeros(len(region.fleet), np.int64)
    for shard in region.shards:
        assert shard.allocator.index is ix  # one index, not a copy per shard
        for name in shard.entitlements:
            usage = shard.allocator.usage(name)
            assert usage.machines == len(region.region.machines_of(name))
        for job in shard.scheduler.jobs.values():
            placement = shard.allocator.jobs[job.name].placement
            assert {i: r.machine for i, r in job.tasks.items()} == placement
            cpu = job.spec.resources.to_units()[0]
            for m in placement.values():
                used[m] += cpu
                tasks[m] += 1
    assert (ix.tasks == tasks).all()
    assert (ix.free_cpu == ix.total_cpu - used).all()
    # the free pool is what no shard holds
    free = set(region.region.free_machines().tolist())
    assert all(ix.is_free(m) for m in list(free)[:500])
    assert not any(ix.is_free(m) for m in np.flatnonzero(ix.ent >= 0)[:500].tolist())


# -- the shard map ---------------------------------------------------------------------------
def test_an_entitlement_goes_to_the_least_loaded_shard():
    region = ShardedRegion(generate(RegionSpec.sized(400, dcs=2, msbs_per_dc=2)), 3)
    placed = [region.define(_ent(name, q)).number
              for name, q in (("a", 10), ("b", 5), ("c", 5), ("d", 3), ("e", 20), ("f", 1))]
    # a->0 (all empty, lowest number), b->1, c->2, d->1 (5 vs 10), e->2 (5 vs 8 vs 10), f->1
    assert placed == [0, 1, 2, 1, 2, 1]
    assert [s.load for s in region.shards] == [10, 9, 25]
    assert region.shards[1].entitlements == ["b", "d", "f"]
    # redefining keeps the shard and its load follows the new quota
    assert region.define(_ent("e", 2)).number == 2
    assert [s.load for s in region.shards] == [10, 9, 7]
    assert region.define(_ent("g", 1)).number == 2
    # an RRU quota weighs the machines of the mean size it amounts to (16 RRU here)
    assert region.weight(_ent("h", rru=33)) == 3


def test_a_lender_or_borrower_goes_to_the_shard_of_the_others():
    """Loans are counted per scheduler shard (decision 94): an entitlement that lends
    or borrows lands where the region's other lenders and borrowers are, however
    loaded that shard is, like the front end's shard map (``place_on_shard``)."""
    region = ShardedRegion(generate(RegionSpec.sized(400, dcs=2, msbs_per_dc=2)), 3)
    assert region.define(_ent("a", 10)).number == 0
    assert region.define(Entitlement(name="web", owner="o", quota=Quota(machines=20),
                                     lends=True)).number == 1
    assert region.define(_ent("c", 5)).number == 2
    # shard 1 is the most loaded (20 vs 10 vs 5), yet the next lender and the
    # borrower go there; an entitlement without loans still goes to the least loaded
    assert region.define(Entitlement(name="db", owner="o", quota=Quota(machines=8),
                                     lends=True)).number == 1
    assert region.define(Entitlement(name="batch", owner="o", quota=Quota(machines=30),
                                     elastic=ElasticTerms())).number == 1
    assert region.define(_ent("d", 1)).number == 2
    assert [s.load for s in region.shards] == [10, 58, 6]
    assert region.shards[1].entitlements == ["web", "db", "batch"]


def test_define_all_balances_the_mix_largest_first(settled):
    region, mix = settled
    loads = [0] * len(region.shards)
    for ent in sorted(mix.entitlements, key=lambda e: (-e.quota.machines, e.name)):
        least = min(range(len(loads)), key=lambda k: (loads[k], k))
        assert region.shard_map[ent.name] == least
        loads[least] += ent.quota.machines
    assert loads == [s.load for s in region.shards]
    largest = max(e.quota.machines for e in mix.entitlements)
    assert max(loads) - min(loads) <= largest


def test_a_job_goes_to_the_shard_of_its_entitlement():
    region = ShardedRegion(generate(RegionSpec.sized(400, dcs=2, msbs_per_dc=2)), 2)
    region.define(_ent("a", 50))
    region.define(_ent("b", 50))
    job = region.create_job(job_spec("web", 3, entitlement="b"), 0.0)
    assert region.shards[1].scheduler.jobs == {"web": job}
    assert region.job("web") is job and not region.shards[0].scheduler.jobs
    with pytest.raises(NotFound):
        region.create_job(job_spec("x", 1, entitlement="nope"), 0.0)


# -- racing for the free pool ---------------------------------------------------------------
def _two_shards(machines=48):
    fleet = generate(RegionSpec.sized(machines, dcs=2, msbs_per_dc=2, rows_per_msb=1,
                                      racks_per_row=2))
    region = ShardedRegion(fleet, 2)
    a = region.define(_ent("ea", machines))
    b = region.define(_ent("eb", machines))
    assert (a.number, b.number) == (0, 1)
    return region, a.allocator, b.allocator


def test_two_shards_deciding_on_the_same_free_machine_one_wins_the_other_picks_another():
    region, a, b = _two_shards()
    pa = a.propose(AllocationRequest.of("ja", "ea", WHOLE, allocate=[0]))
    pb = b.propose(AllocationRequest.of("jb", "eb", WHOLE, allocate=[0]))
    machine = pa.claims[0][0]
    assert [m for m, _ in pb.claims] == [machine]  # both saw it free, both want it
    a.commit(pa)
    with pytest.raises(Conflict):
        b.commit(pb)  # the stale claim fails, changing nothing
    assert "jb" not in b.jobs and region.region.record(machine).entitlement == "ea"
    r = b.allocate(AllocationRequest.of("jb", "eb", WHOLE, allocate=[0]))
    assert r.complete and r.machines[0] != machine and r.claimed == r.machines
    assert region.region.record(r.machines[0]).entitlement == "eb"
    assert region.audit() == []


def test_a_claim_of_a_machine_another_shard_holds_fails_at_the_broker():
    region, a, _ = _two_shards()
    r = a.allocate(AllocationRequest.of("ja", "ea", WHOLE, allocate=[0]))
    m = r.machines[0]
    with pytest.raises(Conflict):  # the record's version moved on: the CAS fails
        region.region.claim(m, "eb", 0)
    with pytest.raises(Conflict):  # and with the current version, it is not free
        region.region.claim(m, "eb", region.region.version(m))
    assert region.region.record(m).entitlement == "ea"


def test_shards_interleaving_many_requests_never_share_a_machine():
    region, a, b = _two_shards(machines=40)
    conflicts = 0
    for k in range(12):  # 24 jobs of 2 whole machines each: only 20 fit
        plans = [(a, a.propose(AllocationRequest.of(f"a{k}", "ea", WHOLE, allocate=[0, 1]))),
                 (b, b.propose(AllocationRequest.of(f"b{k}", "eb", WHOLE, allocate=[0, 1])))]
        for alloc, plan in plans:
            try:
                alloc.commit(plan)
            except Conflict:
                conflicts += 1
                alloc.allocate(plan.request)
    ea = set(region.region.machines_of("ea").tolist())
    eb = set(region.region.machines_of("eb").tolist())
    assert conflicts > 0  # the race did happen
    assert ea.isdisjoint(eb) and len(ea) + len(eb) == 40
    placed = [m for alloc in (a, b) for job in alloc.jobs.values()
              for m in job.placement.values()]
    assert len(placed) == len(set(placed)) == 40  # one whole-machine task per machine
    assert region.audit() == []


def test_schedulers_of_two_shards_share_the_free_pool_without_double_claims():
    region, _, _ = _two_shards(machines=40)
    region.create_job(job_spec("big-a", 30, entitlement="ea", cpu=16, memory_gb=8), 0.0)
    region.create_job(job_spec("big-b", 30, entitlement="eb", cpu=16, memory_gb=8), 0.0)
    region.tick(1.0)
    a, b = region.job("big-a"), region.job("big-b")
    on_a = {r.machine for r in a.tasks.values() if r.machine is not None}
    on_b = {r.machine for r in b.tasks.values() if r.machine is not None}
    assert len(on_a) == 30 and len(on_b) == 10 and on_a.isdisjoint(on_b)
    assert b.unplaced_reason is not None  # "does not fit" is a result
    assert region.audit() == []


# -- the benchmark ---------------------------------------------------------------------------
KEYS = {"machines", "shards", "tasks", "state_bytes", "max_shard_reconcile_ms",
        "max_shard_place_s", "build_s", "largest_job_tasks", "largest_entitlement_machines",
        "peak_rss_bytes", "max_shard_idle_tick_ms", "unplaced_tasks", "invariant_problems"}


def test_bench_region_prints_one_json_object_with_the_issue_keys():
    # (a process of its own: in the test runner's, memory freed by earlier tests can
    # make the resident memory it measures shrink while the region is built)
    res = subprocess.run([sys.executable, "-m", "plait.cli.main", "bench", "region",
                          "--machines", "5000", "--shards", "4"],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    figures = json.loads(res.stdout)
    assert set(figures) >= KEYS
    assert figures["machines"] == 5000 and figures["shards"] == 4
    assert figures["tasks"] == figures["tasks_reported_running"] > 9000
    assert figures["unplaced_tasks"] == 0 and figures["invariant_problems"] == []
    assert figures["state_bytes"] > 0 and figures["max_shard_reconcile_ms"] > 0
    assert figures["largest_entitlement_machines"] == 300  # 6% of the machines
    assert figures["largest_job_tasks"] == 75  # 0.75% of the tasks


@pytest.mark.slow
def test_a_million_machine_region_fits_in_two_gib():
    from plait.bench import region

    figures = region.run(machines=1_000_000, shards=20)
    assert abs(figures["tasks"] - 2_000_000) <= 20_000
    assert figures["largest_job_tasks"] == 15_000
    assert figures["largest_entitlement_machines"] == 60_000
    assert figures["unplaced_tasks"] == 0 and figures["invariant_problems"] == []
    assert figures["state_bytes"] <= 2 * 2**30
