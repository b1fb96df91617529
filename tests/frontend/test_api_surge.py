"""The surge buffer through the API on a live control plane (simulated agents): an
entitlement's surge buffer and a job's ``update.surge`` are set as any field is; an
update of the single-task job starts a surge task that serves (in discovery) before
the task goes down, and it goes away after; the job never leaves discovery."""

from __future__ import annotations

import threading

from livecp import Live, wait_for

JOB = {"name": "model", "entitlement": "e", "task_count": 1, "command": "serve",
       "resources": {"cpu": 1, "memory_gb": 1}, "update": {"surge": True}}


def test_an_update_is_covered_by_a_surge_task(live: Live) -> None:
    r = live.admin.post("/v1/entitlements", json={
        "name": "e", "owner": "alice", "quota": {"machines": 4}, "surge_buffer": 1})
    assert r.status_code == 201, r.text
    alice = live.owner("alice")
    assert alice.get("/v1/entitlements/e").json()["surge_buffer"] == 1
    assert alice.post("/v1/jobs", json=JOB).status_code == 201
    wait_for(lambda: alice.get("/v1/jobs/model").json()["settled"])
    seen: list[list[int]] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            seen.append([e["index"] for e in alice.get("/v1/discovery/model").json()[
                "endpoints"]])
    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        assert alice.put("/v1/jobs/model", json={**JOB, "command": "serve-v2"}
                         ).status_code == 200
        wait_for(lambda: bool(live.admin.get("/v1/events", params={
            "job": "model", "kind": "surge_released"}).json()["events"]))
        wait_for(lambda: alice.get("/v1/jobs/model").json()["settled"])
    finally:
        stop.set()
        watcher.join()
    # never out of discovery: task 0, or its surge task (index 1) while task 0 updated
    assert all(seen) and [1] in seen and seen[-1] == [0]
    tasks = alice.get("/v1/jobs/model/tasks").json()["tasks"]
    assert [t["index"] for t in tasks] == [0] and tasks[0]["version"] == 2
    started = live.admin.get("/v1/events", params={"job": "model", "kind": "surge_started"}
                             ).json()["events"]
    assert len(started) == 1 and "task 0" in started[0]["message"]
