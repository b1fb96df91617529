"""Autoscaling through the API on a live control plane (simulated agents): a job's
owner sets a policy, pushes its load, and the autoscaler resizes the job (stored as
a resize by actor ``autoscaler``); another owner cannot see or touch it; a policy on
an unknown metric is refused by name, a load pushed to a policy on CPU too; turning
it off leaves the size."""

from __future__ import annotations

from livecp import Live, wait_for

JOB = {"name": "web", "entitlement": "e", "task_count": 2, "command": "serve",
       "resources": {"cpu": 1, "memory_gb": 1}}
POLICY = {"interval_seconds": 1, "policy": {
    "metric": "external", "target_utilization": 0.5, "min_tasks": 1, "max_tasks": 20,
    "scale_down_fraction": 0.5, "history_weight": 0}}


def size(live: Live) -> int:
    return int(live.admin.get("/v1/jobs/web").json()["spec"]["task_count"])


def test_the_autoscaler_resizes_a_job_to_its_pushed_load(live: Live) -> None:
    assert live.admin.post("/v1/entitlements", json={
        "name": "e", "owner": "alice", "quota": {"machines": 24}}).status_code == 201
    alice, bob = live.owner("alice"), live.owner("bob")
    assert alice.post("/v1/jobs", json=JOB).status_code == 201
    # a load before any policy: refused (no policy to scale by)
    assert alice.post("/v1/jobs/web/load", json={"value": 3}).status_code == 404
    bad = alice.put("/v1/jobs/web/autoscale", json={**POLICY, "policy": {
        **POLICY["policy"], "metric": "memory"}})
    assert bad.status_code == 422 and "metric" in bad.json()["message"]
    # a policy on the CPU its agents report takes no pushed load
    assert alice.put("/v1/jobs/web/autoscale", json={**POLICY, "policy": {
        **POLICY["policy"], "metric": "cpu"}}).status_code == 200
    refused = alice.post("/v1/jobs/web/load", json={"value": 3})
    assert refused.status_code == 409 and "cpu metric" in refused.json()["message"]
    r = alice.put("/v1/jobs/web/autoscale", json=POLICY)
    assert r.status_code == 200, r.text
    assert r.json()["policy"]["target_utilization"] == 0.5
    # the other owner cannot tell it from a missing job
    assert bob.get("/v1/jobs/web/autoscale").status_code == 404
    assert bob.post("/v1/jobs/web/load", json={"value": 100}).status_code == 404
    assert alice.post("/v1/jobs/web/load", json={"value": -1}).status_code == 422
    # NaN was "Input should be less than or equal to 10000000"
    nan = alice.post("/v1/jobs/web/load", content=b'{"value": NaN}',
                     headers={"Content-Type": "application/json"})
    assert nan.status_code == 422 and "finite number" in nan.json()["message"], nan.text
    # 4 tasks' worth of work at 50 %: 8 tasks
    assert alice.post("/v1/jobs/web/load", json={"value": 4}).status_code == 200
    wait_for(lambda: size(live) == 8)
    def autoscaled() -> list[dict]:
        return live.admin.get("/v1/events", params={"job": "web", "kind": "autoscaled"}
                              ).json()["events"]
    wait_for(lambda: bool(autoscaled()))
    assert autoscaled()[0]["actor"] == "autoscaler" and "2 -> 8 tasks" in autoscaled()[0][
        "message"]
    resized = live.admin.get("/v1/events", params={"job": "web"}).json()["events"]
    assert any(e["actor"] == "autoscaler" for e in resized if e["kind"] != "autoscaled")
    # the load falls: at most half the tasks go per decision
    def shrink() -> bool:
        alice.post("/v1/jobs/web/load", json={"value": 0.5})
        return size(live) == 1
    wait_for(shrink)
    assert alice.get("/v1/jobs/web/autoscale").json()["load"]["value"] == 0.5
    # while the autoscaler's sizing intent holds, a resize by hand is refused by name
    # (the intent would put its size back at once)
    refused = alice.post("/v1/jobs/web/resize", json={"task_count": 3})
    assert refused.status_code == 409 and "sizing intent of 1 tasks (by autoscaler)" in (
        refused.json()["message"])
    assert alice.post("/v1/jobs/web/resize", json={"task_count": 1}).status_code == 200
    removed = alice.delete("/v1/jobs/web/autoscale")
    assert removed.status_code == 200 and removed.json()["policy"]["max_tasks"] == 20
    assert alice.get("/v1/jobs/web/autoscale").status_code == 404
    assert size(live) == 1
    # turned off, its sizing intent goes with it: a resize then is the job's size
    assert alice.get("/v1/jobs/web/intents").json()["sizing"] is None
    assert alice.post("/v1/jobs/web/resize", json={"task_count": 3}).status_code == 200
    passes = live.cp.steps
    wait_for(lambda: live.cp.steps >= passes + 5)  # (the Job Control Plane runs after
    assert size(live) == 3                         # each: it did not undo the resize)


def test_a_machine_reports_cpu_only_for_the_tasks_placed_on_it(tmp_path) -> None:
    """An agent's CPU figures reach a job's autoscaler only for that job's tasks on
    the agent's own machine: a machine credential cannot drive another job's size by
    reporting usage for tasks it does not run."""
    from livecp import start_live, stop_live

    live = start_live(tmp_path / "data", sim_agents=False)
    try:
        assert live.admin.post("/v1/entitlements", json={
            "name": "e", "owner": "alice", "quota": {"machines": 24}}).status_code == 201
        alice = live.owner("alice")
        assert alice.post("/v1/jobs", json={**JOB, "task_count": 1}).status_code == 201
        assert alice.put("/v1/jobs/web/autoscale", json={**POLICY, "policy": {
            **POLICY["policy"], "metric": "cpu", "max_tasks": 50}}).status_code == 200
        def placed() -> str | None:
            tasks = alice.get("/v1/jobs/web/tasks").json()["tasks"]
            return tasks[0]["machine"] if tasks else None
        wait_for(lambda: placed() is not None)
        host = placed()
        other = "m0000011" if host != "m0000011" else "m0000012"
        burn = {"tasks": [{"job": "web", "index": i, "revision": 1, "phase": "running",
                           "cpu": 100_000} for i in range(3)]}
        intruder, _ = live.agent(other)
        r = intruder.post(f"/v1/machines/{other}/status", json=burn)
        assert r.status_code == 200, r.text  # (taken: a stale copy is not an error)
        wait_for(lambda: live.cp.liveness.last.get(other) is not None)  # (applied)
        live.cp.autoscaling.decide(live.cp.clock())
        assert not live.cp.autoscaling.cpu.get("web")
        assert size(live) == 1
        # the machine the task is on speaks for it (index 0 only: 1 and 2 do not exist)
        own, _ = live.agent(host)
        assert own.post(f"/v1/machines/{host}/status", json={"tasks": [
            {"job": "web", "index": i, "revision": 1, "phase": "running", "cpu": 0.25}
            for i in range(3)]}).status_code == 200
        wait_for(lambda: set(live.cp.autoscaling.cpu.get("web", {})) == {0})
    finally:
        stop_live(live)
