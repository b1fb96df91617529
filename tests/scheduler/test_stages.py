"""The pass's stages return plans and change nothing; ``apply`` commits them."""

import copy

from plait.model import UpdatePolicy
from plait.scheduler import acks, apply, execution, placement
from plait.scheduler.plans import RESIZE
from plait.scheduler.wanted import plan_wanted
from plait.sim.scenarios import job_spec, world
from plait.taskcontrol.protocol import OpKind


def snapshot(job):
    return (copy.deepcopy(job.tasks), dict(job.offers), dict(job.serials), dict(job.acked),
            job.op_counter, job.dirty)


def settled_world(count=6, max_unavailable=2):
    sim = world(machines=12)
    s = sim.scheduler
    s.create_job(job_spec("web", count, update=UpdatePolicy(max_unavailable=max_unavailable)),
                 0)
    assert sim.run_until(lambda: len(s.discovery("web")) == count, 300)
    return sim, s, s.job("web")


def test_an_update_plans_one_offer_per_task_and_changes_nothing_until_applied():
    sim, s, job = settled_world()
    s.update_job(job.spec.model_copy(update={"command": "serve2"}), sim.now)
    before = snapshot(job)
    plan = plan_wanted(job, {}, sim.now)
    assert snapshot(job) == before  # planning is a computation
    assert [i for i, _ in plan.offers] == list(range(6))
    assert all(w == ((OpKind.UPDATE, "update to version 2"),) for _, w in plan.offers)
    assert not (plan.rerun or plan.retag or plan.dropped or plan.gone)
    apply.wanted(s, job, plan, sim.now)
    assert sorted(job.offers) == list(range(6))
    assert sorted(job.serials.values()) == [1, 2, 3, 4, 5, 6]  # stable ids, in task order
    assert plan_wanted(job, {}, sim.now).offers == []  # offered once: unchanged next time


def test_a_resize_down_offers_stops_and_a_resize_only_version_retags_in_place():
    sim, s, job = settled_world()
    s.resize("web", 4, sim.now)
    plan = plan_wanted(job, {}, sim.now)
    assert plan.offers == [(4, ((OpKind.STOP, RESIZE),)), (5, ((OpKind.STOP, RESIZE),))]
    assert plan.retag == [0, 1, 2, 3]  # same runtime: nothing restarts


def test_builtin_acks_stay_within_max_unavailable_and_execution_within_tokens():
    sim, s, job = settled_world(max_unavailable=2)
    s.update_job(job.spec.model_copy(update={"command": "serve2"}), sim.now)
    apply.wanted(s, job, plan_wanted(job, {}, sim.now), sim.now)
    assert acks.builtin_acks(job, sim.now) == [0, 1]  # the budget: two tasks down at once
    apply.acks(s, job, acks.builtin_acks(job, sim.now))
    assert sorted(op.task.index for op in job.acked.values()) == [0, 1]
    one = execution.plan_execution(job, 1, sim.now)
    assert [op.task.index for op, _ in one.start] == [0] and one.throttled
    both = execution.plan_execution(job, 5, sim.now)
    assert [(op.task.index, costs) for op, costs in both.start] == [(0, True), (1, True)]
    assert not both.throttled and not both.obsolete
    apply.execution(s, job, both, sim.now)
    assert {i for i, r in job.tasks.items() if r.op is not None} == {0, 1}
    assert acks.builtin_acks(job, sim.now) == []  # two down: the budget is spent


def test_placement_plans_one_request_per_version_for_pending_tasks():
    sim = world(machines=12)
    s = sim.scheduler
    s.create_job(job_spec("web", 3), 0)
    job = s.job("web")
    plan = placement.plan_placement(job)
    assert [(v, sorted(t for t, _ in r.tasks)) for v, r in plan.requests] == [(1, [0, 1, 2])]
    assert all(r.machine is None for r in job.tasks.values())  # nothing placed yet
    apply.placement(s, job, plan, 0)
    assert all(r.machine is not None for r in job.tasks.values())


def test_a_pass_tells_its_hook_each_stage_it_enters_in_order():
    """``Scheduler.stage`` hears a pass's stages: machines, then per job reconciled its
    four stages between ``jobs`` marks; a pass with every job idle reconciles none."""
    from plait.scheduler.scheduler import STAGES

    sim = world(machines=12)
    s = sim.scheduler
    told: list[str] = []
    s.stage = told.append
    s.create_job(job_spec("web", 2), sim.now)
    s.create_job(job_spec("db", 1), sim.now)
    s.tick(sim.now)
    per_job = ["wanted", "acks", "execution", "placement", "jobs"]
    assert told == ["machines", "jobs", *per_job, *per_job]
    assert set(told) == set(STAGES)
    assert sim.run_until(lambda: len(s.discovery("web")) == 2 and len(s.discovery("db"))
                         == 1, 300)
    for _ in range(20):  # the last reports' passes: then nothing is under way
        sim.step()
    told.clear()
    s.tick(sim.now + 1)
    assert told == ["machines", "jobs"]  # both idle: no job's stages ran
