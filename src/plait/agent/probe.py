"""Per-task health probes, run by the agent (a job's ``health`` field).

A probe is an HTTP GET on the task's port or a command. Probes run on a small
thread pool so a slow or hanging task never delays the agent's step: each step
collects the probes that finished and starts the ones that are due, and the task's
health is what the finished probes said. A task is unhealthy from its start until a
probe first passes, and again after ``failure_threshold`` failures in a row.

HTTP probes are plain HTTP/1.1 requests (``http_probe``): a probe costs a connection
and a request, not a client's set-up (a fresh httpx client, with its TLS context,
cost some 20 ms of CPU per probe).
``next_due`` tells the agent's loop when to wake for the next probe, and
``on_change`` is called (on the probe's thread) when a finished probe may change a
task's health, so the agent reports it at once.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: an HTTP/1.x status line, the only part of a probe's answer that is read
STATUS_LINE = re.compile(rb"HTTP/1\.[0-9] ([0-9]{3})(?: |\r?\n)")
#: a request path the probe sends (as a job's ``health.http`` is checked)
PATH = re.compile(r"/[\x21-\x7e]*\Z")
#: bytes read at most looking for it
STATUS_LINE_MAX = 1024
#: seconds a killed command probe is waited for (one stuck in the kernel is left)
KILL_WAIT = 5.0
#: probes running at once at most (threads made as needed): a task has one probe out at
#: a time, so one tenant's tasks whose probes hang for their whole timeout (up to 10
#: minutes) hold only their own threads, not the other tasks' probes (with 4 shared
#: threads, four such tasks left every other task on the machine unprobed: unhealthy)
PROBE_THREADS = 256
#: how a command probe starts in its task's isolation: (argv, env, cwd) -> (argv, env,
#: what the child runs before the exec)
Wrap = Callable[[list[str], dict[str, str], Path],
                tuple[list[str], dict[str, str], Callable[[], None] | None]]


@dataclass
class _State:
    healthy: bool = False
    failures: int = 0
    next_due: float = 0.0
    running: Future[bool] | None = None
    checks: int = 0
    #: the command probe running now (its session is killed if the task goes first)
    proc: subprocess.Popen[bytes] | None = None
    gone: bool = False

    def end(self) -> None:
        """The task left (or the agent stops): its probe's session goes now, not at
        its timeout. (With ``command_probe``'s own check, whichever of the two comes
        second kills it.)"""
        self.gone = True
        proc = self.proc
        if proc is not None:
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGKILL)


def http_probe(host: str, port: int, path: str, timeout: float) -> bool:
    """A plain HTTP/1.1 GET on the task's port: whether it answered 200-399 within
    ``timeout`` (all of it: connect, send and the status line). A new connection each
    time, as a new client's (a kept one could pass while the task accepts no new ones),
    and no client set up per probe: no TLS context, no proxy lookup, no redirect
    followed (a 3xx passes, as a 2xx). The verdict is the status line alone: neither
    the headers nor the body are read (a task's answer of any size, or one that never
    ends, costs the agent nothing), and nothing parses them (a status line read off
    the socket costs half the CPU of the standard library's client, which parses every
    header: ten tasks probed each second are most of an idle agent's work)."""
    if not PATH.match(path):
        return False  # (a spec's path is checked so: this one came from elsewhere)
    deadline = time.monotonic() + timeout
    name = f"[{host}]" if ":" in host else host  # (an IPv6 literal, in the Host header)
    request = (f"GET {path} HTTP/1.1\r\nHost: {name}:{port}\r\nConnection: close\r\n"
               "User-Agent: plait-agent-probe\r\n\r\n").encode("latin-1", "replace")
    try:
        with socket.create_connection((host, port), timeout) as conn:
            conn.settimeout(max(0.001, deadline - time.monotonic()))
            conn.sendall(request)
            line = b""
            while b"\n" not in line:
                if len(line) > STATUS_LINE_MAX:
                    return False  # (no status line: not HTTP)
                conn.settimeout(max(0.001, deadline - time.monotonic()))
                got = conn.recv(STATUS_LINE_MAX)
                if not got:
                    break
                line += got
    except (OSError, ValueError):  # refused, reset, timed out, a name that is not one
        return False
    match = STATUS_LINE.match(line)
    return match is not None and 200 <= int(match.group(1)) < 400


def command_probe(argv: list[str], env: dict[str, str], cwd: Path, timeout: float,
                  setup: Callable[[], None] | None = None,
                  state: _State | None = None) -> bool:
    """Exit 0 within the timeout; the probe runs in a session of its own, all of which
    is killed when it ends (or at the timeout, or when its task goes: ``state``):
    nothing it started outlives it. ``setup``: run in the child before the exec (it
    joins the task's cgroups)."""
    try:
        proc = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True, preexec_fn=setup)
    except Exception:  # (a command that cannot start fails the check)
        return False
    if state is not None:
        state.proc = proc
        if state.gone:  # (its task went while it started)
            state.end()
    try:
        ok = proc.wait(timeout) == 0
    except subprocess.TimeoutExpired:
        ok = False
    with contextlib.suppress(OSError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(KILL_WAIT)  # (a process stuck in the kernel: not waited for longer)
    if state is not None:
        state.proc = None
    return ok


class Prober:
    def __init__(self, workers: int = PROBE_THREADS,
                 on_change: Callable[[], None] | None = None) -> None:
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="plait-probe")
        self.states: dict[str, _State] = {}
        #: called (on a probe's thread) when a probe finished that may change its task's
        #: health: it passed while unhealthy, or failed
        self.on_change = on_change

    def check(self, key: str, probe: dict[str, Any], address: str, port: int,
              env: dict[str, str], cwd: Path, now: float,
              wrap: Wrap | None = None) -> bool:
        """The task's health now; starts its next probe when one is due. ``wrap``:
        how a command probe starts in the task's isolation (``probe_command``)."""
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
                st.running = self.pool.submit(http_probe, address, port,
                                              str(probe["http"]), timeout)
            else:
                argv, penv, setup = list(probe["command"]), env, None
                if wrap is not None:
                    try:
                        argv, penv, setup = wrap(argv, env, cwd)
                    except (OSError, RuntimeError, ValueError):  # (it cannot start)
                        argv = []
                st.running = self.pool.submit(command_probe, argv, penv, cwd, timeout, setup,
                                              st)
            if self.on_change is not None:
                healthy, due = st.healthy, st.next_due
                st.running.add_done_callback(lambda f: self._done(f, healthy, due))
        return st.healthy

    def _done(self, finished: Future[bool], healthy: bool, due: float) -> None:
        """A probe finished: the loop is woken if its task's health may change (it
        passed while unhealthy, or failed), or if its next probe is due already (it
        took longer than the interval)."""
        passed = (not finished.cancelled() and finished.exception() is None
                  and finished.result())
        if not (passed and healthy) or time.monotonic() >= due:
            assert self.on_change is not None
            self.on_change()

    def next_due(self, now: float) -> float | None:
        """When the next probe is due (monotonic seconds), or None if none is: a probe
        still running past its next time is left out (its end wakes the loop)."""
        due = [st.next_due for st in self.states.values()
               if st.running is None or st.next_due > now]
        return min(due) if due else None

    def resume(self, key: str) -> None:
        """A task that was healthy before its agent restarted: healthy until its probe
        fails ``failure_threshold`` times in a row, as if the agent had never stopped."""
        self.states[key] = _State(healthy=True)

    def starting(self, key: str) -> bool:
        """The task has not passed a probe since it (re)started."""
        st = self.states.get(key)
        return st is None or not st.healthy

    def forget(self, key: str) -> None:
        """The task (re)started or left: its health starts over, and a command probe
        still running for it is killed."""
        st = self.states.pop(key, None)
        if st is not None:
            st.end()

    def close(self) -> None:
        for st in list(self.states.values()):
            st.end()
        self.pool.shutdown(wait=False, cancel_futures=True)
