"""Infrastructure rollouts and pushes (the 2023 post's Figure 7, decision 104): a
host profile's new version rolled over an entitlement never drains a machine that
runs a task of a job whose push is under way. Those machines stay cordoned, so the
push's own updates carry their tasks to machines that carry the new profile; once
the push ends, the roll drains what is left. Run on the simulator (no sockets)."""

from __future__ import annotations

from plait.model import Entitlement, Quota, UpdatePolicy
from plait.model.hostprofile import HostProfile, HostProfileSpec
from plait.scheduler import SchedulerConfig
from plait.sim.scenarios import job_spec, world

WEB = HostProfileSpec(name="web", sysctls={"net.core.somaxconn": "4096"})


def setup():
    """Jobs a and b, six whole-machine tasks each, in an entitlement on profile web."""
    sim = world(machines=40, entitlements=(), config=SchedulerConfig(rate=20, burst=40))
    s = sim.scheduler
    s.define_profile(HostProfile(spec=WEB, version=1))
    sim.allocator.define(Entitlement(name="web", owner="o", quota=Quota(machines=20),
                                     host_profile="web"))
    for m in range(40):
        sim.agent(m).guard = False  # the scheduler's gate alone
    for name in ("a", "b"):
        s.create_job(job_spec(name, 6, entitlement="web", cpu=16,
                              update=UpdatePolicy(max_unavailable=1)), sim.now)
    assert sim.run_until(lambda: all(len(s.discovery(n)) == 6 for n in "ab"), 600)
    return sim


def machines(sim, job: str) -> set[int]:
    return {r.machine for r in sim.scheduler.jobs[job].tasks.values() if r.machine is not None}


def on_v2(sim, job: str) -> bool:
    s = sim.scheduler
    return len(s.discovery(job)) == 6 and all(
        sim.agents[m].profile == ("web", 2) for m in machines(sim, job))


def rolled_while_a_pushes():
    """Web's profile gets version 2 while job a's push is under way; returns the
    simulation, a's machines then, and the set the roll's drained machines go into."""
    sim = setup()
    s = sim.scheduler
    pushed = machines(sim, "a")
    drained: set[int] = set()
    sim.observers.append(lambda sm: drained.update(s.rolling))
    s.pushing = {"a"}  # (the Job Control Plane: a's push is under way)
    s.define_profile(HostProfile(spec=WEB.model_copy(update={"turbo": True}), version=2))
    return sim, pushed, drained


def test_a_roll_waits_for_a_push_under_way_and_the_push_carries_its_tasks_over():
    sim, pushed, drained = rolled_while_a_pushes()
    s = sim.scheduler
    # b's machines are drained and its tasks move to machines on v2; a's wait
    assert sim.run_until(lambda: on_v2(sim, "b"), 3000)
    assert not drained & pushed
    assert machines(sim, "a") == pushed and len(s.discovery("a")) == 6
    assert all(sim.agents[m].profile == ("web", 1) for m in pushed)
    assert "profile_roll_waiting" in [t.kind for t in s.profile_transitions]
    # the push's stage: its updates move a's tasks off their cordoned machines, onto
    # machines that carry v2 (the new spec and the new profile arrive together)
    spec = s.jobs["a"].spec.model_copy(update={"command": "serve-v2"})
    s.update_job(spec, sim.now)
    assert sim.run_until(lambda: on_v2(sim, "a") and all(
        r.spec_version == 2 for r in s.jobs["a"].tasks.values()), 3000)
    assert not drained & pushed  # none of them drained by the roll: the push moved them
    s.pushing = set()
    assert sim.run_until(lambda: not s.stale and not s.rolling, 600)
    assert sum(a.mismatched_starts for a in sim.agents.values()) == 0


def test_when_the_push_ends_the_roll_goes_on():
    sim, pushed, drained = rolled_while_a_pushes()
    s = sim.scheduler
    assert sim.run_until(lambda: on_v2(sim, "b"), 3000)
    sim.run(120)
    assert not drained & pushed and s.stale.get("web") == pushed
    s.pushing = set()  # aborted, or completed without touching them
    assert sim.run_until(lambda: on_v2(sim, "a") and not s.stale and not s.rolling, 3000)
    assert drained >= pushed  # drained by the roll this time
    for job in s.jobs.values():
        assert s.unavailable(job) <= 1
