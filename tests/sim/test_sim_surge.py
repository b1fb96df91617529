"""The shared surge buffer in the simulator: single-task jobs updated, restarted and
moved for maintenance never go unavailable while the buffer has room (a surge task
serves before the task goes down); with the buffer full, operations wait instead of
taking a job down; no task runs twice; surge tasks go away once the task is back."""

from hypothesis import given, settings
from hypothesis import strategies as st

from plait.model import Entitlement, Quota, UpdatePolicy
from plait.sim.scenarios import job_spec, world

SURGING = UpdatePolicy(surge=True)


def build(jobs: int, buffer: int, machines: int = 12):
    sim = world(machines=machines, entitlements=())
    sim.allocator.define(Entitlement(name="ent", owner="o", quota=Quota(machines=machines),
                                     surge_buffer=buffer))
    for n in range(jobs):
        sim.scheduler.create_job(job_spec(f"j{n}", 1, cpu=4, update=SURGING), sim.now)
    return sim


def serving(sim, name):
    return [i for i, r in sim.scheduler.job(name).tasks.items() if r.serving]


def settled(sim, version):
    for job in sim.scheduler.jobs.values():
        if [(i, r.spec_version, r.serving) for i, r in job.tasks.items()] != [
                (0, version, True)]:
            return False
        if job.offers or job.acked:
            return False
    return True


class Watch:
    """Every job keeps a serving task (its own or its surge task) at every step; no
    task runs twice; at most ``buffer`` surge tasks at once."""

    def __init__(self, sim, buffer):
        self.most = 0
        self.buffer = buffer
        sim.observers.append(self)

    def __call__(self, sim):
        surges = 0
        for job in sim.scheduler.jobs.values():
            assert any(r.serving for r in job.tasks.values()), f"{job.name} unavailable"
            surges += sum(1 for i in job.tasks if i >= job.spec.task_count)
            for index in job.tasks:
                assert len(sim.running_copies(job.ref(index))) <= 1
        assert surges <= self.buffer
        self.most = max(self.most, surges)


def update_all(sim, jobs, command):
    for n in range(jobs):
        sim.scheduler.update_job(job_spec(f"j{n}", 1, cpu=4, update=SURGING,
                                          command=command), sim.now)


def test_an_update_of_single_task_jobs_never_takes_one_down():
    sim = build(jobs=6, buffer=2)
    assert sim.run_until(lambda: settled(sim, 1), 600)
    watch = Watch(sim, buffer=2)
    update_all(sim, 6, "serve-v2")
    assert sim.run_until(lambda: settled(sim, 2), 3600)
    assert watch.most == 2  # the buffer was used, and never passed
    assert sim.scheduler.counters["surge_started"] == 6
    # the jobs waited for room rather than going down
    assert sim.scheduler.counters["surge_waits"] >= 1
    kinds = [e.kind for e in sim.scheduler.events]
    assert "surge_started" in kinds and "surge_released" in kinds


def test_with_no_buffer_an_update_waits_instead_of_breaking_availability():
    sim = build(jobs=2, buffer=0)
    assert sim.run_until(lambda: settled(sim, 1), 600)
    watch = Watch(sim, buffer=0)
    update_all(sim, 2, "serve-v2")
    sim.run(300)
    for n in range(2):  # still serving the old version: the updates queue
        job = sim.scheduler.job(f"j{n}")
        assert job.tasks[0].spec_version == 1 and job.tasks[0].serving and job.offers
    # room in the buffer: they go on, one at a time
    sim.allocator.define(Entitlement(name="ent", owner="o", quota=Quota(machines=12),
                                     surge_buffer=1))
    watch.buffer = 1
    for n in range(2):
        sim.scheduler.mark(f"j{n}")
    assert sim.run_until(lambda: settled(sim, 2), 3600)


def test_maintenance_moves_are_covered_too():
    sim = build(jobs=3, buffer=3)
    assert sim.run_until(lambda: settled(sim, 1), 600)
    Watch(sim, buffer=3)
    machines = sorted({sim.fleet.name(sim.scheduler.job(f"j{n}").tasks[0].machine)
                       for n in range(3)})
    sim.maintenance(machines, start=sim.now + 600, end=sim.now + 1800)
    assert sim.run_until(lambda: all(
        sim.fleet.name(sim.scheduler.job(f"j{n}").tasks[0].machine) not in machines
        and settled(sim, 1) for n in range(3)), 3600)


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 4), st.integers(1, 3), st.lists(st.sampled_from(
    ["update", "restart", "fail"]), min_size=1, max_size=4))
def test_a_job_stays_available_through_random_operations(jobs, buffer, ops):
    sim = build(jobs=jobs, buffer=buffer)
    assert sim.run_until(lambda: settled(sim, 1), 600)
    watch = Watch(sim, buffer=buffer)
    version = 1
    for op in ops:
        if op == "update":
            version += 1
            update_all(sim, jobs, f"serve-v{version}")
        elif op == "restart":
            sim.scheduler.restart("j0", sim.now)
        else:  # an unplanned failure: not covered (nothing was planned), so it may
            # take the job down until it is moved; the watch stops checking
            sim.observers.remove(watch)
            sim.fail([sim.fleet.name(sim.scheduler.job("j0").tasks[0].machine)])
            assert sim.run_until(lambda v=version: settled(sim, v), 3600)
            return
        assert sim.run_until(lambda v=version: settled(sim, v), 3600)
