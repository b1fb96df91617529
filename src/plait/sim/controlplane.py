"""The production control plane on the simulated clock: the region's pass
(``plait.server.controlplane.passes.Pass.run`` and ``Pass.after``, through the
control plane's own ``Loop.step``: the Job Control Plane's reconcile, the autoscaler,
elastic loans, host-profile rolls, drains and maintenance behind it) driven pass by
pass over an in-memory store, with simulated agents on every machine (stepped inside
the pass, ``ControlPlaneConfig.sim_agents``).

What the real world reaches over the network has a stand-in here, answered at once
on the simulated clock and never from a thread: a push's health gate
(``SimGates``, a rule of the scenario in place of the tenant's URL). Jobs in a
scenario name no TaskController of their own (the scheduler's built-in one paces
them), so no call leaves the pass.

Observers run after every pass, as in ``plait.sim.harness``: a scenario checks its
rules at every simulated instant, not just at the end.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from plait.model.topology import RegionSpec
from plait.scheduler import SchedulerConfig
from plait.server.controlplane import ControlPlane, ControlPlaneConfig
from plait.sim.harness import Simulation
from plait.store.sqlite import SqliteStore

#: (gate URL, job, stage numbered from 1) -> (passed, what the gate said)
GateRule = Callable[[str, str, int], tuple[bool, str]]
Observer = Callable[["SimControlPlane"], None]


class SimGates:
    """A push gate's stand-in (``plait.server.controlplane.gates.GateAsker``'s
    interface): answers by ``rule`` at once, as a done future."""

    def __init__(self, rule: GateRule) -> None:
        self.rule = rule
        self.asked: list[tuple[str, str, int]] = []

    def ask(self, owner: str, url: str, job: str, stage: int) -> Future[tuple[bool, str]]:
        self.asked.append((url, job, stage))
        answer: Future[tuple[bool, str]] = Future()
        answer.set_result(self.rule(url, job, stage))
        return answer

    def in_flight(self, owner: str) -> int:
        return 0

    def close(self) -> None:
        pass


class SimControlPlane:
    def __init__(self, region: RegionSpec, *, start: float = 0.0, tick: float = 10.0,
                 task_start_seconds: float = 5.0, scheduler: SchedulerConfig | None = None,
                 gate: GateRule | None = None) -> None:
        """A new region of simulated machines under a control plane of its own, at
        simulated time ``start``; each ``step`` is one pass, ``tick`` seconds on."""
        self.now = start
        self.tick = tick
        # (a store of one connection, in memory: as ``open_store`` makes one, typed
        # loosely, its sessions being its own kind)
        store: Any = SqliteStore(":memory:", clock=self.clock)
        config = ControlPlaneConfig(
            region=region, sim_agents=True, sim_start_seconds=task_start_seconds,
            metrics=False, controller_process=False,
            scheduler=scheduler or SchedulerConfig())
        self.cp = ControlPlane(store, config, clock=self.clock)
        self.gates = SimGates(gate or (lambda url, job, stage: (True, "passed")))
        self.cp.jcp.gates = self.gates
        self.observers: list[Observer] = []
        self.passes = 0

    def clock(self) -> float:
        return self.now

    @property
    def sim(self) -> Simulation:
        """The simulated agents (stepped inside each pass)."""
        assert self.cp.sim is not None
        return self.cp.sim

    def step(self) -> None:
        """One pass, ``tick`` simulated seconds after the last."""
        self.now += self.tick
        self.cp.loop.step()
        self.passes += 1
        for observe in self.observers:
            observe(self)

    def run_until(self, done: Callable[[], bool], limit: float = 3600.0) -> bool:
        """Pass until ``done()``; False if ``limit`` simulated seconds pass first."""
        end = self.now + limit
        while not done():
            if self.now >= end:
                return False
            self.step()
        return True

    def run(self, seconds: float) -> None:
        end = self.now + seconds
        while self.now < end - 1e-9:
            self.step()
