"""A day of single-task inference jobs, updated and maintained, with the shared surge
buffer against doubling every job: ``plait sim run examples/scenarios/surge.yaml``.

Two regions run the same day on the simulated clock, with the real scheduler:

* *buffer*: each job runs one task with ``update.surge``; its entitlement's quota is
  the jobs' machines plus a shared surge buffer of ``buffer`` surge tasks
  (``plait.scheduler.surge``: a surge task serves before a task is updated or moved
  for maintenance; with the buffer full, operations wait);
* *doubled*: each job runs two tasks (max_unavailable 1), the usual way to keep a
  job serving through its own updates and moves; its quota has the same spare
  machines on top of its doubled jobs.

Every task takes a whole machine (a model server). During the day every job is
updated in waves (a new model at each hour in ``pushes``), and every hour
``maintenance_per_hour`` machines running tasks get planned maintenance (notice,
then down for its duration). Each tick, a job with no task serving counts as
unavailable. The capacity each world needs is the most machines its entitlement
held; ``capacity_saved_fraction`` is the buffer world's saving over doubling.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import pydantic

from plait.model import Entitlement, Quota, UpdatePolicy
from plait.model.base import Value
from plait.model.topology import RegionSpec, generate
from plait.sim.agents import Behaviour
from plait.sim.harness import Simulation
from plait.sim.scenarios import job_spec

ENT = "inference"


class Surge(Value):
    scenario: Literal["surge"]
    seed: int = 11
    #: machines in each region (the entitlements' quotas are within it)
    machines: int = pydantic.Field(default=600, ge=4, le=1_000_000)
    jobs: int = pydantic.Field(default=200, ge=1, le=100_000)
    #: the shared surge buffer, in surge tasks (whole machines here)
    buffer: int = pydantic.Field(default=20, ge=1, le=100_000)
    hours: float = pydantic.Field(default=24.0, gt=0, le=24 * 28)
    tick_seconds: float = pydantic.Field(default=10.0, gt=0, le=600)
    #: hours of the day at which every job is updated (a new model)
    pushes: tuple[float, ...] = pydantic.Field(default=(9.0, 15.0, 21.0), max_length=48)
    maintenance_per_hour: int = pydantic.Field(default=2, ge=0, le=10_000)
    maintenance_notice_seconds: float = pydantic.Field(default=1800.0, ge=0, le=86_400)
    maintenance_seconds: float = pydantic.Field(default=1800.0, gt=0, le=86_400)
    #: how long a model server takes to start (load its model) and to stop
    start_seconds: float = pydantic.Field(default=90.0, ge=0, le=3600)
    stop_seconds: float = pydantic.Field(default=10.0, ge=0, le=3600)


@dataclass
class World:
    """One region's day, sampled every minute."""

    name: str
    hours: list[float] = field(default_factory=list)
    held: list[int] = field(default_factory=list)
    unavailable: list[int] = field(default_factory=list)
    extra: list[int] = field(default_factory=list)
    unavailable_seconds: float = 0.0
    updates: int = 0
    maintenance: int = 0
    counters: dict[str, int] = field(default_factory=dict)


@dataclass
class SurgeResult:
    figures: dict[str, Any]
    buffer: World
    doubled: World


def _world(scn: Surge, surge: bool, progress: Callable[[float], None] | None,
           share: tuple[float, float]) -> World:
    rng = np.random.default_rng(scn.seed)
    fleet = generate(RegionSpec.sized(scn.machines, dcs=2, msbs_per_dc=4, rows_per_msb=1,
                                      racks_per_row=max(1, scn.machines // 160)),
                     seed=scn.seed)
    behaviour = Behaviour(start_seconds=scn.start_seconds, stop_seconds=scn.stop_seconds)
    sim = Simulation(fleet, behaviour=lambda a: behaviour, tick=scn.tick_seconds)
    s = sim.scheduler
    per_job = 1 if surge else 2
    quota = scn.jobs * per_job + scn.buffer
    sim.allocator.define(Entitlement(name=ENT, owner="ml", quota=Quota(machines=quota),
                                     surge_buffer=scn.buffer if surge else 0))
    cpu = int(fleet.cpu.min()) / 1000
    policy = UpdatePolicy(surge=surge, max_unavailable=1)

    def spec(n: int, version: int) -> Any:
        return job_spec(f"model-{n:04d}", per_job, ENT, cpu=cpu, memory_gb=1,
                        command=f"serve-model-v{version}", update=policy)
    for n in range(scn.jobs):
        s.create_job(spec(n, 1), 0.0)
    world = World("buffer" if surge else "doubled")
    total = scn.hours * 3600
    pushes = sorted(h * 3600 for h in scn.pushes)
    version, next_sample, next_maintenance, told = 1, 0.0, 3600.0, 0.0
    names = [f"model-{n:04d}" for n in range(scn.jobs)]
    # the day starts once every job serves (its first placement is not part of it)
    sim.run_until(lambda: all(any(r.serving for r in s.job(n).tasks.values())
                              for n in names), 3600)
    start = sim.now
    while sim.now - start < total - 1e-9:
        sim.step()
        now = sim.now - start
        jobs = s.jobs
        down = sum(1 for n in names if not any(r.serving for r in jobs[n].tasks.values()))
        world.unavailable_seconds += down * scn.tick_seconds
        while pushes and now >= pushes[0]:
            pushes.pop(0)
            version += 1
            for n in range(scn.jobs):
                s.update_job(spec(n, version), sim.now)
                world.updates += 1
        if scn.maintenance_per_hour and now >= next_maintenance:
            next_maintenance += 3600.0
            busy = sorted({r.machine for n in names for r in jobs[n].tasks.values()
                           if r.machine is not None and r.serving})
            chosen = rng.choice(len(busy), size=min(scn.maintenance_per_hour, len(busy)),
                                replace=False)
            machines = [fleet.name(busy[int(i)]) for i in chosen]
            begin = sim.now + scn.maintenance_notice_seconds
            sim.maintenance(machines, begin, begin + scn.maintenance_seconds)
            world.maintenance += len(machines)
        if now >= next_sample:
            next_sample += 60.0
            world.hours.append(now / 3600)
            world.held.append(len(sim.region.machines_of(ENT)))
            world.unavailable.append(down)
            world.extra.append(sum(1 for n in names for i in jobs[n].tasks
                                   if i >= jobs[n].spec.task_count))
        if progress is not None and now / total - told >= 0.01:
            told = now / total
            progress(share[0] + share[1] * told)
    world.counters = {k: int(v) for k, v in s.counters.items()
                      if k in ("surge_started", "surge_waits", "ops_started")}
    return world


def run(scn: Surge, progress: Callable[[float], None] | None = None) -> SurgeResult:
    buffer = _world(scn, True, progress, (0.0, 0.5))
    doubled = _world(scn, False, progress, (0.5, 0.5))
    need, double = max(buffer.held), max(doubled.held)
    figures = {
        "capacity_saved_fraction": round(1 - need / double, 4) if double else 0.0,
        "unavailable_task_minutes": round(buffer.unavailable_seconds / 60, 1),
        "doubled_unavailable_task_minutes": round(doubled.unavailable_seconds / 60, 1),
        "machines_buffer": need, "machines_doubled": double,
        "jobs": scn.jobs, "buffer": scn.buffer, "updates": buffer.updates,
        "maintained_machines": buffer.maintenance,
        "surge_tasks_started": buffer.counters.get("surge_started", 0),
        "most_surge_tasks_at_once": max(buffer.extra, default=0),
        "jobs_that_waited_for_the_buffer": buffer.counters.get("surge_waits", 0),
        "hours": scn.hours,
    }
    return SurgeResult(figures, buffer, doubled)


def plot(result: SurgeResult, path: str) -> None:
    """Machines held by each world over the day, surge tasks in use, jobs down."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 6), sharex=True)
    for world, color in ((result.doubled, "C1"), (result.buffer, "C0")):
        top.plot(world.hours, world.held, label=f"machines held ({world.name})",
                 color=color, lw=1.2)
    top.set_ylabel("machines")
    top.legend(loc="center right", fontsize="small")
    top.set_title("single-task inference jobs: a shared surge buffer vs doubling each job")
    b = result.buffer
    bottom.plot(b.hours, b.extra, label="surge tasks running", color="C0", lw=1.0)
    bottom.plot(b.hours, b.unavailable, label="jobs with no task serving (buffer)",
                color="C3", lw=1.0)
    bottom.set_xlabel("hour")
    bottom.set_ylabel("count")
    bottom.legend(loc="upper left", fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
