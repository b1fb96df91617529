"""``plait bench agent``: what an agent, and the control plane its agents long-poll,
cost while nothing changes.

Two figures, each over a window of ``seconds``:

* ``agent_cpu_pct``: one real agent process (``plait agent``) against a real
  ``plait serve`` (a one-machine region, real-agent mode), running ``tasks`` tasks,
  each with an HTTP health probe every ``probe_interval`` seconds. The tasks are a
  tiny Python HTTP server each (it answers 200 on every path and logs nothing, so the
  agent forwards no output): the probe target. The figure is the CPU of the agent
  process (all its threads) plus that of the children it reaped during the window
  (probe commands, helpers: plait's own), as a percentage of one core; the tasks'
  own processes run for the whole window and are never counted.
* ``cp_idle_cpu_pct``: the CPU of a ``plait serve`` process (``agents`` machines,
  no job) while ``agents`` agents are connected: real ``plait.agent.daemon.Agent``
  objects, each running its ordinary loop (``Agent.run``, the default 1 s interval)
  on a thread of this process, so each long-polls its desired set and reports over
  the real API exactly as an agent process does. As a percentage of one core.

Both servers run with the default pass interval (``--tick 0.5``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from plait.bench.api import Server
from plait.testing import wait_for

#: the task: an HTTP server on $PLAIT_PORT answering 200, silent
TASK = ("import http.server, os\n"
        "class H(http.server.BaseHTTPRequestHandler):\n"
        "    def do_GET(self):\n"
        "        self.send_response(200); self.send_header('Content-Length', '0');"
        " self.end_headers()\n"
        "    def log_message(self, *args):\n"
        "        pass\n"
        "http.server.HTTPServer(('127.0.0.1', int(os.environ['PLAIT_PORT'])), H)"
        ".serve_forever()\n")


def _ticks(pid: int) -> tuple[float, float] | None:
    """(the process's own user + system CPU, that of its reaped children) in seconds."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    hz = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / hz, (int(fields[13]) + int(fields[14])) / hz


def _sent(agent: Any) -> float:
    """The reports an agent has sent (its own counter)."""
    got = agent.metrics.registry.get_sample_value("plait_agent_reports_total",
                                                  {"outcome": "sent"})
    return float(got or 0.0)


def _join_token(server: Server) -> str:
    r = httpx.post(f"{server.url}/v1/tokens", json={"role": "join", "name": "bench"},
                   headers={"Authorization": f"Bearer {server.token}"}, timeout=30.0)
    r.raise_for_status()
    return str(r.json()["token"])


def agent_cpu(tasks: int, seconds: float, probe_interval: float, settle_timeout: float,
              profile: Path | None = None, spy: Path | None = None) -> dict[str, Any]:
    """One agent process with ``tasks`` probed tasks: its CPU over the window.
    ``profile``: run the agent under cProfile, its stats written there when it stops;
    ``spy``: sample it with py-spy over the window (a flame graph written there)."""
    with Server(1, sim_agents=False, extra=("--dcs", "1", "--msbs-per-dc", "1")) as server, \
            tempfile.TemporaryDirectory(prefix="plait-bench-agent-") as tmp:
        api = httpx.Client(base_url=server.url, timeout=30.0,
                           headers={"Authorization": f"Bearer {server.token}"})
        machine = api.get("/v1/machines").json()["machines"][0]["id"]
        token_file = Path(tmp) / "join-token"
        token_file.write_text(_join_token(server))
        env = {**os.environ, "PLAIT_LOG_LEVEL": os.environ.get("PLAIT_LOG_LEVEL", "warning")}
        wrap = ([sys.executable, "-m", "cProfile", "-o", str(profile)]
                if profile is not None else [sys.executable])
        cmd = [*wrap, "-m", "plait.cli.main", "agent", "--machine-id", machine,
               "--control-plane", server.url, "--data-dir", str(Path(tmp) / "agent"),
               "--join-token-file", str(token_file)]
        with open(Path(tmp) / "agent.log", "wb") as log:
            proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        try:
            r = api.post("/v1/entitlements", json={"name": "bench", "owner": "bench",
                                                    "quota": {"machines": 1}})
            if r.status_code not in (200, 201):
                raise RuntimeError(f"entitlement: {r.status_code} {r.text}")
            r = api.post("/v1/jobs", json={
                "name": "probed", "entitlement": "bench", "task_count": tasks,
                "resources": {"cpu": 0.01, "memory_gb": 0.01},
                "command": sys.executable, "args": ["-c", TASK],
                "health": {"http": "/healthz", "interval_seconds": probe_interval,
                           "timeout_seconds": 1.0}})
            if r.status_code not in (200, 201):
                raise RuntimeError(f"job: {r.status_code} {r.text}")

            def healthy() -> bool:
                if proc.poll() is not None:
                    raise RuntimeError(f"plait agent exited with {proc.returncode}:\n"
                                       f"{(Path(tmp) / 'agent.log').read_text()[-2000:]}")
                r = api.get("/v1/jobs/probed/tasks")
                if r.status_code != 200:  # (stored, not applied by a pass yet)
                    return False
                got = r.json()["tasks"]
                return len(got) == tasks and all(t.get("healthy") for t in got)
            wait_for(healthy, settle_timeout, f"{tasks} tasks running and healthy", poll=0.2)
            time.sleep(min(2.0, seconds))  # (the start's after-effects settle)
            before, started = _ticks(proc.pid), time.monotonic()
            if spy is None:
                time.sleep(seconds)
            else:
                subprocess.run(["py-spy", "record", "-p", str(proc.pid), "-d",
                                str(int(seconds)), "-r", "200", "-o", str(spy),
                                "--format", "raw", "--threads"],
                               check=True, capture_output=True,
                               env={**os.environ, "PATH": f"{Path(sys.executable).parent}:"
                                                         f"{os.environ.get('PATH', '')}"})
            after, elapsed = _ticks(proc.pid), time.monotonic() - started
            if before is None or after is None or proc.poll() is not None:
                raise RuntimeError("the agent process went away during the window")
            still = api.get("/v1/jobs/probed/tasks").json()["tasks"]
            own = after[0] - before[0]
            children = after[1] - before[1]
        finally:
            proc.send_signal(signal.SIGINT)  # stops its tasks too
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            api.close()
    return {"agent_cpu_pct": round(100 * (own + children) / elapsed, 3),
            "agent_own_cpu_pct": round(100 * own / elapsed, 3),
            "agent_children_cpu_pct": round(100 * children / elapsed, 3),
            "tasks": tasks, "probe_interval_s": probe_interval,
            "tasks_healthy_after": sum(1 for t in still if t.get("healthy")),
            "agent_window_s": round(elapsed, 2)}


def cp_idle_cpu(agents: int, seconds: float, settle_timeout: float) -> dict[str, Any]:
    """A control plane with ``agents`` connected agents and no job: its CPU."""
    from plait.agent.daemon import Agent

    with Server(agents, sim_agents=False, extra=("--dcs", "1", "--msbs-per-dc", "1"),
                env={"PLAIT_LOG_LEVEL": os.environ.get("PLAIT_LOG_LEVEL", "warning")}
                ) as server, tempfile.TemporaryDirectory(prefix="plait-bench-agents-") as tmp:
        api = httpx.Client(base_url=server.url, timeout=30.0,
                           headers={"Authorization": f"Bearer {server.token}"})
        names = [m["id"] for m in api.get("/v1/machines").json()["machines"]][:agents]
        join = _join_token(server)
        stop = threading.Event()
        fleet = [Agent(m, [server.url], join, Path(tmp) / m) for m in names]
        threads = [threading.Thread(target=a.run, args=(1.0, stop), daemon=True,
                                    name=f"agent-{a.machine}") for a in fleet]
        try:
            for t in threads:
                t.start()

            def connected() -> bool:  # each has joined, pulled its set and reported
                return all(_sent(a) > 0 for a in fleet)
            wait_for(connected, settle_timeout, f"{agents} agents connected", poll=0.2)
            time.sleep(min(3.0, seconds))  # (the joins' after-effects settle)
            before, started = server.cpu_seconds(), time.monotonic()
            sent = sum(_sent(a) for a in fleet)
            time.sleep(seconds)
            after, elapsed = server.cpu_seconds(), time.monotonic() - started
            reports = sum(_sent(a) for a in fleet) - sent
            if before is None or after is None:
                raise RuntimeError("the control plane went away during the window")
            up = sum(1 for m in api.get("/v1/machines").json()["machines"]
                     if m.get("state") == "healthy")
        finally:
            stop.set()
            for t in threads:
                t.join(timeout=30)
            for a in fleet:
                with contextlib.suppress(Exception):
                    a.close()
            api.close()
    return {"cp_idle_cpu_pct": round(100 * (after - before) / elapsed, 3),
            "agents": agents, "agents_up_after": up,
            "agent_reports_per_s": round(reports / elapsed, 2),
            "cp_window_s": round(elapsed, 2)}


def run(tasks: int = 10, agents: int = 20, seconds: float = 60.0, probe_interval: float = 1.0,
        settle_timeout: float = 120.0, profile: Path | None = None) -> dict[str, Any]:
    return {**agent_cpu(tasks, seconds, probe_interval, settle_timeout, profile),
            **cp_idle_cpu(agents, seconds, settle_timeout)}
