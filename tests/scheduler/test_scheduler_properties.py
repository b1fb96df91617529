"""Property test: random mixes of updates, resizes, failures and maintenance.

At every simulated second: planned operations never take a job above its
max_unavailable (its down tasks less those waiting for room; never more than
max_unavailable of its serving tasks), no task index runs (let alone serves) in two
places, a serving task really runs where discovery says, and destructive operations never exceed
the rate limit (deadline stops aside).
"""

from hypothesis import given, settings
from hypothesis import strategies as st

from plait.model import UpdatePolicy
from plait.model.task import TaskRef, TaskState
from plait.scheduler import SchedulerConfig
from plait.sim.scenarios import job_spec, world
from plait.taskcontrol import OneAtATime

RATE, BURST = 2.0, 4.0
JOBS = {"a": 1, "b": 2, "c": "30%"}

actions = st.lists(st.one_of(
    st.tuples(st.just("update"), st.sampled_from(sorted(JOBS))),
    st.tuples(st.just("resize"), st.sampled_from(sorted(JOBS)), st.integers(0, 9)),
    st.tuples(st.just("fail"), st.integers(0, 29)),
    st.tuples(st.just("repair")),
    st.tuples(st.just("maintenance"), st.integers(0, 29), st.integers(5, 40),
              st.integers(10, 60)),
    st.tuples(st.just("wait"), st.integers(1, 30)),
    st.tuples(st.just("restart"), st.sampled_from(sorted(JOBS))),
    st.tuples(st.just("rollback"), st.sampled_from(sorted(JOBS))),
), min_size=1, max_size=12)


def watch_starts(sim, starts):
    """Independently of the scheduler's own bookkeeping: when an operation starts on
    a task that is available, the job must be below its cap at that moment."""
    s = sim.scheduler
    original = s.start_ops

    def start(job, steps, now):
        for op, costly in steps:  # one at a time: each is checked as it starts
            rec = job.tasks[op.task.index]
            count = job.spec.task_count
            available = rec.state.value == "running" and rec.healthy and rec.serving
            if available and rec.index < count and not job.deleting:
                cap = job.spec.update.resolve(count)
                if cap is None and job.controller is None:
                    cap = 1
                if cap is not None:
                    starts.append((job.name, s.disrupted(job), cap))
                    assert s.disrupted(job) < cap, f"{job.name}: started at the cap"
                    # independently: the serving tasks planned operations took down
                    # (and that have not served again) stay below the cap, and the
                    # tasks left out of the count are pending ones no planned
                    # operation took down
                    taken = [r.index for r in job.tasks.values() if r.index < count
                             and r.op is not None and r.op_costly]
                    assert len(taken) < cap, f"{job.name}: {taken} taken down already"
                    for i in s.waiting_for_room(job):
                        r = job.tasks[i]
                        assert r.state.value == "pending" and not (r.op and r.op_costly)
            original(job, [(op, costly)], now)

    s.start_ops = start


def check(sim, started_log):
    s = sim.scheduler
    for name, job in s.jobs.items():
        # (the cap itself is checked when each operation starts: see watch_starts; a
        # resize may lower it under operations already in flight)
        assert all(not (r.op and r.op_costly and r.op.reason == "machine failed")
                   for r in job.tasks.values())
        for rec in job.tasks.values():
            copies = sim.running_copies(TaskRef(name, rec.index))
            assert len(copies) <= 1, f"{name}/{rec.index} runs on {copies}"
            if rec.serving:
                assert copies == [sim.fleet.name(rec.machine)]
    started_log.append((sim.now, s.counters["ops_started"]))
    for t0, n0 in started_log:
        assert s.counters["ops_started"] - n0 <= BURST + RATE * (sim.now - t0) + 1e-9


@given(actions=actions, with_controller=st.booleans())
def test_invariants_under_random_operations(actions, with_controller):
    sim = world(machines=30, config=SchedulerConfig(rate=RATE, burst=BURST,
                                                    failure_deadline=60))
    s = sim.scheduler
    specs = {}
    for name, cap in JOBS.items():
        specs[name] = job_spec(name, 6, cpu=4, update=UpdatePolicy(max_unavailable=cap))
        controller = OneAtATime() if with_controller and name == "a" else None
        s.create_job(specs[name], 0, controller=controller)
    log: list = []
    sim.observers.append(lambda sm: check(sm, log))
    starts: list = []
    watch_starts(sim, starts)
    sim.run(20)
    play(sim, specs, actions)
    # and it settles: every job runs its target version at full strength
    assert sim.run_until(lambda: all(
        len(s.discovery(n)) == specs[n].task_count
        and all(r.spec_version == s.job(n).target for r in s.job(n).tasks.values())
        for n in JOBS), 3000)


grow = st.lists(st.one_of(
    st.tuples(st.just("update"), st.sampled_from(sorted(JOBS))),
    st.tuples(st.just("resize"), st.sampled_from(sorted(JOBS)), st.integers(0, 14)),
    st.tuples(st.just("fail"), st.integers(0, 5)),
    st.tuples(st.just("repair")),
    st.tuples(st.just("wait"), st.integers(1, 30)),
    st.tuples(st.just("restart"), st.sampled_from(sorted(JOBS))),
), min_size=1, max_size=10)



def play(sim, specs: dict, actions: list) -> None:
    """Run ``actions`` on the simulated world (updates, resizes, failures and their
    repairs, maintenance, restarts, rollbacks, waits), then repair what failed."""
    s = sim.scheduler
    failures: list[str] = []
    version = 1
    for action in actions:
        kind = action[0]
        if kind == "update":
            version += 1
            specs[action[1]] = specs[action[1]].model_copy(update={"args": (f"v{version}",)})
            s.update_job(specs[action[1]], sim.now)
        elif kind == "resize":
            specs[action[1]] = specs[action[1]].model_copy(update={"task_count": action[2]})
            s.update_job(specs[action[1]], sim.now)
        elif kind == "fail":
            failures.append(sim.fail([sim.fleet.name(action[1])]))
        elif kind == "repair" and failures:
            sim.repair(failures.pop(0))
        elif kind == "maintenance":
            _, m, start, length = action
            sim.maintenance([sim.fleet.name(m)], sim.now + start, sim.now + start + length)
        elif kind == "restart":
            s.restart(action[1], sim.now)
        elif kind == "rollback":
            s.rollback(action[1], 1, sim.now)
            specs[action[1]] = s.job(action[1]).spec
        sim.run(action[1] if kind == "wait" else 5)
    for event_id in failures:
        sim.repair(event_id)

@settings(max_examples=60, deadline=None)
@given(actions=grow)
def test_jobs_grown_past_the_region_keep_the_cap_and_finish_their_rollouts(actions):
    """Six machines of 16 cores and three jobs of up to 14 four-core tasks: often more
    than the region holds. The cap holds at every start (see ``watch_starts``), and
    once the failures are repaired every rollout finishes over the tasks that run:
    tasks waiting for room never freeze the others' operations."""
    sim = world(machines=6, config=SchedulerConfig(rate=RATE, burst=BURST,
                                                   failure_deadline=60))
    s = sim.scheduler
    specs = {}
    for name, cap in JOBS.items():
        specs[name] = job_spec(name, 6, cpu=4, update=UpdatePolicy(max_unavailable=cap))
        s.create_job(specs[name], 0)
    log: list = []
    sim.observers.append(lambda sm: check(sm, log))
    watch_starts(sim, [])
    sim.run(20)
    play(sim, specs, actions)

    def settled():
        """Every task of every job serves at its target version with no operation
        under way, but those waiting for room (pending while the job has tasks no
        machine could take), whatever operation they wait with."""
        for n in JOBS:
            job = s.job(n)
            waiting = s.waiting_for_room(job) if job.unplaced_reason is not None else set()
            if job.acked or any(i not in waiting for i in job.offers):
                return False
            for r in job.tasks.values():
                if r.index in waiting:
                    continue
                if not (r.state is TaskState.RUNNING and r.serving and r.op is None
                        and r.spec_version == job.target_of(r.index)):
                    return False
        return True
    assert sim.run_until(settled, 3000), {n: (
        s.job(n).unplaced_reason, s.job(n).in_progress, list(s.job(n).acked), s.job(n).offers,
        {i: (r.state.value, r.op) for i, r in s.job(n).tasks.items() if not r.serving})
        for n in JOBS}
    # and what runs is all the room there is, or the whole job
    for n in JOBS:
        job = s.job(n)
        assert len(s.discovery(n)) + len(s.waiting_for_room(job)) == specs[n].task_count
