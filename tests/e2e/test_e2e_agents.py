"""Real processes on loopback: a control plane and agents that run tasks as processes.
Every wait is bounded by a generous liveness timeout; nothing asserts speed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from plait.server.serve import free_port

WEB = {"name": "web", "entitlement": "web", "task_count": 3,
       "resources": {"cpu": 0.1, "memory_gb": 0.1}, "command": "sh",
       "args": ["-c", "exec python3 -m http.server $PLAIT_PORT --bind 127.0.0.1"],
       "policy": {"requirements": {"max_tasks_per_machine": 1}}}
AGENTS = ["m0000000", "m0000001", "m0000002", "m0000003"]


def wait_for(check, timeout=60.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"{what}: not reached within the liveness bound")


class Region:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {**os.environ, "PLAIT_CONFIG": str(tmp / "config.yaml")}
        self.procs: list[subprocess.Popen[bytes]] = []
        self.agents: dict[str, subprocess.Popen[bytes]] = {}
        self.serve = self._spawn("serve", "--data-dir", str(tmp / "cp"), "--port",
                                 str(self.port), "--machines", "8", "--dcs", "2",
                                 "--msbs-per-dc", "2", "--tick", "0.2",
                                 "--heartbeat-timeout", "3")
        wait_for(lambda: httpx.get(f"{self.url}/healthz").status_code == 200,
                 what="the control plane starts")
        token = (tmp / "cp" / "admin-token").read_text().strip()
        self.admin = httpx.Client(base_url=self.url, timeout=30,
                                  headers={"Authorization": f"Bearer {token}"})
        self.join = self.admin.post("/v1/tokens", json={"role": "join",
                                                        "name": "cluster"}).json()["token"]

    def _spawn(self, *args: str) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen([sys.executable, "-m", "plait.cli.main", *args], env=self.env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.procs.append(proc)
        return proc

    def start_agent(self, machine: str) -> None:
        self.agents[machine] = self._spawn(
            "agent", "--machine-id", machine, "--control-plane", self.url, "--join-token",
            self.join, "--data-dir", str(self.tmp / "agents" / machine), "--interval", "0.3")

    def task_pids(self, machine: str) -> dict[str, int]:
        state = json.loads((self.tmp / "agents" / machine / "agent.json").read_text())
        return {k: t["handle"]["pid"] for k, t in state["tasks"].items() if t["handle"]}

    def endpoints(self) -> dict[int, str]:
        found = self.admin.get("/v1/discovery/web").json()["endpoints"]
        return {e["index"]: e["endpoint"] for e in found if e["endpoint"]}

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
        for machine in self.agents:  # the tasks outlive their agents by design
            try:
                for pid in self.task_pids(machine).values():
                    os.killpg(pid, signal.SIGKILL)
            except (OSError, ValueError):
                pass


@pytest.fixture
def region(tmp_path):
    r = Region(tmp_path)
    yield r
    r.close()


def answers(endpoint: str) -> bool:
    return httpx.get(f"http://{endpoint}/", timeout=2).status_code == 200


def test_agents_run_a_job_as_processes_and_adopt_them_after_a_restart(region):
    for machine in AGENTS:
        region.start_agent(machine)
    # machines without an agent become unavailable; those with one stay up
    wait_for(lambda: region.admin.get("/v1/machines", params={"state": "failed"}).json()[
        "total"] == 4, what="agentless machines fail")
    region.admin.post("/v1/entitlements", json={"name": "web", "owner": "o",
                                                "quota": {"machines": 8}})
    assert region.admin.post("/v1/jobs", json=WEB).status_code == 201
    wait_for(lambda: len(region.endpoints()) == 3 and all(
        answers(e) for e in region.endpoints().values()), what="every task answers HTTP")
    tasks = region.admin.get("/v1/jobs/web/tasks").json()["tasks"]
    assert {t["machine"] for t in tasks} <= set(AGENTS)
    # what the task printed (http.server logs each request on stderr) reaches the API
    wait_for(lambda: '"GET / HTTP/1.1" 200' in region.admin.get(
        "/v1/jobs/web/tasks/0/logs").json()["data"], what="the task's output is shipped")

    # the agent alone crashes and comes back before the heartbeat timeout: it adopts
    # its tasks, nothing is restarted
    machine = tasks[0]["machine"]
    before = region.task_pids(machine)
    assert before
    region.agents[machine].kill()
    region.agents[machine].wait(timeout=30)
    region.start_agent(machine)
    wait_for(lambda: region.admin.get(f"/v1/machines/{machine}").json()["state"] == "healthy"
             and len(region.endpoints()) == 3, what="the agent is back")
    time.sleep(2)  # a few agent steps
    assert region.task_pids(machine) == before
    for pid in before.values():
        os.kill(pid, 0)  # still the same, running process
    assert all(answers(e) for e in region.endpoints().values())


def test_a_dead_machine_is_replaced_and_a_returning_agent_stops_its_stale_copies(region):
    for machine in AGENTS:
        region.start_agent(machine)
    wait_for(lambda: region.admin.get("/v1/machines", params={"state": "failed"}).json()[
        "total"] == 4, what="agentless machines fail")
    region.admin.post("/v1/entitlements", json={"name": "web", "owner": "o",
                                                "quota": {"machines": 8}})
    region.admin.post("/v1/jobs", json=WEB)
    wait_for(lambda: len(region.endpoints()) == 3 and all(
        answers(e) for e in region.endpoints().values()), what="every task answers HTTP")
    tasks = region.admin.get("/v1/jobs/web/tasks").json()["tasks"]
    victim = tasks[0]["machine"]
    stale = region.task_pids(victim)
    seen: list[dict[int, str]] = []

    # the agent dies and stays away past the heartbeat timeout; its task keeps running
    # (a partitioned machine), is disabled in discovery and replaced elsewhere
    region.agents[victim].kill()
    region.agents[victim].wait(timeout=30)

    def replaced() -> bool:
        now = region.endpoints()
        seen.append(now)
        placed = {t["index"]: t["machine"] for t in region.admin.get(
            "/v1/jobs/web/tasks").json()["tasks"]}
        return len(now) == 3 and victim not in placed.values() and all(
            answers(e) for e in now.values())
    wait_for(replaced, what="the lost task runs and answers elsewhere")
    assert all(len(s) == len(set(s)) for s in seen)  # one entry per task index, always
    assert all(alive(pid) for pid in stale.values())  # the stale copy still runs...

    # ...until its agent is back and fences itself
    region.start_agent(victim)
    wait_for(lambda: not any(alive(pid) for pid in stale.values()),
             what="the returning agent stops the replaced copy")
    assert len(region.endpoints()) == 3


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False
