"""A week of diurnal web-tier load under the autoscaler (the shape of the paper's
Figure 15): ``plait sim run examples/scenarios/autoscale-week.yaml``.

One job of whole-machine tasks carries a daily load curve (a cosine between the
trough and the peak, with noise); every few minutes the autoscaler
(``plait.autoscaler.recommend``) reads the load the job carried (its tasks' mean CPU
utilization times its tasks) and its history, and resizes the job through the
scheduler; the tasks it sheds free whole machines, which go back to the free pool.
A minute whose utilization is above ``slo_utilization`` (or with load and no task
serving) is an SLO violation.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import pydantic

from plait.autoscaler import AutoscalePolicy, History, Room, recommend, within_room
from plait.model import Entitlement, Quota
from plait.model.base import Value
from plait.model.topology import RegionSpec, generate
from plait.sim.harness import Simulation
from plait.sim.scenarios import job_spec


class Load(Value):
    #: the load at the daily peak, in tasks' worth of work (tasks at 100 % CPU)
    peak: float = pydantic.Field(gt=0, le=100_000)
    trough_fraction: float = pydantic.Field(default=0.65, ge=0, le=1)
    peak_hour: float = pydantic.Field(default=20.0, ge=0, lt=24)
    #: the standard deviation of the load's noise, as a fraction of it
    noise: float = pydantic.Field(default=0.03, ge=0, le=1)

    def at(self, t: float) -> float:
        hour = (t / 3600) % 24
        wave = (1 + math.cos(2 * math.pi * (hour - self.peak_hour) / 24)) / 2
        return self.peak * (self.trough_fraction + (1 - self.trough_fraction) * wave)


class AutoscaleWeek(Value):
    scenario: Literal["autoscale-week"]
    seed: int = 3
    machines: int = pydantic.Field(ge=2, le=1_000_000)
    days: float = pydantic.Field(default=7.0, gt=0, le=28)
    tick_seconds: float = pydantic.Field(default=30.0, gt=0, le=600)
    decide_every_seconds: float = pydantic.Field(default=300.0, gt=0, le=86_400)
    quota: int = pydantic.Field(ge=1, le=1_000_000)
    load: Load
    policy: AutoscalePolicy = AutoscalePolicy()
    slo_utilization: float = pydantic.Field(default=0.85, gt=0, le=1)


@dataclass
class WeekResult:
    figures: dict[str, Any]
    hours: list[float] = field(default_factory=list)
    recommended: list[int] = field(default_factory=list)
    serving: list[int] = field(default_factory=list)
    utilization: list[float] = field(default_factory=list)


def run(scn: AutoscaleWeek, progress: Callable[[float], None] | None = None) -> WeekResult:
    rng = np.random.default_rng(scn.seed)
    fleet = generate(RegionSpec.sized(scn.machines, dcs=2, msbs_per_dc=4, rows_per_msb=1,
                                      racks_per_row=max(1, scn.machines // 160)))
    sim = Simulation(fleet, tick=scn.tick_seconds)
    s = sim.scheduler
    sim.allocator.define(Entitlement(name="web", owner="web", quota=Quota(machines=scn.quota)))
    cpu = int(fleet.cpu.min()) / 1000
    policy, history = scn.policy, History()
    first = recommend(policy, history, 0.0, 0, scn.load.at(0.0))
    s.create_job(job_spec("web", first, "web", cpu=cpu, memory_gb=1), 0.0)
    total = scn.days * 86_400
    result = WeekResult({})
    noise = 1.0
    next_decision, next_sample, told = scn.decide_every_seconds, 0.0, 0.0
    violation_seconds = 0.0
    last_day: list[tuple[int, int]] = []  # (tasks asked, machines held) on the last day
    while sim.now < total - 1e-9:
        sim.step()
        now = sim.now
        load = scn.load.at(now) * noise
        serving = len(s.discovery("web"))
        utilization = load / serving if serving else float("inf")
        if utilization > scn.slo_utilization:
            violation_seconds += scn.tick_seconds
        if now >= next_decision:
            next_decision += scn.decide_every_seconds
            noise = max(0.0, 1.0 + scn.load.noise * float(rng.standard_normal()))
            history.add(now, load)
            tasks = s.job("web").spec.task_count
            want = recommend(policy, history, now, tasks, load)
            if want >= tasks:  # (as the control plane: within the room there is)
                want = within_room(policy, want, Room(*s.placeable("web", want))).tasks
            if want != tasks:
                s.resize("web", want, now)
        if now >= next_sample:
            next_sample += 600.0
            tasks = s.job("web").spec.task_count
            result.hours.append(now / 3600)
            result.recommended.append(tasks)
            result.serving.append(serving)
            result.utilization.append(round(min(utilization, 2.0), 4))
            if now >= total - 86_400:
                last_day.append((tasks, len(sim.region.machines_of("web"))))
        if progress is not None and now / total - told >= 0.01:
            told = now / total
            progress(told)
    peak = max((m for _, m in last_day), default=0)
    low = min((m for _, m in last_day), default=0)
    result.figures = {
        "peak_tasks": max((t for t, _ in last_day), default=0),
        "offpeak_tasks": min((t for t, _ in last_day), default=0),
        "machines_freed_offpeak_fraction": round(1 - low / peak, 4) if peak else 0.0,
        "slo_violations_minutes": round(violation_seconds / 60, 1),
        "days": scn.days, "machines": len(fleet),
        "mean_utilization": round(float(np.mean([u for u in result.utilization
                                                 if u < 2.0] or [0.0])), 4),
    }
    return result


def plot(result: WeekResult, path: str) -> None:
    """Recommended and actual size over the week, with CPU utilization."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(11, 5))
    days = [h / 24 for h in result.hours]
    ax.plot(days, result.recommended, label="recommended size", color="C0", lw=1.2)
    ax.plot(days, result.serving, label="actual size (serving)", color="C1", lw=1.0)
    ax.set_xlabel("day")
    ax.set_ylabel("tasks")
    other = ax.twinx()
    other.plot(days, result.utilization, label="CPU utilization", color="C2", lw=0.7,
               alpha=0.7)
    other.set_ylabel("CPU utilization")
    other.set_ylim(0, 1.2)
    lines = ax.get_legend_handles_labels()
    more = other.get_legend_handles_labels()
    ax.legend(lines[0] + more[0], lines[1] + more[1], loc="lower right", fontsize="small")
    ax.set_title("autoscaling a web tier over a week")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
