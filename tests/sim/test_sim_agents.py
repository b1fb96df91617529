"""Simulated agents: the agent contract on the simulated clock."""

from plait.model import TaskRef
from plait.scheduler import Assignment, Phase
from plait.sim import Behaviour, SimAgent
from plait.sim.scenarios import job_spec, world

SPEC = job_spec("web", 1)


def assign(index=0, revision=1, spec=SPEC):
    return Assignment("web", index, revision, revision, spec)


def phases(statuses):
    return [(s.index, s.phase.value) for s in statuses]


def test_start_latency_then_running():
    agent = SimAgent("m1", lambda a: Behaviour(start_seconds=2))
    assert phases(agent.step(0, [assign()])) == [(0, "starting")]
    assert phases(agent.step(1, [assign()])) == [(0, "starting")]
    st = agent.step(2, [assign()])
    assert phases(st) == [(0, "running")] and st[0].healthy


def test_fencing_stops_what_is_no_longer_assigned_after_the_stop_latency():
    agent = SimAgent("m1", lambda a: Behaviour(start_seconds=0, stop_seconds=3))
    agent.step(0, [assign()])
    agent.step(1, [assign()])
    assert agent.running(TaskRef("web", 0)) is not None
    agent.step(2, [])  # taken out of the desired set
    assert agent.running(TaskRef("web", 0)) is None  # stopping: not serving any more
    assert phases(agent.step(4, [])) == [(0, "stopping")]  # still winding down
    assert phases(agent.step(5, [])) == []  # gone: no longer reported (stopped)
    assert agent.processes == {}


def test_a_new_revision_replaces_the_process_after_the_old_one_stops():
    agent = SimAgent("m1", lambda a: Behaviour(start_seconds=0, stop_seconds=1))
    agent.step(0, [assign(revision=1)])
    agent.step(1, [assign(revision=1)])
    agent.step(2, [assign(revision=2)])
    st = agent.step(2.5, [assign(revision=2)])
    assert [(s.revision, s.phase) for s in st] == [(1, Phase.STOPPING)]  # old one stopping
    st = agent.step(3, [assign(revision=2)])  # stopped, and the new one starts at once
    assert [(s.revision, s.phase) for s in st] == [(2, Phase.STARTING)]


def test_crash_then_restart_after_the_agents_backoff():
    # the real agent's policy: 1, 2, 4 ... seconds between restarts
    agent = SimAgent("m1", lambda a: Behaviour(start_seconds=0, crash=True, crash_after=1))
    agent.step(0, [assign()])
    agent.step(0.5, [assign()])
    st = agent.step(1.5, [assign()])
    assert phases(st) == [(0, "exited")] and st[0].exit_code == 1
    assert phases(agent.step(2, [assign()])) == [(0, "exited")]  # backing off 1 s
    assert phases(agent.step(2.5, [assign()])) == [(0, "starting")]  # restarted
    assert phases(agent.step(3, [assign()])) == [(0, "running")]
    assert phases(agent.step(4, [assign()])) == [(0, "exited")]  # and crashed again
    assert phases(agent.step(5.5, [assign()])) == [(0, "exited")]  # backing off 2 s
    assert phases(agent.step(6, [assign()])) == [(0, "starting")]


def test_a_failed_machine_loses_its_processes_and_starts_afresh_after_repair():
    sim = world(machines=6)
    s = sim.scheduler
    s.create_job(job_spec("web", 2, cpu=16), 0)
    assert sim.run_until(lambda: len(s.discovery("web")) == 2, 60)
    index, where = s.discovery("web")[0]
    event = sim.fail([where])
    assert sim.running_copies(s.job("web").ref(index)) == []  # died with the machine
    assert sim.run_until(lambda: len(s.discovery("web")) == 2, 60)  # moved
    sim.repair(event)
    sim.run(10)
    ref = s.job("web").ref(index)
    assert len(sim.running_copies(ref)) == 1  # never two copies


def test_next_due_is_the_earliest_transition_in_flight():
    agent = SimAgent("m1", lambda a: Behaviour(start_seconds=2, stop_seconds=3))
    assert agent.next_due() is None  # nothing there
    agent.step(0, [assign(0)])
    assert agent.next_due() == 2  # its start completes
    agent.step(2, [assign(0), assign(1)])
    assert agent.next_due() == 4  # task 0 runs for good; task 1 starts until 4
    agent.step(4, [assign(1)])
    assert agent.next_due() == 7  # task 0 stops within its 3 seconds
    agent.step(7, [assign(1)])
    assert agent.next_due() is None  # one task running, nothing in flight


def test_an_agent_is_stepped_when_something_is_due_not_on_every_tick():
    """As a real agent reports a change, not every pass: a task that takes 2 s to
    start on a 0.1 s tick has its machine stepped when it is placed and when its
    start is due, and it runs from the same tick as it would if stepped every tick."""
    sim = world(machines=4, behaviour=lambda a: Behaviour(start_seconds=2.0))
    sim.tick = 0.1
    steps: list[float] = []
    sim.scheduler.create_job(job_spec("web", 1), sim.now)
    sim.step()  # placed (the agent hears of it on the next tick)
    agent = sim.agent(sim.scheduler.jobs["web"].tasks[0].machine)
    real = agent.step

    def counted(now, desired, target=None, hold=False):
        steps.append(now)
        return real(now, desired, target, hold)
    agent.step = counted  # type: ignore[method-assign]
    running_at = None
    while running_at is None and sim.now < 10:
        sim.step()
        if sim.scheduler.jobs["web"].tasks[0].state.value == "running":
            running_at = sim.now
    assert running_at is not None and steps[0] + 2.0 <= running_at < steps[0] + 2.0 + 0.1 + 1e-9
    assert len(steps) <= 3, steps  # placed, started; not the 20 ticks between
