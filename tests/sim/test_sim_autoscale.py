"""``plait sim run examples/scenarios/autoscale-week.yaml``: a week of diurnal load
under the production autoscaler (the control plane's own pass, on simulated agents)
frees at least a fifth of the web tier's machines off-peak (the paper: up to a
quarter) and reports its SLO minutes; the simulated agents' CPU reports reach the
autoscaler as real agents' do, for the tasks placed on their machines only."""

from pathlib import Path

import pytest

from plait.autoscaler import AutoscalePolicy
from plait.model import Entitlement, Quota
from plait.model.topology import RegionSpec
from plait.server.controlplane.autoscaling import JobAutoscale
from plait.sim import autoscale, files
from plait.sim.controlplane import SimControlPlane
from plait.sim.scenarios import job_spec

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "scenarios" / "autoscale-week.yaml"


@pytest.mark.parametrize("days", [
    2, pytest.param(None, marks=pytest.mark.slow, id="the-whole-week")])
def test_the_example_week_frees_machines_off_peak(days):
    _kind, scenario = files.load(EXAMPLE, {"days": days} if days else None)
    assert isinstance(scenario, autoscale.AutoscaleWeek)
    f = autoscale.run(scenario).figures
    assert f["machines_freed_offpeak_fraction"] >= 0.2
    assert f["peak_tasks"] > f["offpeak_tasks"] > 0
    assert 0 <= f["slo_violations_minutes"] < 60 * 24  # reported, and not the whole time
    assert 0.4 <= f["mean_utilization"] <= 0.7  # near the policy's target of 0.6
    # the control plane's autoscaler resized the job, through its sizing intents: at
    # least once an hour over the week (it decides every five minutes)
    assert f["autoscale_decisions"] >= 24 * f["days"]
    assert f["passes"] == round(f["days"] * 86_400 / scenario.tick_seconds)


def region():
    world = SimControlPlane(RegionSpec.sized(12, dcs=1, msbs_per_dc=2, rows_per_msb=1,
                                             racks_per_row=1), start=1_800_057_600.0,
                            tick=10.0)
    world.cp.commands.define_entitlement(Entitlement(name="web", owner="web",
                                                     quota=Quota(machines=12)))
    world.cp.commands.create_job(job_spec("web", 2, "web", cpu=2, memory_gb=1))
    world.cp.autoscaling.put("web", JobAutoscale(
        policy=AutoscalePolicy(metric="cpu", target_utilization=0.5, min_tasks=1,
                               max_tasks=12, scale_down_fraction=1.0, history_weight=0),
        interval_seconds=60))
    return world


def tasks(world):
    with world.cp.lock:
        job = world.cp.scheduler.jobs.get("web")  # (in the scheduler from the first pass)
        return None if job is None else job.spec.task_count


def serving(world):
    with world.cp.lock:
        if "web" not in world.cp.scheduler.jobs:
            return 0
        return len(world.cp.scheduler.discovery("web"))


def test_simulated_agents_cpu_drives_the_control_planes_autoscaler():
    world = region()
    cores = [3.0]  # each running task's use: 1.5 tasks' worth of a 2-core task
    world.sim.cpu_use = lambda running, now: [cores[0] for _ in running]
    world.sim.usage_every = 30.0
    # two tasks at 150 %: three tasks' worth, six tasks at the target of 50 %
    assert world.run_until(lambda: tasks(world) == 6, limit=900)
    events, _ = world.cp.events.query(limit=1000)
    grew = [e for e in events if e.kind == "autoscaled"]
    assert grew and grew[0].actor == "autoscaler" and "2 -> 6 tasks" in grew[0].message
    sizing = world.cp.jcp.record("web").sizing  # (its sizing intent)
    assert sizing.actor == "autoscaler" and sizing.intent.task_count == 6
    assert world.run_until(lambda: serving(world) == 6, 600)
    cores[0] = 0.5  # six tasks at 25 %: 1.5 tasks' worth, three tasks
    assert world.run_until(lambda: tasks(world) == 3, limit=900)


def test_a_machine_speaks_for_its_own_tasks_cpu_only():
    world = region()
    assert world.run_until(lambda: serving(world) == 2, 600)
    with world.cp.lock:
        placed = {i: r.machine for i, r in world.cp.scheduler.jobs["web"].tasks.items()}
    other = next(m for m in range(12) if m not in placed.values())
    world.cp.pass_.take_usage(other, {("web", 0): 50.0}, world.now)  # not placed there
    assert 0 not in world.cp.autoscaling.cpu.get("web", {})
    world.cp.pass_.take_usage(placed[0], {("web", 0): 1.0}, world.now)
    assert world.cp.autoscaling.cpu["web"][0] == (1.0, world.now)
