"""`plait up`: a region on one box, stopped with Ctrl-C, brought back, and surviving
a SIGKILL of its control plane. Liveness bounds only; nothing asserts speed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
from test_e2e_agents import WEB, alive, answers, wait_for

from plait.server.serve import free_port


def task_pids(data: Path) -> dict[str, int]:
    pids = {}
    for state in (data / "agents").glob("*/agent.json"):
        for key, task in json.loads(state.read_text())["tasks"].items():
            if task["handle"]:
                pids[key] = task["handle"]["pid"]
    return pids


def test_up_stop_up_again_and_survive_a_killed_control_plane(tmp_path):
    data, port = tmp_path / "region", free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "PLAIT_CONFIG": str(tmp_path / "config.yaml")}

    def up() -> subprocess.Popen[bytes]:
        proc = subprocess.Popen([sys.executable, "-m", "plait.cli.main", "up", "--data-dir",
                                 str(data), "--machines", "4", "--port", str(port),
                                 "--heartbeat-timeout", "3"], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        wait_for(lambda: httpx.get(f"{url}/healthz").status_code == 200, what="plait up")
        return proc

    def endpoints(admin: httpx.Client) -> dict[int, str]:
        found = admin.get("/v1/discovery/web").json()["endpoints"]
        return {e["index"]: e["endpoint"] for e in found if e["endpoint"]}

    proc = up()
    try:
        token = (data / "admin-token").read_text().strip()
        admin = httpx.Client(base_url=url, timeout=30,
                             headers={"Authorization": f"Bearer {token}"})
        admin.post("/v1/entitlements", json={"name": "web", "owner": "o",
                                             "quota": {"machines": 4}})
        assert admin.post("/v1/jobs", json=WEB).status_code == 201
        wait_for(lambda: len(endpoints(admin)) == 3 and all(
            answers(e) for e in endpoints(admin).values()), what="the job serves")
        first = task_pids(data)
        assert len(first) == 3

        # Ctrl-C: the agents and their tasks stop
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0
        wait_for(lambda: not any(alive(p) for p in first.values()), what="tasks stopped")

        # up again: the job comes back and serves again
        proc = up()
        wait_for(lambda: len(endpoints(admin)) == 3 and all(
            answers(e) for e in endpoints(admin).values()), what="the job serves again")
        second = task_pids(data)

        # the control plane alone is killed: agents and tasks keep serving, and the
        # next `plait up` adopts them without restarting any task
        proc.kill()
        proc.wait(timeout=30)
        time.sleep(1)
        assert all(alive(p) for p in second.values())
        assert all(answers(e) for e in endpoints_from_state(data).values())
        proc = up()
        output = b""
        wait_for(lambda: len(endpoints(admin)) == 3, what="the tasks are adopted")
        time.sleep(2)
        assert task_pids(data) == second
        assert all(alive(p) for p in second.values())
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            output = proc.communicate(timeout=60)[0]
        except subprocess.TimeoutExpired:
            proc.kill()
            output = proc.communicate()[0]
        for pid in task_pids(data).values():
            if alive(pid):
                os.killpg(pid, signal.SIGKILL)
    assert b"adopted" in output


def endpoints_from_state(data: Path) -> dict[str, str]:
    found = {}
    for state in (data / "agents").glob("*/agent.json"):
        for key, task in json.loads(state.read_text())["tasks"].items():
            if task["handle"]:
                found[key] = f"127.0.0.1:{task['port']}"
    return found
