"""Task-level events: what happened to each task, who decided it and why; a job's ops
chart is drawn from them alone (plait.ui.gantt), so each operation must open and close
exactly one bar."""

from dataclasses import asdict

from plait.model import UpdatePolicy
from plait.scheduler import SchedulerConfig
from plait.sim.scenarios import job_spec, world
from plait.taskcontrol import OneAtATime
from plait.ui import gantt


def wire(events):
    return [{**asdict(e), "seq": n} for n, e in enumerate(events)]


def test_a_rolling_update_records_one_acked_operation_per_task_and_its_end():
    sim = world(machines=12)
    s = sim.scheduler
    spec = job_spec("web", 4, update=UpdatePolicy(max_unavailable=1))
    s.create_job(spec, 0, controller=OneAtATime())
    assert sim.run_until(lambda: len(s.discovery("web")) == 4, 300)
    placed = [e for e in s.events if e.kind == "task_placed"]
    assert sorted(e.task for e in placed) == [0, 1, 2, 3]
    assert all(e.op == "start" and e.machine is not None for e in placed)

    s.update_job(spec.model_copy(update={"command": "serve2"}), sim.now)
    assert sim.run_until(lambda: not s.job("web").rollout_active
                         and len(s.discovery("web")) == 4, 600)
    started = [e for e in s.events if e.kind == "op_started"]
    assert sorted(e.task for e in started) == [0, 1, 2, 3]
    assert {(e.op, e.decision) for e in started} == {
        ("update", "acked by the job's TaskController")}
    assert all("version 2" in (e.reason or "") for e in started)
    # each task became ready again after its update began
    for e in started:
        assert any(r.kind == "task_ready" and r.task == e.task and r.time >= e.time
                   for r in s.events)

    rows = gantt.bars(wire(s.events))
    assert sorted(rows) == [0, 1, 2, 3]
    for bars in rows.values():
        assert [b.op for b in bars] == ["start", "update"]
        assert all(b.end is not None and b.end >= b.start for b in bars)
    # the update bars never overlap more than max_unavailable at a time
    updates = [b for bars in rows.values() for b in bars if b.op == "update"]
    for b in updates:
        overlapping = [o for o in updates if o.start < b.end and b.start < o.end]
        assert len(overlapping) <= 1


def test_without_a_controller_the_decision_says_the_scheduler_paced_it():
    sim = world(machines=12)
    s = sim.scheduler
    spec = job_spec("web", 2, update=UpdatePolicy(max_unavailable=1))
    s.create_job(spec, 0)
    assert sim.run_until(lambda: len(s.discovery("web")) == 2, 300)
    s.update_job(spec.model_copy(update={"command": "serve2"}), sim.now)
    assert sim.run_until(lambda: not s.job("web").rollout_active, 600)
    decisions = {e.decision for e in s.events if e.kind == "op_started"}
    assert decisions == {"approved by the scheduler (no TaskController), within "
                         "max_unavailable"}


def test_a_machine_failure_draws_a_failure_bar_until_the_task_serves_elsewhere():
    sim = world(machines=12)
    s = sim.scheduler
    s.create_job(job_spec("web", 3, cpu=8), 0)
    assert sim.run_until(lambda: len(s.discovery("web")) == 3, 300)
    index, victim = s.discovery("web")[0]
    sim.fail([victim])
    assert sim.run_until(lambda: len(s.discovery("web")) == 3
                         and dict(s.discovery("web"))[index] != victim, 600)
    lost = [e for e in s.events if e.kind == "task_lost"]
    assert [(e.task, e.machine, e.op) for e in lost] == [(index, victim, "failure")]
    bars = gantt.bars(wire(s.events))[index]
    assert [b.op for b in bars] == ["start", "failure"]
    failure = bars[-1]
    assert failure.end is not None and failure.machine == victim
    # a replacement is not paced: its decision does not claim max_unavailable
    moved = [e for e in s.events if e.kind == "op_started" and e.op == "failure"]
    assert [e.decision for e in moved] == [
        "approved by the scheduler (no TaskController): the task was down"]
    assert failure.ended_on not in (None, victim)  # it ends where the task runs now
    assert f"{victim} -> {failure.ended_on}" in failure.detail(sim.now)
    # the other tasks drew no failure
    assert all(b.op == "start" for i, bs in gantt.bars(wire(s.events)).items()
               if i != index for b in bs)


def test_task_events_can_be_turned_off_and_job_events_stay():
    sim = world(machines=12, config=SchedulerConfig(task_events=False))
    s = sim.scheduler
    spec = job_spec("web", 2)
    s.create_job(spec, 0)
    assert sim.run_until(lambda: len(s.discovery("web")) == 2, 300)
    assert [e for e in s.events if e.task is not None] == []
    assert any(e.kind == "created" for e in s.events)


def test_the_shell_names_who_asked_on_the_events_an_operation_raises():
    sim = world(machines=12)
    s = sim.scheduler
    s.acting = ("owner:alice", "req-1")
    s.create_job(job_spec("web", 2), 0)
    s.acting = (None, None)
    created = next(e for e in s.events if e.kind == "created")
    assert (created.actor, created.request) == ("owner:alice", "req-1")
    assert sim.run_until(lambda: len(s.discovery("web")) == 2, 300)
    placed = next(e for e in s.events if e.kind == "task_placed")
    assert placed.actor is None  # the scheduler's own doing
