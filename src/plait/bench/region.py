"""``plait bench region``: a whole simulated region, sharded, in one process.

Workload (issue 6, "Simulated scale"): a generated region of ``machines`` machines
(16 RRU / 64 GB, 5 DCs of 12 MSBs), ``shards`` scheduler shards over one shared
machine index (``plait.sim.shards``), and ``plait.sim.jobmix.region_mix``: at a
million machines about 2,000,000 tasks in about 72,000 jobs over about 2,000
entitlements, the largest job 15,000 tasks, the largest entitlement 60,000 machines.
Entitlements go to the least-loaded shard, largest first.

Phases, each timed:

* **build** (``build_s``): fleet, brokers, the shared index, the shards, the job
  mix, every entitlement defined and every job created (tasks pending);
* **initial placement** (``max_shard_place_s``): each shard's first ``tick``
  places all its jobs through its allocator (claims from the shared free pool);
  shards run one after the other, as the simulator does;
* **agents** (``report_s``): stand-in agents report every task running, healthy;
* **steady state**: ``max_shard_reconcile_ms`` is the slowest shard's next
  ``tick``, a full reconcile pass over every one of its jobs (the reports changed
  each job's tasks, so none is skipped) in which nothing is left to do: the cost of
  looking at a whole settled shard. ``max_shard_idle_tick_ms`` is the tick after
  that, when every job is known settled and skipped: the loop's cost between
  inputs. Both are taken with the long-lived objects frozen out of the cyclic
  collector (``gc.freeze``), as a long-running control plane does after start-up.

Memory: ``state_bytes`` is resident memory (VmRSS in /proc/self/status) after
building, placing and reaching the steady state, minus VmRSS just before building,
both after ``gc.collect()``: what holding the region costs, including freed memory
the allocator has not handed back to the system. ``peak_rss_bytes`` is the whole
process's peak (VmHWM), ``baseline_rss_bytes`` the interpreter and imports.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from typing import Any

from plait.model import RegionSpec, generate
from plait.sim.jobmix import region_mix
from plait.sim.shards import ShardedRegion

#: (what is being done, steps done, steps in all)
ProgressFn = Callable[[str, int, int], None]


def _status(field: str) -> int:
    """A memory figure of this process from /proc/self/status, in bytes."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def _quiet(what: str, done: int, total: int) -> None:
    pass


def run(machines: int = 1_000_000, shards: int = 20, tasks_per_machine: float = 2.0,
        seed: int = 0, progress: ProgressFn = _quiet) -> dict[str, Any]:
    gc.collect()
    rss0 = _status("VmRSS")
    steps = 3 + 2 * shards
    progress("building the region", 0, steps)
    t0 = time.perf_counter()
    fleet = generate(RegionSpec.sized(machines), seed=seed)
    mix = region_mix(machines, seed=seed, tasks_per_machine=tasks_per_machine)
    region = ShardedRegion(fleet, shards)
    region.define_all(mix.entitlements)
    for spec in mix.jobs:
        region.create_job(spec, 0.0)
    build_s = time.perf_counter() - t0
    jobs, entitlements = len(mix.jobs), len(mix.entitlements)
    largest_job, largest_ent = mix.largest_job, mix.largest_entitlement
    del mix

    place_s = []
    region.region.tick(1.0)
    for k, shard in enumerate(region.shards):
        progress(f"placing shard {k + 1}/{shards}", 1 + k, steps)
        t = time.perf_counter()
        shard.scheduler.tick(1.0)
        place_s.append(time.perf_counter() - t)

    progress("agents report their tasks running", 1 + shards, steps)
    t = time.perf_counter()
    reported = region.agents_report_running(2.0)
    report_s = time.perf_counter() - t

    full_ms, idle_ms = [], []
    gc.collect()
    gc.freeze()
    try:
        for k, shard in enumerate(region.shards):
            progress(f"steady-state passes, shard {k + 1}/{shards}", 2 + shards + k, steps)
            t = time.perf_counter()
            shard.scheduler.tick(3.0)
            full_ms.append((time.perf_counter() - t) * 1000)
            t = time.perf_counter()
            shard.scheduler.tick(4.0)
            idle_ms.append((time.perf_counter() - t) * 1000)
    finally:
        gc.unfreeze()
    gc.collect()
    state_bytes = _status("VmRSS") - rss0

    progress("checking the invariants", 2 + 2 * shards, steps)
    problems = region.audit()
    tasks = region.tasks
    unplaced = sum(1 for shard in region.shards for job in shard.scheduler.jobs.values()
                   for rec in job.tasks.values() if rec.machine is None)
    bound = [region.machines_of_shard(shard) for shard in region.shards]
    loads = [shard.load for shard in region.shards]
    progress("done", steps, steps)
    return {
        "machines": machines,
        "shards": shards,
        "tasks": tasks,
        "state_bytes": state_bytes,
        "max_shard_reconcile_ms": round(max(full_ms), 2),
        "max_shard_idle_tick_ms": round(max(idle_ms), 3),
        "max_shard_place_s": round(max(place_s), 3),
        "place_s": round(sum(place_s), 3),
        "build_s": round(build_s, 3),
        "report_s": round(report_s, 3),
        "largest_job_tasks": largest_job,
        "largest_entitlement_machines": largest_ent,
        "jobs": jobs,
        "entitlements": entitlements,
        "state_bytes_per_task": round(state_bytes / max(tasks, 1), 1),
        "peak_rss_bytes": _status("VmHWM"),
        "baseline_rss_bytes": rss0,
        "index_bytes": region.index.nbytes(),
        "bound_machines": sum(bound),
        "max_shard_bound_machines": max(bound),
        "max_shard_tasks": max(shard.tasks for shard in region.shards),
        "max_shard_load_machines": max(loads),
        "min_shard_load_machines": min(loads),
        "tasks_reported_running": reported,
        "unplaced_tasks": unplaced,
        "claim_conflicts": sum(shard.allocator.conflicts for shard in region.shards),
        "invariant_problems": problems,
        "rss_source": "/proc/self/status VmRSS after gc.collect()",
    }
