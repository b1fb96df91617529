"""Pacing when a job has more tasks than the region can place.

A task that waits for room (pending, unplaced for want of a machine, and not taken
down by an operation under way) is down already, like a lost task: it does not count
against max_unavailable for the job's other operations, so an update goes on over the
tasks that run. A serving task that a planned operation took down still counts while
it waits for room: planned operations never take more than max_unavailable of the
job's serving tasks down at once.
"""

from plait.model import UpdatePolicy
from plait.model.task import TaskState
from plait.sim.scenarios import job_spec, world


def costly(job):
    """Tasks within the count that a planned operation took down and that have not
    served again since."""
    count = job.spec.task_count
    return [r.index for r in job.tasks.values()
            if r.index < count and r.op is not None and r.op_costly]


def grown_past_the_region():
    """Six machines of 16 cores hold twelve 8-core tasks: a job of 12 grown to 16."""
    sim = world(machines=6)
    s = sim.scheduler
    spec = job_spec("web", 12, cpu=8, update=UpdatePolicy(max_unavailable=1))
    s.create_job(spec, 0)
    assert sim.run_until(lambda: len(s.discovery("web")) == 12, 600)
    s.resize("web", 16, sim.now)
    sim.run(10)
    job = s.job("web")
    assert sum(1 for r in job.tasks.values() if r.state is TaskState.PENDING) == 4
    assert job.unplaced_reason is not None
    return sim, spec.model_copy(update={"task_count": 16})


def test_tasks_waiting_for_room_do_not_hold_back_an_update():
    sim, spec = grown_past_the_region()
    s = sim.scheduler
    job = s.job("web")
    assert s.waiting_for_room(job) == {12, 13, 14, 15}
    assert s.unavailable(job) == 4 and s.disrupted(job) == 0
    low = []

    def observe(sm):
        j = sm.scheduler.job("web")
        assert len(costly(j)) <= 1, costly(j)  # one serving task down at a time
        low.append(len(sm.scheduler.discovery("web")))
    sim.observers.append(observe)
    target = s.update_job(spec.model_copy(update={"args": ("v2",)}), sim.now)
    # every task that runs gets the new version, one at a time, while four wait
    assert sim.run_until(lambda: len(s.discovery("web")) == 12 and all(
        r.spec_version == target for r in job.tasks.values()
        if r.state is TaskState.RUNNING) and not job.in_progress, 1200)
    assert min(low) >= 11  # never more than max_unavailable of the serving tasks down
    assert sum(1 for r in job.tasks.values() if r.state is TaskState.PENDING) == 4
    kinds = [e.kind for e in s.events if e.job == "web"]
    assert "unplaced" in kinds


def test_a_task_an_operation_took_down_counts_while_it_waits_for_room():
    """An update to 9 cores: the first task stopped for it finds no machine with room
    (each holds two 8-core tasks). It waits for room, and it still counts: no other
    serving task goes down meanwhile."""
    sim = world(machines=6)
    s = sim.scheduler
    spec = job_spec("web", 12, cpu=8, update=UpdatePolicy(max_unavailable=1))
    s.create_job(spec, 0)
    assert sim.run_until(lambda: len(s.discovery("web")) == 12, 600)
    s.update_job(job_spec("web", 12, cpu=9, update=UpdatePolicy(max_unavailable=1)),
                 sim.now)
    job = s.job("web")
    assert sim.run_until(lambda: job.unplaced_reason is not None, 300)
    for _ in range(120):
        sim.run(1)
        assert len(costly(job)) == 1
        assert len(s.discovery("web")) == 11
        assert s.waiting_for_room(job) == set()  # (taken down by the update: counted)
        assert s.disrupted(job) == 1


def test_a_canary_ends_while_tasks_wait_for_room():
    """A canary (task 0 pinned to another version) of a job grown past its region:
    unpinned, it goes back to the job's version (before, the four tasks waiting for
    room spent the job's max_unavailable and the canary's task kept its version)."""
    sim, spec = grown_past_the_region()
    s = sim.scheduler
    job = s.job("web")
    canary = s.add_version(spec.model_copy(update={"args": ("canary",)}), sim.now)
    s.pin("web", {0: canary}, sim.now)
    assert sim.run_until(lambda: job.tasks[0].spec_version == canary
                         and job.tasks[0].serving, 600)
    s.pin("web", {}, sim.now)  # the canary ends
    assert sim.run_until(lambda: job.tasks[0].spec_version == job.target
                         and job.tasks[0].serving and not job.in_progress, 600)
    assert len(s.discovery("web")) == 12 and len(s.waiting_for_room(job)) == 4


def test_a_task_that_took_the_room_of_one_an_update_took_down_frees_the_cap():
    """A full region loses a machine: its two tasks wait for room. An update of the
    tasks' memory (placed again, not restarted in place) stops a serving task; a
    waiting task (of the older version, placed first) takes its room, and the stopped
    one waits for room instead. The job serves as many tasks as before the update's
    operation, so that operation no longer holds max_unavailable: the update goes on
    (before, it froze with the stopped task counted for good)."""
    sim = world(machines=6)
    s = sim.scheduler
    spec = job_spec("web", 12, cpu=8, update=UpdatePolicy(max_unavailable=1))
    s.create_job(spec, 0)
    assert sim.run_until(lambda: len(s.discovery("web")) == 12, 600)
    job = s.job("web")
    lost = {r.index for r in job.tasks.values() if r.machine == 5}
    sim.fail([sim.fleet.name(5)])
    assert sim.run_until(lambda: s.waiting_for_room(job) == lost, 600)
    low = []
    sim.observers.append(lambda sm: low.append(len(s.discovery("web"))))
    target = s.update_job(job_spec("web", 12, cpu=8, memory_gb=3,
                                   update=UpdatePolicy(max_unavailable=1)), sim.now)
    assert sim.run_until(lambda: len(s.discovery("web")) == 10 and all(
        r.spec_version == target for r in job.tasks.values()
        if r.state is TaskState.RUNNING) and not any(
        r.op is not None and r.op_costly for r in job.tasks.values()), 1800)
    assert min(low) >= 9  # one serving task down at a time
    assert len(s.waiting_for_room(job)) == 2
