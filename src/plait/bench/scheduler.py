"""``plait bench scheduler``: reconcile cost on a huge job, and simulated throughput.

* ``plan_15k_ms``: one reconcile call (``Scheduler.tick``) on a job of
  ``big_tasks`` running tasks whose spec just changed: it offers the full list of
  update operations and starts the first wave the built-in pacing allows
  (max_unavailable 10%) within the rate limit. Median of ``repeat`` runs.
* ``sim_task_ops_per_s``: task operations (updates, restarts, moves, stops)
  completed per second of wall time in a simulated region of ``machines``
  machines running ``jobs`` jobs through updates, resizes and machine failures.
"""

from __future__ import annotations

import gc
import statistics
import time
from typing import Any

import numpy as np

from plait.model import RegionSpec, UpdatePolicy, generate
from plait.scheduler import SchedulerConfig
from plait.sim.scenarios import job_spec, world


def _plan_once(big_tasks: int) -> tuple[float, int, int]:
    machines = max(64, big_tasks // 8)
    fleet = generate(RegionSpec.sized(machines, dcs=2, msbs_per_dc=6))
    sim = world(fleet=fleet, config=SchedulerConfig(rate=1000, burst=2000))
    s = sim.scheduler
    spec = job_spec("big", big_tasks, cpu=1, memory_gb=2,
                    update=UpdatePolicy(max_unavailable="10%"))
    s.create_job(spec, sim.now)
    sim.run_until(lambda: len(s.job("big").tasks) == big_tasks and all(
        r.serving for r in s.job("big").tasks.values()), 600)
    s.update_job(spec.model_copy(update={"args": ("--v2",)}), sim.now)
    # a long-running control plane keeps its long-lived objects out of the cyclic
    # collector (gc.freeze after start-up); without that, a full collection of the
    # 15,000 task records and the simulator's objects may land inside the timed call
    gc.collect()
    gc.freeze()
    try:
        t0 = time.perf_counter()
        s.tick(sim.now)
        elapsed = time.perf_counter() - t0
    finally:
        gc.unfreeze()
    job = s.job("big")
    offered = len(job.offers) + len(job.acked) + len(job.in_progress)
    return elapsed, offered, len(job.in_progress)


def run(big_tasks: int = 15_000, machines: int = 10_000, jobs: int = 200,
        sim_seconds: float = 600.0, repeat: int = 3, seed: int = 0) -> dict[str, Any]:
    plans = [_plan_once(big_tasks) for _ in range(repeat)]
    plan_ms = statistics.median(p[0] for p in plans) * 1000

    rng = np.random.default_rng(seed)
    sim = world(machines=machines, config=SchedulerConfig(rate=200, burst=400))
    s = sim.scheduler
    specs = []
    for j in range(jobs):
        spec = job_spec(f"job{j:03d}", int(rng.integers(5, 60)), cpu=1, memory_gb=2,
                        update=UpdatePolicy(max_unavailable="20%"))
        s.create_job(spec, sim.now)
        specs.append(spec)
    sim.run(30)
    done0 = s.counters["ops_completed"]
    wall0 = time.perf_counter()
    version = 1
    failures: list[str] = []
    while sim.now < 30 + sim_seconds:
        k = int(sim.now) % 60
        if k == 0:  # a wave of updates
            version += 1
            for j in rng.choice(jobs, size=jobs // 4, replace=False):
                spec = specs[j].model_copy(update={"args": (f"--v{version}",)})
                specs[j] = spec
                s.update_job(spec, sim.now)
        elif k == 20:  # resizes
            for j in rng.choice(jobs, size=jobs // 10, replace=False):
                spec = specs[j].model_copy(update={"task_count": int(rng.integers(5, 60))})
                specs[j] = spec
                s.update_job(spec, sim.now)
        elif k == 40:  # machine failures, repaired a minute later
            for event_id in failures:
                sim.repair(event_id)
            busy = sorted(m for m, tasks in s.desired.items() if tasks)  # (not dict order)
            victims = rng.choice(busy, size=min(len(busy), machines // 500), replace=False)
            failures = [sim.fail([sim.fleet.name(int(m))]) for m in victims]
        sim.step()
    wall = time.perf_counter() - wall0
    completed = s.counters["ops_completed"] - done0
    return {
        "plan_15k_ms": round(plan_ms, 2),
        "plan_tasks": big_tasks,
        "plan_ops_offered": plans[0][1],
        "plan_first_wave": plans[0][2],
        "sim_task_ops_per_s": round(completed / wall, 1),
        "sim_ops_completed": completed,
        "sim_wall_s": round(wall, 2),
        "sim_seconds": sim_seconds,
        "machines": machines,
        "jobs": jobs,
        "tasks_lost": s.counters["tasks_lost"],
        "throttled": s.counters["throttled"],
    }
