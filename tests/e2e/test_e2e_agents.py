"""Real processes on loopback: a control plane and agents that run tasks as processes.
Every wait is bounded by a generous liveness timeout; nothing asserts speed."""

from __future__ import annotations

import os
import time

import pytest
from e2e_region import Region, alive, answers, wait_for

WEB = {"name": "web", "entitlement": "web", "task_count": 3,
       "resources": {"cpu": 0.1, "memory_gb": 0.1}, "command": "sh",
       "args": ["-c", "exec python3 -m http.server $PLAIT_PORT --bind 127.0.0.1"],
       "policy": {"requirements": {"max_tasks_per_machine": 1}}}
AGENTS = ["m0000000", "m0000001", "m0000002", "m0000003"]


@pytest.fixture
def region(tmp_path):
    r = Region(tmp_path)
    yield r
    r.close()


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
    time.sleep(2)  # a few agent steps (the subject is time: nothing restarts meanwhile)
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
