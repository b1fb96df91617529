"""Helpers shared by the runtime tests (process and sandbox): the isolation modes to
run each test under, bounded waits, and whether a process is gone."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from plait.agent import Handle, ProcessRuntime
from plait.testing import wait_for as wait_for  # (the suite's one; tests import it here)

PY = sys.executable
WAIT = 30.0  # generous bound on every wait


def _detected_isolation() -> str:
    with tempfile.TemporaryDirectory() as tmp:
        return ProcessRuntime(Path(tmp)).isolation


ISOLATION = _detected_isolation()
#: the machine's isolation and, where that is a cgroup mode, rlimit too
MODES = [ISOLATION] if ISOLATION == "rlimit" else [ISOLATION, "rlimit"]


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


class RuntimeEnv:
    """What the runtime tests' environments share: the handles they started (every
    one stopped and cleaned up at the end), their logs, their exits."""

    rt: ProcessRuntime
    handles: list[tuple[ProcessRuntime, Handle]]

    def log_text(self, h: Handle) -> str:
        return h.log_path.read_text() if h.log_path.exists() else ""

    def wait_log(self, h: Handle, text: str) -> None:
        wait_for(lambda: text in self.log_text(h), what=f"{text!r} in the log")

    def wait_exit(self, h: Handle, rt: ProcessRuntime | None = None) -> int:
        rt = rt or self.rt
        codes: list[int | None] = []

        def done() -> bool:
            codes.append(rt.poll(h))
            return codes[-1] is not None

        wait_for(done, what=f"{h.key} to exit")
        code = codes[-1]
        assert code is not None
        return code

    def close(self) -> None:
        for rt, h in self.handles:
            if rt.poll(h) is None:
                rt.stop(h, grace=0)
            rt.cleanup(h.key)
