"""The discrete-event shell: the real allocator, brokers and scheduler driven on a
simulated clock against simulated agents.

``step()`` advances the clock by one tick: brokers apply due events, agents whose
machines have something to do converge and report, the scheduler reconciles.
Failures and maintenance are injected through the brokers, as the health check
service and the ops planner would. Observers run after every step (the tests use
them to assert invariants at every instant, not just at the end).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence

from plait.model.events import EventKind, UnavailabilityEvent
from plait.model.task import TaskRef
from plait.model.topology import Fleet
from plait.scheduler import Scheduler, SchedulerConfig
from plait.scheduler.wiring import wire
from plait.sim.agents import BehaviourFn, SimAgent, default_behaviour
from plait.taskcontrol.protocol import ControllerAnswer, ControllerCall, TaskController

Observer = Callable[["Simulation"], None]


class Simulation:
    def __init__(self, fleet: Fleet, behaviour: BehaviourFn = default_behaviour,
                 config: SchedulerConfig | None = None, tick: float = 1.0,
                 scheduler: Scheduler | None = None, now: float = 0.0) -> None:
        """A new region, or simulated agents for the machines of an existing
        ``scheduler`` (a control plane running without real agents)."""
        self.fleet = fleet
        if scheduler is None:
            scheduler = wire(fleet, config).scheduler
        self.scheduler = scheduler
        self.allocator = scheduler.allocator
        self.index = scheduler.allocator.index
        self.region = scheduler.region
        self.behaviour = behaviour
        self.tick = tick
        self.now = now
        self.agents: dict[int, SimAgent] = {}
        #: machines whose agents have something due, by when: (time, machine), the
        #: earliest first; ``_due`` the earliest time each machine is queued for (an
        #: agent is stepped when its next transition is due or its desired set changed,
        #: as a real agent reports on a change, not on every pass)
        self._queue: list[tuple[float, int]] = []
        self._due: dict[int, float] = {}
        self.observers: list[Observer] = []
        #: when a list, the simulated processes' output lands here: (task, time, line)
        self.output: list[tuple[TaskRef, float, str]] | None = None
        self._event_seq = 0
        #: stand-ins for remote TaskControllers, by URL: the controller and how many
        #: seconds it takes to answer. The simulator is the shell that carries a
        #: ``RemoteController``'s calls (``Scheduler.outbox``) and answers, as the
        #: control plane's dispatcher does for real ones
        self.remotes: dict[str, tuple[TaskController, float]] = {}
        self._calls: list[tuple[float, int, ControllerCall]] = []
        #: machines whose agents are cut off from the control plane (``cut``)
        self.cut: set[int] = set()
        #: False when another shell carries the calls (a control plane running
        #: simulated agents sends its jobs' calls to their real controllers)
        self.carry_calls = True
        #: a scenario's model of the cores its running tasks use (given every running
        #: task of the region at once, what each uses): when set, the agents report
        #: it every ``usage_every`` seconds, as a real agent's report carries it, and
        #: the control plane's pass hands it to the autoscaler (``take_usage``)
        self.cpu_use: Callable[[Sequence[TaskRef], float], Sequence[float]] | None = None
        self.usage_every = 60.0
        self._usage_at: float | None = None
        #: per machine, its agent's last usage report not yet taken: (cores per task,
        #: when)
        self._usage: dict[int, tuple[dict[tuple[str, int], float], float]] = {}

    def agent(self, machine: int) -> SimAgent:
        agent = self.agents.get(machine)
        if agent is None:
            agent = self.agents[machine] = SimAgent(self.fleet.name(machine), self.behaviour)
            agent.output = self.output
        return agent

    # -- the clock -----------------------------------------------------------------------
    def step(self, now: float | None = None) -> None:
        """One tick: to ``now``, or ``tick`` seconds later: the brokers, then the
        agents (``step_agents``), then the scheduler, in the order a control plane's
        pass runs them (``plait.server.controlplane.passes.Pass.run``)."""
        now = self.now + self.tick if now is None else now
        self.region.tick(now)
        self.step_agents(now)
        sched = self.scheduler
        sched.tick(now)
        for call in sched.take_calls() if self.carry_calls else ():
            latency = self.remotes[call.url][1] if call.url in self.remotes else 0.0
            heapq.heappush(self._calls, (now + latency, self._event_seq, call))
            self._event_seq += 1
        for observe in self.observers:
            observe(self)

    def step_agents(self, now: float) -> None:
        """The simulated agents' part of a pass at ``now``: each agent whose machine
        has something due or whose desired set changed (the scheduler's ``touched``
        since its last tick) converges and reports; usage reports and TaskControl
        answers that are due are handed over."""
        self.now = now
        sched = self.scheduler
        active = sched.take_touched()
        queue, due = self._queue, self._due
        while queue and queue[0][0] <= now:
            at, m = heapq.heappop(queue)
            if due.get(m) == at:
                del due[m]
                active.add(m)
        for m in self.cut:
            self.agents[m].fence(now)  # (its fence keeper: no report, no desired set)
        for m in sorted(active):
            agent = self.agent(m)
            if not agent.up or agent.cut:
                continue
            desired = sched.desired_of(m)
            statuses = agent.step(now, desired, sched.profile_target(m), sched.profile_hold(m))
            sched.report(agent.machine, statuses, now)
            if agent.profile_changed:
                agent.profile_changed = False
                sched.report_profile(agent.machine, agent.applied(), now)
            if agent.switching is not None:  # (a switch in flight: stepped when done)
                self.wake(m, agent.next_due())
            else:
                self.wake(m, now if len(agent.processes) != len(desired)
                          else agent.next_due())
        if self.cpu_use is not None and (
                self._usage_at is None or now - self._usage_at >= self.usage_every):
            self._usage_at = now
            self._report_usage(self.cpu_use, now)
        self._answer_calls(now)

    def _report_usage(self, model: Callable[[Sequence[TaskRef], float], Sequence[float]],
                      now: float) -> None:
        """Every live agent's report of the cores its running tasks use (``cpu_use``)."""
        running = [(m, ref) for m, agent in self.agents.items()
                   if agent.up and not agent.cut
                   for ref in agent.processes if agent.running(ref) is not None]
        used = model([ref for _, ref in running], now)
        reports: dict[int, dict[tuple[str, int], float]] = {}
        for (m, ref), cores in zip(running, used, strict=True):
            reports.setdefault(m, {})[ref.job, ref.index] = cores
        for m, usage in reports.items():  # (a machine's newer report replaces its last)
            self._usage[m] = (usage, now)

    def take_usage(self) -> list[tuple[int, dict[tuple[str, int], float], float]]:
        """The agents' usage reports since the last take: (machine, cores per task,
        when)."""
        taken, self._usage = self._usage, {}
        return [(machine, usage, at) for machine, (usage, at) in taken.items()]

    def wake(self, machine: int, at: float | None = 0.0) -> None:
        """Step ``machine``'s agent at the first tick at or after ``at`` (the next
        one by default; None: nothing due)."""
        if at is None:
            return
        if at < self._due.get(machine, float("inf")):
            self._due[machine] = at
            heapq.heappush(self._queue, (at, machine))

    def _answer_calls(self, now: float) -> None:
        """Deliver the remote controllers' answers that are due."""
        sched = self.scheduler
        while self._calls and self._calls[0][0] <= now:
            _, _, call = heapq.heappop(self._calls)
            remote = self.remotes.get(call.url)
            seq = call.request.sequence_number
            if remote is None:
                sched.answer(ControllerAnswer(call.job, seq, None,
                                              f"controller {call.url}: connection refused"))
                continue
            try:
                response = remote[0].process(call.request)
            except Exception as exc:  # what the real shell turns into "acked nothing"
                sched.answer(ControllerAnswer(call.job, seq, None, str(exc)))
                continue
            sched.answer(ControllerAnswer(call.job, seq, response))

    def run(self, seconds: float) -> None:
        end = self.now + seconds
        while self.now < end - 1e-9:
            self.step()

    def run_until(self, done: Callable[[], bool], limit: float = 3600.0) -> bool:
        """Step until ``done()``; False if ``limit`` simulated seconds pass first."""
        end = self.now + limit
        while not done():
            if self.now >= end:
                return False
            self.step()
        return True

    # -- injected events -------------------------------------------------------------------
    def _next_id(self, prefix: str) -> str:
        self._event_seq += 1
        return f"{prefix}-{self._event_seq}"

    def fail(self, machines: list[str]) -> str:
        """Machines fail now: their processes die, the health check raises an event."""
        for name in machines:
            self.agent(self.fleet.index_of(name)).fail()
        event_id = self._next_id("failure")
        self.region.add_event(UnavailabilityEvent(event_id, EventKind.FAILURE, tuple(machines),
                                                  start=self.now), self.now)
        return event_id

    def cut_off(self, machines: list[str]) -> str:
        """Machines' agents lose the control plane now, after one last heartbeat (a
        partition, a frozen agent): their processes run on unreported, the health
        check raises a failure event; a job's fence stops its tasks there by itself.
        ``repair`` ends it."""
        sched = self.scheduler
        for name in machines:
            m = self.fleet.index_of(name)
            agent = self.agent(m)
            if agent.up and not agent.cut:
                sched.report(agent.machine, agent.step(
                    self.now, sched.desired_of(m), sched.profile_target(m),
                    sched.profile_hold(m)), self.now)
            agent.cut = True
            self.cut.add(m)
        event_id = self._next_id("failure")
        self.region.add_event(UnavailabilityEvent(event_id, EventKind.FAILURE, tuple(machines),
                                                  start=self.now), self.now)
        return event_id

    def repair(self, event_id: str) -> None:
        event = next(e for e in self.region.events() if e.id == event_id)
        for name in event.machines:
            m = self.fleet.index_of(name)
            self.agent(m).repair()
            self.agent(m).cut = False
            self.cut.discard(m)
            self.wake(m)
        self.region.end_event(event_id, self.now)

    def maintenance(self, machines: list[str], start: float, end: float) -> str:
        """Planned maintenance announced now, from ``start`` to ``end``."""
        event_id = self._next_id("maintenance")
        self.region.add_event(UnavailabilityEvent(event_id, EventKind.MAINTENANCE,
                                                  tuple(machines), start=start, end=end),
                              self.now)
        return event_id

    # -- observation -------------------------------------------------------------------------
    def running_copies(self, ref: TaskRef) -> list[str]:
        """Machines where a copy of the task is running (should be at most one)."""
        return [a.machine for a in self.agents.values()
                if a.up and a.running(ref) is not None]
