"""Helpers shared by the runtime tests (process and sandbox): the isolation modes to
run each test under, bounded waits, and whether a process is gone."""

from __future__ import annotations

import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from plait.agent import ProcessRuntime

PY = sys.executable
WAIT = 30.0  # generous bound on every wait


def _detected_isolation() -> str:
    with tempfile.TemporaryDirectory() as tmp:
        return ProcessRuntime(Path(tmp)).isolation


ISOLATION = _detected_isolation()
#: the machine's isolation and, where that is a cgroup mode, rlimit too
MODES = [ISOLATION] if ISOLATION == "rlimit" else [ISOLATION, "rlimit"]


def wait_for(cond: Callable[[], bool], timeout: float = WAIT, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def proc_stat(pid: int) -> list[bytes] | None:
    """Fields 3 onwards of /proc/<pid>/stat, or None if the process is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return raw[raw.rindex(b")") + 2 :].split()


def gone(pid: int, start_time: int | None) -> bool:
    """The process no longer runs (gone, a zombie, or its pid reused)."""
    rest = proc_stat(pid)
    return rest is None or rest[0] in (b"Z", b"X") or int(rest[19]) != start_time
