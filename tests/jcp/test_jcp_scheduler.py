"""The unified spec executed by the real scheduler on the simulated clock: a 50 %
push pinned with ``Scheduler.pin`` stays half the job while it is resized, a canary
takes tasks the push does not hold, and every step keeps the job within its
max_unavailable with no task running twice."""

from fractions import Fraction

from plait.jcp import Canary, Push, Sizing, unify
from plait.model import UpdatePolicy
from plait.sim.scenarios import job_spec, world

SPEC = job_spec("web", 10, cpu=2, update=UpdatePolicy(max_unavailable=2))


def by_args(sim):
    """Serving tasks per the args their version runs."""
    job = sim.scheduler.job("web")
    out: dict[tuple[str, ...], int] = {}
    for rec in job.tasks.values():
        if rec.serving:
            args = job.versions[rec.spec_version - 1].args
            out[args] = out.get(args, 0) + 1
    return out


def settled(sim, want):
    s = sim.scheduler
    job = s.job("web")
    return by_args(sim) == want and all(r.op is None for r in job.tasks.values())


def apply(sim, unified):
    s = sim.scheduler
    s.pin("web", {i: v for i, v in enumerate(unified.versions)}, sim.now)
    if unified.task_count != s.job("web").spec.task_count:
        s.resize("web", unified.task_count, sim.now)


def test_a_push_stays_half_the_job_through_resizes_and_a_canary_takes_other_tasks():
    sim = world(machines=24)
    s = sim.scheduler
    worst = {"down": 0}

    def watch(sim):
        job = sim.scheduler.job("web")
        worst["down"] = max(worst["down"], sim.scheduler.unavailable(job)
                            - sum(1 for r in job.tasks.values() if r.index >= job.spec.task_count))
        for index in job.tasks:
            assert len(sim.running_copies(job.ref(index))) <= 1
    s.create_job(SPEC, 0)
    assert sim.run_until(lambda: settled(sim, {(): 10}), 600)
    sim.observers.append(watch)
    pushed = s.add_version(SPEC.model_copy(update={"args": ("v2",)}), sim.now)
    u = unify(1, 10, push=Push(pushed, Fraction(50)))
    apply(sim, u)
    assert sim.run_until(lambda: settled(sim, {(): 5, ("v2",): 5}), 600)
    # the autoscaler shrinks the job: the push stays half of it
    u = unify(1, 10, push=Push(pushed, Fraction(50)), sizing=Sizing(6), previous=u)
    apply(sim, u)
    assert sim.run_until(lambda: settled(sim, {(): 3, ("v2",): 3}), 600)
    # a canary of one task: not one of the pushed ones
    canary = s.add_version(SPEC.model_copy(update={"args": ("canary",), "task_count": 6}),
                           sim.now)
    stable = s.job("web").target
    u = unify(stable, 6, push=Push(pushed, Fraction(50)), sizing=Sizing(6),
              canaries=[Canary("c", canary, 1)], previous=u)
    assert u.count("push") == 3 and u.count("canary:c") == 1
    apply(sim, u)
    assert sim.run_until(lambda: settled(sim, {(): 2, ("v2",): 3, ("canary",): 1}), 600)
    # the canary ends: its task goes back to the stable spec
    u = unify(stable, 6, push=Push(pushed, Fraction(50)), sizing=Sizing(6), previous=u)
    apply(sim, u)
    assert sim.run_until(lambda: settled(sim, {(): 3, ("v2",): 3}), 600)
    assert worst["down"] <= 2  # max_unavailable held through every step
