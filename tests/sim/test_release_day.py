"""The release day (``examples/scenarios/release-day.yaml``) on the production control
plane: its pushes, gate, canary, autoscaler, loans, host-profile roll and maintenance
all happen, and its rules hold at every pass, on a short day of a small region and
(slow) on the file as it is, another seed and twice its machines."""

from pathlib import Path

import pytest

from plait.sim import files, releaseday
from plait.sim.controlplane import SimControlPlane

FILE = Path(__file__).resolve().parents[2] / "examples" / "scenarios" / "release-day.yaml"
HAPPENED = ("pushes_completed", "pushes_rolled_back", "canaries_completed",
            "autoscale_decisions", "profile_rolls_completed", "revokes", "maintenances")
RULES = ("max_unavailable_exceeded", "mismatched_starts", "revokes_past_deadline",
         "tasks_on_unexplained_version")


def day(**overrides):
    kind, scenario = files.load(FILE, overrides)
    figures, _ = kind.run(scenario, None)
    return figures


def check(figures):
    for name in HAPPENED:
        assert figures[name] >= 1, (name, figures)
    for name in RULES:
        assert figures[name] == 0, (name, figures)
    assert figures["maintenance_machines_busy_at_start"] == 0
    assert figures["pushes_rolled_back_by_gate"] >= 1
    # the gate was asked for each of the good push's three stages and the bad one's first
    assert figures["gates_asked"] == 4
    assert figures["api_tasks_max"] > figures["api_tasks_min"]  # (it followed the curve)


def test_a_short_release_day_on_a_small_region_keeps_its_rules():
    check(day(hours=4, machines=80))


def test_the_day_draws_its_plot(tmp_path):
    pytest.importorskip("matplotlib")
    kind, scenario = files.load(FILE, {"hours": 2, "machines": 40})
    _, draw = kind.run(scenario, None)
    draw(str(tmp_path / "day.png"))
    assert (tmp_path / "day.png").stat().st_size > 10_000


def test_a_task_on_a_version_no_intent_explains_is_counted():
    """The rule's observer is not blind: a process running a version its job never
    had is counted."""
    from plait.model.topology import RegionSpec

    world = SimControlPlane(RegionSpec.sized(40, dcs=2, msbs_per_dc=3, rows_per_msb=1,
                                             racks_per_row=2))
    cp = world.cp
    from plait.model import Entitlement, Quota

    cp.commands.define_entitlement(Entitlement(name="e", owner="o", quota=Quota(machines=10)))
    cp.commands.create_job(releaseday._spec("j", "e", 4, 1, "v1"))
    watch = releaseday.Observers(world)
    world.observers.append(watch)
    world.step()
    assert world.run_until(lambda: len(cp.scheduler.discovery("j")) == 4, 600)
    assert not watch.unexplained
    agent = next(a for a in world.sim.agents.values() if a.processes)
    process = next(iter(agent.processes.values()))
    spec = process.assignment.spec.model_copy(update={"args": ("--version", "rogue")})
    process.assignment = type(process.assignment)(
        process.assignment.job, process.assignment.index, process.assignment.spec_version,
        process.assignment.revision, spec)
    world.step()
    assert [u[2] for u in watch.unexplained] == ["--version rogue"]


def test_the_release_day_file_keeps_its_rules():
    check(day())


@pytest.mark.slow
@pytest.mark.parametrize("overrides", [{"seed": 7}, {"machines": 600}])
def test_the_release_day_keeps_its_rules_on_another_seed_and_twice_the_machines(overrides):
    check(day(**overrides))
