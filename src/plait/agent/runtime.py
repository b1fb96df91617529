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
import errno
import logging
import os
import resource
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

log = logging.getLogger(__name__)

#: reported by :meth:`ProcessRuntime.poll` and :meth:`ProcessRuntime.stop` for a process
#: that exited but was not our child (adopted after an agent restart): the code is lost.
#: Note that Popen also reports a death by SIGHUP as -1.
EXIT_UNKNOWN = -1

CGROUP_ROOT = Path("/sys/fs/cgroup")
CPU_PERIOD_US = 100_000
#: the kernel refuses a cfs quota below 1 ms
MIN_CPU_QUOTA_US = 1_000
DEFAULT_MAX_LOG_BYTES = 10 * 1024 * 1024
#: rotated logs kept per task: <name>.log.1 (newest) .. <name>.log.3
OLD_LOGS = 3
#: a log this many times over ``max_log_bytes`` is a flood: only its last ``max_log_bytes``
#: are kept when it is rotated
FLOOD = 4
ISOLATIONS = ("cgroup2", "cgroup1", "rlimit")


def _enter_cgroups(procs_files: list[bytes]) -> None:
    """Move the calling process into the cgroups of these ``cgroup.procs`` files (run
    in a child between its fork and its exec: system calls only)."""
    pid = str(os.getpid()).encode()
    for path in procs_files:
        fd = os.open(path, os.O_WRONLY)
        try:
            os.write(fd, pid)
        finally:
            os.close(fd)
_V1_CONTROLLERS = ("memory", "cpu", "pids")
_V2_CONTROLLERS = ("cpu", "memory", "pids")
_CGROUP_SLACK = 1.5  # seconds stop() may spend after the grace (kill, reap, rmdir)


def task_name(key: str) -> str:
    """The file and cgroup name of a task key: percent-encoded, never hidden or ``..``."""
    if not key:
        raise ValueError("empty task key")
    name = quote(key, safe="-_.@:+=,")
    if name.startswith("."):
        name = "%2E" + name[1:]
    return name


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


def _unescape_mount(path: str) -> str:
    # /proc/self/mounts escapes space, tab, newline and backslash as \ooo
    out, i = [], 0
    while i < len(path):
        if path[i] == "\\" and path[i + 1 : i + 4].isdigit() and i + 4 <= len(path):
            out.append(chr(int(path[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(path[i])
            i += 1
    return "".join(out)


def _mounts() -> list[tuple[str, str, set[str]]]:
    """(mount point, fs type, options) of every mount."""
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        parts = line.split()
        if len(parts) >= 4:
            out.append((_unescape_mount(parts[1]), parts[2], set(parts[3].split(","))))
    return out


def _own_cgroups_v1() -> dict[str, str]:
    """Controller -> the agent's own cgroup path in that v1 hierarchy."""
    out: dict[str, str] = {}
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) == 3 and parts[1]:
            for ctrl in parts[1].split(","):
                out[ctrl] = parts[2]
    return out


def _write(path: Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _cgroup_pids(group: Path) -> list[int]:
    try:
        return [int(x) for x in (group / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


def _waitstatus_code(status: int) -> int:
    return os.waitstatus_to_exitcode(status)


class ProcessRuntime:
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

    def _detect(self, forced: str | None) -> str:
        order = ISOLATIONS if forced is None else (forced,)
        for mode in order:
            if mode == "cgroup2" and self._try_cgroup2():
                return mode
            if mode == "cgroup1" and self._try_cgroup1():
                return mode
            if mode == "rlimit":
                return mode
        raise RuntimeError(f"{forced} isolation is not available: {'; '.join(self._why_not)}")

    def _probe(self, parent: Path, files: tuple[str, ...]) -> bool:
        probe = parent / f".probe-{os.getpid()}"
        try:
            probe.mkdir(exist_ok=True)
            try:
                missing = [f for f in files if not (probe / f).exists()]
            finally:
                probe.rmdir()
        except OSError as e:
            self._why_not.append(f"cannot create a group in {parent}: {e.strerror}")
            return False
        if missing:
            self._why_not.append(f"{parent} groups lack {', '.join(missing)}")
            return False
        return True

    def _try_cgroup2(self) -> bool:
        root = self.cgroup_root
        if not any(mp == str(root) and fs == "cgroup2" for mp, fs, _ in _mounts()):
            self._why_not.append(f"no cgroup2 mount at {root}")
            return False
        try:
            available = set((root / "cgroup.controllers").read_text().split())
        except OSError as e:
            self._why_not.append(f"cannot read {root}/cgroup.controllers: {e.strerror}")
            return False
        missing = [c for c in _V2_CONTROLLERS if c not in available]
        if missing:
            self._why_not.append(f"cgroup2 lacks controllers {', '.join(missing)}")
            return False
        parent = root / "plait"
        try:
            for group in (root, parent):
                group.mkdir(exist_ok=True)
                enabled = set((group / "cgroup.subtree_control").read_text().split())
                todo = [c for c in _V2_CONTROLLERS if c not in enabled]
                if todo:
                    _write(group / "cgroup.subtree_control", " ".join("+" + c for c in todo))
        except OSError as e:
            self._why_not.append(f"cannot delegate cgroup2 controllers: {e.strerror}")
            return False
        if not self._probe(parent, ("cpu.max", "memory.max", "pids.max")):
            return False
        self.cgroup_parents = {"unified": parent}
        return True

    def _try_cgroup1(self) -> bool:
        root = str(self.cgroup_root)
        own = _own_cgroups_v1()
        parents: dict[str, Path] = {}
        for ctrl in _V1_CONTROLLERS:
            for mp, fs, opts in _mounts():
                if fs == "cgroup" and ctrl in opts and (mp + "/").startswith(root + "/"):
                    base = Path(mp)
                    mine = base / own.get(ctrl, "/").lstrip("/")
                    # in a container /proc/self/cgroup may name a path the mount lacks
                    parents[ctrl] = (mine if mine.is_dir() else base) / "plait"
                    break
        missing = [c for c in ("memory", "cpu") if c not in parents]
        if missing:
            self._why_not.append(f"no cgroup1 {' or '.join(missing)} hierarchy under {root}")
            return False
        needs = {
            "memory": ("memory.limit_in_bytes",),
            "cpu": ("cpu.cfs_quota_us", "cpu.cfs_period_us"),
            "pids": ("pids.max",),
        }
        for ctrl, parent in list(parents.items()):
            try:
                parent.mkdir(exist_ok=True)
            except OSError as e:
                self._why_not.append(f"cannot create {parent}: {e.strerror}")
                if ctrl == "pids":
                    del parents[ctrl]
                    continue
                return False
            if not self._probe(parent, needs[ctrl]):
                if ctrl == "pids":
                    del parents[ctrl]
                    continue
                return False
        self.cgroup_parents = parents
        return True

    def describe(self) -> str:
        """One line saying how tasks are isolated on this machine."""
        if self.isolation == "cgroup2":
            parent = self.cgroup_parents["unified"]
            return (f"cgroup2: a group per task in {parent}/<key> with cpu.max, "
                    "memory.max and pids.max; core dumps off")
        if self.isolation == "cgroup1":
            where = ", ".join(f"{c}={p}" for c, p in sorted(self.cgroup_parents.items()))
            pids = "pids.max" if "pids" in self.cgroup_parents else "no pids limit"
            return (f"cgroup1: a group per task in <hierarchy>/plait/<key> ({where}) with "
                    f"cpu.cfs_quota_us, memory.limit_in_bytes and {pids}; core dumps off")
        why = "; ".join(self._why_not) or "not tried, rlimit was asked for"
        return (f"rlimit: memory by RLIMIT_AS, no cpu or pids limits, core dumps off "
                f"(no cgroups: {why})")

    # ----------------------------------------------------------------- start

    def _group_dirs(self, key: str) -> dict[str, Path]:
        name = task_name(key)
        return {ctrl: parent / name for ctrl, parent in self.cgroup_parents.items()}

    def _make_groups(self, key: str, cpu: float, memory_mb: int, pids: int) -> dict[str, Path]:
        dirs = self._group_dirs(key)
        mem = memory_mb * 1024 * 1024
        quota = max(MIN_CPU_QUOTA_US, round(cpu * CPU_PERIOD_US))
        made: list[Path] = []
        try:
            for group in dirs.values():
                if group.exists():
                    if _cgroup_pids(group):
                        raise RuntimeError(f"cgroup {group} still has processes")
                    group.rmdir()  # a leftover: start from fresh limits
                group.mkdir()
                made.append(group)
            if self.isolation == "cgroup2":
                g = dirs["unified"]
                _write(g / "cpu.max", f"{quota} {CPU_PERIOD_US}")
                _write(g / "memory.max", str(mem))
                if (g / "memory.swap.max").exists():
                    _write(g / "memory.swap.max", "0")
                _write(g / "pids.max", str(pids))
            else:
                _write(dirs["cpu"] / "cpu.cfs_period_us", str(CPU_PERIOD_US))
                _write(dirs["cpu"] / "cpu.cfs_quota_us", str(quota))
                _write(dirs["memory"] / "memory.limit_in_bytes", str(mem))
                memsw = dirs["memory"] / "memory.memsw.limit_in_bytes"
                if memsw.exists():
                    with contextlib.suppress(OSError):
                        _write(memsw, str(mem))
                if "pids" in dirs:
                    _write(dirs["pids"] / "pids.max", str(pids))
        except BaseException:
            for group in made:
                with contextlib.suppress(OSError):
                    group.rmdir()
            raise
        return dirs

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

    def _kill_cgroups(self, handle: Handle) -> None:
        for group in handle.cgroups:
            kill = group / "cgroup.kill"
            if kill.exists():
                with contextlib.suppress(OSError):
                    _write(kill, "1")
                continue
            for pid in _cgroup_pids(group):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)

    def _remove_cgroups(self, groups: list[Path], deadline: float) -> bool:
        """rmdir the groups, retrying while their killed processes leave."""
        left = [g for g in groups if g.exists()]
        while left:
            for group in list(left):
                try:
                    group.rmdir()
                    left.remove(group)
                except FileNotFoundError:
                    left.remove(group)
                except OSError as e:
                    if e.errno != errno.EBUSY:
                        log.warning("cannot remove cgroup %s: %s", group, e.strerror)
                        left.remove(group)
            if not left:
                return True
            if time.monotonic() >= deadline:
                log.warning("cgroups still busy: %s", ", ".join(map(str, left)))
                return False
            time.sleep(0.02)
        return True

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
        self._kill_cgroups(handle)
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
        self._kill_cgroups(handle)
        self._remove_cgroups(handle.cgroups, hard_deadline)
        log.info("stopped %s: exit %s after %.2fs", handle.key, code,
                 time.monotonic() - start)
        return code

    # ----------------------------------------------------------------- logs

    def _base_path(self, name: str) -> Path:
        return self.log_dir / f"{name}.offset"

    def _base(self, name: str) -> int:
        """The logical offset of the task's current log file's first byte (its output
        rotated away before it), kept in memory once read: only ``_rotate`` changes it."""
        base = self._bases.get(name)
        if base is None:
            try:
                base = int(self._base_path(name).read_text())
            except (OSError, ValueError):
                base = 0
            self._bases[name] = base
        return base

    def _segments(self, log_path: Path) -> list[tuple[Path, int, int]]:
        """(file, logical start, size) of the task's log files, oldest first."""
        name = log_path.name[: -len(".log")]
        try:
            size = log_path.stat().st_size
        except FileNotFoundError:
            size = 0
        start = self._base(name)
        segs = [(log_path, start, size)]
        for i in range(1, OLD_LOGS + 1):
            old = log_path.with_name(f"{log_path.name}.{i}")
            try:
                osize = old.stat().st_size
            except FileNotFoundError:
                break
            start -= osize
            if start < 0:
                break
            segs.append((old, start, osize))
        segs.reverse()
        return segs

    def read_log(self, handle: Handle, offset: int, max_bytes: int = 1 << 20
                 ) -> tuple[bytes, int]:
        """Up to ``max_bytes`` of the task's output from ``offset`` (counted over its
        whole output, across rotations) and the offset after them. An offset older than
        the oldest kept file skips to that file's start."""
        path = handle.log_path
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            size = 0
        start = self._base(path.name[: -len(".log")])
        # a reader at or past the current file's start (every report of a task's
        # output but the first after a rotation) looks at no rotated file
        segs = [(path, start, size)] if offset >= start else self._segments(path)
        first, last = segs[0], segs[-1]
        end = last[1] + last[2]
        if offset >= end:
            return b"", end
        if offset < first[1]:
            offset = first[1]
        for path, seg_start, size in segs:
            if seg_start <= offset < seg_start + size:
                try:
                    with open(path, "rb") as f:
                        f.seek(offset - seg_start)
                        data = f.read(min(max_bytes, seg_start + size - offset))
                except FileNotFoundError:  # rotated away meanwhile: the caller retries
                    return b"", offset
                return data, offset + len(data)
        return b"", offset

    def rotate_logs(self) -> list[str]:
        """Rotate every task log over ``max_log_bytes`` (keeping .1 .. .3); the file
        names rotated."""
        rotated = []
        for path in sorted(self.log_dir.glob("*.log")):
            try:
                if path.stat().st_size > self.max_log_bytes:
                    self._rotate(path)
                    rotated.append(path.name)
            except OSError as e:
                log.warning("cannot rotate %s: %s", path, e.strerror)
        return rotated

    def _rotate(self, path: Path) -> None:
        """Move the log's bytes to ``.1`` (the older ones along) and empty it. The copy is
        bounded, whatever the task writes meanwhile: what the file held, and at most
        ``max_log_bytes`` more. A log many times over the bound (a task that floods its
        output) keeps only its last ``max_log_bytes``, and the older files go: the
        bytes between are dropped (their offsets are skipped)."""
        size = path.stat().st_size
        skipped = size - self.max_log_bytes if size > FLOOD * self.max_log_bytes else 0
        for i in range(OLD_LOGS - 1, 0, -1):
            src = path.with_name(f"{path.name}.{i}")
            if skipped:  # (before the gap: no reader could place them)
                with contextlib.suppress(FileNotFoundError):
                    src.unlink()
            elif src.exists():
                os.replace(src, path.with_name(f"{path.name}.{i + 1}"))
        if skipped:
            with contextlib.suppress(FileNotFoundError):
                path.with_name(f"{path.name}.{OLD_LOGS}").unlink()
        first = path.with_name(f"{path.name}.1")
        with open(path, "rb") as src_f, open(first, "wb") as dst_f:
            src_f.seek(skipped)
            budget = size - skipped + self.max_log_bytes
            while budget > 0:
                chunk = src_f.read(min(1 << 20, budget))
                if not chunk:
                    break
                dst_f.write(chunk)
                budget -= len(chunk)
            copied = dst_f.tell()
        os.truncate(path, 0)  # the task appends (O_APPEND): its next write lands at 0
        name = path.name[: -len(".log")]
        tmp = self._base_path(name).with_suffix(".offset.tmp")
        base = self._base(name) + skipped + copied
        tmp.write_text(str(base))
        os.replace(tmp, self._base_path(name))
        self._bases[name] = base

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


#: the runtimes :func:`create_runtime` makes
RUNTIMES = ("process", "sandbox")


def create_runtime(name: str, data_dir: Path, hide: Sequence[Path] = (),
                   task_user: str = "nobody") -> ProcessRuntime:
    """The agent runtime called ``name`` on ``data_dir``: ``process`` (plain processes,
    :class:`ProcessRuntime`) or ``sandbox`` (the same, each task inside bubblewrap
    namespaces: :class:`plait.agent.sandbox.SandboxRuntime`, which raises RuntimeError
    where bwrap is missing)."""
    if name == "process":
        return ProcessRuntime(data_dir)
    if name == "sandbox":
        from plait.agent.sandbox import SandboxRuntime  # only loaded when asked for

        return SandboxRuntime(data_dir, hide=hide, task_user=task_user)
    raise ValueError(f"unknown agent runtime {name!r}: use one of {', '.join(RUNTIMES)}")


__all__ = ["EXIT_UNKNOWN", "RUNTIMES", "Handle", "ProcessRuntime", "create_runtime",
           "proc_start_time", "task_name"]
