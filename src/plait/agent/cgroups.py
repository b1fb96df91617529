"""The cgroups of the agent's process runtime (``plait.agent.runtime``): which
isolation the machine offers (detected once: cgroup2, cgroup1 or rlimit), each
task's groups with its limits, and killing and removing them. The modes are
described in ``plait.agent.runtime``."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import signal
import time
from pathlib import Path
from urllib.parse import quote

log = logging.getLogger("plait.agent.runtime")

CGROUP_ROOT = Path("/sys/fs/cgroup")
CPU_PERIOD_US = 100_000
#: the kernel refuses a cfs quota below 1 ms
MIN_CPU_QUOTA_US = 1_000
ISOLATIONS = ("cgroup2", "cgroup1", "rlimit")
_V1_CONTROLLERS = ("memory", "cpu", "pids")
_V2_CONTROLLERS = ("cpu", "memory", "pids")


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


def task_name(key: str) -> str:
    """The file and cgroup name of a task key: percent-encoded, never hidden or ``..``."""
    if not key:
        raise ValueError("empty task key")
    name = quote(key, safe="-_.@:+=,")
    if name.startswith("."):
        name = "%2E" + name[1:]
    return name


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

class Cgroups:
    """The isolation part of a runtime (a mixin of ``ProcessRuntime``: it sets
    ``cgroup_root``, ``cgroup_parents``, ``_why_not`` and ``isolation``)."""

    cgroup_root: Path
    cgroup_parents: dict[str, Path]
    _why_not: list[str]
    isolation: str

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

    def _kill_cgroups(self, groups: list[Path]) -> None:
        for group in groups:
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
