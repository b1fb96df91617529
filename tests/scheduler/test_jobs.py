"""Job operations: create, resize, update history, restart, delete."""

import pytest

from plait.errors import Conflict, NotFound, ValidationError
from plait.sim.scenarios import job_spec, world
from plait.taskcontrol import OneAtATime


def settled(sim, name, n):
    return sim.run_until(lambda: len(sim.scheduler.discovery(name)) == n, 300)


def test_create_is_idempotent_and_a_different_spec_conflicts():
    sim = world()
    spec = job_spec("web", 3)
    a = sim.scheduler.create_job(spec, 0)
    assert sim.scheduler.create_job(spec, 0) is a
    with pytest.raises(Conflict):
        sim.scheduler.create_job(job_spec("web", 4), 0)
    with pytest.raises(ValidationError) as err:
        sim.scheduler.create_job(job_spec("db", 1, entitlement="nope"), 0)
    assert err.value.field == "entitlement"
    with pytest.raises(NotFound):
        sim.scheduler.resize("ghost", 3, 0)


def test_resize_up_and_down_without_restarting_survivors():
    sim = world()
    s = sim.scheduler
    s.create_job(job_spec("web", 4), 0)
    assert settled(sim, "web", 4)
    before = dict(s.discovery("web"))
    s.resize("web", 6, sim.now)
    assert settled(sim, "web", 6)
    assert all(dict(s.discovery("web"))[i] == m for i, m in before.items())
    started = s.counters["ops_started"]
    s.resize("web", 2, sim.now)
    assert sim.run_until(lambda: len(s.job("web").tasks) == 2, 300)
    assert [i for i, _ in s.discovery("web")] == [0, 1]
    assert s.counters["ops_started"] == started + 4  # four stops, no restarts
    assert len(s.job("web").versions) == 3  # every version is kept
    assert int(sim.index.tasks.sum()) == 2  # the allocator freed the rest


def test_restart_one_task_goes_through_taskcontrol():
    sim = world()
    s = sim.scheduler
    ctl = OneAtATime()
    s.create_job(job_spec("web", 3), 0, controller=ctl)
    assert settled(sim, "web", 3)
    s.restart("web", sim.now, index=1)
    sim.run(30)
    kinds = [(op.kind.value, op.task.index) for call in ctl.calls for op in call.request]
    assert ("restart", 1) in kinds and ("restart", 0) not in kinds
    assert s.counters["ops_completed"] == 1
    assert len(s.discovery("web")) == 3


def test_delete_stops_everything_and_frees_the_machines():
    sim = world()
    s = sim.scheduler
    s.create_job(job_spec("web", 5), 0)
    assert settled(sim, "web", 5)
    s.delete_job("web", sim.now)
    assert sim.run_until(lambda: "web" not in s.jobs, 300)
    assert int(sim.index.tasks.sum()) == 0
    assert sim.allocator.machines_of("ent") == []
    assert all(not a.processes for a in sim.agents.values())
    assert any(e.kind == "deleted" for e in s.events)


def test_restart_whole_job_restarts_every_task_within_the_pacing():
    sim = world()
    s = sim.scheduler
    from plait.model import UpdatePolicy

    s.create_job(job_spec("web", 6, update=UpdatePolicy(max_unavailable=2)), 0)
    assert settled(sim, "web", 6)
    started = {i: next(a.processes[s.job("web").ref(i)].started_at
                       for a in sim.agents.values() if s.job("web").ref(i) in a.processes)
               for i in range(6)}
    worst = [0]
    sim.observers.append(lambda sm: worst.__setitem__(
        0, max(worst[0], 6 - len(sm.scheduler.discovery("web")))))
    s.restart("web", sim.now)
    assert sim.run_until(lambda: not any(r.restart or r.op for r in s.job("web").tasks.values())
                         and len(s.discovery("web")) == 6, 300)
    for i in range(6):  # a new process everywhere
        ref = s.job("web").ref(i)
        now_started = next(a.processes[ref].started_at for a in sim.agents.values()
                           if ref in a.processes)
        assert now_started > started[i]
    assert worst[0] == 2
