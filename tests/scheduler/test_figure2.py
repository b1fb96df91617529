"""Paper Figure 2: replicas of shards A-D on tasks 1-7 (plait indices 0-6: task k of
the figure is index k - 1). Tasks 1 and 3 are never restarted together; with task
4's machine down, neither 1 nor 7 restarts."""

from plait.model import Fleet, UpdatePolicy
from plait.sim.scenarios import job_spec, world
from plait.taskcontrol import ReplicaAware
from plait.testing import machine

FIGURE = {"A": {1, 3}, "B": {2, 5, 6}, "C": {1, 4, 7}, "D": {2, 3, 5}}
SHARDS = {shard: {k - 1 for k in tasks} for shard, tasks in FIGURE.items()}


def task(k):
    """The index of the figure's task k."""
    return k - 1


def test_figure2_shard_aware_rolling_update_with_task4_down():
    # one machine per task: a failed machine's task cannot move anywhere
    fleet = Fleet.from_machines([machine(f"m{i}", msb=f"msb{i}") for i in range(7)])
    sim = world(fleet=fleet)
    s = sim.scheduler
    spec = job_spec("cache", 7, cpu=16, update=UpdatePolicy(max_unavailable=None))
    s.create_job(spec, 0, controller=ReplicaAware(SHARDS, max_down=1))
    assert sim.run_until(lambda: len(s.discovery("cache")) == 7, 300)
    job = s.job("cache")

    down_log = []

    def observe(sm):
        down = {i for i in range(7) if i not in dict(sm.scheduler.discovery("cache"))}
        down_log.append(down)

    sim.observers.append(observe)
    machine4 = dict(s.discovery("cache"))[task(4)]
    failure = sim.fail([machine4])
    s.update_job(spec.model_copy(update={"args": ("--v2",)}), sim.now)
    sim.run(200)
    # 4 is down: 1 and 7 (shard C) were held back, the others went ahead
    assert job.tasks[task(1)].spec_version == 1 and job.tasks[task(7)].spec_version == 1
    assert all(job.tasks[task(k)].spec_version == 2 for k in (2, 3, 5, 6))
    sim.repair(failure)
    assert sim.run_until(lambda: not job.rollout_active, 600)
    for down in down_log:
        assert not {task(1), task(3)} <= down
        assert not (task(4) in down and (task(1) in down or task(7) in down))
        for replicas in SHARDS.values():
            assert len(replicas & down) <= 1
