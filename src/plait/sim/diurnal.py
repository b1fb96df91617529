"""A day of diurnal load with elastic loans (the shape of the paper's Figure 18).

Online entitlements lend the machines they do not use; their jobs follow a daily
load curve (a simple load-following sizing: a cosine between the trough and the
peak, resized every few minutes), so at night they shrink, the machines they free go
back to the free pool, and an elastic batch entitlement borrows them (switched to its
host profile); in the morning the online jobs grow again and the loans are revoked on
the batch entitlement's terms, each machine switched back to its lender's profile.
Profile switch times are drawn per kind of setting from log-normal distributions
whose P90s default to the paper's Figure 17 (turbo 3.0 s, hugepages 244 s).

The real scheduler, allocator and Sidekick book run on the simulated clock; the
simulated agents' own guard is off, so ``mismatched_starts`` counts what the
scheduler's gate let through (it must be zero).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import pydantic

from plait.model import ElasticTerms, Entitlement, Quota
from plait.model.base import Value
from plait.model.hostprofile import HostProfile, HostProfileSpec, kinds_changed
from plait.model.topology import RegionSpec, generate
from plait.scheduler import SchedulerConfig
from plait.sim.agents import SWITCH_SECONDS
from plait.sim.harness import Simulation
from plait.sim.scenarios import job_spec

#: the z-score of a normal distribution's 90th percentile
Z90 = 1.2815515655446004


class Online(Value):
    """An online entitlement that lends, and its job's daily load."""

    name: str
    quota: int = pydantic.Field(ge=1, le=1_000_000)
    profile: str = "default"
    #: the job's tasks at the peak (one whole machine each)
    peak_tasks: int = pydantic.Field(ge=0)
    #: the trough's load as a fraction of the peak's
    trough_fraction: float = pydantic.Field(default=0.5, ge=0, le=1)
    #: the hour of the day the load peaks
    peak_hour: float = pydantic.Field(default=20.0, ge=0, lt=24)

    def tasks_at(self, hour: float) -> int:
        wave = (1 + math.cos(2 * math.pi * (hour - self.peak_hour) / 24)) / 2
        return math.ceil(self.peak_tasks * (self.trough_fraction
                                            + (1 - self.trough_fraction) * wave))


class Steady(Value):
    """An entitlement that neither lends nor borrows, with a job of constant size."""

    name: str
    quota: int = pydantic.Field(ge=1, le=1_000_000)
    profile: str = "default"
    tasks: int = pydantic.Field(ge=0)


class Batch(Value):
    """The elastic entitlement: a backlog of batch tasks that takes every loan."""

    name: str = "batch"
    quota: int = pydantic.Field(ge=1, le=1_000_000)
    profile: str = "default"
    tasks: int = pydantic.Field(ge=0)
    terms: ElasticTerms = ElasticTerms()


class Diurnal(Value):
    """``examples/scenarios/diurnal.yaml``."""

    scenario: Literal["diurnal"]
    seed: int = 7
    machines: int = pydantic.Field(ge=2, le=1_000_000)
    #: the day simulated (after ``warmup_hours`` that are not counted)
    hours: float = pydantic.Field(default=24.0, gt=0, le=24 * 14)
    warmup_hours: float = pydantic.Field(default=1.0, ge=0, le=24)
    #: the simulated clock's tick, and how often the online jobs are resized
    tick_seconds: float = pydantic.Field(default=10.0, gt=0, le=600)
    resize_every_seconds: float = pydantic.Field(default=300.0, gt=0, le=86_400)
    profiles: list[HostProfileSpec] = pydantic.Field(default_factory=list, max_length=64)
    online: list[Online] = pydantic.Field(min_length=1, max_length=64)
    steady: list[Steady] = pydantic.Field(default_factory=list, max_length=64)
    batch: Batch
    #: P90 of a switch's duration per kind of setting (the paper's Figure 17 for turbo
    #: and hugepages), and the log-normal spread around it
    switch_p90_seconds: dict[str, float] = pydantic.Field(
        default_factory=lambda: dict(SWITCH_SECONDS))
    switch_sigma: float = pydantic.Field(default=0.5, ge=0, le=3)
    #: a revoked loan's machine is due back this long after the revoke's deadline
    loan_return_grace: float = pydantic.Field(default=30.0, ge=0, le=3600)


@dataclass
class DiurnalResult:
    figures: dict[str, Any]
    #: the plot's data: hours since the counted day began, then machines held per
    #: entitlement (and "free") at each sample
    hours: list[float] = field(default_factory=list)
    held: dict[str, list[int]] = field(default_factory=dict)
    revokes_at: list[float] = field(default_factory=list)


def switch_sampler(scn: Diurnal, rng: np.random.Generator
                   ) -> Callable[[HostProfileSpec | None, HostProfileSpec], float]:
    """A switch's duration: per kind of setting changed, a log-normal draw whose P90
    is the scenario's; the slowest counts (at least 1 s)."""
    shift = Z90 * scn.switch_sigma

    def draw(old: HostProfileSpec | None, new: HostProfileSpec) -> float:
        took = 1.0
        for kind in kinds_changed(old, new):
            p90 = scn.switch_p90_seconds.get(kind, 1.0)
            took = max(took, float(p90 * math.exp(scn.switch_sigma * rng.standard_normal()
                                                  - shift)))
        return took
    return draw


def run(scn: Diurnal, progress: Callable[[float], None] | None = None) -> DiurnalResult:
    """Simulate the scenario; ``progress`` is told the fraction done now and then."""
    rng = np.random.default_rng(scn.seed)
    fleet = generate(RegionSpec.sized(scn.machines, dcs=2, msbs_per_dc=4, rows_per_msb=1,
                                      racks_per_row=max(1, scn.machines // 160)))
    sim = Simulation(fleet, config=SchedulerConfig(loan_return_grace=scn.loan_return_grace),
                     tick=scn.tick_seconds)
    s, alloc = sim.scheduler, sim.allocator
    for spec in scn.profiles:
        s.define_profile(HostProfile(spec=spec, version=1))
    draw = switch_sampler(scn, rng)
    for m in range(len(fleet)):
        agent = sim.agent(m)
        agent.guard = False  # what is measured is the scheduler's gate
        agent.switch_time = draw
    cpu = int(fleet.cpu.min()) / 1000  # a whole machine per task
    memory = max(1.0, int(fleet.memory.min()) / 1024 / 4)
    for o in scn.online:
        alloc.define(Entitlement(name=o.name, owner="online", quota=Quota(machines=o.quota),
                                 host_profile=o.profile, lends=True))
    for st in scn.steady:
        alloc.define(Entitlement(name=st.name, owner="steady", quota=Quota(machines=st.quota),
                                 host_profile=st.profile))
    b = scn.batch
    alloc.define(Entitlement(name=b.name, owner="batch", quota=Quota(machines=b.quota),
                             host_profile=b.profile, elastic=b.terms))
    start_hour = -scn.warmup_hours
    for o in scn.online:
        s.create_job(job_spec(o.name, o.tasks_at(start_hour % 24), o.name, cpu=cpu,
                              memory_gb=memory), 0.0)
    for st in scn.steady:
        s.create_job(job_spec(st.name, st.tasks, st.name, cpu=cpu, memory_gb=memory), 0.0)
    s.create_job(job_spec(b.name, b.tasks, b.name, cpu=cpu, memory_gb=memory), 0.0)

    names = [o.name for o in scn.online] + [st.name for st in scn.steady] + [b.name]
    result = DiurnalResult({}, held={n: [] for n in [*names, "free"]})
    warmup, total = scn.warmup_hours * 3600, (scn.warmup_hours + scn.hours) * 3600
    next_resize = scn.resize_every_seconds
    sample_every = max(scn.tick_seconds, 60.0)
    next_sample = warmup
    switches0 = revokes0 = late0 = 0
    loaned_seconds = 0.0
    told = 0.0
    while sim.now < total - 1e-9:
        sim.step()
        now = sim.now
        if now >= next_resize:
            next_resize += scn.resize_every_seconds
            hour = (start_hour + now / 3600) % 24
            for o in scn.online:
                want = o.tasks_at(hour)
                if want != s.job(o.name).spec.task_count:
                    s.resize(o.name, want, now)
        if now < warmup:
            continue
        if not switches0 and now - scn.tick_seconds < warmup:  # the counted day begins
            switches0 = sum(a.switches for a in sim.agents.values())
            revokes0, late0 = s.counters["loan_revokes"], s.counters["loan_revokes_late"]
        loaned_seconds += len(sim.region.machines_of(b.name)) * scn.tick_seconds
        for e in s.loan_events:
            if e.kind == "loan_revoked":
                result.revokes_at.append((e.at - warmup) / 3600)
        s.loan_events.clear()
        if now >= next_sample:
            next_sample += sample_every
            result.hours.append((now - warmup) / 3600)
            for n in names:
                result.held[n].append(len(sim.region.machines_of(n)))
            result.held["free"].append(len(sim.region.free_machines()))
        if progress is not None and now / total - told >= 0.01:
            told = now / total
            progress(told)
    switches = sum(a.switches for a in sim.agents.values()) - switches0
    days = scn.hours / 24
    result.figures = {
        "profile_switches_per_machine_per_day": round(switches / len(fleet) / days, 4),
        "mismatched_starts": sum(a.mismatched_starts for a in sim.agents.values()),
        "loaned_machine_hours": round(loaned_seconds / 3600, 1),
        "revokes": s.counters["loan_revokes"] - revokes0,
        "revokes_past_deadline": s.counters["loan_revokes_late"] - late0,
        "machines": len(fleet), "hours": scn.hours,
        "peak_loaned": max(result.held[b.name], default=0),
        "min_loaned": min(result.held[b.name], default=0),
    }
    return result


def plot(result: DiurnalResult, path: str, title: str = "") -> None:
    """Machines per entitlement over the day, with the revokes marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(11, 5))
    names = [n for n in result.held if n != "free"]
    colors = [f"C{k}" for k in range(len(names))] + ["#dddddd"]
    ax.stackplot(result.hours, *[result.held[n] for n in [*names, "free"]],
                 labels=[*names, "free pool"], colors=colors, alpha=0.9)
    if result.revokes_at:
        ax.plot(result.revokes_at, [0] * len(result.revokes_at), "|", color="red",
                markersize=14, label="loan revoked")
    ax.set_xlabel("hour of the simulated day")
    ax.set_ylabel("machines")
    ax.set_title(title or "machines per entitlement (elastic loans)")
    ax.set_xlim(0, max(result.hours, default=24))
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
