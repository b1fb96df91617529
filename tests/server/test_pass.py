"""The region's pass (``plait.server.controlplane.passes.Pass``) driven by hand: a control
plane over an in-memory store, a ``PassInput`` filled in by the test (the time, the
jobs to look at, agents' reports and heartbeats), assertions on the ``PassOutcome``
and on the region after it. No HTTP, no thread: the test holds the lock and calls
the pass itself."""

from __future__ import annotations

import pytest

from plait.jcp.intents import SizingIntent
from plait.model import Entitlement, JobSpec, Quota, RegionSpec, parse
from plait.model.task import TaskState
from plait.scheduler.records import Phase, TaskStatus
from plait.server.controlplane import ControlPlane, ControlPlaneConfig
from plait.server.controlplane.passes import PassInput
from plait.store.sqlite import SqliteStore

REGION = RegionSpec.sized(12, dcs=2, msbs_per_dc=2, rows_per_msb=1, racks_per_row=1)
START = 1_000_000.0


class Region:
    """A control plane with real-agent rules (heartbeats, long-polled desired sets)
    on an injected clock, and the machines' names."""

    def __init__(self) -> None:
        self.now = START
        config = ControlPlaneConfig(region=REGION, metrics=False, controller_process=False,
                                    heartbeat_timeout=5.0, startup_grace=10.0)
        self.cp = ControlPlane(SqliteStore(":memory:", clock=lambda: self.now), config,
                               clock=lambda: self.now)
        self.machines = [self.cp.fleet.name(m) for m in range(len(self.cp.fleet))]
        self.cp.commands.define_entitlement(
            Entitlement(name="e", owner="o", quota=Quota(machines=6)))

    def run(self, seconds: float = 1.0, **given):
        """One pass, ``seconds`` later, over ``given`` (every machine beating unless
        ``beats`` is given)."""
        self.now += seconds
        given.setdefault("beats", dict.fromkeys(self.machines, self.now))
        with self.cp.lock:
            return self.cp.pass_.run(PassInput(now=self.now, **given))

    def running(self, machine: str) -> tuple:
        """The report of an agent that runs its whole desired set."""
        statuses = [TaskStatus(a.job, a.index, a.revision, Phase.RUNNING)
                    for a in self.cp.scheduler.desired_for(machine)]
        return (machine, statuses, {}, self.now, None, {})


def spec(tasks: int = 3) -> JobSpec:
    return parse(JobSpec, {"name": "web", "entitlement": "e", "task_count": tasks,
                           "command": "serve", "resources": {"cpu": 1, "memory_gb": 1}})


@pytest.fixture
def region() -> Region:
    return Region()


def test_a_stored_job_is_placed_and_its_machines_desired_sets_change(region):
    region.cp.commands.create_job(spec(3))
    out = region.run(names=("web",))
    assert out.changed is not None and "web" in out.changed
    assert out.errors == [] and out.calls == []
    placed = {region.cp.fleet.name(m) for m in out.touched}
    wanted = {(a.job, a.index) for m in placed for a in region.cp.scheduler.desired_for(m)}
    assert wanted == {("web", 0), ("web", 1), ("web", 2)}
    placed_events = [(job, task) for _, job, kind, _, task, *_ in out.events
                     if kind == "task_placed"]
    assert sorted(placed_events) == [("web", 0), ("web", 1), ("web", 2)]


def test_a_job_not_named_in_the_input_waits_for_a_pass_that_names_it(region):
    region.run(names=())  # (the first pass: nothing stored yet)
    region.cp.commands.create_job(spec(2))
    out = region.run(names=())
    assert "web" not in region.cp.scheduler.jobs and not out.touched
    out = region.run(names=("web",))
    assert "web" in region.cp.scheduler.jobs and out.touched


def test_agents_reports_make_the_tasks_running(region):
    region.cp.commands.create_job(spec(2))
    out = region.run(names=("web",))
    hosts = sorted({region.cp.fleet.name(m) for m in out.touched})
    region.run(reports=tuple(region.running(h) for h in hosts))
    job = region.cp.scheduler.jobs["web"]
    assert {r.state for r in job.tasks.values()} == {TaskState.RUNNING}


def test_a_machine_whose_heartbeats_stop_is_failed_by_the_pass(region):
    region.run()
    silent = region.machines[0]
    region.run(seconds=6.0, beats={m: region.now + 6.0 for m in region.machines[1:]})
    out = region.run(seconds=6.0, beats={m: region.now + 6.0 for m in region.machines[1:]})
    assert out.errors == []
    failed = [e for e in region.cp.region.events() if e.id == f"health-{silent}"]
    assert failed and failed[0].machines == (silent,)
    region.cp.flush_events()
    told, _ = region.cp.events.query(kind="machine_unreachable")
    assert [e.machine for e in told] == [silent]


def test_a_sizing_intent_resizes_the_job_after_the_pass(region):
    """The Job Control Plane sits behind the pass: ``Pass.after`` turns a sizing
    intent into the job's new size, which the next pass takes."""
    region.cp.commands.create_job(spec(2))
    region.run(names=("web",))
    region.cp.jcp.put_sizing("web", SizingIntent(task_count=4), actor="test")
    region.cp.pass_.after(region.now)
    assert region.cp.jobs.get("web").spec.task_count == 4
    out = region.run(names=("web",))
    assert len(region.cp.scheduler.jobs["web"].tasks) == 4
    assert out.changed is not None and "web" in out.changed
