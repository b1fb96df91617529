"""The autoscaler's decision within the room there is, on the simulator: a job the
load asks to grow past its region is sized to what the region can place (the same
``Scheduler.placeable`` and ``within_room`` the control plane uses), and grows again
when machines come back."""

from plait.autoscaler import AutoscalePolicy, History, Room, recommend, within_room
from plait.model import UpdatePolicy
from plait.sim.scenarios import job_spec, world

POLICY = AutoscalePolicy(target_utilization=0.5, min_tasks=1, max_tasks=100,
                         history_weight=0)


def decide(sim, load):
    s = sim.scheduler
    tasks = s.job("web").spec.task_count
    want = recommend(POLICY, History(), sim.now, tasks, load)
    capped = within_room(POLICY, want, Room(*s.placeable("web", want)))
    if capped.tasks != tasks:
        s.resize("web", capped.tasks, sim.now)
    return capped


def test_the_autoscaler_never_grows_a_job_past_its_region():
    sim = world(machines=8)  # 8 machines of 16 cores: twelve 8-core tasks on 6 of them
    s = sim.scheduler
    failed = sim.fail([sim.fleet.name(6), sim.fleet.name(7)])
    s.create_job(job_spec("web", 12, cpu=8, update=UpdatePolicy(max_unavailable=1)), 0)
    assert sim.run_until(lambda: len(s.discovery("web")) == 12, 600)
    capped = decide(sim, 8)  # 8 tasks' worth at 50 %: 16 wanted
    assert (capped.wanted, capped.tasks) == (16, 12)
    assert capped.why is not None and capped.why.startswith("region capacity")
    assert s.job("web").spec.task_count == 12
    sim.run(60)
    assert s.waiting_for_room(s.job("web")) == set()
    sim.repair(failed)  # two machines back: room for four more
    sim.run(30)
    capped = decide(sim, 8)
    assert capped.tasks == 16 and capped.why is None
    assert sim.run_until(lambda: len(s.discovery("web")) == 16, 600)
