"""Simulated agents: each pulls its machine's desired task set and converges to it,
with start/stop latencies and crashes, on the simulated clock.

The same contract as a real agent (DESIGN.md "Agents and the control plane"): start
what is missing, stop what is no longer assigned (fencing), restart what crashed,
report statuses. A machine that fails takes its processes with it; one cut off from
the control plane (``cut``) keeps them, and stops those of jobs with a fence by
itself, by the real agent's rule (``fence``, ``plait.model.fence``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from plait.model import fence as fencing
from plait.model.converge import converge
from plait.model.hostprofile import DEFAULT_PROFILE, HostProfile, HostProfileSpec, kinds_changed
from plait.model.task import TaskRef
from plait.scheduler.records import Assignment, Phase, TaskStatus
from plait.sidekick.book import Applied

#: seconds a simulated switch takes per kind of setting it changes (the slowest
#: counts): the paper's Figure 17 P90s for turbo (3.0 s) and hugepages (244 s)
SWITCH_SECONDS = {"turbo": 3.0, "hugepages": 244.0, "sysctls": 1.0, "cgroup_controllers": 1.0,
                  "fs_label": 30.0, "nic": 5.0, "user": 1.0}
#: a failed switch is tried again after this long, doubled each time up to the cap
SWITCH_RETRY, SWITCH_RETRY_MAX = 10.0, 300.0


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
    assignment: Assignment
    phase: Phase
    #: when the current phase ends (starting -> running, running -> crash, ...)
    until: float
    started_at: float = 0.0
    stopping: bool = False
    reported_stop: bool = False
    #: waiting to be restarted after a crash
    backoff_until: float | None = None
    #: how it behaves (decided once, when it starts)
    behaviour: Behaviour | None = None
    #: restarts after a non-zero exit so far
    retries: int = 0
    #: exited and not started again (restart policy): (exit code,)
    final: int | None = None


class SimAgent:
    def __init__(self, machine: str, behaviour: BehaviourFn) -> None:
        self.machine = machine
        self.behaviour = behaviour
        self.up = True
        self.processes: dict[TaskRef, Process] = {}
        #: when a list: what the simulated processes print, as (task, time, line)
        self.output: list[tuple[TaskRef, float, str]] | None = None
        #: the host profile applied (a machine starts with ``default``) and its spec
        self.profile: tuple[str, int] = (DEFAULT_PROFILE, 1)
        self.profile_spec: HostProfileSpec | None = None
        #: a switch in flight: its target and when it is done
        self.switching: tuple[HostProfile, float] | None = None
        #: why switches to a profile fail (None: they succeed), and the failures in a row
        self.switch_error: Callable[[HostProfile], str | None] = lambda profile: None
        self.switch_failures = 0
        self.profile_error: str | None = None
        #: a report of the profile is due (it changed, or a switch failed)
        self.profile_changed = False
        #: tasks started on a profile other than the target (the invariant: none)
        self.mismatched_starts = 0
        #: switches completed
        self.switches = 0
        #: the agent's own guard: no start until the machine carries its target (off
        #: in tests of the scheduler's gate alone)
        self.guard = True
        #: how long a switch from one profile's settings to another's takes
        self.switch_time: Callable[[HostProfileSpec | None, HostProfileSpec], float] = (
            switch_seconds)
        #: cut off from the control plane (its processes run on, unreported), and when
        #: its last report was taken: the lease of its fenced tasks
        self.cut = False
        self.contact: float | None = None

    def _say(self, ref: TaskRef, now: float, line: str) -> None:
        if self.output is not None:
            self.output.append((ref, now, line))

    def busy(self) -> bool:
        """Has something in flight that needs further steps."""
        return any(p.final is None and (
            p.phase is not Phase.RUNNING or p.stopping or p.backoff_until is not None
            or self._exits(self.behaviour(p.assignment))) for p in self.processes.values())

    def next_due(self) -> float | None:
        """When the next step could change something (a start, a stop, an exit, a
        restart after a crash): the earliest, or None when nothing is in flight."""
        due: float | None = None if self.switching is None else self.switching[1]
        for p in self.processes.values():
            if p.final is not None:
                continue
            if p.backoff_until is not None:
                at = p.backoff_until
            elif p.stopping or p.phase is not Phase.RUNNING or self._exits(
                    p.behaviour if p.behaviour is not None else self.behaviour(p.assignment)):
                at = p.until
            else:
                continue
            if due is None or at < due:
                due = at
        return due

    @staticmethod
    def _exits(b: Behaviour) -> bool:
        return b.crash or b.finish_after is not None

    def fail(self) -> None:
        self.up = False
        self.processes.clear()

    def repair(self) -> None:
        self.up = True

    def fence(self, now: float) -> None:
        """The fence of a machine cut off (the real agent's, and its keeper's): a task
        of a job with a fence gets SIGTERM once the lease is ``fence.seconds`` old and
        is gone at the latest ``FENCE_KILL_GRACE`` later (its stop time, if shorter)."""
        for ref, p in list(self.processes.items()):
            policy = p.assignment.spec.fence
            if policy is None or p.final is not None:
                continue
            said = fencing.verdict(policy.seconds, self.contact, now)
            if said is fencing.Verdict.RUN:
                continue
            if not p.stopping:
                b = p.behaviour if p.behaviour is not None else self.behaviour(p.assignment)
                p.behaviour, p.stopping = b, True
                p.until = now + min(b.stop_seconds, fencing.FENCE_KILL_GRACE)
            if said is fencing.Verdict.KILL or now >= p.until:
                del self.processes[ref]
                self._say(ref, now, "stopped by its fence")

    def applied(self) -> Applied:
        """The profile report: what is applied, and why the last switch failed."""
        return Applied(self.profile[0], self.profile[1], self.profile_error,
                       self.switch_failures)

    def _switch(self, now: float, target: HostProfile | None, hold: bool = False) -> bool:
        """Move towards ``target`` (None: no profile asked for); True when the machine
        carries it, so tasks may start. A switch begins only when no task runs here."""
        if target is None:
            return True
        if self.switching is not None:
            goal, until = self.switching
            if goal.name != target.name or goal.version != target.version:
                self.switching = None  # the target moved: begin again
            elif now >= until:
                self.switching = None
                error = self.switch_error(goal)
                self.profile_changed = True
                if error is None:
                    self.profile, self.profile_spec = (goal.name, goal.version), goal.spec
                    self.profile_error, self.switch_failures = None, 0
                    self.switches += 1
                else:
                    self.profile_error = error
                    self.switch_failures += 1
                    wait = min(SWITCH_RETRY_MAX,
                               SWITCH_RETRY * 2.0 ** min(self.switch_failures - 1, 32))
                    self.switching = (goal, now + wait)  # tried again after a backoff
                    return False
        if self.profile == (target.name, target.version):
            return True
        if self.switching is None and not self.processes and not hold:
            self.switching = (target, now + self.switch_time(self.profile_spec, target.spec))
        return False

    def step(self, now: float, desired: list[Assignment],
             target: HostProfile | None = None, hold: bool = False) -> list[TaskStatus]:
        """Converge to ``desired`` and return the statuses to report. ``target``: the
        host profile the machine must carry; no task starts until it does (``hold``:
        nor does a switch begin: a roll drains the machine)."""
        self.contact = now  # (this step's report is taken now: the lease renews)
        want = {TaskRef(a.job, a.index): a for a in desired}
        revisions = {ref: a.revision for ref, a in want.items()}
        # fence: stop whatever is not assigned here (or an older version of it)
        plan = converge({ref: p.assignment.revision for ref, p in self.processes.items()},
                        revisions)
        for ref in plan.remove + plan.replace:
            p = self.processes[ref]
            if not p.stopping:
                p.stopping = True
                if p.behaviour is None:
                    p.behaviour = self.behaviour(p.assignment)
                p.until = now + p.behaviour.stop_seconds
        statuses: list[TaskStatus] = []
        for ref, p in list(self.processes.items()):
            b = p.behaviour
            if b is None:
                b = p.behaviour = self.behaviour(p.assignment)
            a = p.assignment
            if p.stopping:
                if now >= p.until:
                    statuses.append(TaskStatus(a.job, a.index, a.revision, Phase.STOPPED))
                    del self.processes[ref]
                    self._say(ref, now, f"stopped (revision {a.revision})")
                else:
                    statuses.append(TaskStatus(a.job, a.index, a.revision, p.phase,
                                               p.phase is Phase.RUNNING))
                continue
            if p.final is not None:  # finished for good; its status until unassigned
                statuses.append(TaskStatus(a.job, a.index, a.revision, Phase.EXITED,
                                           False, p.final, final=True))
                continue
            if p.backoff_until is not None:
                if now >= p.backoff_until:
                    p.backoff_until = None
                    p.phase, p.until, p.started_at = Phase.STARTING, now + b.start_seconds, now
                    self._say(ref, now, f"restarting {a.spec.command} after a crash")
                else:
                    statuses.append(TaskStatus(a.job, a.index, a.revision, Phase.EXITED,
                                               False, 1))
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
                wait = a.spec.restart.after_exit(code, p.retries)
                if wait is None:
                    p.final = code
                    statuses.append(TaskStatus(a.job, a.index, a.revision, Phase.EXITED,
                                               False, code, final=True))
                    continue
                p.retries += 1
                p.backoff_until = now + wait
                statuses.append(TaskStatus(a.job, a.index, a.revision, Phase.EXITED,
                                           False, code))
                continue
            statuses.append(TaskStatus(a.job, a.index, a.revision, p.phase,
                                       p.phase is Phase.RUNNING))
        # start what is assigned and not held (a replaced copy once it has stopped), on
        # the machine's host profile only
        held = {ref: p.assignment.revision for ref, p in self.processes.items()}
        if not self._switch(now, target, hold) and self.guard:
            return statuses
        for ref in converge(held, revisions).add:
            a = want[ref]
            if ref not in self.processes:
                if target is not None and self.profile != (target.name, target.version):
                    self.mismatched_starts += 1
                b = self.behaviour(a)
                self.processes[ref] = Process(a, Phase.STARTING, now + b.start_seconds, now,
                                              behaviour=b)
                self._say(ref, now, f"starting {' '.join([a.spec.command, *a.spec.args])} "
                                    f"(version {a.spec_version}, revision {a.revision})")
                statuses.append(TaskStatus(a.job, a.index, a.revision, Phase.STARTING,
                                           False))
        return statuses

    def running(self, ref: TaskRef) -> Process | None:
        p = self.processes.get(ref)
        if p is None or p.stopping or p.phase is not Phase.RUNNING:
            return None
        return p
