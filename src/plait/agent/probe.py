"""Per-task health probes, run by the agent (a job's ``health`` field).

A probe is an HTTP GET on the task's port or a command. Probes run on a small
thread pool so a slow or hanging task never delays the agent's step: each step
collects the probes that finished and starts the ones that are due, and the task's
health is what the finished probes said. A task is unhealthy from its start until a
probe first passes, and again after ``failure_threshold`` failures in a row.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx


@dataclass
class _State:
    healthy: bool = False
    failures: int = 0
    next_due: float = 0.0
    running: Future[bool] | None = None
    checks: int = 0


def http_probe(url: str, timeout: float) -> bool:
    try:
        r = httpx.get(url, timeout=timeout)
    except Exception:  # any failure (an unreachable task, a URL httpx refuses) fails it
        return False
    return 200 <= r.status_code < 400


def command_probe(argv: list[str], env: dict[str, str], cwd: Path, timeout: float) -> bool:
    """Exit 0 within the timeout; the probe runs in a session of its own, all of which
    is killed at the timeout."""
    try:
        proc = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
    except Exception:  # (a command that cannot start fails the check)
        return False
    try:
        return proc.wait(timeout) == 0
    except subprocess.TimeoutExpired:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return False


class Prober:
    def __init__(self, workers: int = 4) -> None:
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="plait-probe")
        self.states: dict[str, _State] = {}

    def check(self, key: str, probe: dict[str, Any], address: str, port: int,
              env: dict[str, str], cwd: Path, now: float) -> bool:
        """The task's health now; starts its next probe when one is due."""
        st = self.states.setdefault(key, _State())
        if st.running is not None and st.running.done():
            ok = st.running.result()
            st.running = None
            st.checks += 1
            if ok:
                st.healthy, st.failures = True, 0
            else:
                st.failures += 1
                if st.failures >= int(probe.get("failure_threshold", 3)):
                    st.healthy = False
        if st.running is None and now >= st.next_due:
            st.next_due = now + float(probe.get("interval_seconds", 1.0))
            timeout = float(probe.get("timeout_seconds", 1.0))
            if probe.get("http"):
                st.running = self.pool.submit(
                    http_probe, f"http://{address}:{port}{probe['http']}", timeout)
            else:
                st.running = self.pool.submit(
                    command_probe, list(probe["command"]), env, cwd, timeout)
        return st.healthy

    def resume(self, key: str) -> None:
        """A task that was healthy before its agent restarted: healthy until its probe
        fails ``failure_threshold`` times in a row, as if the agent had never stopped."""
        self.states[key] = _State(healthy=True)

    def starting(self, key: str) -> bool:
        """The task has not passed a probe since it (re)started."""
        st = self.states.get(key)
        return st is None or not st.healthy

    def forget(self, key: str) -> None:
        """The task (re)started or left: its health starts over."""
        self.states.pop(key, None)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
