"""A week of diurnal web-tier load under the autoscaler (the shape of the paper's
Figure 15): ``plait sim run examples/scenarios/autoscale-week.yaml``.

One job of whole-machine tasks carries a daily load curve (a cosine between the
trough and the peak, with noise), on the production control plane
(``plait.sim.controlplane``: the region's own pass, simulated agents on every
machine). The job's autoscale policy is set as ``PUT /v1/jobs/web/autoscale`` sets
it (``Autoscaling.put``, deciding every ``decide_every_seconds``); the agents report
the cores each running task uses (the load spread over them), as real agents'
reports carry it, and the control plane's autoscaler (``Autoscaling.decide``, after
each pass) reads the job's load from them, decides and writes its sizing intent,
which the Job Control Plane turns into a resize; the tasks it sheds free whole
machines, which go back to the free pool. A minute whose utilization is above
``slo_utilization`` (or with load and no task serving) is an SLO violation.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import pydantic

from plait.autoscaler import AutoscalePolicy, History, recommend
from plait.model import Entitlement, Quota
from plait.model.base import Value
from plait.model.task import TaskRef
from plait.model.topology import RegionSpec
from plait.server.controlplane.autoscaling import JobAutoscale
from plait.sim.controlplane import SimControlPlane
from plait.sim.scenarios import job_spec

#: the first simulated second: a midnight (UTC), as a real clock reads
START = 1_800_057_600.0


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
    region = RegionSpec.sized(scn.machines, dcs=2, msbs_per_dc=4, rows_per_msb=1,
                              racks_per_row=max(1, scn.machines // 160))
    world = SimControlPlane(region, start=START, tick=scn.tick_seconds)
    cp = world.cp
    s = cp.scheduler
    cp.commands.define_entitlement(Entitlement(name="web", owner="web",
                                               quota=Quota(machines=scn.quota)))
    cpu = int(cp.fleet.cpu.min()) / 1000
    # (the owner's first size: what the policy asks for the load at the start)
    first = recommend(scn.policy, History(), 0.0, 0, scn.load.at(0.0))
    cp.commands.create_job(job_spec("web", first, "web", cpu=cpu, memory_gb=1))
    cp.autoscaling.put("web", JobAutoscale(policy=scn.policy,
                                           interval_seconds=scn.decide_every_seconds))
    noise = [1.0]  # (redrawn every ``decide_every_seconds``)

    def load(now: float) -> float:
        return scn.load.at(now - START) * noise[0]

    def cpu_use(running: Sequence[TaskRef], now: float) -> list[float]:
        """The cores each running task uses: the load spread over the job's."""
        web = sum(1 for ref in running if ref.job == "web")
        share = load(now) / web * cpu if web else 0.0
        return [share if ref.job == "web" else 0.0 for ref in running]

    world.sim.cpu_use = cpu_use
    # (reported twice an interval: the autoscaler reads what was reported within it)
    world.sim.usage_every = scn.decide_every_seconds / 2
    end = START + scn.days * 86_400
    result = WeekResult({})
    next_noise, next_sample, told = START + scn.decide_every_seconds, START, 0.0
    violation_seconds = 0.0
    decisions, cursor = 0, 0
    last_day: list[tuple[int, int]] = []  # (tasks asked, machines held) on the last day
    while world.now < end - 1e-9:
        world.step()
        now = world.now
        if now >= next_noise:
            next_noise += scn.decide_every_seconds
            noise[0] = max(0.0, 1.0 + scn.load.noise * float(rng.standard_normal()))
        with cp.lock:
            serving = len(s.discovery("web"))
            tasks = s.jobs["web"].spec.task_count
            held = len(s.region.machines_of("web"))
        utilization = load(now) / serving if serving else float("inf")
        if utilization > scn.slo_utilization:
            violation_seconds += scn.tick_seconds
        if now >= next_sample:
            next_sample += 600.0
            result.hours.append((now - START) / 3600)
            result.recommended.append(tasks)
            result.serving.append(serving)
            result.utilization.append(round(min(utilization, 2.0), 4))
            if now >= end - 86_400:
                last_day.append((tasks, held))
            found, _ = cp.events.query(after=cursor, limit=1000)
            while found:
                decisions += sum(1 for e in found if e.kind == "autoscaled")
                cursor = max(e.seq for e in found)
                found, _ = cp.events.query(after=cursor, limit=1000)
        if progress is not None and (now - START) / (end - START) - told >= 0.01:
            told = (now - START) / (end - START)
            progress(told)
    peak = max((m for _, m in last_day), default=0)
    low = min((m for _, m in last_day), default=0)
    result.figures = {
        "peak_tasks": max((t for t, _ in last_day), default=0),
        "offpeak_tasks": min((t for t, _ in last_day), default=0),
        "machines_freed_offpeak_fraction": round(1 - low / peak, 4) if peak else 0.0,
        "slo_violations_minutes": round(violation_seconds / 60, 1),
        "days": scn.days, "machines": len(cp.fleet),
        "mean_utilization": round(float(np.mean([u for u in result.utilization
                                                 if u < 2.0] or [0.0])), 4),
        "autoscale_decisions": decisions, "passes": world.passes,
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
