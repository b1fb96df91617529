"""The agent's process runtime: start, watch, stop and adopt the tasks of one machine.

Each task runs as a plain process in its own session (``start_new_session=True``, so
its pid is its process group id), with stdin from /dev/null and stdout and stderr
appended to ``<data_dir>/logs/<name>.log``. Limits come from the best isolation the
machine offers, detected once when the runtime starts:

``cgroup2``
    a ``cgroup2`` mount at /sys/fs/cgroup whose ``cgroup.controllers`` lists cpu,
    memory and pids, and under which we can create a group. Tasks live in
    ``/sys/fs/cgroup/plait/<name>`` with ``cpu.max`` (``cpu * 100000`` per 100000 µs),
    ``memory.max`` (``memory.swap.max`` 0 where it exists) and ``pids.max``.
``cgroup1``
    the memory and cpu controllers mounted as v1 hierarchies under /sys/fs/cgroup
    (pids too if mounted). Tasks live in ``plait/<name>`` below the agent's own cgroup
    in each hierarchy (so they stay inside whatever its supervisor gave the agent),
    with ``cpu.cfs_quota_us`` over a 100000 µs period, ``memory.limit_in_bytes`` (and
    ``memory.memsw.limit_in_bytes``, no swap, where it exists) and ``pids.max``.
``rlimit``
    no usable cgroups: memory is bounded by ``RLIMIT_AS``; cpu and pids are not
    limited (``RLIMIT_NPROC`` counts per user and we run as root, so it is not used).

In every mode core dumps are off (``RLIMIT_CORE`` 0). A task is put in its cgroups
*before it execs*: the forked child writes its own pid to each group's
``cgroup.procs`` in ``preexec_fn`` (and sets its rlimits there), so neither the task
nor anything it forks ever runs outside its limits. ``preexec_fn`` only makes system
calls (``os.open``/``os.write``/``setrlimit``) on values prepared before the fork.

Task keys (such as ``job/3``) are percent-encoded into file and cgroup names.

A :class:`Handle` is JSON-serialisable so the agent can persist it and, after it
restarts, :meth:`ProcessRuntime.adopt` the still-running process; the start time from
``/proc/<pid>/stat`` tells a live task from a reused pid. A process that is not our
child (an adopted one) is watched through /proc; its exit code cannot be known and is
reported as :data:`EXIT_UNKNOWN`.

Logs are rotated copy-then-truncate (the task keeps its O_APPEND descriptor, so its
next write lands at the start of the emptied file); a few bytes written between the
copy and the truncate are lost. :meth:`ProcessRuntime.read_log` offsets count every
byte of the task's output since its log was created, across rotations.
"""

from __future__ import annotations

import contextlib
import logging
import os
import resource
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from plait.agent.cgroups import (
    CGROUP_ROOT,
    ISOLATIONS,
    Cgroups,
    _cgroup_pids,
    _enter_cgroups,
    task_name,
)
from plait.agent.tasklogs import DEFAULT_MAX_LOG_BYTES, OLD_LOGS, TaskLogs

log = logging.getLogger(__name__)

#: reported by :meth:`ProcessRuntime.poll` and :meth:`ProcessRuntime.stop` for a process
#: that exited but was not our child (adopted after an agent restart): the code is lost.
#: Note that Popen also reports a death by SIGHUP as -1.
EXIT_UNKNOWN = -1


_CGROUP_SLACK = 1.5  # seconds stop() may spend after the grace (kill, reap, rmdir)


@dataclass
class Handle:
    """A started (or adopted) task process, as the agent persists it."""

    key: str
    pid: int
    pgid: int
    #: field 22 of /proc/<pid>/stat (clock ticks after boot): tells our process from a
    #: later one that reused its pid
    start_time: int
    log_path: Path
    #: the task's cgroup directory (cgroup2: its only one; cgroup1: the memory one)
    cgroup: Path | None = None
    #: every cgroup directory of the task (cgroup1: one per hierarchy)
    cgroups: list[Path] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "pid": self.pid,
            "pgid": self.pgid,
            "start_time": self.start_time,
            "log_path": str(self.log_path),
            "cgroup": None if self.cgroup is None else str(self.cgroup),
            "cgroups": [str(p) for p in self.cgroups],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Handle:
        cgroup = data.get("cgroup")
        return cls(
            key=str(data["key"]),
            pid=int(data["pid"]),
            pgid=int(data["pgid"]),
            start_time=int(data["start_time"]),
            log_path=Path(data["log_path"]),
            cgroup=None if cgroup is None else Path(cgroup),
            cgroups=[Path(p) for p in data.get("cgroups", [])],
        )


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _proc_stat(pid: int) -> tuple[str, int, int] | None:
    """(state, pgid, start_time) of a process from /proc/<pid>/stat, or None if gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return None
    except OSError:
        return None
    # comm (field 2) is in parentheses and may hold anything; fields resume after the last ')'
    rest = raw[raw.rindex(b")") + 2 :].split()
    # rest[0] is field 3 (state), rest[2] field 5 (pgrp), rest[19] field 22 (starttime)
    return rest[0].decode(), int(rest[2]), int(rest[19])


def proc_start_time(pid: int) -> int | None:
    st = _proc_stat(pid)
    return None if st is None else st[2]


def _waitstatus_code(status: int) -> int:
    return os.waitstatus_to_exitcode(status)


class ProcessRuntime(Cgroups, TaskLogs):
    """Runs a machine's tasks as processes, limited by cgroups where it can."""

    def __init__(
        self,
        data_dir: Path,
        *,
        max_log_bytes: int = DEFAULT_MAX_LOG_BYTES,
        isolation: str | None = None,
        cgroup_root: Path = CGROUP_ROOT,
    ) -> None:
        """``isolation`` forces a mode (``rlimit`` always works; a cgroup mode the
        machine lacks raises RuntimeError); by default the best available is used."""
        self.data_dir = Path(data_dir)
        self.log_dir = self.data_dir / "logs"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.max_log_bytes = max_log_bytes
        self.cgroup_root = cgroup_root
        #: hierarchy name ("unified" for cgroup2, else the v1 controller) -> the
        #: ``plait`` directory the tasks' groups are made in
        self.cgroup_parents: dict[str, Path] = {}
        self._why_not: list[str] = []
        if isolation is not None and isolation not in ISOLATIONS:
            raise ValueError(f"isolation must be one of {ISOLATIONS}, not {isolation!r}")
        self.isolation: str = self._detect(isolation)
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._handles: dict[str, Handle] = {}
        #: exit codes of adopted (non-child) tasks seen to have exited
        self._foreign_exit: dict[str, int] = {}
        #: each task log's base offset (``_base``), by log name
        self._bases: dict[str, int] = {}
        log.info("process runtime: %s", self.describe())

    # ----------------------------------------------------------------- isolation

    # ----------------------------------------------------------------- start

    def _argv(self, key: str, command: str, args: list[str], env: Mapping[str, str],
              cwd: Path) -> list[str]:
        """What the task's process execs (in ``cwd``, with ``env``, in its cgroups): here
        the command itself; a subclass may wrap it. Called before the task's cgroups are
        made, so it may raise to refuse the start."""
        return [command, *args]

    def probe_command(self, key: str, argv: list[str], env: dict[str, str], cwd: Path
                      ) -> tuple[list[str], dict[str, str], Callable[[], None] | None]:
        """How a command probe of task ``key`` starts in the task's own isolation: the
        argv (wrapped as the task's command is), its environment, and what its child
        runs before the exec (it joins the task's cgroups: their limits hold it, and
        the task's stop kills what it left behind)."""
        wrapped = self._argv(key, argv[0], argv[1:], env, cwd)
        procs = [os.fsencode(g / "cgroup.procs") for g in self._group_dirs(key).values()
                 if g.is_dir()]

        return wrapped, self._exec_env(env), (
            (lambda: _enter_cgroups(procs)) if procs else None)

    def _exec_env(self, env: dict[str, str]) -> dict[str, str]:
        """The environment the task's process is started with (its own, here; a
        subclass that wraps the command may pass it on another way)."""
        return env

    def start(
        self,
        key: str,
        command: str,
        args: list[str],
        env: dict[str, str],
        cwd: Path,
        cpu: float,
        memory_mb: int,
        pids: int = 512,
    ) -> Handle:
        """Start a task. It gets exactly ``env`` (the executable is looked up in its
        PATH, or /bin:/usr/bin), runs in ``cwd``, in a new session, limited to ``cpu``
        cores, ``memory_mb`` MiB and ``pids`` processes (as far as the isolation can)."""
        if cpu <= 0 or memory_mb <= 0 or pids <= 0:
            raise ValueError("cpu, memory_mb and pids must be positive")
        old = self._handles.get(key)
        if old is not None and self.poll(old) is None:
            raise RuntimeError(f"task {key} is already running (pid {old.pid})")
        name = task_name(key)
        log_path = self.log_dir / f"{name}.log"
        argv = self._argv(key, command, args, env, cwd)
        dirs = self._make_groups(key, cpu, memory_mb, pids) if self.cgroup_parents else {}

        # everything the child needs, prepared before the fork
        procs_files = [os.fsencode(g / "cgroup.procs") for g in dirs.values()]
        mem_bytes = memory_mb * 1024 * 1024
        limit_as = self.isolation == "rlimit"

        def child_setup() -> None:
            _enter_cgroups(procs_files)
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
            if limit_as:
                resource.setrlimit(resource.RLIMIT_AS, (mem_bytes, mem_bytes))

        try:
            with open(log_path, "ab") as out:
                proc = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    cwd=cwd,
                    env=self._exec_env(env),
                    start_new_session=True,
                    preexec_fn=child_setup,
                    close_fds=True,
                )
        except BaseException:
            for group in dirs.values():
                with contextlib.suppress(OSError):
                    group.rmdir()
            raise
        start_time = proc_start_time(proc.pid)
        try:
            pgid = os.getpgid(proc.pid)
        except OSError:
            pgid = proc.pid
        cgroups = list(dirs.values())
        primary = dirs.get("unified", dirs.get("memory"))
        handle = Handle(
            key=key,
            pid=proc.pid,
            pgid=pgid,
            start_time=start_time if start_time is not None else -1,
            log_path=log_path,
            cgroup=primary,
            cgroups=cgroups,
        )
        self._procs[key] = proc
        self._handles[key] = handle
        self._foreign_exit.pop(key, None)
        log.debug("started %s: pid %d, %s %s", key, proc.pid, command, args)
        return handle

    # ----------------------------------------------------------------- watch

    def _child(self, handle: Handle) -> subprocess.Popen[bytes] | None:
        proc = self._procs.get(handle.key)
        return proc if proc is not None and proc.pid == handle.pid else None

    def _same_process(self, handle: Handle) -> bool:
        """The handle's process still exists (a zombie counts) and is not a reused pid."""
        st = _proc_stat(handle.pid)
        return st is not None and st[2] == handle.start_time

    def _foreign_alive(self, handle: Handle) -> bool:
        st = _proc_stat(handle.pid)
        return st is not None and st[2] == handle.start_time and st[0] not in ("Z", "X")

    def adopt(self, handle_dict: Mapping[str, Any]) -> Handle | None:
        """Take back a task started before the agent restarted: its handle if that pid
        is alive with the same start time, else None."""
        handle = Handle.from_dict(handle_dict)
        if not self._foreign_alive(handle):
            return None
        mine = self._child(handle)
        if mine is None:
            self._procs.pop(handle.key, None)
        self._handles[handle.key] = handle
        self._foreign_exit.pop(handle.key, None)
        log.info("adopted %s: pid %d", handle.key, handle.pid)
        return handle

    def _reap_foreign(self, handle: Handle) -> int | None:
        """The exit code of an exited adopted process, or None while it runs."""
        if handle.key in self._foreign_exit:
            return self._foreign_exit[handle.key]
        if self._foreign_alive(handle):
            return None
        code = EXIT_UNKNOWN
        # it may still be our child (adopted by the same process that started it):
        # reap it for its real code, unless the pid now belongs to another task of ours
        ours = any(p.pid == handle.pid for p in self._procs.values())
        if not ours and self._same_process(handle):
            try:
                pid, status = os.waitpid(handle.pid, os.WNOHANG)
                if pid == handle.pid:
                    code = _waitstatus_code(status)
            except ChildProcessError:
                pass
        self._foreign_exit[handle.key] = code
        return code

    def poll(self, handle: Handle) -> int | None:
        """The task's exit code once it has exited (negative: killed by that signal;
        :data:`EXIT_UNKNOWN` for an adopted process), else None. Its cgroups stay until
        :meth:`stop` (which returns at once for an exited task, after killing anything
        left in its group) or :meth:`cleanup`."""
        proc = self._child(handle)
        if proc is not None:
            return proc.poll()
        return self._reap_foreign(handle)

    @staticmethod
    def oom_killed(handle: Handle) -> bool | None:
        """Whether the kernel's out-of-memory killer killed a process of the task's
        memory cgroup (``oom_kill`` of cgroup v2's ``memory.events``, or of v1's
        ``memory.oom_control``); None when the task has no memory cgroup to ask."""
        for group in handle.cgroups:
            for name in ("memory.events", "memory.oom_control"):
                try:
                    text = (group / name).read_text()
                except OSError:
                    continue
                for line in text.splitlines():
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value or 0) > 0
        return None

    def cpu_seconds(self, handle: Handle) -> float | None:
        """CPU time the task has used so far, in seconds: its cgroup's (cgroup v2's
        ``cpu.stat`` usage_usec, or v1's ``cpuacct.usage``), else its leader's user
        and system time with its reaped children's (``/proc/<pid>/stat``); None once
        it is gone."""
        for group in handle.cgroups:
            try:
                for line in (group / "cpu.stat").read_text().splitlines():
                    key, _, value = line.partition(" ")
                    if key == "usage_usec":
                        return int(value) / 1e6
            except (OSError, ValueError):
                pass
            try:
                return int((group / "cpuacct.usage").read_text()) / 1e9
            except (OSError, ValueError):
                pass
        try:
            raw = Path(f"/proc/{handle.pid}/stat").read_bytes()
        except OSError:
            return None
        rest = raw[raw.rindex(b")") + 2:].split()
        if int(rest[19]) != handle.start_time:  # (field 22: a pid reused since)
            return None
        # fields 14-17 (utime, stime, cutime, cstime) are rest[11:15], in clock ticks
        return sum(int(x) for x in rest[11:15]) / _CLOCK_TICKS

    def _exited(self, handle: Handle) -> bool:
        """Whether the task's leader exited, without reaping a child of ours (its zombie
        keeps its pid, and so its process group id, from being reused)."""
        proc = self._child(handle)
        if proc is None:
            return not self._foreign_alive(handle)
        if proc.returncode is not None:
            return True
        try:
            info = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return True
        return info is not None

    def _kill_group(self, handle: Handle, sig: int) -> None:
        leader_held = self._child(handle) is not None or self._same_process(handle)
        if leader_held:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(handle.pgid, sig)
        else:
            # the leader is gone and its pid may be reused: signal only the members of
            # its group that started after it
            for pid in self._group_members(handle):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)

    @staticmethod
    def _group_members(handle: Handle) -> list[int]:
        out = []
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                st = _proc_stat(int(entry.name))
                if st is not None and st[1] == handle.pgid and st[2] >= handle.start_time:
                    out.append(int(entry.name))
        return out

    def stop(self, handle: Handle, grace: float = 10.0) -> int | None:
        """SIGTERM the task's process group, SIGKILL it (and anything left in its
        cgroups) after ``grace`` seconds, remove its cgroups; the exit code, or None if
        the leader had not died by ``grace`` + 2 s (it is in uninterruptible sleep)."""
        start = time.monotonic()
        grace = max(0.0, grace)
        term_deadline = start + grace
        hard_deadline = term_deadline + _CGROUP_SLACK
        if not self._exited(handle):
            self._kill_group(handle, signal.SIGTERM)
            delay = 0.005
            while not self._exited(handle) and time.monotonic() < term_deadline:
                time.sleep(min(delay, max(0.0, term_deadline - time.monotonic())))
                delay = min(delay * 2, 0.05)
        # whatever is left of the group (the leader, or children that outlived it)
        self._kill_group(handle, signal.SIGKILL)
        self._kill_cgroups(handle.cgroups)
        code: int | None
        proc = self._child(handle)
        if proc is not None:
            try:
                code = proc.wait(timeout=max(0.01, hard_deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                code = None
        else:
            while self._foreign_alive(handle) and time.monotonic() < hard_deadline:
                time.sleep(0.01)
            code = self._reap_foreign(handle)
        # members of the group (or escapees in the cgroup) that were forking meanwhile
        self._kill_cgroups(handle.cgroups)
        self._remove_cgroups(handle.cgroups, hard_deadline)
        log.info("stopped %s: exit %s after %.2fs", handle.key, code,
                 time.monotonic() - start)
        return code

    # ----------------------------------------------------------------- logs

    # ----------------------------------------------------------------- cleanup

    def cleanup(self, key: str) -> None:
        """Forget a task that left the machine: kill it if it still runs, remove its
        cgroups and its logs."""
        handle = self._handles.get(key)
        if handle is not None and self.poll(handle) is None:
            self.stop(handle, grace=0)
        groups = list(self._group_dirs(key).values())
        if handle is not None:
            groups += [g for g in handle.cgroups if g not in groups]
        for group in groups:
            if group.exists():
                for pid in _cgroup_pids(group):
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, signal.SIGKILL)
        self._remove_cgroups(groups, time.monotonic() + _CGROUP_SLACK)
        name = task_name(key)
        for path in [self.log_dir / f"{name}.log", self._base_path(name),
                     *(self.log_dir / f"{name}.log.{i}" for i in range(1, OLD_LOGS + 1))]:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        self._procs.pop(key, None)
        self._handles.pop(key, None)
        self._foreign_exit.pop(key, None)
        self._bases.pop(name, None)


__all__ = ["CGROUP_ROOT", "DEFAULT_MAX_LOG_BYTES", "EXIT_UNKNOWN", "Handle",
           "ProcessRuntime", "proc_start_time", "task_name"]
