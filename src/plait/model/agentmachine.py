"""The agent's task state machine (pure): what an agent does with the tasks of its
machine, written once for the real agent (``plait.agent.daemon``, processes through
its runtime) and the simulated one (``plait.sim.agents``, simulated processes).

Given the desired set (``Wanted`` entries), the host profile the machine must carry,
the fence's lease and what runs now, the ``Machine`` decides which tasks to stop
(gone from the set, or replaced by a new revision), which to start and when (a new
task, a restart after the backoff of its restart policy, a task its fence stopped
once a desired set pulled since the agent reached the control plane again lists
it), which to stop by their fence, when a host-profile switch may begin (nothing
runs or stops on the machine, and no retry is pending), and what the next report
says of each task. The driver (real or simulated) carries out each decision and
tells the machine what happened: a process started, exited, a stop finished, a
switch finished, a report was taken. Times are given (``now``: the driver's clock
of restarts; ``fence_now``: the fence's clock, on which the lease counts); nothing
here reads a clock, a file or a socket.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass
from typing import Generic, TypeVar

from plait.model import fence as fencing
from plait.model.converge import converge
from plait.model.job import restart_after

K = TypeVar("K", bound=Hashable)

#: the exit code a task stopped by its fence is reported with, not started again yet
#: (killed by SIGTERM)
FENCED_EXIT_CODE = -15
#: the first retry after a failed host-profile switch, and the longest wait between
#: tries (doubled after each failure in a row)
SWITCH_RETRY, SWITCH_RETRY_MAX = 5.0, 300.0


class Phase(enum.StrEnum):
    """What an agent reports of a task (``plait.scheduler.records.Phase`` is this)."""

    STARTING = "starting"
    RUNNING = "running"
    #: exited on its own (crashed or finished)
    EXITED = "exited"
    #: stopped because it left the machine's desired set
    STOPPED = "stopped"
    #: being stopped by its agent (SIGTERM sent, within the job's kill timeout)
    STOPPING = "stopping"


@dataclass
class HeldTask:
    """One task its agent holds: what the state machine decides on. The real agent
    keeps it (with its process's handle, port and output offset) in its state file."""

    job: str
    index: int
    revision: int
    _: KW_ONLY
    exit_code: int | None = None
    restarts: int = 0
    next_start: float = 0.0
    #: the process exited and will not be started again (restart policy)
    final: bool = False
    #: the job's restart policy: always, on-failure (with max_retries) or never
    policy: str = "always"
    max_retries: int = 3
    #: what its health probe said last (kept: a restarted agent's adopted tasks stay
    #: healthy, and in discovery, until their probe says otherwise)
    healthy: bool = False
    #: its last exit was a SIGKILL from outside (not its agent, not out of memory)
    killed: bool = False
    #: the request that assigned it, while its start waits (for the start's log line)
    cause: str | None = None
    #: stopped by its job's fence at this time (the fence's clock): not started again
    #: before a desired set pulled after the agent reached the control plane again
    #: lists it
    fenced_at: float | None = None
    #: and the first report the control plane took after that (its answer's time)
    rejoined_at: float | None = None
    #: its job's ``fence.seconds`` (None: no fence)
    fence: float | None = None


T = TypeVar("T", bound=HeldTask)


@dataclass(slots=True)
class Wanted(Generic[K]):
    """One entry of the desired set, as the state machine reads it."""

    key: K
    job: str
    index: int
    revision: int
    policy: str = "always"
    max_retries: int = 3
    fence: float | None = None
    #: the id of the request behind the assignment (for the log)
    cause: str | None = None


@dataclass(frozen=True, slots=True)
class Stop(Generic[K]):
    """Stop the task's process (``remove``: it left the machine: then forget it, its
    files too: ``Machine.forget``). ``had_process``: False when nothing runs to stop."""

    key: K
    reason: str
    cause: str | None
    remove: bool
    had_process: bool


@dataclass(slots=True)
class Status:
    """One task of the next report. A running task's health (and whether it is
    still starting) is the driver's to say."""

    job: str
    index: int
    revision: int
    phase: Phase
    exit_code: int | None = None
    final: bool = False
    killed: bool = False


class ProfileGate:
    """The host profile part: the machine starts no task until it carries the
    profile its desired set names, and switches to it only while nothing runs or
    stops there. Profiles are named by (name, version); what a switch applies is
    the driver's."""

    def __init__(self) -> None:
        #: the profile applied, and the one the desired set names
        self.applied: tuple[str, int] | None = None
        self.target: tuple[str, int] | None = None
        #: the desired set names a profile the control plane does not know: nothing
        #: starts
        self.unknown = False
        #: whether a switch may begin (False while the control plane holds it: a
        #: roll drains the machine first)
        self.switch = True
        #: a switch under way (its target), why the last one failed, failures in a
        #: row, and when the next try may begin
        self.switching: tuple[str, int] | None = None
        self.error: str | None = None
        self.failures = 0
        self.next_try = 0.0
        #: the agent's own guard on (off only in simulations measuring the control
        #: plane's gate alone)
        self.guard = True

    def want(self, target: tuple[str, int] | None, unknown: bool = False,
             switch: bool = True) -> None:
        """The profile the latest desired set names (``unknown``: it names one the
        control plane does not know)."""
        self.target, self.unknown, self.switch = target, unknown, switch

    def carries(self) -> bool:
        """The machine carries the profile it must."""
        if self.target is None:
            return not self.unknown
        return self.applied == self.target

    def may_start(self) -> bool:
        return self.carries() or not self.guard

    def begin(self, now: float, idle: bool) -> tuple[str, int] | None:
        """The profile to switch to now, if a switch may begin: the machine does not
        carry its target, nothing runs or stops on it (``idle``), the control plane
        does not hold it, no switch is under way and no retry is pending."""
        if (self.switching is None and self.target is not None and not self.carries()
                and self.switch and idle and now >= self.next_try):
            self.switching = self.target
            return self.target
        return None

    def done(self, profile: tuple[str, int], error: str | None, now: float) -> float | None:
        """A switch to ``profile`` finished (``error``: why it failed). Returns the
        wait before the next try after a failure."""
        self.switching = None
        if error is None:
            self.applied, self.error, self.failures = profile, None, 0
            return None
        self.error = error
        self.failures += 1
        wait = min(SWITCH_RETRY_MAX, SWITCH_RETRY * 2.0 ** min(self.failures - 1, 32))
        self.next_try = now + wait
        return wait

    def next_due(self) -> float | None:
        """When a retry may begin, if one waits."""
        if self.switching is None and self.error is not None and not self.carries():
            return self.next_try
        return None


@dataclass(frozen=True, slots=True)
class Plan(Generic[K]):
    """What a desired set asks of the machine: stops, then starts (``starts`` comes
    from ``Machine.starts`` once the stops are under way)."""

    stops: tuple[Stop[K], ...]
    #: the request behind each listed task (a start names it in its log line)
    causes: Mapping[K, str | None]


class Machine(Generic[K, T]):
    """The tasks of one machine and what to do with them. ``make`` builds the
    record of a task new to the machine (the driver's subclass of ``HeldTask``)."""

    def __init__(self, make: Callable[[Wanted[K]], T]) -> None:
        self.make = make
        self.tasks: dict[K, T] = {}
        #: tasks whose process runs, and those being stopped
        self.running: set[K] = set()
        self.stopping: set[K] = set()
        #: tasks listed by a desired set since the agent started (only those are
        #: restarted: an adopted task waits for the set to say it is still wanted)
        self.listed: set[K] = set()
        self.profile = ProfileGate()
        #: when the last report the control plane took was sent (the fence's clock;
        #: None: none yet): the lease of the tasks of jobs with a fence
        self.contact: float | None = None

    # -- the desired set ----------------------------------------------------------------
    def converge(self, wanted: Sequence[Wanted[K]], pulled_at: float) -> Plan[K]:
        """Take a desired set, pulled at ``pulled_at`` (the fence's clock): stop what
        left it (to forget), stop the old revision of what it lists at a new one
        (its record takes the new revision, restarts counted anew), take each
        listed task's restart policy and fence, lift the fence of a task it stopped
        once this set was pulled after the agent reached the control plane again."""
        want = {w.key: w for w in wanted}
        plan = converge({k: t.revision for k, t in self.tasks.items()},
                        {k: w.revision for k, w in want.items()})
        stops: list[Stop[K]] = []
        for key in plan.remove:  # (the driver forgets them once their stop is under way)
            stops.append(self.stop(key, "no longer assigned", None, remove=True))
        for key in plan.replace:
            w = want[key]
            stops.append(self.stop(key, f"revision {w.revision}", w.cause, remove=False))
            old = self.tasks[key]
            old.revision = w.revision
            old.restarts, old.next_start, old.exit_code = 0, 0.0, None
            old.final = False
        for key, w in want.items():
            task = self.tasks.get(key)
            if task is None:
                task = self.tasks[key] = self.make(w)
            task.policy, task.max_retries, task.fence = w.policy, w.max_retries, w.fence
            if (task.fenced_at is not None and task.rejoined_at is not None
                    and pulled_at >= task.rejoined_at):
                # still assigned here in a set asked for after the agent reached the
                # control plane again: the fence is lifted (``plait.model.fence``)
                task.fenced_at = task.rejoined_at = None
            self.listed.add(key)
        return Plan(tuple(stops), {k: w.cause for k, w in want.items()})

    def forget(self, key: K) -> None:
        """The task left the machine (or finished and was reported)."""
        self.tasks.pop(key, None)
        self.listed.discard(key)

    # -- starts and exits ----------------------------------------------------------------
    def may_start(self, task: HeldTask, fence_now: float) -> bool:
        """A task starts on its machine's host profile only, and a task of a job with
        a fence under a lease that holds, not after its fence stopped it before a
        desired set pulled since the agent reached the control plane again lists it."""
        if not self.profile.may_start():
            return False
        if task.fence is None:
            return True
        return task.fenced_at is None and fencing.may_start(task.fence, self.contact,
                                                            fence_now)

    def startable(self, now: float) -> list[K]:
        """The listed tasks that should run now and do not: new, a new revision once
        its old copy stopped, or restarted once their backoff passed (whether they
        may start is ``starts``'s to say)."""
        return [k for k, t in self.tasks.items()
                if k in self.listed and t.exit_code is None and not t.final
                and k not in self.running and k not in self.stopping
                and now >= t.next_start]

    def starts(self, now: float, fence_now: float,
               causes: Mapping[K, str | None] | None = None) -> list[tuple[K, str | None]]:
        """The tasks to start now, each with the request behind it. One held back (by
        the host profile or its fence) keeps its cause for when it starts."""
        causes = causes or {}
        out: list[tuple[K, str | None]] = []
        for key in self.startable(now):
            task = self.tasks[key]
            cause = causes.get(key) or task.cause
            if not self.may_start(task, fence_now):
                task.cause = cause
                continue
            task.cause = None
            out.append((key, cause))
        return out

    def started(self, key: K) -> None:
        """Its process runs (unhealthy until its probe passes)."""
        self.running.add(key)
        self.tasks[key].healthy = False

    def exited(self, key: K, code: int, now: float, killed: bool = False) -> None:
        """Its process exited with ``code`` (or its start failed): the restart policy
        says whether it starts again, and after what backoff."""
        self.running.discard(key)
        task = self.tasks[key]
        task.killed = killed
        task.exit_code = code
        wait = restart_after(task.policy, task.max_retries, code, task.restarts)
        if wait is None:
            task.final = True
            return
        task.restarts += 1
        task.next_start = now + wait

    def supervise(self, now: float) -> None:
        """The exited tasks whose backoff passed are to start again."""
        for task in self.tasks.values():
            if task.exit_code is not None and not task.final and now >= task.next_start:
                task.exit_code = None

    def stop(self, key: K, reason: str, cause: str | None, remove: bool) -> Stop[K]:
        """Stop the task's process, if one runs (it is ``stopping`` until ``stopped``)."""
        had = key in self.running
        if had:
            self.running.discard(key)
            self.stopping.add(key)
        return Stop(key, reason, cause, remove, had)

    def stopped(self, key: K) -> None:
        """A stop finished."""
        self.stopping.discard(key)

    # -- the fence -------------------------------------------------------------------------
    def fence(self, fence_now: float) -> list[tuple[K, fencing.Verdict]]:
        """The running tasks whose fence ran out (the agent has not reached the control
        plane for their job's ``fence.seconds``): stop them now (``TERM``; ``KILL``
        once the grace is over too); they stay held, to start again only from a set
        pulled after the agent reached the control plane again."""
        out: list[tuple[K, fencing.Verdict]] = []
        for key in list(self.running):
            task = self.tasks[key]
            if task.fence is None:
                continue
            said = fencing.verdict(task.fence, self.contact, fence_now)
            if said is fencing.Verdict.RUN:
                continue
            self.stop(key, f"fenced: the control plane not reached for {task.fence:g}s",
                      None, remove=False)
            task.fenced_at, task.rejoined_at = fence_now, None
            out.append((key, said))
        return out

    def heard(self, sent: float, renewed: float) -> bool:
        """The control plane took a report sent at ``sent`` (its answer came at
        ``renewed``, both on the fence's clock): the lease renews. True when a task
        its fence stopped may start again from a set pulled from now on (pull one)."""
        self.contact = sent
        newer = False
        for task in self.tasks.values():
            if task.fenced_at is not None and task.rejoined_at is None:
                task.rejoined_at = renewed
                newer = True
        return newer

    def finished(self) -> list[K]:
        """The tasks that ended for good (final): the control plane took them off the
        machine with the report that said so; forget them once it was taken, so a
        rerun it asks for is started, not reported as finished again."""
        return [k for k, t in self.tasks.items() if t.final]

    # -- reports ---------------------------------------------------------------------------
    def idle(self) -> bool:
        """Nothing runs or stops on the machine (a profile switch may begin)."""
        return not self.running and not self.stopping

    def statuses(self) -> list[tuple[K, Status]]:
        """What the next report says of each task held (a task waiting for its start
        is not in it; ``stopping_statuses`` says the tasks being stopped)."""
        out: list[tuple[K, Status]] = []
        for key, t in self.tasks.items():
            if key in self.running:
                out.append((key, Status(t.job, t.index, t.revision, Phase.RUNNING)))
            elif t.fenced_at is not None and t.exit_code is None:
                # stopped by its fence, not started again yet: down, to start again
                out.append((key, Status(t.job, t.index, t.revision, Phase.EXITED,
                                        FENCED_EXIT_CODE)))
            elif t.exit_code is not None:
                out.append((key, Status(t.job, t.index, t.revision, Phase.EXITED,
                                        t.exit_code, t.final, t.killed)))
        return out

    @staticmethod
    def stopping_statuses(stopping: Iterable[tuple[str, int, int]]) -> list[Status]:
        return [Status(job, index, revision, Phase.STOPPING)
                for job, index, revision in stopping]

    def next_due(self) -> float | None:
        """When a restart after a backoff, or a profile switch's retry, is due."""
        due = [t.next_start for t in self.tasks.values()
               if t.exit_code is not None and not t.final]
        retry = self.profile.next_due()
        if retry is not None:
            due.append(retry)
        return min(due) if due else None

    def phases(self) -> dict[str, int]:
        """How many of its tasks are running, exited (waiting for a restart or
        final) and stopping."""
        exited = sum(1 for k, t in self.tasks.items()
                     if k not in self.running and t.exit_code is not None)
        return {"running": len(self.running), "exited": exited,
                "stopping": len(self.stopping)}
