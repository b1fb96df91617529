"""One release day on a region, on the production control plane:
``plait sim run examples/scenarios/release-day.yaml``.

The region's pass (``plait.sim.controlplane``: the control plane's own loop, Job
Control Plane, autoscaler, loans, host-profile rolls and maintenance) runs on the
simulated clock over four entitlements:

* ``front`` (job ``frontend``): a staged push whose gate passes completes; a second
  push, of a version its gate fails, is rolled back at its first stage; later a
  canary runs its time and ends;
* ``web`` (job ``api``), a lender: its autoscaler follows a daily load curve, and
  at the peak takes back the machines ``batch`` borrowed;
* ``batch`` (jobs ``crunch-*``), elastic: borrows what ``web`` does not use;
* ``store`` (job ``kv``): its host profile changes mid-day, rolled over its busy
  machines;

and planned maintenance, announced with notice, drains a few of ``frontend``'s
machines. Every time is a fraction of the day (``hours``), so a shorter day runs the
same story faster.

Observers check at every pass: no planned operation starts with its job at its
``max_unavailable`` (moves forced at a revoke's or a maintenance's deadline are not
planned), no task starts on a machine without its entitlement's host profile, no
revoked machine comes back past its deadline, and no task runs a version no intent
explains (its job's target, a version pinned by a push or a canary, or one the job
was moving from while its rollout is under way).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import pydantic

from plait.autoscaler import AutoscalePolicy
from plait.jcp.intents import CanaryIntent, Gate, PushIntent
from plait.model import ElasticTerms, Entitlement, JobSpec, Quota, parse
from plait.model.base import Value
from plait.model.hostprofile import HostProfileSpec
from plait.model.topology import RegionSpec
from plait.scheduler import SchedulerConfig
from plait.scheduler.records import JobRecord
from plait.server.controlplane.autoscaling import JobAutoscale
from plait.sim.controlplane import SimControlPlane
from plait.taskcontrol.protocol import TaskOp

#: the first simulated second: a midnight (UTC)
START = 1_800_057_600.0
#: the simulated gate's URL (a literal address: no name is resolved)
GATE = "http://192.0.2.1/health"


class ReleaseDay(Value):
    scenario: Literal["release-day"]
    seed: int = 0
    machines: int = pydantic.Field(default=300, ge=40, le=5_000)
    #: the length of the simulated day; every time below is a fraction of it
    hours: float = pydantic.Field(default=24.0, ge=2, le=48)
    tick_seconds: float = pydantic.Field(default=10.0, ge=1, le=60)
    #: ``frontend``'s pushes (the second of a version its gate fails), its canary
    good_push_at: float = pydantic.Field(default=0.10, ge=0, lt=1)
    bad_push_at: float = pydantic.Field(default=0.30, ge=0, lt=1)
    canary_at: float = pydantic.Field(default=0.45, ge=0, lt=1)
    canary_for: float = pydantic.Field(default=0.05, gt=0, lt=1)
    #: ``store``'s host profile gets its next version
    profile_change_at: float = pydantic.Field(default=0.20, ge=0, lt=1)
    #: a maintenance window of ``maintenance_machines`` of ``frontend``'s machines,
    #: announced ``maintenance_notice_seconds`` ahead
    maintenance_at: float = pydantic.Field(default=0.55, ge=0, lt=1)
    maintenance_machines: int = pydantic.Field(default=3, ge=1, le=100)
    maintenance_notice_seconds: float = pydantic.Field(default=1800.0, ge=60, le=86_400)
    maintenance_seconds: float = pydantic.Field(default=3600.0, ge=60, le=86_400)
    #: ``api``'s load at its peak, in machines' worth of the region, and when
    peak_fraction: float = pydantic.Field(default=0.30, gt=0, le=0.5)
    trough_fraction: float = pydantic.Field(default=0.25, ge=0, le=1)
    peak_at: float = pydantic.Field(default=0.75, ge=0, lt=1)
    noise: float = pydantic.Field(default=0.02, ge=0, le=0.5)


@dataclass
class DayResult:
    figures: dict[str, Any]
    hours: list[float] = field(default_factory=list)
    series: dict[str, list[float]] = field(default_factory=dict)
    #: (hour, what happened) for the plot's marks
    marks: list[tuple[float, str]] = field(default_factory=list)


def _spec(name: str, entitlement: str, tasks: int, cpu: float, version: str,
          max_unavailable: int | str = 1) -> JobSpec:
    return parse(JobSpec, {
        "name": name, "entitlement": entitlement, "task_count": tasks, "command": "serve",
        "args": ["--version", version], "resources": {"cpu": cpu, "memory_gb": 4},
        "update": {"max_unavailable": max_unavailable}})


def _label(spec: JobSpec) -> str:
    return " ".join(spec.args)


class Observers:
    """The day's rules, checked at every pass, and what it counts."""

    def __init__(self, world: SimControlPlane) -> None:
        self.world = world
        self.cp = world.cp
        self.max_unavailable_exceeded = 0
        self.revokes_past_deadline = 0
        self.unexplained: set[tuple[str, int, str]] = set()
        #: per job, the versions (labels) explained since it was last at rest
        self.moving: dict[str, set[str]] = {}
        #: entitlements whose profile changed, until their roll is seen to start; then
        #: rolls under way; those that ended with every busy machine carrying the
        #: profile's new version
        self.awaiting: set[str] = set()
        self.rolls: set[str] = set()
        self.rolls_completed = 0
        self.kinds: dict[str, int] = {}
        self.cursor = 0
        self.late_seen: set[int] = set()
        self.gate_rollbacks = 0
        self._watch_starts()

    def _watch_starts(self) -> None:
        """When a planned operation starts on an available task, its job is below its
        cap (as ``tests/sim/test_sim_profiles`` checks it)."""
        s = self.cp.scheduler
        original = s.start_ops

        def start(job: JobRecord, steps: Sequence[tuple[TaskOp, bool]], now: float) -> None:
            for op, _ in steps:
                rec = job.tasks.get(op.task.index)
                count = job.spec.task_count
                if rec is None or "/drain-" in op.op_id or job.deleting:
                    continue  # (forced at a deadline: not planned)
                if rec.state.value == "running" and rec.healthy and rec.serving and (
                        rec.index < count):
                    cap = job.spec.update.resolve(count)
                    if cap is not None and s.disrupted(job) >= cap:
                        self.max_unavailable_exceeded += 1
            original(job, steps, now)
        s.start_ops = start  # type: ignore[method-assign]

    def __call__(self, world: SimControlPlane) -> None:
        self._events()
        self._versions()
        self._rolls()
        s = self.cp.scheduler
        grace = s.config.loan_return_grace
        for m, revoke in s.revokes.items():
            if world.now > revoke.deadline + grace and m not in self.late_seen:
                self.late_seen.add(m)
                self.revokes_past_deadline += 1

    def _events(self) -> None:
        while True:
            found, _ = self.cp.events.query(after=self.cursor, limit=1000)
            if not found:
                return
            for event in found:
                self.kinds[event.kind] = self.kinds.get(event.kind, 0) + 1
                if event.kind == "push_rolled_back" and "the gate failed" in event.message:
                    self.gate_rollbacks += 1
                if event.kind == "profile_roll_started" and event.entitlement in self.awaiting:
                    self.awaiting.discard(event.entitlement)
                    self.rolls.add(event.entitlement)
                self.cursor = max(self.cursor, event.seq)

    def _versions(self) -> None:
        """No task runs a version that no intent explains."""
        s = self.cp.scheduler
        explained: dict[str, set[str]] = {}
        for name, job in s.jobs.items():
            now_wanted = {_label(job.versions[job.target - 1])}
            for v in (job.pins or {}).values():
                now_wanted.add(_label(job.versions[v - 1]))
            if job.rollout_active or job.in_progress or job.pins:
                self.moving.setdefault(name, set()).update(now_wanted)
                now_wanted |= self.moving[name]
            else:
                self.moving.pop(name, None)
            explained[name] = now_wanted
        for agent in self.world.sim.agents.values():
            if not agent.up:
                continue
            for ref, process in agent.processes.items():
                label = _label(process.assignment.spec)
                if label not in explained.get(ref.job, {label}):
                    self.unexplained.add((ref.job, ref.index, label))

    def _rolls(self) -> None:
        """A roll has ended once none of its entitlement's machines waits for it or
        drains for it, and every one of them carries the profile's new version."""
        s = self.cp.scheduler
        for name in sorted(self.rolls):
            rolling = any(ent == name for _, ent in s.rolling.values())
            if s.stale.get(name) or rolling or s.roll_moved.get(name):
                continue
            agents = self.world.sim.agents
            carried = True
            for m in s.region.machines_of(name):
                target = s.profile_target(int(m))
                agent = agents.get(int(m))
                if target is None or agent is None or agent.profile != (
                        target.name, target.version):
                    carried = False
            if carried:
                self.rolls.discard(name)
                self.rolls_completed += 1

    def profile_changed(self, entitlement: str) -> None:
        self.awaiting.add(entitlement)

    @property
    def mismatched_starts(self) -> int:
        return sum(a.mismatched_starts for a in self.world.sim.agents.values())


def run(scn: ReleaseDay, progress: Callable[[float], None] | None = None) -> DayResult:
    rng = random.Random(scn.seed)
    n = scn.machines
    day = scn.hours * 3600.0
    region = RegionSpec.sized(n, dcs=2, msbs_per_dc=3, rows_per_msb=1, racks_per_row=2)
    bad = "v3"

    def gate(url: str, job: str, stage: int) -> tuple[bool, str]:
        """The health gate: a version marked bad fails it."""
        push = world.cp.jcp.record(job).push
        label = "" if push is None else _label(push.intent.spec)
        if label.endswith(bad):
            return False, f"stage {stage}: error rate above its threshold on {label}"
        return True, f"stage {stage}: healthy"
    world = SimControlPlane(region, start=START, tick=scn.tick_seconds,
                            scheduler=SchedulerConfig(failure_deadline=120), gate=gate)
    cp = world.cp
    for name in ("web", "batch", "storage"):
        cp.profiles.put(HostProfileSpec(name=name, description=f"{name} v1",
                                        sysctls={"vm.swappiness": "10"}))
    q = max(4, n // 5)
    cp.commands.define_entitlement(Entitlement(
        name="front", owner="front-team", quota=Quota(machines=q)))
    cp.commands.define_entitlement(Entitlement(
        name="web", owner="web-team", quota=Quota(machines=int(n * 0.35)), lends=True,
        host_profile="web"))
    cp.commands.define_entitlement(Entitlement(
        name="batch", owner="batch-team", quota=Quota(machines=q), host_profile="batch",
        elastic=ElasticTerms(min_notice_seconds=120, max_reclaim_fraction_per_minute=0.25)))
    cp.commands.define_entitlement(Entitlement(
        name="store", owner="store-team", quota=Quota(machines=q), host_profile="storage"))
    for m in range(n):
        world.sim.agent(m).guard = False  # the scheduler's gate alone
    front = _spec("frontend", "front", max(6, n // 10), 4, "v1", max_unavailable="10%")
    kv = _spec("kv", "store", max(4, n // 15) * 2, 8, "v1", max_unavailable=2)
    # (each within what batch's own quota could hold: a job larger is refused; the
    # three want more than the quota, which batch borrows)
    crunch = [_spec(f"crunch-{c}", "batch", 2 * q, 8, "v1", max_unavailable="25%")
              for c in "abc"]
    api = _spec("api", "web", max(2, n // 20), 8, "v1", max_unavailable="10%")
    for spec in (front, kv, api, *crunch):
        cp.commands.create_job(spec)
    peak = scn.peak_fraction * n * 2  # (tasks' worth: two api tasks a machine)
    policy = AutoscalePolicy(metric="external", target_utilization=0.8,
                             min_tasks=max(2, n // 20), max_tasks=n, scale_down_fraction=0.2,
                             history_weight=0.0)
    cp.autoscaling.put("api", JobAutoscale(policy=policy,
                                           interval_seconds=max(60.0, day / 96)))
    watch = Observers(world)
    world.observers.append(watch)

    def load(t: float) -> float:
        phase = ((t - START) / day - scn.peak_at) * 2 * math.pi
        wave = (1 + math.cos(phase)) / 2
        level = peak * (scn.trough_fraction + (1 - scn.trough_fraction) * wave)
        return max(0.0, level * (1 + rng.gauss(0, scn.noise)))

    stages = (10, 50, 100)
    soak = min(300.0, day / 200)
    plan: list[tuple[float, str]] = sorted([
        (scn.good_push_at, "good_push"), (scn.bad_push_at, "bad_push"),
        (scn.canary_at, "canary"), (scn.profile_change_at, "profile"),
        (scn.maintenance_at, "maintenance")])
    result = DayResult(figures={})
    series = result.series
    for key in ("api_tasks", "api_load", "crunch_machines", "web_machines",
                "frontend_serving", "unavailable_machines"):
        series[key] = []
    sample_every = max(1, int(300 / scn.tick_seconds))
    maintenance: list[tuple[float, list[str]]] = []
    maintenances_clean = maintenance_left = 0
    while world.now < START + day:
        at = (world.now - START) / day
        while plan and plan[0][0] <= at:
            _, what = plan.pop(0)
            hour = (world.now - START) / 3600
            result.marks.append((hour, what))
            if what in ("good_push", "bad_push"):
                version = "v2" if what == "good_push" else bad
                spec = front.model_copy(update={"args": ("--version", version)})
                cp.jcp.put_push("frontend", PushIntent(
                    spec=spec, stages=stages, soak_seconds=soak,
                    gate=Gate(url=GATE)))
            elif what == "canary":
                spec = front.model_copy(update={"args": ("--version", "v4-canary")})
                cp.jcp.put_canary("frontend", "c1", CanaryIntent(
                    spec=spec, tasks=2, duration_seconds=scn.canary_for * day))
            elif what == "profile":
                cp.profiles.put(HostProfileSpec(name="storage", description="storage v2",
                                                sysctls={"vm.swappiness": "1"}))
                watch.profile_changed("store")
            elif what == "maintenance":
                with cp.lock:
                    job = cp.scheduler.jobs["frontend"]
                    hosts = sorted({cp.fleet.name(r.machine) for r in job.tasks.values()
                                    if r.machine is not None})
                chosen = rng.sample(hosts, min(scn.maintenance_machines, len(hosts)))
                start = world.now + scn.maintenance_notice_seconds
                cp.machine_ops.schedule_maintenance(chosen, start, scn.maintenance_seconds,
                                                    "kernel upgrade")
                maintenance.append((start, chosen))
        cp.autoscaling.push_load("api", load(world.now))
        world.step()
        for start, chosen in list(maintenance):
            if world.now >= start:  # the window began: its machines are empty
                maintenance.remove((start, chosen))
                busy = [c for c in chosen if _occupied(world, c)]
                if not busy:
                    maintenances_clean += 1
                else:
                    maintenance_left += len(busy)
                    result.marks.append(((world.now - START) / 3600,
                                         f"maintenance began with tasks on {busy}"))
        if world.passes % sample_every == 0:
            _sample(world, series, load(world.now))
            result.hours.append((world.now - START) / 3600)
            if progress is not None:
                progress(min(1.0, (world.now - START) / day))
    s = cp.scheduler
    k = watch.kinds
    result.figures = {
        "machines": n, "hours": scn.hours, "seed": scn.seed, "passes": world.passes,
        "pushes_completed": k.get("push_completed", 0),
        "pushes_rolled_back": k.get("push_rolled_back", 0),
        "pushes_rolled_back_by_gate": watch.gate_rollbacks,
        "canaries_completed": k.get("canary_ended", 0),
        "autoscale_decisions": k.get("autoscaled", 0),
        "profile_rolls_completed": watch.rolls_completed,
        "profile_roll_drains": k.get("profile_roll_drained", 0),
        "revokes": s.counters["loan_revokes"],
        "maintenances": maintenances_clean,
        "maintenances_scheduled": k.get("maintenance_scheduled", 0),
        "maintenance_machines_busy_at_start": maintenance_left,
        "gates_asked": len(world.gates.asked),
        "max_unavailable_exceeded": watch.max_unavailable_exceeded,
        "mismatched_starts": watch.mismatched_starts,
        "revokes_past_deadline": watch.revokes_past_deadline
        + s.counters["loan_revokes_late"],
        "tasks_on_unexplained_version": len(watch.unexplained),
        "api_tasks_min": min(series["api_tasks"], default=0),
        "api_tasks_max": max(series["api_tasks"], default=0),
    }
    return result


def _occupied(world: SimControlPlane, machine: str) -> bool:
    m = world.cp.fleet.index_of(machine)
    agent = world.sim.agents.get(m)
    return agent is not None and bool(agent.processes)


def _sample(world: SimControlPlane, series: dict[str, list[float]], load: float) -> None:
    cp = world.cp
    s = cp.scheduler
    region = s.region
    series["api_tasks"].append(s.jobs["api"].spec.task_count)
    series["api_load"].append(load)
    series["crunch_machines"].append(len(region.machines_of("batch")))
    series["web_machines"].append(len(region.machines_of("web")))
    series["frontend_serving"].append(len(s.discovery("frontend")))
    series["unavailable_machines"].append(
        sum(1 for a in world.sim.agents.values() if not a.up))


def plot(result: DayResult, path: str) -> None:
    """The day: api's load and size, the machines each side of the loan holds,
    frontend serving; the day's events marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(13, 7), sharex=True)
    h, s = result.hours, result.series
    top.plot(h, s["api_load"], label="api load (tasks' worth)", color="C0", lw=1)
    top.plot(h, s["api_tasks"], label="api tasks (autoscaled)", color="C1", lw=1.2)
    top.plot(h, s["frontend_serving"], label="frontend serving", color="C2", lw=1)
    top.set_ylabel("tasks")
    # (the legends beside the plots: the events are named along the top)
    top.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small")
    bottom.plot(h, s["web_machines"], label="web (lender) machines", color="C3", lw=1.2)
    bottom.plot(h, s["crunch_machines"], label="batch (borrower) machines", color="C4",
                lw=1.2)
    bottom.set_ylabel("machines")
    bottom.set_xlabel("hour")
    bottom.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small")
    for hour, what in result.marks:
        for ax in (top, bottom):
            ax.axvline(hour, color="grey", lw=0.6, ls="--")
        top.annotate(what, (hour, top.get_ylim()[1]), rotation=90, fontsize="x-small",
                     va="top", ha="right")
    top.set_title("a release day on the production control plane")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
