"""``plait bench recovery``: how fast a whole region on one box comes up, deploys, and
recovers from a dead machine.

The region is ``plait up`` in a process of its own, exactly as an operator runs it:
a fresh data dir in a temporary directory, a free loopback port, ``machines`` agent
processes, ``heartbeat_timeout``. Its client configuration goes to the temporary
directory too (``PLAIT_CONFIG``, ``HOME`` and ``XDG_CONFIG_HOME`` point there), so
the user's CLI configuration is left alone. Everything is observed through the REST
API with the admin token ``plait up`` leaves in its data dir; the only other things
read are the files ``plait up`` and its agents keep there (``agents/<machine>/agent.pid``
and ``agent.json``), to find the processes of the machine that is killed.

Three figures, in order:

``up_ready_s``
    from launching ``plait up`` until every machine's agent has joined (the
    ``machine_joined`` event: an agent heartbeats, with its first status report, in
    the same step as it joins) and the API lists ``machines`` machines, all healthy.
    It is taken from the events' own times (the control plane's clock); the figure as
    this process saw it, up to one event flush later, is ``up_ready_observed_s``.
``deploy_200_running_s``
    from the ``POST /v1/jobs`` of a job of ``tasks`` tasks whose command is
    ``sleep infinity`` (so it measures plait, not an interpreter starting) until the
    API shows every task running. ``deploy_all_placed_s`` is when every task had a
    machine, and ``deploy_running_p50_s`` when half of them ran. The job is then
    deleted; ``delete_s`` is until the API no longer knows it.
``recovery_s_after_timeout``
    the web job of ``examples/web.yaml`` is deployed and waited for until every task
    answers HTTP 200 at its endpoint in service discovery. Then the machine with the
    most of its tasks dies: its agent and all its tasks get SIGKILL at the same moment
    (their process groups; every task runs in its own session). The heartbeat timeout
    is taken as the time of the control plane's ``machine_unreachable`` event for that
    machine (when it noticed the missing heartbeats; the machine's last heartbeat
    was at most one agent step before the kill). The figure is from there until every
    lost task index answers HTTP 200 at a new endpoint, on another machine, in
    service discovery. ``recovery_s_after_kill`` counts from the kill instead, and
    ``machine_unavailable_s_after_kill`` is the detection alone (about the heartbeat
    timeout). ``recovery_steps`` splits the recovery per lost index: when the task
    was placed on its new machine, when it ran, when it answered.

``plait up`` is stopped with SIGINT (it stops its agents and their tasks) and waited
for a bounded time; whatever is left (agents, tasks: found by their pid files, their
state files and, in /proc, by the data dir in their command line or environment) is
killed, whatever happened before, and the temporary directory removed.

CPU: ``control_plane_cpu_util`` and ``agents_cpu_util`` are the CPU seconds of the
``plait up`` process and of all agent processes per second of the run (an agent
steps every 0.5 s), and ``agent_start_cpu_s`` the mean CPU an agent spent until it
was ready (mostly its interpreter and imports): on a box with few cores the agents'
start-up competes for CPU, which ``up_ready_s`` shows.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import httpx
import yaml

from plait.errors import ValidationError

#: the job of the deploy figure (the tasks' command: ``sleep infinity``)
SLEEP_JOB = "bench-sleep"
#: the entitlement of the deploy figure
SLEEP_ENTITLEMENT = "bench"
#: how often the API (and the endpoints) are polled while a figure is measured
POLL_S = 0.05


def _examples() -> Path:
    return Path(__file__).resolve().parents[3] / "examples"


def _cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a process, or None once it is gone (or off Linux)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _started_at(pid: int) -> float | None:
    """When a process started, by the wall clock (to the kernel's 10 ms tick), or None."""
    try:
        ticks = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, IndexError, ValueError):
        return None
    return time.time() - uptime + ticks / os.sysconf("SC_CLK_TCK")


def _alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _processes_under(root: Path) -> set[int]:
    """Processes whose command line or environment names ``root`` or a path under it
    (``plait up``'s agents get ``--data-dir`` there, their tasks ``PLAIT_DATA_DIR``)."""
    path = str(root).encode()
    needles = (path + b"/", path + b"\0")  # not a sibling that merely starts the same
    found = set()
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            text = (entry / "cmdline").read_bytes() + b"\0" + (entry / "environ").read_bytes()
        except OSError:
            continue
        if any(n in text for n in needles):
            found.add(int(entry.name))
    return found


def _kill_groups(pids: Iterable[int]) -> None:
    """SIGKILL the process group of each pid (and the pid itself, if it leads none)."""
    for pid in pids:
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(
            errors="replace").strip()
    except OSError:
        return "?"


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _round(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 3)


class Region:
    """``plait up`` in a child process (its own session) over a fresh data dir."""

    def __init__(self, machines: int, heartbeat_timeout: float, start_timeout: float = 120.0,
                 grace: float = 45.0) -> None:
        self.machines, self.heartbeat_timeout = machines, heartbeat_timeout
        self.start_timeout, self.grace = start_timeout, grace
        self._tmp = tempfile.TemporaryDirectory(prefix="plait-bench-recovery-")
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
    def start(self) -> Region:
        from plait.server.serve import free_port

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
               "--heartbeat-timeout", f"{self.heartbeat_timeout:g}"]
        with open(self.dir / "up.log", "wb") as log:
            self.launched_at = time.time()
            self.proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + self.start_timeout
        while True:
            self._check_running()
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1.0).status_code == 200:
                    self.api_at = time.time()
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"plait up did not answer /healthz on {self.url} within "
                                   f"{self.start_timeout:g}s:\n{self._log_tail()}")
            time.sleep(POLL_S)
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
        deadline = time.monotonic() + timeout
        while True:
            self._check_running()
            with contextlib.suppress(httpx.TransportError):
                value = check()
                if value:
                    return value
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what}: not within {timeout:g}s\n{self._log_tail()}")
            time.sleep(POLL_S)

    # -- processes --------------------------------------------------------------------
    def agent_pids(self) -> dict[str, int]:
        found = {}
        for path in sorted((self.data / "agents").glob("*/agent.pid")):
            pid = _read_pid(path)
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
            cpu = _cpu_seconds(pid)
            if cpu is not None and _alive(pid):
                self.agent_cpu[machine] = cpu
        return dict(self.agent_cpu)

    def control_plane_cpu(self) -> float | None:
        return None if self.proc is None else _cpu_seconds(self.proc.pid)

    def kill_machine(self, machine: str) -> tuple[float, float, int]:
        """SIGKILL a machine's agent and every task of it at once (the machine dies);
        (the time of the kill by the wall clock and by the monotonic clock, the process
        groups killed)."""
        home = self.data / "agents" / machine
        agent = _read_pid(home / "agent.pid")
        if agent is None or not _alive(agent):
            raise RuntimeError(f"the agent of {machine} is not running")
        # its tasks: from the agent's state, and any process that carries the machine's
        # directory in its environment (a task the agent started after its last save)
        groups = {agent, *self.task_groups(machine), *_processes_under(home)}
        os.kill(agent, signal.SIGSTOP)  # it starts nothing more while we look
        groups |= self.task_groups(machine) | _processes_under(home)
        killed_at, killed_mono = time.time(), time.monotonic()
        _kill_groups(groups)
        for _ in range(3):  # anything forked meanwhile
            rest = {p for p in _processes_under(home) if _alive(p)}
            if not rest:
                break
            _kill_groups(rest)
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
                _kill_groups([proc.pid])
                proc.wait()
        if proc is not None:
            self.exit_code = proc.returncode
        with contextlib.suppress(OSError):
            left = {p for p in [*self.agent_pids().values(), *(
                g for m in self.agent_pids() for g in self.task_groups(m))] if _alive(p)}
            left |= {p for p in _processes_under(self.dir) if _alive(p)}
            self.leftovers_killed = len(left)
            self.leftovers = [_cmdline(p)[-160:] for p in sorted(left)][:5]
            _kill_groups(left)
            deadline = time.monotonic() + 5
            while any(_alive(p) for p in left) and time.monotonic() < deadline:
                time.sleep(0.05)
        self.stop_s = time.monotonic() - started
        self._tmp.cleanup()

    def __enter__(self) -> Region:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _answers(endpoint: str, timeout: float = 0.5) -> bool:
    try:
        return httpx.get(f"http://{endpoint}/", timeout=timeout).status_code == 200
    except httpx.HTTPError:
        return False


# -- the phases -----------------------------------------------------------------------------
def _wait_ready(region: Region, timeout: float) -> dict[str, Any]:
    """Until every machine's agent has joined and the API lists every machine healthy."""
    def ready() -> dict[str, float] | None:
        joined: dict[str, float] = {}
        for e in region.events("machine_joined"):
            if e["machine"]:
                joined.setdefault(e["machine"], e["time"])
        if len(joined) < region.machines:
            return None
        views = region.machine_views()
        if len(views) < region.machines or any(v["state"] != "healthy" for v in views):
            return None
        if not {v["id"] for v in views} <= set(joined):
            return None
        return joined

    joined = region.wait(ready, timeout, f"{region.machines} agents joined")
    observed = time.time()
    t0 = region.launched_at
    # where the time went: each agent process's start (from /proc), the end of its
    # start-up (its pid file is written once it has imported and set up, before its
    # first step), its join
    spawned, initialised = [], []
    for machine, pid in region.agent_pids().items():
        at = _started_at(pid)
        with contextlib.suppress(OSError):
            done = (region.data / "agents" / machine / "agent.pid").stat().st_mtime
            if at is not None:
                spawned.append(at - t0)
                initialised.append(done - at)
    return {"up_ready_s": max(joined.values()) - t0,
            "up_ready_observed_s": observed - t0,
            "api_ready_s": region.api_at - t0,
            "first_agent_joined_s": min(joined.values()) - t0,
            "agents_spawned_s": max(spawned, default=None),
            "agent_startup_s_mean": statistics.mean(initialised) if initialised else None,
            "agent_startup_s_max": max(initialised, default=None)}


def _running_times(region: Region, job: str, started: float, timeout: float,
                   count: int) -> dict[str, Any]:
    """Poll the job's tasks until ``count`` run; when each was first placed and first
    seen running (seconds after ``started``, a monotonic time)."""
    placed: dict[int, float] = {}
    running: dict[int, float] = {}

    def all_running() -> bool:
        tasks = region.get(f"/v1/jobs/{job}/tasks")["tasks"]
        now = time.monotonic() - started
        for t in tasks:
            if t["machine"] is not None:
                placed.setdefault(t["index"], now)
            if t["state"] == "running":
                running.setdefault(t["index"], now)
        return len(running) >= count and sum(t["state"] == "running" for t in tasks) >= count

    region.wait(all_running, timeout, f"{count} tasks of {job} running")
    return {"running_s": max(running.values()), "placed_s": max(placed.values()),
            "running_p50_s": statistics.median(running.values())}


def _deploy_sleepers(region: Region, tasks: int, timeout: float) -> dict[str, Any]:
    region.send("POST", "/v1/entitlements", {
        "name": SLEEP_ENTITLEMENT, "owner": "bench", "quota": {"machines": region.machines}})
    spec = {"name": SLEEP_JOB, "entitlement": SLEEP_ENTITLEMENT, "task_count": tasks,
            "resources": {"cpu": 0.1, "memory_gb": 0.1}, "command": "sleep",
            "args": ["infinity"]}
    started = time.monotonic()
    region.send("POST", "/v1/jobs", spec, ok=(201,))
    figures = _running_times(region, SLEEP_JOB, started, timeout, tasks)
    machines = {t["machine"] for t in region.get(f"/v1/jobs/{SLEEP_JOB}/tasks")["tasks"]}
    deleting = time.monotonic()
    region.send("DELETE", f"/v1/jobs/{SLEEP_JOB}", ok=(202,))

    def gone() -> bool:
        assert region.api is not None
        return region.api.get(f"/v1/jobs/{SLEEP_JOB}").status_code == 404

    region.wait(gone, timeout, f"{SLEEP_JOB} deleted")
    return {"deploy_running_s": figures["running_s"], "deploy_placed_s": figures["placed_s"],
            "deploy_running_p50_s": figures["running_p50_s"],
            "deploy_machines_used": len(machines), "delete_s": time.monotonic() - deleting}


def _serving(region: Region, job: str, count: int) -> dict[int, dict[str, Any]] | None:
    """The discovery entries of the job's tasks, if all ``count`` answer HTTP 200."""
    found = {e["index"]: e for e in region.get(f"/v1/discovery/{job}")["endpoints"]
             if e["endpoint"]}
    if len(found) < count or not all(_answers(e["endpoint"]) for e in found.values()):
        return None
    return found


def _recover(region: Region, web: dict[str, Any], timeout: float) -> dict[str, Any]:
    entitlements = yaml.safe_load((_examples() / "entitlements.yaml").read_text())
    for ent in entitlements["entitlements"]:
        if ent["name"] == web["entitlement"]:
            region.send("POST", "/v1/entitlements", ent)
    job, count = web["name"], int(web["task_count"])
    started = time.monotonic()
    region.send("POST", "/v1/jobs", web, ok=(201,))
    before = region.wait(lambda: _serving(region, job, count), timeout, f"{job} serving")
    web_serving_s = time.monotonic() - started

    per_machine: dict[str, list[int]] = {}
    for index, e in sorted(before.items()):
        per_machine.setdefault(e["machine"], []).append(index)
    victim = max(sorted(per_machine), key=lambda m: len(per_machine[m]))
    lost = per_machine[victim]
    region.sample_agent_cpu()
    killed_at, kill_mono, groups = region.kill_machine(victim)

    # the control plane notices the missing heartbeats; the new copies come up
    placed: dict[int, float] = {}
    running: dict[int, float] = {}
    answered: dict[int, float] = {}
    old = {i: before[i]["endpoint"] for i in lost}
    seen_unavailable: float | None = None

    def recovered() -> bool:
        # (each time is taken once the answer that shows it is in)
        nonlocal seen_unavailable
        state = region.get(f"/v1/machines/{victim}")["state"]
        if seen_unavailable is None and state != "healthy":
            seen_unavailable = time.monotonic()
        tasks = region.get(f"/v1/jobs/{job}/tasks")["tasks"]
        now = time.monotonic()
        for t in tasks:
            if t["index"] in old and t["machine"] not in (None, victim):
                placed.setdefault(t["index"], now)
                if t["state"] == "running":
                    running.setdefault(t["index"], now)
        for e in region.get(f"/v1/discovery/{job}")["endpoints"]:
            i = e["index"]
            if i in old and i not in answered and e["machine"] != victim and e["endpoint"] \
                    and e["endpoint"] != old[i] and _answers(e["endpoint"]):
                answered[i] = time.monotonic()
        return len(answered) == len(lost) and seen_unavailable is not None

    region.wait(recovered, timeout + region.heartbeat_timeout, "the lost tasks answer again")
    done = max(answered.values())
    # when the control plane declared the machine unavailable (its clock, the wall clock)
    unreachable = [e["time"] for e in region.events("machine_unreachable", victim)
                   if e["time"] >= killed_at]
    timeout_at = min(unreachable) if unreachable else \
        killed_at + (seen_unavailable - kill_mono)  # type: ignore[operator]
    timeout_mono = kill_mono + (timeout_at - killed_at)
    after_kill = done - kill_mono
    steps = {str(i): {"placed_s": _round(placed.get(i, done) - timeout_mono),
                      "running_s": _round(running.get(i, done) - timeout_mono),
                      "answered_s": _round(answered[i] - timeout_mono)} for i in lost}
    return {
        "recovery_s_after_timeout": done - timeout_mono,
        "recovery_s_after_kill": after_kill,
        "recovery_s_after_kill_plus_timeout": after_kill - region.heartbeat_timeout,
        "machine_unavailable_s_after_kill": timeout_at - killed_at,
        "machine_unavailable_seen_s_after_kill": None if seen_unavailable is None
        else seen_unavailable - kill_mono,
        "recovery_steps": steps,
        "killed_machine": victim, "killed_process_groups": groups,
        "lost_tasks": len(lost), "recovered_tasks": len(answered),
        "web_tasks": count, "web_machines": len(per_machine), "web_serving_s": web_serving_s,
    }


def run(machines: int = 20, tasks: int = 200, heartbeat_timeout: float = 5.0,
        timeout: float = 120.0, web_spec: Path | None = None) -> dict[str, Any]:
    """One run: ``plait up`` of ``machines`` agents, a deploy of ``tasks`` sleeping
    tasks, then the web job and a machine failure. ``timeout`` bounds each wait."""
    for name, value in (("machines", machines), ("tasks", tasks),
                        ("heartbeat_timeout", heartbeat_timeout), ("timeout", timeout)):
        if not value > 0:
            raise ValidationError(name, f"must be > 0, not {value}")
    if machines < 2:
        raise ValidationError("machines", "at least 2: the lost tasks need another machine")
    path = web_spec or _examples() / "web.yaml"
    try:
        web = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ValidationError("web_spec", f"cannot read {path}: {exc}") from None
    started, loadavg = time.monotonic(), os.getloadavg()[0]
    with Region(machines, heartbeat_timeout) as region:
        ready = _wait_ready(region, timeout)
        agents_ready = region.sample_agent_cpu()
        cp_ready, at_ready = region.control_plane_cpu(), time.monotonic()
        deploy = _deploy_sleepers(region, tasks, timeout)
        recovery = _recover(region, web, timeout)
        agents_end = region.sample_agent_cpu()
        cp_end, at_end = region.control_plane_cpu(), time.monotonic()
    span = at_end - at_ready
    agent_cpu = sum(agents_end.values()) - sum(agents_ready.values())
    result: dict[str, Any] = {
        "machines": machines,
        "tasks": tasks,
        "heartbeat_timeout_s": heartbeat_timeout,
        "recovery_s_after_timeout": _round(recovery.pop("recovery_s_after_timeout")),
        "up_ready_s": _round(ready["up_ready_s"]),
        "deploy_200_running_s": _round(deploy["deploy_running_s"]),
        **{k: _round(v) for k, v in ready.items() if k != "up_ready_s"},
        "deploy_placed_s": _round(deploy["deploy_placed_s"]),
        "deploy_running_p50_s": _round(deploy["deploy_running_p50_s"]),
        "deploy_machines_used": deploy["deploy_machines_used"],
        "delete_s": _round(deploy["delete_s"]),
        **{k: _round(v) if isinstance(v, float) else v for k, v in recovery.items()},
        "agent_start_cpu_s": _round(statistics.mean(agents_ready.values()))
        if agents_ready else None,
        "agents_cpu_util": round(agent_cpu / span, 3) if span > 0 else None,
        "control_plane_cpu_util": None if cp_ready is None or cp_end is None or span <= 0
        else round((cp_end - cp_ready) / span, 3),
        "up_stopped_by": region.stopped_by,
        "up_exit_code": region.exit_code,
        "up_stop_s": _round(region.stop_s),
        "leftover_processes_killed": region.leftovers_killed,
        "leftover_processes": region.leftovers,
        "params": {"timeout": timeout, "web_spec": str(path),
                   "sleep_task": "sleep infinity, 0.1 cpu, 0.1 GB"},
        "cpu_count": os.cpu_count(),
        "loadavg_1m_at_start": round(loadavg, 2),
        "python": sys.version.split()[0],
        "wall_s": round(time.monotonic() - started, 1),
    }
    if not all(isinstance(result[k], int | float) and math.isfinite(result[k])
               for k in ("recovery_s_after_timeout", "up_ready_s", "deploy_200_running_s")):
        raise RuntimeError(f"a figure is missing: {result}")
    return result
