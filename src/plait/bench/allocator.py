"""``plait bench allocator``: job allocations per second on a generated region.

Workload (issue "Foundation"): a region of 16 RRU / 64 GB machines of two types;
20 entitlements whose quotas together cover the region; jobs of ``tasks_per_job``
tasks of 1 RRU and 2 GB under the default policy (spread over MSBs, then stack),
a quarter of them with a hard requirement on machine type. Jobs stay allocated, so
the region fills as the run goes. A share ``repeat_ratio`` of the requests re-issue
an earlier job's identical request (a new but equal object, as a scheduler retry
would send) and must get the same placement back.

Scenarios (``scenario``):

* ``default``: the workload above;
* ``big-entitlement``: one entitlement already holding half the region (50,000
  machines at the default size), every machine of it with room; every job goes
  there under the default policy, so each request stacks into a large member set;
* ``rack-spread``: the 20 entitlements of ``default``, every job spreading over
  racks (thousands of bins) then stacking.

``seconds`` is the wall time of the allocation loop alone; building the region and
the index are reported apart. ``machines_used`` (machines hosting a task) is the
stacking figure: fewer is tighter; ``max_msb_loss_ratio`` and ``max_rack_loss_ratio``
are the worst share of one job's tasks in one MSB or rack.
"""

from __future__ import annotations

import gc
import math
import time
from typing import Any

import numpy as np

from plait.allocator import AllocationRequest, Allocator, MachineIndex
from plait.broker import Region
from plait.errors import ValidationError
from plait.model import (
    AllocationPolicy,
    Entitlement,
    Quota,
    RegionSpec,
    Requirements,
    Resources,
    generate,
)
from plait.model.policy import Preference, Property, Strategy

TASK = Resources(cpu=1, memory_gb=2)
SCENARIOS = ("default", "big-entitlement", "rack-spread")
RACK_SPREAD = (Preference(strategy=Strategy.SPREAD, property=Property.RACK),
               Preference(strategy=Strategy.STACK))


def run(
    machines: int = 100_000, jobs: int = 2_000, tasks_per_job: int = 36, dcs: int = 5,
    msbs_per_dc: int = 12, repeat_ratio: float = 0.0, entitlements: int = 20, seed: int = 0,
    scenario: str = "default",
) -> dict[str, Any]:
    if scenario not in SCENARIOS:
        raise ValidationError("scenario", f"one of {', '.join(SCENARIOS)}")
    rng = np.random.default_rng(seed)
    t0 = time.perf_counter()
    fleet = generate(RegionSpec.sized(machines, dcs=dcs, msbs_per_dc=msbs_per_dc), seed=seed)
    region = Region(fleet)
    t1 = time.perf_counter()
    index = MachineIndex(fleet, region)
    t2 = time.perf_counter()
    allocator = Allocator(index)
    if scenario == "big-entitlement":
        # half the region, drawn at random, bound before the run: all of it has room
        big = max(1, machines // 2)
        ent_names = ["big"]
        allocator.define(Entitlement(name="big", owner="bench", quota=Quota(machines=big)))
        for m in np.sort(rng.choice(machines, big, replace=False)).tolist():
            region.claim(m, "big", region.version(m))
        entitlements = 1
    else:
        per_ent = math.ceil(machines / entitlements)
        ent_names = [f"ent{k:02d}" for k in range(entitlements)]
        for name in ent_names:
            allocator.define(Entitlement(name=name, owner="bench",
                                         quota=Quota(machines=per_ent)))
    t3 = time.perf_counter()
    prefs = RACK_SPREAD if scenario == "rack-spread" else None
    typed = AllocationPolicy(requirements=Requirements(machine_types=(fleet.type_names[0],)),
                             preferences=prefs)
    default = AllocationPolicy(preferences=prefs)

    def request(k: int) -> AllocationRequest:
        return AllocationRequest.of(
            f"job{k:06d}", ent_names[k % entitlements], TASK, allocate=range(tasks_per_job),
            # a quarter of the jobs, spread over the entitlements and over time
            policy=typed if (k + k // entitlements) % 4 == 0 else default,
        )

    # the share of repeats is exact, not drawn: request i is a new job when the count
    # of new jobs so far falls below ceil((i + 1) * (1 - repeat_ratio))
    picks = rng.random(jobs)
    first: dict[int, tuple[int, ...]] = {}
    mismatches = unplaced = claimed = placed_new = 0
    latencies = np.empty(jobs)
    gc.disable()
    start = time.perf_counter()
    for i in range(jobs):
        if first and len(first) >= math.ceil((i + 1) * (1 - repeat_ratio) - 1e-9):
            k = int(picks[i] * len(first))  # an earlier job, uniformly
        else:
            k = len(first)
        t = time.perf_counter()
        result = allocator.allocate(request(k))
        latencies[i] = time.perf_counter() - t
        if k in first:
            mismatches += result.machines != first[k]
        else:
            first[k] = result.machines
            placed_new += len(result.machines)
        unplaced += len(result.unplaced)
        claimed += len(result.claimed)
    seconds = time.perf_counter() - start
    gc.enable()

    # the worst share of one job's tasks in one MSB (what an MSB failure can take)
    msb, rack = index.loc["msb"], index.loc["rack"]
    worst = worst_rack = 0.0
    for state in allocator.jobs.values():
        hosts = np.fromiter(state.placement.values(), np.int64, len(state.placement))
        # of the tasks asked
        worst = max(worst, np.bincount(msb[hosts]).max() / tasks_per_job)
        worst_rack = max(worst_rack, np.bincount(rack[hosts]).max() / tasks_per_job)
    n_msb = dcs * msbs_per_dc
    used = int(np.count_nonzero(index.tasks))
    return {
        "scenario": scenario,
        "machines": machines,
        "jobs": jobs,
        "tasks_per_job": tasks_per_job,
        "seconds": round(seconds, 4),
        "job_allocations_per_s": round(jobs / seconds, 1),
        "task_placements_per_s": round(placed_new / seconds, 1),
        "cache_hit_ratio": round(allocator.cache.hit_ratio, 4),
        "index_bytes_per_machine": round(index.nbytes() / machines, 1),
        "max_msb_loss_ratio": round(worst, 4),
        "ideal_msb_loss_ratio": round(math.ceil(tasks_per_job / n_msb) / tasks_per_job, 4),
        "max_rack_loss_ratio": round(worst_rack, 4),
        "region_build_s": round(t1 - t0, 3),
        "index_build_s": round(t2 - t1, 3),
        "entitlements_setup_s": round(t3 - t2, 3),
        "distinct_jobs": len(first),
        "repeats": int(jobs - len(first)),
        "repeat_placement_mismatches": int(mismatches),
        "placed_tasks": int(placed_new),
        "unplaced_tasks": int(unplaced),
        "claimed_machines": int(claimed),
        "machines_used": used,
        "tasks_per_machine_used": round(placed_new / used, 3) if used else 0.0,
        "commit_conflicts": allocator.conflicts,
        "p50_ms": round(float(np.percentile(latencies, 50)) * 1000, 3),
        "p99_ms": round(float(np.percentile(latencies, 99)) * 1000, 3),
        "repeat_ratio": repeat_ratio,
    }
