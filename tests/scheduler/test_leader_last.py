"""Leader-last: a rolling update of an n-member ensemble changes leader once with the
controller, and on every restart of the leader without it."""

import pytest

from plait.model import UpdatePolicy
from plait.sim.scenarios import job_spec, world
from plait.taskcontrol import LeaderLast, OneAtATime


class Ensemble:
    """ZooKeeper-like election: when the leader stops, the member that has been
    running longest (lowest index on a tie) takes over."""

    def __init__(self, sim, job, n):
        self.sim, self.job, self.n = sim, job, n
        self.leader = None
        self.changes = 0

    def observe(self, sim):
        up = {}
        for i in range(self.n):
            for agent in sim.agents.values():
                p = agent.running(sim.scheduler.job(self.job).ref(i))
                if p is not None:
                    up[i] = p.started_at
        if self.leader in up:
            return
        if up:
            new = min(up, key=lambda i: (up[i], i))
            if self.leader is not None:
                self.changes += 1
            self.leader = new

    def current(self):
        return self.leader


def rolling_update(n, controller_for):
    sim = world(machines=2 * n)
    s = sim.scheduler
    spec = job_spec("zk", n, update=UpdatePolicy(max_unavailable=1))
    ensemble = Ensemble(sim, "zk", n)
    sim.observers.append(ensemble.observe)
    s.create_job(spec, 0, controller=controller_for(ensemble))
    assert sim.run_until(lambda: len(s.discovery("zk")) == n, 300)
    assert ensemble.leader == 0 and ensemble.changes == 0
    s.update_job(spec.model_copy(update={"args": ("--v2",)}), sim.now)
    assert sim.run_until(lambda: not s.job("zk").rollout_active, 3000)
    sim.run(10)
    return ensemble.changes


@pytest.mark.parametrize("n", [3, 5, 7])
def test_leader_changes_exactly_once_with_leader_last(n):
    assert rolling_update(n, lambda e: LeaderLast(e.current)) == 1


@pytest.mark.parametrize("n", [3, 5, 7])
def test_leader_changes_on_every_step_without_it(n):
    assert rolling_update(n, lambda e: OneAtATime()) == n
