"""Simulated agents: each pulls its machine's desired task set and converges to it,
with start/stop latencies and crashes, on the simulated clock.

The real agent's state machine decides (``plait.model.agentmachine``: what to start,
stop and restart, when, the host-profile switch and its gate, the fence, what each
report says); only the processes are simulated (``Behaviour``: how long a start and
a stop take, whether a task crashes or finishes). A machine that fails takes its
processes with it; one cut off from the control plane (``cut``) keeps them, and
stops those of jobs with a fence by itself (``fence``, ``plait.model.fence``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from plait.model import fence as fencing
from plait.model.agentmachine import HeldTask, Machine, Status, Wanted
from plait.model.hostprofile import DEFAULT_PROFILE, HostProfile, HostProfileSpec, kinds_changed
from plait.model.task import TaskRef
from plait.scheduler.records import Assignment, Phase, TaskStatus
from plait.sidekick.book import Applied

#: seconds a simulated switch takes per kind of setting it changes (the slowest
#: counts): the paper's Figure 17 P90s for turbo (3.0 s) and hugepages (244 s)
SWITCH_SECONDS = {"turbo": 3.0, "hugepages": 244.0, "sysctls": 1.0, "cgroup_controllers": 1.0,
                  "fs_label": 30.0, "nic": 5.0, "user": 1.0}
def switch_seconds(old: HostProfileSpec | None, new: HostProfileSpec) -> float:
    """How long a simulated switch from ``old`` to ``new`` takes (at least 1 s)."""
    return max([1.0, *(SWITCH_SECONDS.get(k, 1.0) for k in kinds_changed(old, new))])


@dataclass(frozen=True)
class Behaviour:
    """How a simulated task behaves: how long it takes to start and stop, whether it
    crashes ``crash_after`` seconds after starting, and whether it finishes on its
    own (with ``exit_code``) ``finish_after`` seconds after starting, like a batch
    task. What happens after an exit is the job's restart policy."""

    start_seconds: float = 2.0
    stop_seconds: float = 1.0
    crash: bool = False
    crash_after: float = 1.0
    finish_after: float | None = None
    exit_code: int = 0


BehaviourFn = Callable[[Assignment], Behaviour]


def default_behaviour(assignment: Assignment) -> Behaviour:
    """Tasks whose command is ``crash`` crash; ``finish`` exits 0 and ``fail`` exits 1
    after 3 seconds of running; everything else runs."""
    command = assignment.spec.command
    if command in ("finish", "fail"):
        return Behaviour(finish_after=3.0, exit_code=0 if command == "finish" else 1)
    return Behaviour(crash=command == "crash")


@dataclass
class Process:
    """A simulated process of a task (or a task that exited, waiting for its restart
    or final, until its agent forgets it)."""

    assignment: Assignment
    phase: Phase
    #: when the current phase ends (starting -> running, running -> exit, stopping)
    until: float
    started_at: float = 0.0
    stopping: bool = False
    #: how it behaves (decided once, when it starts)
    behaviour: Behaviour | None = None
    #: exited, and started again at this time (restart policy)
    backoff_until: float | None = None
    #: exited and not started again (restart policy): its exit code
    final: int | None = None


#: a task's key in the state machine: (job, index)
Key = tuple[str, int]


@dataclass
class SimTask(HeldTask):
    #: its simulated process, once started (the last one: it may have exited)
    process: Process | None = None


def _wanted(a: Assignment) -> Wanted[Key]:
    spec = a.spec
    fence = spec.fence
    return Wanted((a.job, a.index), a.job, a.index, a.revision, spec.restart.policy,
                  spec.restart.max_retries, None if fence is None else fence.seconds, a.cause)


def _held(w: Wanted[Key]) -> SimTask:
    return SimTask(w.job, w.index, w.revision)


class SimAgent:
    def __init__(self, machine: str, behaviour: BehaviourFn) -> None:
        self.machine = machine
        self.behaviour = behaviour
        self.up = True
        #: the state machine (the real agent's), and the simulated processes
        self.core: Machine[Key, SimTask] = Machine(_held)
        self.core.profile.applied = (DEFAULT_PROFILE, 1)  # (a machine starts on default)
        self.processes: dict[TaskRef, Process] = {}
        #: when a list: what the simulated processes print, as (task, time, line)
        self.output: list[tuple[TaskRef, float, str]] | None = None
        #: the settings of the host profile applied (``default``'s: none)
        self.profile_spec: HostProfileSpec | None = None
        #: a switch in flight: its target and when it is done
        self.switching: tuple[HostProfile, float] | None = None
        #: why switches to a profile fail (None: they succeed)
        self.switch_error: Callable[[HostProfile], str | None] = lambda profile: None
        #: a report of the profile is due (it changed, or a switch failed)
        self.profile_changed = False
        #: tasks started on a profile other than the target (the invariant: none)
        self.mismatched_starts = 0
        #: switches completed
        self.switches = 0
        #: how long a switch from one profile's settings to another's takes
        self.switch_time: Callable[[HostProfileSpec | None, HostProfileSpec], float] = (
            switch_seconds)
        #: cut off from the control plane (its processes run on, unreported)
        self.cut = False

    # -- what the state machine holds ------------------------------------------------------
    @property
    def profile(self) -> tuple[str, int]:
        """The host profile applied (a machine starts with ``default``)."""
        applied = self.core.profile.applied
        return applied if applied is not None else (DEFAULT_PROFILE, 1)

    @property
    def profile_error(self) -> str | None:
        return self.core.profile.error

    @property
    def switch_failures(self) -> int:
        return self.core.profile.failures

    @property
    def guard(self) -> bool:
        """The agent's own guard: no start until the machine carries its target (off
        in tests of the scheduler's gate alone)."""
        return self.core.profile.guard

    @guard.setter
    def guard(self, on: bool) -> None:
        self.core.profile.guard = on

    @property
    def contact(self) -> float | None:
        """When its last report was taken: the lease of its fenced tasks."""
        return self.core.contact

    def _say(self, ref: TaskRef, now: float, line: str) -> None:
        if self.output is not None:
            self.output.append((ref, now, line))

    def _behaviour(self, p: Process) -> Behaviour:
        if p.behaviour is None:
            p.behaviour = self.behaviour(p.assignment)
        return p.behaviour

    def busy(self) -> bool:
        """Has something in flight that needs further steps."""
        return self.next_due() is not None

    def next_due(self) -> float | None:
        """When the next step could change something (a start, a stop, an exit, a
        restart after a crash, a profile switch or its retry): the earliest, or None
        when nothing is in flight."""
        due: float | None = None if self.switching is None else self.switching[1]
        for p in self.processes.values():
            if p.phase is Phase.EXITED and not p.stopping:
                continue  # (a restart is the state machine's: below)
            moves = p.stopping or p.phase is not Phase.RUNNING or self._exits(self._behaviour(p))
            if moves and (due is None or p.until < due):
                due = p.until
        other = self.core.next_due()
        if other is not None and (due is None or other < due):
            due = other
        return due

    @staticmethod
    def _exits(b: Behaviour) -> bool:
        return b.crash or b.finish_after is not None

    def fail(self) -> None:
        """The machine fails: its processes die with it, and its agent starts afresh
        (the host profile applied stays)."""
        self.up = False
        self.processes.clear()
        gate = self.core.profile
        self.core = Machine(_held)
        self.core.profile = gate

    def repair(self) -> None:
        self.up = True

    def fence(self, now: float) -> None:
        """The fence of a machine cut off (the real agent's, and its keeper's): a task
        of a job with a fence gets SIGTERM once the lease is ``fence.seconds`` old and
        is gone at the latest ``FENCE_KILL_GRACE`` later (its stop time, if shorter)."""
        for key, said in self.core.fence(now):
            p = self.processes[TaskRef(*key)]
            p.stopping = True
            p.until = now + min(self._behaviour(p).stop_seconds, fencing.FENCE_KILL_GRACE)
            if said is fencing.Verdict.KILL:
                p.until = now
        for ref, p in list(self.processes.items()):
            policy = p.assignment.spec.fence
            if not p.stopping or policy is None:
                continue
            said = fencing.verdict(policy.seconds, self.core.contact, now)
            if said is fencing.Verdict.KILL or (said is not fencing.Verdict.RUN
                                                and now >= p.until):
                del self.processes[ref]
                self.core.stopped((ref.job, ref.index))
                self._say(ref, now, "stopped by its fence")

    def applied(self) -> Applied:
        """The profile report: what is applied, and why the last switch failed."""
        return Applied(self.profile[0], self.profile[1], self.profile_error,
                       self.switch_failures)

    # -- one step --------------------------------------------------------------------------
    def _advance(self, now: float) -> None:
        """The simulated processes up to ``now``: stops that finished, starts that
        completed, exits (told to the state machine)."""
        for ref, p in list(self.processes.items()):
            b = self._behaviour(p)
            a = p.assignment
            if p.stopping:
                if now >= p.until:
                    del self.processes[ref]
                    self.core.stopped((a.job, a.index))
                    self._say(ref, now, f"stopped (revision {a.revision})")
                continue
            if p.phase is Phase.STARTING and now >= p.until:
                p.phase = Phase.RUNNING
                p.until = now + (b.crash_after if b.crash or b.finish_after is None
                                 else b.finish_after)
                self._say(ref, now, f"running on {self.machine}")
            if p.phase is Phase.RUNNING and self._exits(b) and now >= p.until:
                code = 1 if b.crash else b.exit_code
                p.phase = Phase.EXITED
                self._say(ref, now, f"exited with code {code}")
                key = (a.job, a.index)
                self.core.exited(key, code, now)
                task = self.core.tasks[key]
                p.final = code if task.final else None
                p.backoff_until = None if task.final else task.next_start

    def _stop(self, key: Key, now: float, remove: bool) -> None:
        if remove:
            self.core.forget(key)
        ref = TaskRef(*key)
        p = self.processes.get(ref)
        if p is None:
            return
        if p.phase is Phase.EXITED:  # (no process: only forgotten, or replaced)
            if remove:
                del self.processes[ref]
            return
        if not p.stopping:
            p.stopping = True
            p.until = now + self._behaviour(p).stop_seconds

    def _switch(self, now: float, target: HostProfile | None) -> None:
        """Take a switch that finished; begin one when the state machine says one may
        (nothing runs or stops here, the control plane does not hold the machine)."""
        gate = self.core.profile
        if self.switching is not None and now >= self.switching[1]:
            goal = self.switching[0]
            self.switching = None
            error = self.switch_error(goal)
            self.profile_changed = True
            gate.done((goal.name, goal.version), error, now)
            if error is None:
                self.profile_spec = goal.spec
                self.switches += 1
        if target is not None and self.switching is None and gate.begin(now, self.core.idle()):
            self.switching = (target, now + self.switch_time(self.profile_spec, target.spec))

    def step(self, now: float, desired: list[Assignment],
             target: HostProfile | None = None, hold: bool = False) -> list[TaskStatus]:
        """Converge to ``desired`` and return the statuses to report. ``target``: the
        host profile the machine must carry; no task starts until it does (``hold``:
        nor does a switch begin: a roll drains the machine)."""
        core = self.core
        core.heard(now, now)  # (this step's report is taken now: the lease renews)
        self._advance(now)
        want = {(a.job, a.index): a for a in desired}
        core.profile.want(None if target is None else (target.name, target.version),
                          switch=not hold)
        plan = core.converge([_wanted(a) for a in desired], now)
        for stop in plan.stops:
            self._stop(stop.key, now, stop.remove)
        core.supervise(now)
        self._switch(now, target)
        for key, _ in core.starts(now, now, plan.causes):
            a = want[key]
            ref = TaskRef(a.job, a.index)
            if target is not None and self.profile != (target.name, target.version):
                self.mismatched_starts += 1
            b = self.behaviour(a)
            p = self.processes[ref] = Process(a, Phase.STARTING, now + b.start_seconds, now,
                                              behaviour=b)
            core.tasks[key].process = p
            core.started(key)
            self._say(ref, now, f"starting {' '.join([a.spec.command, *a.spec.args])} "
                                f"(version {a.spec_version}, revision {a.revision})")
        statuses = [self._status(key, st) for key, st in core.statuses()]
        statuses.extend(self._status(None, st) for st in core.stopping_statuses(
            (p.assignment.job, p.assignment.index, p.assignment.revision)
            for p in self.processes.values() if p.stopping))
        # finished for good, and reported: forgotten (the control plane took them off
        # the machine with this report)
        for key in core.finished():
            core.forget(key)
            self.processes.pop(TaskRef(*key), None)
        return statuses

    def _status(self, key: Key | None, st: Status) -> TaskStatus:
        if st.phase is Phase.RUNNING and key is not None:
            p = self.core.tasks[key].process
            running = p is not None and p.phase is Phase.RUNNING
            return TaskStatus(st.job, st.index, st.revision,
                              Phase.RUNNING if running else Phase.STARTING, running)
        return TaskStatus(st.job, st.index, st.revision, Phase(st.phase), False,
                          st.exit_code, final=st.final, killed=st.killed)

    def running(self, ref: TaskRef) -> Process | None:
        p = self.processes.get(ref)
        if p is None or p.stopping or p.phase is not Phase.RUNNING:
            return None
        return p
