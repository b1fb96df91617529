"""POST /v1/jobs/{name}/move through a real HTTP client on loopback."""

from __future__ import annotations

from livecp import wait_for

SPEC = {"name": "web", "entitlement": "web", "task_count": 4,
        "resources": {"cpu": 1, "memory_gb": 1}, "command": "serve",
        "policy": {"requirements": {"max_tasks_per_machine": 1}},
        "update": {"max_unavailable": 1}}


def entitlement(live, name, owner, machines=8):
    r = live.admin.post("/v1/entitlements", json={"name": name, "owner": owner,
                                                  "quota": {"machines": machines}})
    assert r.status_code in (200, 201), r.text


def test_moving_a_job_needs_both_entitlements_and_refuses_bad_targets(live):
    entitlement(live, "web", "alice")
    entitlement(live, "web2", "alice")
    entitlement(live, "tiny", "alice", machines=2)
    entitlement(live, "db", "bob")
    alice, bob = live.owner("alice"), live.owner("bob")
    assert alice.post("/v1/jobs", json=SPEC).status_code == 201
    wait_for(lambda: alice.get("/v1/jobs/web").json()["settled"])

    def move(client, target, job="web"):
        return client.post(f"/v1/jobs/{job}/move", json={"entitlement": target})

    r = move(live.client(None), "web2")
    assert r.status_code == 401 and r.json()["error"] == "unauthorized"
    assert move(live.client("plait_0000_wrong"), "web2").status_code == 401
    r = move(bob, "db")  # bob owns the target, not the job's entitlement: no such job
    assert r.status_code == 404 and r.json()["message"] == "job 'web' not found"
    r = move(alice, "db")  # alice owns the job, not the target: no such entitlement
    assert r.status_code == 422 and "entitlement 'db' does not exist" in r.json()["message"]
    assert move(alice, "web2", job="ghost").status_code == 404
    assert move(live.admin, "web2", job="ghost").status_code == 404
    r = move(live.admin, "nope")
    assert r.status_code == 422 and r.json()["field"] == "entitlement"
    assert "does not exist" in r.json()["message"]
    r = move(alice, "web")
    assert r.status_code == 422 and "already runs in entitlement 'web'" in r.json()["message"]
    r = move(alice, "tiny")  # four machines needed, a quota of two
    assert r.status_code == 409 and r.json()["error"] == "conflict"
    assert "room for the 4 tasks of job web" in r.json()["message"]
    r = alice.post("/v1/jobs/web/move", json={"entitlement": "web2", "extra": 1})
    assert r.status_code == 422
    r = alice.post("/v1/jobs/web/move", json={})
    assert r.status_code == 422 and r.json()["field"] == "entitlement"
    job = alice.get("/v1/jobs/web").json()  # nothing changed
    assert job["version"] == 1 and job["entitlement"] == "web" and job["moving_from"] is None
    assert [o["op"] for o in alice.get("/v1/jobs/web/history").json()["operations"]] == [
        "create"]

    r = move(alice, "web2")
    assert r.status_code == 200, r.text
    assert r.json()["entitlement"] == "web2" and r.json()["version"] == 2
    view = alice.get("/v1/jobs/web").json()
    assert view["entitlement"] == "web2" and view["spec"]["entitlement"] == "web2"
    # while it moves the view says from where and how far (or it is done already)
    assert (view["moving_from"] == "web" and view["on_entitlement"] < 4) or (
        view["moving_from"] is None and view["on_entitlement"] == 4) or (
        view["applied_version"] == 1)

    def done():
        v = alice.get("/v1/jobs/web").json()
        return v["moving_from"] is None and v["settled"] and v["applied_version"] == 2
    wait_for(done)
    view = alice.get("/v1/jobs/web").json()
    assert view["on_entitlement"] == 4 and view["serving"] == 4
    assert live.admin.get("/v1/entitlements/web").json()["machines"] == 0
    assert live.admin.get("/v1/entitlements/web2").json()["machines"] == 4
    assert [o["op"] for o in alice.get("/v1/jobs/web/history").json()["operations"]] == [
        "create", "move"]
    wait_for(lambda: any(e["kind"] == "move_done" for e in alice.get(
        "/v1/events", params={"job": "web", "limit": 1000}).json()["events"]))
