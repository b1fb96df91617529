"""The machine side of the agent: its tasks' processes, through the runtime, driven
by the agent's task state machine (``plait.model.agentmachine``), and the agent's
own disk (``DATA/agent.json``). ``plait.agent.daemon.Agent`` adds the control plane.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import tempfile
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

from plait import logconfig
from plait.agent import fencekeeper
from plait.agent.fenceguard import FenceGuard
from plait.agent.probe import Prober
from plait.agent.records import CHUNK_BYTES, Stopping, Task, lock_data_dir
from plait.agent.runtime import Handle, ProcessRuntime
from plait.agent.wakeup import Wakeup
from plait.metrics import AgentMetrics
from plait.model.agentmachine import Machine, Phase, Wanted
from plait.model.agentwire import TaskReport
from plait.model.job import JobSpec
from plait.taskcontrol.signing import endpoint_credential

log = logconfig.get("plait.agent")

#: a probe due within this many seconds is started with the others due now: the
#: probes of an agent's tasks fall into step, and its loop wakes once for them all
PROBE_SLACK = 0.1

#: the variables of the agent's environment a task starts with (as a systemd service
#: starts with its manager's few, not the shell's): what finds programs and sets the
#: locale and time zone, and who the process runs as; the rest only from the spec
TASK_HOST_ENV = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "LC_CTYPE", "TZ")

#: stops under way at once at most (each waits out its task's kill timeout)
STOP_THREADS = 256


class TaskHost:
    """The tasks of one machine: ``core`` (the state machine) decides, this class
    carries out with real processes and tells ``core`` what happened."""

    def __init__(self, machine: str, data_dir: Path, advertise: str,
                 runtime: ProcessRuntime | None, describe: dict[str, Any] | None) -> None:
        self.machine = machine
        self.log = log.bind(machine=machine)
        # absolute: tasks run in their own directory, and PLAIT_DATA_DIR is theirs to
        # use from there (`plait up` gives a relative one)
        self.data_dir = Path(data_dir).resolve()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.data_dir, 0o700)  # its machine credential and the tasks' files
        self._lock: int | None = lock_data_dir(self.data_dir)
        self.advertise = advertise
        self.describe = describe or {}
        self.runtime = runtime or ProcessRuntime(self.data_dir)
        self.state_path = self.data_dir / "agent.json"
        digest = hashlib.sha1(str(self.data_dir).encode()).hexdigest()[:8]
        self.prefix = f"{machine}.{digest}"
        #: the state machine: the tasks held, which run, which stop, the host
        #: profile's gate and the fence's lease
        self.core: Machine[str, Task] = Machine(self._new_task)
        self.handles: dict[str, Handle] = {}
        #: the last spec seen per task, and its health probe (wire form, for the prober)
        self.specs: dict[str, JobSpec] = {}
        self.probes: dict[str, dict[str, Any] | None] = {}
        #: per task, its own credential as its desired set gave it (memory only)
        self.credentials: dict[str, str] = {}
        #: what the run loop sleeps on (woken by the long-poll, probes, stops, exits)
        self.wakeup = Wakeup()
        self.prober = Prober(on_change=self.wakeup.set)
        #: Prometheus metrics (``plait agent --metrics-port`` serves them)
        self.metrics = AgentMetrics(self.phases)
        #: something a report should tell happened since the last (a start, an exit,
        #: a stop, a health change): the run loop reports at once
        self._dirty = False
        #: per task: (when, CPU seconds used then, the cores it used over the interval
        #: before): what its status reports as ``cpu``
        self._cpu: dict[str, tuple[float, float, float | None]] = {}
        #: output read from tasks that exited, not sent yet
        self._output: list[dict[str, Any]] = []
        self._saved: dict[str, Any] | None = None
        #: stops under way in the background (SIGTERM, then SIGKILL after the job's
        #: kill timeout): a task that ignores SIGTERM never holds up a heartbeat
        self.stopping: dict[str, Stopping] = {}
        #: (threads made as stops need them, up to more than a machine's tasks: a few
        #: tasks that ignore SIGTERM for their whole kill timeout hold up no other stop)
        self._stops = ThreadPoolExecutor(max_workers=STOP_THREADS, thread_name_prefix="plait-stop")
        #: the fence's clock (seconds since boot, suspend included)
        self.fence_clock = fencekeeper.boottime
        self.fenceguard = FenceGuard(self.data_dir, self.log)

    def _new_task(self, w: Wanted[str]) -> Task:
        raise NotImplementedError  # (the agent's: it picks the task's port)

    # -- what the state machine holds --------------------------------------------------------
    @property
    def tasks(self) -> dict[str, Task]:
        return self.core.tasks

    @tasks.setter
    def tasks(self, tasks: dict[str, Task]) -> None:
        self.core.tasks = tasks

    @property
    def contact(self) -> float | None:
        """When the last report the control plane took was sent (the fence's clock;
        None: none yet, and no lease left on disk by the agent before): the lease of
        the jobs with a fence."""
        return self.core.contact

    @contact.setter
    def contact(self, value: float | None) -> None:
        self.core.contact = value

    def phases(self) -> dict[str, int]:
        """How many of its tasks are running, exited (waiting for a restart or
        final) and stopping."""
        return self.core.phases()

    # -- local state -----------------------------------------------------------------------
    def _load_tasks(self, data: dict[str, Any]) -> None:
        for key, raw in data.get("stopping", {}).items():  # (stops the last run left)
            handle = self.runtime.adopt(raw["handle"])
            self._stop_later(key, Stopping(raw["job"], raw["index"], raw["revision"],
                                           raw["handle"], float(raw["grace"]),
                                           bool(raw["remove"]), fence=raw.get("fence")),
                             handle)
        for key, raw in data.get("tasks", {}).items():
            task = Task(**raw)
            handle = self.runtime.adopt(task.handle) if task.handle else None
            self.tasks[key] = task
            if handle is not None:
                self.handles[key] = handle  # still running: adopted, not restarted
                self.core.running.add(key)
                if task.healthy:
                    self.prober.resume(key)  # as healthy as it was, until probed
            else:
                task.handle = None

    def _state(self) -> dict[str, Any]:
        return {"tasks": {k: asdict(t) for k, t in self.tasks.items()},
                "stopping": {k: s.record() for k, s in self.stopping.items()}}

    def _write_state(self, data: dict[str, Any]) -> bool:
        """Write the agent's state if it changed; False if it could not be (a full
        disk): it is tried again at the next save, which any change makes."""
        if data == self._saved:
            return True  # (most steps change nothing: no write, no fsync)
        tmp = None
        try:
            fd, tmp = tempfile.mkstemp(dir=self.data_dir, prefix=".agent.")
            with os.fdopen(fd, "w") as f:
                json.dump(data, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.state_path)
        except OSError as exc:
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
            self.log.error("agent state not saved", path=str(self.state_path),
                           error=str(exc))
            return False
        self._saved = data  # (only once it is written)
        return True

    # -- processes -------------------------------------------------------------------------
    def _runtime_key(self, key: str) -> str:
        """The runtime's key of task ``key``: it carries the machine and the data dir
        (agents of several machines may share a host, and its cgroup hierarchy)."""
        return f"{self.prefix}/{key}"

    def _guard(self) -> None:
        """The fence keeper's lease: the agent's, and the processes of the tasks of
        jobs with a fence (running or being stopped)."""
        tasks = {k: {"seconds": t.fence, "handle": t.handle} for k, t in self.tasks.items()
                 if t.fence is not None and t.handle is not None}
        for k, st in self.stopping.items():
            if st.fence is not None:
                tasks[f"{k}@stopping"] = {"seconds": st.fence, "handle": st.handle}
        self.fenceguard.guard(tasks, self.contact)

    def _env(self, task: Task, env: Mapping[str, str]) -> dict[str, str]:
        # of the agent's own environment only what locates and localizes a program: the
        # rest (its PLAIT_* settings, a cloud's keys, a proxy's password) is not the tasks'
        host = {k: v for k in TASK_HOST_ENV if (v := os.environ.get(k)) is not None}
        host.setdefault("PATH", os.defpath)
        # (the task's own credential, never one its spec names: a job's env is every
        # task's; bound to the endpoint discovery has for it)
        endpoint = self._endpoint(task)
        own = self.credentials.get(task.key)
        return {**host, **{k: v for k, v in env.items() if k != "PLAIT_TASK_CREDENTIAL"},
                **({"PLAIT_TASK_CREDENTIAL": endpoint_credential(own, endpoint)}
                   if own else {}),
                "PLAIT_TASK_ENDPOINT": endpoint,
                "PLAIT_PORT": str(task.port),
                "PLAIT_JOB": task.job, "PLAIT_TASK_INDEX": str(task.index),
                "PLAIT_MACHINE": self.machine,
                **({"PLAIT_FAULT_DOMAIN": str(self.describe["fault_domain"])}
                   if self.describe.get("fault_domain") else {}),
                "PLAIT_DATA_DIR": str(self.data_dir / "tasks" / task.key)}

    def _endpoint(self, task: Task) -> str:
        """The task's endpoint as its status reports it to discovery (host:port)."""
        return f"{self.advertise}:{task.port}"

    def _supervise(self, now: float) -> None:
        """Notice exits; the state machine applies the restart policy (``always``
        starts the task again after a backoff; ``on-failure`` too, unless it exited 0
        or used its retries; ``never`` does not: a task not started again is final)."""
        for key, handle in list(self.handles.items()):
            code = self.runtime.poll(handle)
            if code is None:
                continue
            task = self.tasks[key]
            for _ in range(16):  # what it printed last (a batch task's result) is kept
                data, task.log_offset = self.runtime.read_log(handle, task.log_offset,
                                                              CHUNK_BYTES)
                if not data:
                    break
                self._output.append({"job": task.job, "index": task.index,
                                     "data": data.decode(errors="replace")})
            # a SIGKILL this agent did not send (its stops are not polled here) and
            # that the memory cgroup does not count as out of memory
            killed = code == -signal.SIGKILL and self.runtime.oom_killed(handle) is False
            # what its main process left running goes with it (its cgroups, its process
            # group), as a container's processes do: it would hold the task's groups
            # (no restart could start) or run on as a second copy beside the restart
            with contextlib.suppress(OSError, RuntimeError):
                self.runtime.stop(handle, grace=0)
            self.metrics.exits.labels("killed" if killed else "exited").inc()
            del self.handles[key]
            task.handle = None
            self.core.exited(key, code, now, killed)
            self._dirty = True
            self.log.info("task exited", job=task.job, index=task.index,
                          revision=task.revision, exit_code=code, killed=task.killed,
                          final=task.final, restarts=task.restarts)
        self.core.supervise(now)

    def _stop(self, key: str, remove: bool = False, reason: str = "",
              cause: str | None = None, grace: float | None = None) -> None:
        """Stop the task in the background (its heartbeats report it ``stopping`` until
        its process is gone); ``remove``: then forget its cgroups, logs and files.
        ``reason`` and ``cause`` (the id of the request behind it) are logged."""
        handle = self.handles.pop(key, None)
        task = self.tasks.get(key)
        self.core.stop(key, reason, cause, remove)
        if task is not None:
            task.handle = None
        if handle is None:
            if remove and key not in self.stopping:
                self._clean(key)
            return
        spec = self.specs.get(key)
        if grace is None:
            grace = JobSpec.model_fields["kill_timeout_seconds"].default if spec is None \
                else spec.kill_timeout_seconds
        assert task is not None
        self.log.info("task stopping", job=task.job, index=task.index, revision=task.revision,
                      reason=reason, request_id=cause, pid=handle.pid, grace_s=grace)
        self._stop_later(key, Stopping(task.job, task.index, task.revision, handle.to_dict(),
                                       float(grace), remove, fence=task.fence), handle)

    def _stop_later(self, key: str, stopping: Stopping, handle: Handle | None) -> None:
        def stop() -> None:
            if handle is not None:
                self.runtime.stop(handle, grace=stopping.grace)
            if stopping.remove:
                self._clean(key)
        stopping.future = self._stops.submit(stop)
        stopping.future.add_done_callback(lambda _: self.wakeup.set())
        self.stopping[key] = stopping
        self.core.stopping.add(key)
        self._dirty = True

    def _stopped(self) -> None:
        """Forget the stops that have finished (the next report leaves them out: the
        control plane then takes them as stopped)."""
        for key, stopping in list(self.stopping.items()):
            if stopping.future is not None and stopping.future.done():
                del self.stopping[key]
                self.core.stopped(key)
                self._dirty = True
                error = stopping.future.exception()
                if error is not None:
                    self.log.error("task stop failed", job=stopping.job, index=stopping.index,
                                   revision=stopping.revision, error=str(error))

    def _clean(self, key: str) -> None:
        self.runtime.cleanup(self._runtime_key(key))
        shutil.rmtree(self.data_dir / "tasks" / key, ignore_errors=True)

    def _remove(self, key: str, reason: str, cause: str | None = None,
                keep_files: bool = False) -> None:
        """Stop the task and forget it (``keep_files``: its files stay on disk)."""
        self._stop(key, remove=not keep_files, reason=reason, cause=cause)
        self.core.forget(key)
        self.specs.pop(key, None)
        self.probes.pop(key, None)
        self.credentials.pop(key, None)
        self.prober.forget(key)
        self._cpu.pop(key, None)

    # -- what a report says ----------------------------------------------------------------
    def _statuses(self, now: float) -> tuple[list[TaskReport], list[dict[str, Any]]]:
        """The statuses of the next report (the state machine's, with each running
        task's health, endpoint and cores), and the output to send with it."""
        statuses: list[TaskReport] = []
        chunks, self._output = self._output, []
        for key, st in self.core.statuses():
            task = self.tasks[key]
            handle = self.handles.get(key)
            if st.phase is Phase.RUNNING and handle is not None:
                task.healthy = self._healthy(task, now)
                statuses.append(TaskReport.model_construct(
                    job=task.job, index=task.index, revision=task.revision,
                    phase=Phase.RUNNING, healthy=task.healthy, endpoint=self._endpoint(task),
                    cpu=self._cores(key, handle, now)))
                data, offset = self._output_of(handle, task.log_offset)
                if data:
                    chunks.append({"job": task.job, "index": task.index,
                                   "data": data.decode(errors="replace")})
                    task.log_offset = offset
            else:
                statuses.append(TaskReport.model_construct(
                    job=st.job, index=st.index, revision=st.revision, phase=st.phase,
                    healthy=False, exit_code=st.exit_code, final=st.final, killed=st.killed))
        for st in self.core.stopping_statuses(
                (s.job, s.index, s.revision) for s in self.stopping.values()):
            statuses.append(TaskReport.model_construct(
                job=st.job, index=st.index, revision=st.revision, phase=st.phase,
                healthy=False))
        return statuses, chunks

    def _healthy(self, task: Task, now: float) -> bool:
        probe = self.probes.get(task.key)
        if not probe:
            return True  # no probe: healthy while the process runs
        # (an HTTP probe needs no environment: not built for it)
        key = self._runtime_key(task.key)
        spec = self.specs.get(task.key)
        env = self._env(task, spec.env if spec is not None else {}) if probe.get(
            "command") else {}
        return self.prober.check(task.key, probe, self.advertise, task.port, env,
                                 self.data_dir / "tasks" / task.key, now + PROBE_SLACK,
                                 wrap=lambda argv, env, cwd: self.runtime.probe_command(
                                     key, argv, env, cwd))

    def _cores(self, key: str, handle: Any, now: float) -> float | None:
        """The cores the task used since the last report (its CPU time over the wall
        time between two reports at least half a second apart); None until known."""
        try:
            used = self.runtime.cpu_seconds(handle)
        except (OSError, ValueError, AttributeError):
            used = None
        if used is None:
            self._cpu.pop(key, None)
            return None
        before = self._cpu.get(key)
        if before is None or used < before[1]:  # (a restarted task: a new count)
            self._cpu[key] = (now, used, None)
            return None
        if now - before[0] < 0.5:
            return before[2]
        cores = round(max(0.0, used - before[1]) / (now - before[0]), 3)
        self._cpu[key] = (now, used, cores)
        return cores

    def _output_of(self, handle: Any, offset: int) -> tuple[bytes, int]:
        """A task's output after ``offset`` for the control plane, at most
        ``CHUNK_BYTES``: the control plane keeps the last ``CHUNK_BYTES`` of each task's
        output, so a task more than two of those behind (a burst of megabytes) is sent its
        newest half of that, after a line that says how much was left out here
        (its agent keeps all of it). It took 45 s of reports to bring a 5 MB line's
        next lines to ``plait task logs``."""
        data, after = self.runtime.read_log(handle, offset, CHUNK_BYTES)
        if len(data) < CHUNK_BYTES:
            return data, after
        _, end = self.runtime.read_log(handle, 1 << 62, 0)  # (where its output ends)
        if end - after <= CHUNK_BYTES:  # (a report or two behind: sent in order)
            return data, after
        keep = CHUNK_BYTES // 2  # (the newest part, and the note before it, in the tail)
        left_out = end - keep - offset
        data, after = self.runtime.read_log(handle, end - keep, keep)
        note = (f"\n[plait: {left_out} bytes of output not sent here (the control plane "
                f"keeps the last {CHUNK_BYTES // 1024} KiB of a task's output; its agent's "
                "log keeps all of it)]\n")
        return note.encode() + data, after

    def close(self) -> None:
        """Let go of the data dir (another agent may take it) and of the prober; the
        tasks run on, for the next agent to adopt."""
        self.prober.close()
        self.wakeup.close()
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None
