"""The agent: one per machine. It joins with the cluster join token, then pulls its
machine's desired task set from the control plane, converges to it with real
processes, and reports their statuses, endpoints and output (DESIGN.md "Agents and
the control plane").

Everything the agent needs to keep its tasks running is on its own disk
(``DATA/agent.json``): a restarted agent adopts its running processes without
restarting them, and while the control plane is unreachable nothing is stopped.
When it reaches the control plane again, whatever is no longer assigned to its
machine is stopped (the agent fences itself: never two serving copies of a task).
A job with a fence (``JobSpec.fence``) asks for more: its tasks stop once the agent
has not reached the control plane for ``fence.seconds``, whether or not the agent
runs (``_fence`` while it does; its fence keeper process, ``plait.agent.fencekeeper``,
whatever becomes of it), and start again only from a desired set pulled after the
agent reached the control plane again (``plait.model.fence``).

It logs through ``plait.logconfig`` (logger ``plait.agent``): every line names the
machine, and lines about a task its job, index and revision; a start names the id of
the API request behind the assignment, a stop that of the request that last changed
the task's job (``request_id``, both as the desired set gives them).

Each task gets its own credential from its entry of the desired set: the agent binds
it to the endpoint it reports for the task to discovery (``host:port``: the
machine's advertised address and the task's port) and sets the result as
``PLAIT_TASK_CREDENTIAL`` in the task's environment, beside that endpoint as
``PLAIT_TASK_ENDPOINT`` (``plait.taskcontrol.signing.endpoint_credential``): kept in
memory only, never logged nor saved (a task started again after the agent restarted
gets it from the next desired set).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx

from plait.agent.client import JoinRefused
from plait.agent.desired import BadDesired, Pulled, checked_desired, wanted
from plait.agent.host import PROBE_SLACK, TASK_HOST_ENV
from plait.agent.member import Member
from plait.agent.profile import ProfileSwitcher
from plait.agent.records import CHUNK_BYTES, Stopping, Task, lock_data_dir
from plait.agent.runtime import ProcessRuntime
from plait.localprocs import listen_error
from plait.model import fence
from plait.model.agentmachine import Wanted
from plait.sidekick.appliers import Applier
from plait.sidekick.appliers import make as make_applier

__all__ = ["CHUNK_BYTES", "PROBE_SLACK", "TASK_HOST_ENV", "Agent", "BadDesired",
           "JoinRefused", "Stopping", "Task", "checked_desired", "lock_data_dir"]

#: how long the run loop's long-poll waits for a change of the desired set (the
#: heartbeat is the report, sent every interval on its own; a report's answer names
#: the set's generation, so a poll stuck on a replica that stopped leading is caught
#: up at the next report)
LONG_POLL_SECONDS = 10.0

#: seconds of the control plane refusing this machine's credential (401) in a row
#: before the agent joins again to learn why (``Agent._refused``): a join of the
#: machine by another agent revokes this one's, and a refusal as short as a store
#: replica's lag behind a new credential is none
REVOKED_AFTER = 10.0
#: seconds a control plane may take a revoked credential still (its cache of them)
#: and more: a heartbeat it heard that long after this agent's first refusal was
#: another agent's
CREDENTIAL_CACHE_SLACK = 3.0


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _some_port(host: str) -> int:
    """A free port, or 0 when none can be had now (a task holds them all): the start
    picks one then, or fails as a start does."""
    try:
        return _free_port(host)
    except OSError:
        return 0


def _port_free(host: str, port: int) -> bool:
    return listen_error(host, port) is None


class Agent(Member):
    def __init__(self, machine: str, urls: list[str], join_token: str | None, data_dir: Path,
                 advertise: str = "127.0.0.1", timeout: float = 5.0,
                 runtime: ProcessRuntime | None = None,
                 describe: dict[str, Any] | None = None, ca_file: str | None = None,
                 applier: Applier | None = None) -> None:
        """``describe``: this machine as it registers when it joins (fault_domain,
        cpu, memory_gb, type and optionally disk_gb); without it, the machine must be
        one the region has already. ``applier``: what switches the machine's host
        profile (``record`` by default: on record only)."""
        super().__init__(machine, urls, join_token, data_dir, advertise, timeout, runtime,
                         describe, ca_file)
        #: since when the control plane has refused the machine's credential (401),
        #: and when the agent joins again to learn why (``_refused``)
        self.refused_since: float | None = None
        self._rejoin_at = 0.0
        #: the last refusal of a join logged, and when (``run``)
        self._join_refused: tuple[str, float] = ("", float("-inf"))
        #: the machine's host profile: switched before any task starts (Sidekick)
        self.profile = ProfileSwitcher(
            applier or make_applier("record", self.data_dir / "sidekick"), self.wakeup.set,
            machine, self.core.profile)
        #: when the last report's answer came (a desired set pulled after it may start
        #: again what the fence stopped)
        self._renewed = float("-inf")
        self._load()

    def _new_task(self, w: Wanted[str]) -> Task:
        return Task(w.job, w.index, w.revision, _some_port(self.advertise))

    # -- one step --------------------------------------------------------------------------
    def step(self, now: float | None = None, wait: float = 0.0) -> None:
        """Pull the desired set (a long-poll of up to ``wait`` seconds when the agent
        has one already: it returns as soon as the set changes), converge, report."""
        self.join()
        self._stopped()
        self._fence()
        desired: Pulled | None = None
        try:
            desired = self._pull(wait, self.generation)
        except (ConnectionError, httpx.HTTPStatusError, BadDesired) as exc:
            self._pulled(exc)
        else:
            self._pulled(desired)
        now = time.monotonic() if now is None else now
        if desired is None:
            self._supervise(now)
            return
        self.profile.tick(now, idle=self.core.idle())
        self._converge(desired, now)
        self._supervise(now)
        self.runtime.rotate_logs()  # (the agent keeps the whole logs, rotated)
        self._report(now)
        self._save()

    def _pulled(self, pulled: Pulled | Exception) -> None:
        """What a pull of the desired set brought: the set, or the error that it could
        not be had (then everything keeps running, as it is)."""
        if isinstance(pulled, Exception):
            desired = pulled
            if (isinstance(desired, httpx.HTTPStatusError)
                    and desired.response.status_code == 401 and self.token is not None):
                self._refused(time.monotonic())
                return
            self.refused_since = None  # (refusals in a row only: another failure ends them)
            if self.reachable:
                self.log.warning("control plane unreachable; tasks keep running",
                                 error=str(desired))
            self.reachable = False
            self.generation = None
            return
        self.refused_since = None
        if not self.reachable:
            self.log.info("control plane reachable", tasks=len(pulled.desired.tasks))
        self.reachable = True
        self.profile.want(pulled.desired)
        self.generation = pulled.desired.generation

    def _refused(self, now: float) -> None:
        """The control plane refused this machine's credential. After ``REVOKED_AFTER``
        seconds of refusals in a row the agent joins again with its join token, and
        the answer says what happened. Refused because another agent of this machine
        is alive (409): that one took the machine over and runs its tasks, so this
        one stops them (their files kept), as if the desired set had dropped them,
        and asks to join again at each heartbeat (two copies of a task must not
        run). Joined: the credential had been revoked (an admin), or the region's
        store lost it; the tasks go on. Anything else (no join token, the join
        refused for another reason, no answer): nothing is stopped, and it is tried
        again after another ``REVOKED_AFTER``. A refusal alone never stops a task:
        a control plane that refuses every agent for a while (a store restored from
        an old backup, a proxy that drops the header) must not stop the region."""
        self.reachable = False
        self.generation = None
        if self.refused_since is None:
            self.refused_since = now
            self.log.warning("the control plane refuses this machine's credential",
                             join_again_after_seconds=REVOKED_AFTER)
            return
        if now < self._rejoin_at or now - self.refused_since < REVOKED_AFTER:
            return
        self._rejoin_at = now + REVOKED_AFTER  # (the next try, if this one settles nothing)
        held, self.token = self.token, None
        try:
            self.join()
        except JoinRefused as exc:
            # (heard since this agent's own beats were refused, and the control plane's
            # cache of credentials let them in: another agent's)
            other = exc.heard_ago is not None and (
                exc.heard_ago < now - self.refused_since - CREDENTIAL_CACHE_SLACK)
            if exc.status != 409 or not other:
                self.token = held
                self.log.error("this machine's credential is refused, and so is its join: "
                               "its tasks keep running", error=str(exc))
                return
            self.log.error("another agent runs this machine (its credential replaced this "
                           "one's): this agent's tasks are stopped, and it asks to join "
                           "again", error=str(exc), tasks=len(self.tasks))
            for key in list(self.tasks):
                self._remove(key, "another agent runs this machine", keep_files=True)
            self.refused_since = None
            self._save()
        except (ConnectionError, httpx.HTTPError, ValueError, OSError) as exc:
            self.token = held  # (no join token, or no answer: as it was)
            self.log.error("this machine's credential is refused, and joining again "
                           "failed: its tasks keep running", error=str(exc))
        else:
            self.refused_since = None
            self.log.warning("this machine's credential was refused: joined again with a "
                             "new one, its tasks kept", tasks=len(self.tasks))

    def _converge(self, pulled: Pulled, now: float) -> None:
        """Converge the tasks to the desired set: the state machine says what to stop
        (what left it, the old revision of what changed) and what to start."""
        desired = pulled.desired
        # (what left the set, and the request behind it: for the log)
        left = {f"{s.job}.{s.index}": s.request_id for s in desired.stopping}
        fenced = {k for k, t in self.tasks.items() if t.fenced_at is not None}
        plan = self.core.converge([wanted(a) for a in desired.tasks], pulled.at)
        for stop in plan.stops:
            if stop.remove:  # stopped (fencing)
                self._remove(stop.key, stop.reason, left.get(stop.key))
            else:  # a new revision: restart on it
                self._stop(stop.key, reason=stop.reason, cause=stop.cause)
        for a in desired.tasks:
            key = a.key
            if key in fenced and self.tasks[key].fenced_at is None:
                self.log.info("task fence lifted", job=a.job, index=a.index)
            self.specs[key] = a.spec
            self.probes[key] = (None if a.spec.health is None
                                else a.spec.health.model_dump(mode="json"))
            if a.credential:
                self.credentials[key] = a.credential
            else:  # (a control plane that sends none: the task has none)
                self.credentials.pop(key, None)
        self._restart(now, plan.causes)

    def _restart(self, now: float, causes: Mapping[str, str | None] | None = None) -> None:
        """Start what the state machine says is due: new tasks, a new revision once
        its old copy stopped, restarts whose backoff has passed; nothing before the
        machine carries the host profile its desired set names, nor a task its fence
        holds back (started by a later turn, once it may)."""
        for key, cause in self.core.starts(now, self.fence_clock(), causes):
            self._start(self.tasks[key], cause)

    def _start(self, task: Task, cause: str | None = None) -> None:
        """Start the task's process; ``cause``: the id of the request that assigned
        it (for the log)."""
        spec = self.specs[task.key]
        home = self.data_dir / "tasks" / task.key
        try:
            # (a full disk, or every port held by some task: a failed start, not a
            # failed turn of the loop, which would stop the machine's heartbeats)
            home.mkdir(parents=True, exist_ok=True)
            if not task.port or not _port_free(self.advertise, task.port):
                # taken meanwhile (by another process's connection, say): a new one,
                # which the next status report publishes in discovery
                task.port = _free_port(self.advertise)
            env = self._env(task, spec.env)
            # runtime keys carry the machine and the data dir: agents of several
            # machines may share a host (`plait up`), and with it the cgroup hierarchy
            handle = self.runtime.start(
                self._runtime_key(task.key), spec.command, list(spec.args), env, home,
                float(spec.resources.cpu), max(16, int(spec.resources.memory_gb * 1024)))
        except (OSError, RuntimeError, ValueError) as exc:  # reported as a failed start
            self.log.error("task start failed", job=task.job, index=task.index,
                           revision=task.revision, request_id=cause, error=str(exc))
            self._failed_start(task)
            return
        self.log.info("task started", job=task.job, index=task.index, revision=task.revision,
                      request_id=cause, pid=handle.pid, port=task.port,
                      restarts=task.restarts)
        self.handles[task.key] = handle
        self.core.started(task.key)
        task.handle = handle.to_dict()
        if task.fence is not None:
            self._guard()  # (in the lease before anything may freeze the agent)
        # saved at once, before anything that may block or fail (a report to the
        # control plane): an agent killed after this start adopts the process when it
        # comes back, and never starts a second copy of the task
        if not self._save():
            # a start the agent cannot remember (its disk is full) is not kept: an
            # agent restarted would not know the process and start a second copy
            self.handles.pop(task.key, None)
            task.handle = None
            self.runtime.stop(handle, grace=0.0)
            self.log.error("task start undone: the agent's state could not be saved",
                           job=task.job, index=task.index, revision=task.revision)
            self._failed_start(task)
            return
        self._dirty = True
        self.metrics.starts.inc()
        self.prober.forget(task.key)  # unhealthy until its probe passes

    def _failed_start(self, task: Task) -> None:
        """A start that failed exits as the shell reports it (127), by the restart
        policy."""
        self.core.exited(task.key, 127, time.monotonic(), task.killed)
        self._dirty = True

    # -- the fence (jobs that ask for at most one copy: ``plait.model.fence``) -----------
    def _fence(self) -> None:
        """Stop the tasks whose fence ran out: the agent has not reached the control
        plane for their job's ``fence.seconds`` (their machine may be failed, and
        the tasks placed elsewhere from ``fence.replace_at`` on)."""
        for key, _ in self.core.fence(self.fence_clock()):
            task = self.tasks[key]
            self._stop(key, reason=f"fenced: the control plane not reached for "
                       f"{task.fence:g}s", grace=fence.FENCE_KILL_GRACE)
            self._dirty = True
        self._guard()

    def run(self, interval: float = 1.0, stop: Any = None) -> None:
        """Run until ``stop`` (a threading.Event) is set. The desired set is
        long-polled on a thread of its own (``_poll``); this loop sleeps until
        something is due -- the next report (every ``interval`` seconds: the
        heartbeat), the next probe, a restart after its backoff -- or until it is
        woken: the long-poll answered, a task's process exited, a probe may have
        changed a task's health, a stop finished. Whatever changed is reported at
        once."""
        stop = stop if stop is not None else threading.Event()
        poll = max(interval, LONG_POLL_SECONDS)
        halt = threading.Event()  # (this run ended: its poller ends too)
        poller: threading.Thread | None = None
        next_report = 0.0
        try:
            while not stop.is_set():
                now = time.monotonic()
                try:
                    if self.token is None:
                        self.join()
                    if poller is None:
                        poller = threading.Thread(target=self._poll,
                                                  args=(poll, interval, stop, halt),
                                                  daemon=True,
                                                  name=f"plait-poll-{self.machine}")
                        poller.start()
                    if self._tick(now, now >= next_report):
                        next_report = now + interval
                except JoinRefused as exc:  # (asked again at the next heartbeat)
                    # (said once, then each minute while the reason stays the same)
                    said, at = self._join_refused
                    if exc.reason.split(" (heard", 1)[0] != said or now - at >= 60:
                        self.log.error("join refused", error=str(exc))
                        self._join_refused = (exc.reason.split(" (heard", 1)[0], now)
                    self.reachable = False
                    next_report = now + interval
                except (ConnectionError, httpx.HTTPError) as exc:
                    self.log.warning("step failed: control plane unreachable",
                                     error=str(exc))
                    self.reachable = False
                    next_report = now + interval
                except Exception:  # the agent keeps its tasks running, whatever broke
                    self.log.exception("step failed")
                    self.reachable = False
                    next_report = now + interval
                self.wakeup.keep({k: h.pid for k, h in self.handles.items()})
                self.wakeup.wait(self._sleep(time.monotonic(), next_report, interval))
        finally:
            halt.set()

    def _tick(self, now: float, report_due: bool) -> bool:
        """One turn of the run loop: take the desired set if the long-poll brought
        one, notice exits, restart what is due, start the probes that are due;
        report if the heartbeat is due or anything changed. True if it reported."""
        self._stopped()
        self._fence()
        with self._inbox_lock:
            pulled, self._inbox = self._inbox, None
        if pulled is not None:
            same = (not isinstance(pulled, Exception) and self.generation is not None
                    and pulled.desired.generation == self.generation)
            self._pulled(pulled)
            if not isinstance(pulled, Exception) and not same:
                # (the same generation is the same set: a long-poll that timed out)
                self._converge(pulled, now)
        self._supervise(now)
        if self.profile.tick(now, idle=self.core.idle()):
            self._dirty = True
        self._restart(now)
        for key in self.handles:
            task = self.tasks[key]
            healthy = self._healthy(task, now)
            if healthy != task.healthy:
                task.healthy = healthy
                self._dirty = True
        if not (report_due or self._dirty):
            return False
        self.runtime.rotate_logs()  # (the agent keeps the whole logs, rotated)
        self._report(now)
        if self._newer:
            # the control plane has a newer set than the long-poll brought (it waits
            # on a replica that stopped leading, say): pulled now, not after its wait
            self._newer = False
            desired = self._pull(0.0, None)
            self._pulled(desired)
            self._converge(desired, now)
            self._report(now)
        self._save()
        return True

    def _sleep(self, now: float, next_report: float, interval: float) -> float:
        """How long the run loop may sleep: until the next report, probe, restart or
        profile switch's retry is due (at most ``interval``: a stop is noticed within
        it)."""
        due = min(next_report, now + interval)
        probe = self.prober.next_due(now + PROBE_SLACK)
        if probe is not None:
            due = min(due, probe - PROBE_SLACK)
        other = self.core.next_due()
        if other is not None:
            due = min(due, other)
        return max(0.0, due - now)

    def close(self) -> None:
        """Let go of the data dir (another agent may take it) and of the prober; the
        tasks run on, for the next agent to adopt."""
        self.client.close()
        self.profile.close()
        super().close()

    def shutdown(self) -> None:
        """Stop every task (Ctrl-C of `plait up`), keeping nothing running."""
        for key in list(self.handles):
            self._stop(key, reason="agent shutting down")
        for stopping in list(self.stopping.values()):
            if stopping.future is not None:
                stopping.future.result()
        self._stopped()
        self._guard()
        self._save()
