"""Machine failures: lost tasks are disabled, reported, moved when acked, rate limited."""

from plait.model import TaskState
from plait.scheduler import SchedulerConfig
from plait.sim.scenarios import job_spec, world
from plait.taskcontrol import OneAtATime, TaskControlResponse


def running(sim, name, n):
    return sim.run_until(lambda: len(sim.scheduler.discovery(name)) == n, 300)


def test_failed_machine_tasks_are_lost_disabled_reported_moved_and_reenabled():
    sim = world(machines=12)
    s = sim.scheduler
    ctl = OneAtATime()
    s.create_job(job_spec("web", 6, cpu=8), 0, controller=ctl)
    assert running(sim, "web", 6)
    index, victim = s.discovery("web")[0]
    sim.fail([victim])
    sim.region.tick(sim.now)
    s.tick(sim.now)
    rec = s.job("web").tasks[index]
    assert rec.state in (TaskState.LOST, TaskState.PENDING, TaskState.ALLOCATED)
    assert index not in dict(s.discovery("web"))  # disabled at once
    last = ctl.calls[-1]
    assert [t.index for t in last.all_unhealthy_tasks] == [index]
    assert [(o.kind.value, o.task.index) for o in last.request] == [("move", index)]
    assert running(sim, "web", 6)
    assert dict(s.discovery("web"))[index] != victim


def test_unacked_moves_wait_until_the_failure_deadline():
    class Never:
        def __init__(self):
            self.calls = 0

        def process(self, request):
            self.calls += 1
            return TaskControlResponse(())

    sim = world(machines=12, config=SchedulerConfig(failure_deadline=120))
    s = sim.scheduler
    s.create_job(job_spec("web", 4, cpu=8), 0, controller=Never())
    assert running(sim, "web", 4)
    index, victim = s.discovery("web")[0]
    sim.fail([victim])
    sim.run(100)
    assert index not in dict(s.discovery("web"))  # no ack: no move
    assert s.counters["failure_deadline_moves"] == 0
    assert running(sim, "web", 4)  # then the deadline passes
    assert s.counters["failure_deadline_moves"] == 1
    assert sim.now >= 120
    assert any(e.kind == "failure_deadline" for e in s.events)


def test_a_flood_of_failures_slows_moves_to_the_rate_limit():
    config = SchedulerConfig(rate=1.0, burst=5)
    sim = world(machines=60, config=config)
    s = sim.scheduler
    s.create_job(job_spec("web", 60, cpu=16), 0)
    assert running(sim, "web", 60)
    msb = sim.fleet.codes["msb"]
    machines = sorted({m for _, m in s.discovery("web")
                       if msb[sim.fleet.index_of(m)] == 0})
    assert len(machines) >= 8
    # leave room: free machines to move to exist only outside the failed MSB
    started0 = s.counters["ops_started"]
    samples = []
    sim.observers.append(lambda sm: samples.append((sm.now, sm.scheduler.counters["ops_started"])))
    t0 = sim.now
    sim.fail(machines)
    sim.run(30)
    for t, started in samples:
        assert started - started0 <= 5 + 1.0 * (t - t0) + 1e-9
    assert s.counters["throttled"] > 0
    assert any(e.kind == "throttled" for e in s.events)


def test_a_controller_that_breaks_acks_nothing_and_the_scheduler_goes_on():
    class Broken:
        def __init__(self, answer):
            self.answer = answer

        def process(self, request):
            if isinstance(self.answer, Exception):
                raise self.answer
            return self.answer

    for answer in (RuntimeError("boom"), {"ack": ["x"]}, None, TaskControlResponse((1, 2))):
        sim = world()
        s = sim.scheduler
        spec = job_spec("web", 3)
        s.create_job(spec, 0, controller=Broken(answer))
        assert running(sim, "web", 3)
        s.update_job(spec.model_copy(update={"args": ("--v2",)}), sim.now)
        sim.run(60)
        assert all(r.spec_version == 1 for r in s.job("web").tasks.values())
        assert s.counters["controller_errors"] >= 1
        assert any(e.kind == "controller_error" for e in s.events)
