"""A whole region on this box, driven from outside: ``plait up`` in a process of its
own over a fresh temporary data dir and a free loopback port, observed through the
REST API with the admin token it leaves in its data dir (the benchmark of issue 5 and
the demo use it).

The client configuration of that ``plait up`` goes to the temporary directory too
(``PLAIT_CONFIG``, ``HOME`` and ``XDG_CONFIG_HOME`` point there), so the user's CLI
configuration is left alone. ``kill_machine`` makes a machine die: its agent and all
its tasks get SIGKILL at once. ``stop`` is Ctrl-C of ``plait up`` (its agents stop
their tasks), then, after a bounded wait, SIGKILL of whatever is left.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import httpx

from plait.localprocs import alive, cmdline, kill_groups, processes_under, read_pid
from plait.testing import WaitTimeout, wait_for

#: how often the API is polled while waiting
POLL_S = 0.05


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a process, or None once it is gone (or off Linux)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def started_at(pid: int) -> float | None:
    """When a process started, by the wall clock (to the kernel's 10 ms tick), or None."""
    try:
        ticks = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, IndexError, ValueError):
        return None
    return time.time() - uptime + ticks / os.sysconf("SC_CLK_TCK")


def wait_healthy(proc: subprocess.Popen[bytes], url: str, timeout: float, what: str,
                 log_tail: Callable[[], str]) -> None:
    """Wait until the process started at ``url`` answers /healthz with a 200; an error
    with its log's tail if it exits first or does not answer within ``timeout``."""
    def answers() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode} at start:\n{log_tail()}")
        return httpx.get(f"{url}/healthz", timeout=1.0).status_code == 200

    try:
        wait_for(answers, timeout, f"{what} answers /healthz on {url}", poll=POLL_S,
                 ignore=(httpx.HTTPError,))
    except WaitTimeout as exc:
        raise RuntimeError(f"{exc}:\n{log_tail()}") from None


class LocalRegion:
    """``plait up`` in a child process (its own session) over a fresh data dir."""

    def __init__(self, machines: int, heartbeat_timeout: float, start_timeout: float = 120.0,
                 grace: float = 45.0) -> None:
        self.machines, self.heartbeat_timeout = machines, heartbeat_timeout
        self.start_timeout, self.grace = start_timeout, grace
        self._tmp = tempfile.TemporaryDirectory(prefix="plait-region-")
        self.dir = Path(self._tmp.name)
        self.data = self.dir / "data"
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""
        self.token = ""
        self.api: httpx.Client | None = None
        #: when ``plait up`` was launched (wall clock, as the control plane's events)
        self.launched_at = 0.0
        #: when the API first answered /healthz (wall clock)
        self.api_at = 0.0
        self.stopped_by: str | None = None
        self.exit_code: int | None = None
        self.leftovers_killed = 0
        #: what was left (command lines, shortened) and how long the stop took
        self.leftovers: list[str] = []
        self.stop_s: float | None = None
        #: CPU seconds of each agent process seen, last reading
        self.agent_cpu: dict[str, float] = {}

    def _log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join((self.dir / "up.log").read_text().splitlines()[-lines:])
        except OSError:
            return ""

    # -- start ------------------------------------------------------------------------
    def start(self) -> LocalRegion:
        from plait.testing import free_port

        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        home = self.dir / "home"
        home.mkdir()
        env = {**os.environ, "PLAIT_CONFIG": str(self.dir / "config.yaml"), "HOME": str(home),
               "XDG_CONFIG_HOME": str(home / ".config"), "PYTHONUNBUFFERED": "1"}
        for name in ("PLAIT_URL", "PLAIT_TOKEN"):
            env.pop(name, None)
        cmd = [sys.executable, "-m", "plait.cli.main", "up", "--data-dir", str(self.data),
               "--machines", str(self.machines), "--host", "127.0.0.1", "--port", str(port),
               "--heartbeat-timeout", f"{self.heartbeat_timeout:g}",
               # (a benchmark's jobs are one owner's: no limit of a tenant's)
               "--owner-max-jobs", "10000000", "--owner-max-tasks", "1000000000"]
        with open(self.dir / "up.log", "wb") as log:
            self.launched_at = time.time()
            self.proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        wait_healthy(self.proc, self.url, self.start_timeout, "plait up", self._log_tail)
        self.api_at = time.time()
        self.token = (self.data / "admin-token").read_text().strip()
        self.api = httpx.Client(base_url=self.url, timeout=30.0,
                                headers={"Authorization": f"Bearer {self.token}"})
        return self

    def _check_running(self) -> None:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(f"plait up exited with {self.proc.returncode}:\n"
                               f"{self._log_tail()}")

    # -- the API ----------------------------------------------------------------------
    def get(self, path: str, **params: Any) -> Any:
        assert self.api is not None
        r = self.api.get(path, params={k: v for k, v in params.items() if v is not None})
        r.raise_for_status()
        return r.json()

    def send(self, method: str, path: str, body: Any = None, ok: Iterable[int] = (200, 201, 202)
             ) -> Any:
        assert self.api is not None
        r = self.api.request(method, path, json=body)
        if r.status_code not in ok:
            raise RuntimeError(f"{method} {path}: {r.status_code} {r.text[:300]}")
        return r.json()

    def events(self, kind: str, machine: str | None = None) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        after = 0
        while True:
            page = self.get("/v1/events", after=after, limit=1000, kind=kind, machine=machine)
            found.extend(page["events"])
            if page["next"] is None:
                return found
            after = page["next"]

    def machine_views(self) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        while True:
            page = self.get("/v1/machines", limit=1000, offset=len(found))
            found.extend(page["machines"])
            if not page["machines"] or len(found) >= page["total"]:
                return found

    def wait(self, check: Callable[[], Any], timeout: float, what: str) -> Any:
        """Poll ``check`` until it returns something true; that value."""
        def checked() -> Any:
            self._check_running()
            return check()

        try:
            return wait_for(checked, timeout, what, poll=POLL_S,
                            ignore=(httpx.TransportError,))
        except WaitTimeout as exc:
            raise RuntimeError(f"{exc}\n{self._log_tail()}") from None

    def wait_ready(self, timeout: float) -> dict[str, float]:
        """Until every machine's agent has joined (an agent sends its first status
        report in the step it joins) and the API lists every machine healthy; returns
        when each machine joined (the control plane's clock)."""
        def ready() -> dict[str, float] | None:
            joined: dict[str, float] = {}
            for e in self.events("machine_joined"):
                if e["machine"]:
                    joined.setdefault(e["machine"], e["time"])
            if len(joined) < self.machines:
                return None
            views = self.machine_views()
            if len(views) < self.machines or any(v["state"] != "healthy" for v in views):
                return None
            if not {v["id"] for v in views} <= set(joined):
                return None
            return joined

        found: dict[str, float] = self.wait(ready, timeout, f"{self.machines} agents joined")
        return found

    # -- processes --------------------------------------------------------------------
    def agent_pids(self) -> dict[str, int]:
        found = {}
        for path in sorted((self.data / "agents").glob("*/agent.pid")):
            pid = read_pid(path)
            if pid is not None:
                found[path.parent.name] = pid
        return found

    def task_groups(self, machine: str) -> set[int]:
        """The process groups of a machine's tasks, from its agent's state file."""
        import json

        try:
            state = json.loads((self.data / "agents" / machine / "agent.json").read_text())
        except (OSError, ValueError):
            return set()
        return {int(t["handle"]["pgid"]) for t in state.get("tasks", {}).values()
                if t.get("handle")}

    def sample_agent_cpu(self) -> dict[str, float]:
        for machine, pid in self.agent_pids().items():
            cpu = cpu_seconds(pid)
            if cpu is not None and alive(pid):
                self.agent_cpu[machine] = cpu
        return dict(self.agent_cpu)

    def control_plane_cpu(self) -> float | None:
        return None if self.proc is None else cpu_seconds(self.proc.pid)

    def kill_machine(self, machine: str) -> tuple[float, float, int]:
        """SIGKILL a machine's agent and every task of it at once (the machine dies);
        (the time of the kill by the wall clock and by the monotonic clock, the process
        groups killed)."""
        home = self.data / "agents" / machine
        agent = read_pid(home / "agent.pid")
        if agent is None or not alive(agent):
            raise RuntimeError(f"the agent of {machine} is not running")
        # its tasks: from the agent's state, and any process that carries the machine's
        # directory in its environment (a task the agent started after its last save)
        groups = {agent, *self.task_groups(machine), *processes_under(home)}
        os.kill(agent, signal.SIGSTOP)  # it starts nothing more while we look
        groups |= self.task_groups(machine) | processes_under(home)
        killed_at, killed_mono = time.time(), time.monotonic()
        kill_groups(groups)
        for _ in range(3):  # anything forked meanwhile
            rest = {p for p in processes_under(home) if alive(p)}
            if not rest:
                break
            kill_groups(rest)
            time.sleep(0.05)
        return killed_at, killed_mono, len(groups)

    # -- stop -------------------------------------------------------------------------
    def stop(self) -> None:
        """SIGINT ``plait up`` (it stops its agents and their tasks), wait at most
        ``grace`` seconds, then kill whatever of the region is left."""
        if self.api is not None:
            self.api.close()
        started = time.monotonic()
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            self.stopped_by = "sigint"
            try:
                proc.wait(self.grace)
            except subprocess.TimeoutExpired:
                self.stopped_by = "kill"
                kill_groups([proc.pid])
                proc.wait()
        if proc is not None:
            self.exit_code = proc.returncode
        with contextlib.suppress(OSError):
            left = {p for p in [*self.agent_pids().values(), *(
                g for m in self.agent_pids() for g in self.task_groups(m))] if alive(p)}
            left |= {p for p in processes_under(self.dir) if alive(p)}
            self.leftovers_killed = len(left)
            self.leftovers = [cmdline(p)[-160:] for p in sorted(left)][:5]
            kill_groups(left)
            deadline = time.monotonic() + 5
            while any(alive(p) for p in left) and time.monotonic() < deadline:
                time.sleep(0.05)
        self.stop_s = time.monotonic() - started
        self._tmp.cleanup()

    def __enter__(self) -> LocalRegion:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()
