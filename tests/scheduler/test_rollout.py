"""Rollout health: a crashing version halts by itself; rollback is a paced update."""

import random
from typing import Any

import pytest

from plait.model import UpdatePolicy
from plait.model.task import TaskState
from plait.scheduler.records import TaskRecord
from plait.sim.scenarios import job_spec, world


def test_crashing_version_halts_then_rollback_restores_under_the_same_pacing():
    sim = world(machines=24)
    s = sim.scheduler
    good = job_spec("web", 10, update=UpdatePolicy(max_unavailable=2, halt_after_failures=2,
                                                   min_ready_seconds=5))
    s.create_job(good, 0)
    assert sim.run_until(lambda: len(s.discovery("web")) == 10, 300)
    worst = [0]
    sim.observers.append(lambda sm: worst.__setitem__(
        0, max(worst[0], sm.scheduler.unavailable(sm.scheduler.job("web")))))

    bad = good.model_copy(update={"command": "crash"})
    s.update_job(bad, sim.now)
    assert sim.run_until(lambda: s.job("web").halted is not None, 300)
    job = s.job("web")
    assert "version 2" in job.halted and "failed to become healthy" in job.halted
    # the exit code the agent reported is said (a crash loop showed none anywhere)
    assert job.halted.endswith("(the last exited with code 1)"), job.halted
    assert any(e.kind == "task_exited" and "exited with code 1; its agent restarts it"
               in str(e.message) for e in s.events)
    assert any(e.kind == "rollout_halted" for e in s.events)
    on_bad = sum(1 for r in job.tasks.values() if r.spec_version == 2)
    sim.run(120)  # halted: no further update starts
    assert sum(1 for r in job.tasks.values() if r.spec_version == 2) == on_bad
    assert on_bad == 2  # the first wave only

    version = s.rollback("web", 1, sim.now)
    assert version == 3 and job.spec == good
    assert sim.run_until(lambda: len(s.discovery("web")) == 10 and not job.rollout_active, 600)
    assert all(r.spec_version == 3 for r in job.tasks.values())
    # planned operations never took more than max_unavailable down; the crashing
    # tasks of version 2 count among the unavailable ones
    assert worst[0] <= 2
    assert [v.command for v in job.versions] == ["serve", "crash", "serve"]


def test_resume_continues_a_halted_rollout():
    sim = world(machines=24)
    s = sim.scheduler
    spec = job_spec("web", 4, update=UpdatePolicy(max_unavailable=1, halt_after_failures=1))
    s.create_job(spec, 0)
    assert sim.run_until(lambda: len(s.discovery("web")) == 4, 300)
    s.update_job(spec.model_copy(update={"command": "crash"}), sim.now)
    assert sim.run_until(lambda: s.job("web").halted is not None, 300)
    s.resume("web", sim.now)
    assert s.job("web").halted is None
    assert sim.run_until(lambda: s.job("web").halted is not None, 300)  # halts again


def test_a_rollout_is_done_only_once_its_last_task_is_ready():
    """``rollout_done`` came while the last task was still in its min_ready_seconds:
    a crash of it then would not have counted toward halting the rollout."""
    sim = world(machines=24)
    s = sim.scheduler
    spec = job_spec("web", 4, update=UpdatePolicy(max_unavailable=1, min_ready_seconds=5))
    s.create_job(spec, 0)
    assert sim.run_until(lambda: len(s.discovery("web")) == 4, 300)
    s.update_job(spec.model_copy(update={"args": ("--v2",)}), sim.now)
    job = s.job("web")

    def last_in_its_min_ready() -> bool:
        busy = [r for r in job.tasks.values() if r.op is not None]
        return (len(busy) == 1 and busy[0].healthy and busy[0].state is TaskState.RUNNING and all(
            r.spec_version == 2 for r in job.tasks.values()))

    assert sim.run_until(last_in_its_min_ready, 600)
    # a heartbeat that reports another task healthy (a real agent reports every task
    # each second) looks whether the rollout is done: not yet
    other = next(r for r in job.tasks.values() if r.op is None)
    s.maybe_serving(job, other, sim.now)
    assert job.rollout_active
    assert sim.run_until(lambda: not job.rollout_active, 600)
    done = [e.time for e in s.events if e.kind == "rollout_done"][-1]
    ready = [e.time for e in s.events if e.kind == "task_ready"]
    assert len(ready) >= 8 and done >= max(ready)
    assert all(r.op is None and r.serving for r in job.tasks.values())


class _CountedTasks(dict[int, TaskRecord]):
    """A job's tasks that count the records ``rollout_done`` looks at."""

    looks = 0

    def get(self, index: int, default: object = None) -> Any:
        type(self).looks += 1
        return super().get(index, default)

    def values(self) -> Any:
        for rec in super().values():
            type(self).looks += 1
            yield rec


@pytest.mark.parametrize("order", ["by index", "reversed", "shuffled"])
def test_a_rollouts_reports_look_at_each_task_a_bounded_number_of_times(order: str):
    """Every task-ready report asks whether the rollout is done. It scanned the job's
    tasks from the first each time: tasks update in index order, so a rollout of
    20,000 tasks looked at 200 million records and its passes grew to seconds."""
    sim = world(machines=24)
    s = sim.scheduler
    n = 600
    spec = job_spec("web", n, cpu=0.01, memory_gb=0.01)
    s.create_job(spec, 0)
    assert sim.run_until(lambda: len(s.discovery("web")) == n, 300)
    s.update_job(spec.model_copy(update={"args": ("--v2",)}), sim.now)
    job = s.job("web")
    assert job.rollout_active
    job.tasks = counted = _CountedTasks(job.tasks)
    _CountedTasks.looks = 0
    indices = list(range(n))
    if order == "reversed":
        indices.reverse()
    elif order == "shuffled":
        random.Random(7).shuffle(indices)
    for k, index in enumerate(indices):
        rec = counted[index]
        rec.spec_version, rec.op, rec.healthy = 2, None, True
        rec.state = TaskState.RUNNING
        s.rollout_done(job, sim.now)
        # done once the last task is, not before
        assert job.rollout_active == (k < n - 1), (order, k)
    # a report costs the tasks done since the last one, not the job's size
    assert _CountedTasks.looks <= 6 * n, (order, _CountedTasks.looks)
    assert sum(e.kind == "rollout_done" for e in s.events) == 1
