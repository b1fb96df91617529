"""The REST API through a real HTTP client on loopback."""

from __future__ import annotations

import json

import httpx
import pytest
from livecp import REGION, start_live, wait_for

from plait.errors import NotFound
from plait.model import JobSpec
from plait.server.controlplane import ControlPlane, ControlPlaneConfig
from plait.server.events import Retention
from plait.server.serve import ApiServer, store_for

SPEC = {"name": "web", "entitlement": "web", "task_count": 6,
        "resources": {"cpu": 1, "memory_gb": 1}, "command": "serve",
        "update": {"max_unavailable": 1}}


def entitlement(live, name="web", owner="alice", machines=12):
    r = live.admin.post("/v1/entitlements", json={"name": name, "owner": owner,
                                                  "quota": {"machines": machines}})
    assert r.status_code in (200, 201), r.text
    return r.json()


def settled(client, name):
    r = client.get(f"/v1/jobs/{name}")
    return r.status_code == 200 and r.json()["settled"]


def events(client, **params):
    found, after = [], 0
    while True:
        page = client.get("/v1/events", params={"after": after, "limit": 1000, **params}).json()
        found.extend(page["events"])
        if page["next"] is None:
            return found
        after = page["next"]


# -- authentication -------------------------------------------------------------------------
def test_every_endpoint_but_healthz_needs_a_token_and_refusals_are_events(live):
    anon = live.client(None)
    assert anon.get("/healthz").json()["ok"] is True
    for method, path in [("GET", "/v1/jobs"), ("POST", "/v1/jobs"), ("GET", "/v1/entitlements"),
                         ("GET", "/v1/machines"), ("GET", "/v1/events"),
                         ("POST", "/v1/machines/m0000000/fail"), ("GET", "/v1/tokens")]:
        r = anon.request(method, path)
        assert r.status_code == 401, (method, path)
        assert r.json()["error"] == "unauthorized"
        assert "bearer" in r.json()["message"]
        assert r.headers["www-authenticate"] == "Bearer"
    # every bad token gets one answer; why is recorded for the admins
    forged = live.admin_token[:-4] + "AAAA"
    unknown = "plait_0000000000000000_" + "A" * 43
    for token in ("nonsense", forged, unknown):
        r = live.client(token).get("/v1/jobs")
        assert r.status_code == 401 and r.json()["message"] == "invalid token", token
    wait_for(lambda: len(events(live.admin, kind="unauthorized")) >= 10)
    refused = events(live.admin, kind="unauthorized")
    assert any("POST /v1/machines/m0000000/fail" in e["message"] for e in refused)
    assert any("malformed" in e["message"] for e in refused)
    assert any("wrong token secret" in e["message"] for e in refused)


def test_a_flood_of_refusals_takes_only_its_share_of_the_events(live, monkeypatch):
    # anyone can send a refused request: a burst is recorded whole, a flood only now
    # and then, with how many were left out (the retained events are one pool; at 20
    # a second a flood emptied the default 10,000 of everything else in 8 minutes)
    anon = live.client(None)
    for i in range(200):
        assert anon.get(f"/v1/jobs/x{i}").status_code == 401
    wait_for(lambda: len(events(live.admin, kind="unauthorized")) >= 20)
    refused = events(live.admin, kind="unauthorized")
    assert len(refused) == 20 and not events(live.admin, kind="refusals_suppressed")
    clock = live.cp.clock
    monkeypatch.setattr(live.cp, "clock", lambda: clock() + 10.5)  # one more allowed
    assert anon.get("/v1/jobs/later").status_code == 401
    assert anon.get("/v1/jobs/later2").status_code == 401  # (not yet another)
    wait_for(lambda: len(events(live.admin, kind="unauthorized")) >= 21)
    refused = events(live.admin, kind="unauthorized")
    assert len(refused) == 21 and "GET /v1/jobs/later:" in refused[-1]["message"]
    said = events(live.admin, kind="refusals_suppressed")
    assert [e["message"] for e in said] == ["180 more refusals not recorded"]


def test_a_refusal_budget_fills_at_its_rate_up_to_its_burst():
    from plait.server.events import Budget

    b = Budget(burst=2, per_second=0.5)
    assert [b.take(0.0), b.take(0.0), b.take(0.0), b.take(1.0)] == [0, 0, None, None]
    assert b.take(2.0) == 2  # a whole one again after 2 s: the two left out are said
    assert b.take(2.0) is None
    assert [b.take(100.0), b.take(100.0), b.take(100.0)] == [1, 0, None]  # at most 2


def test_tokens_are_stored_only_as_hashes_and_can_be_revoked_and_rotated(live):
    r = live.admin.post("/v1/tokens", json={"role": "owner", "name": "alice"})
    assert r.status_code == 201
    token, token_id = r.json()["token"], r.json()["id"]
    secret = token.split("_", 2)[2]
    stored = b"".join(live.cp.store.get(f"/auth/tokens/{t}")[0]
                      for t in live.cp.store.children("/auth/tokens"))
    assert secret.encode() not in stored and live.admin_token.split("_", 2)[2].encode() \
        not in stored
    alice = live.client(token)
    assert alice.get("/v1/jobs").status_code == 200
    listed = live.admin.get("/v1/tokens").json()["tokens"]
    assert {"id": token_id, "role": "owner", "name": "alice"}.items() <= next(
        t for t in listed if t["id"] == token_id).items()
    assert all("token" not in t and "hash" not in t for t in listed)

    rotated = live.admin.post(f"/v1/tokens/{token_id}/rotate").json()
    assert alice.get("/v1/jobs").status_code == 401  # the old one is revoked
    assert live.client(rotated["token"]).get("/v1/jobs").status_code == 200
    live.admin.delete(f"/v1/tokens/{rotated['id']}")
    r = live.client(rotated["token"]).get("/v1/jobs")
    assert r.status_code == 401 and r.json()["message"] == "invalid token"
    # a revoked token is not rotated back to life
    r = live.admin.post(f"/v1/tokens/{rotated['id']}/rotate")
    assert r.status_code == 409 and "revoked" in r.json()["message"]
    assert len(live.admin.get("/v1/tokens").json()["tokens"]) == len(listed) + 1


def test_owners_see_and_manage_only_their_own_entitlements_and_jobs(live):
    entitlement(live, "web", "alice")
    entitlement(live, "db", "bob")
    alice, bob = live.owner("alice"), live.owner("bob")
    assert [e["name"] for e in alice.get("/v1/entitlements").json()["entitlements"]] == ["web"]
    # another owner's entitlement is answered as one that does not exist
    def same(a: httpx.Response, b: httpx.Response, name: str, other: str) -> bool:
        return a.status_code == b.status_code and a.text == b.text.replace(other, name)

    assert same(alice.get("/v1/entitlements/db"), alice.get("/v1/entitlements/zz"), "db", "zz")
    r = alice.post("/v1/jobs", json={**SPEC, "entitlement": "db"})
    assert r.status_code == 422 and same(
        r, alice.post("/v1/jobs", json={**SPEC, "entitlement": "zz"}), "db", "zz")
    assert alice.post("/v1/jobs", json=SPEC).status_code == 201
    # bob cannot see, change or delete alice's job, nor tell it from a missing one
    assert bob.get("/v1/jobs").json()["jobs"] == []
    entitlement(live, "bobs", "bob")
    for method, path, body in [("GET", "/v1/jobs/{}", None), ("DELETE", "/v1/jobs/{}", None),
                               ("POST", "/v1/jobs/{}/resize", {"task_count": 1}),
                               ("GET", "/v1/jobs/{}/tasks", None),
                               ("GET", "/v1/discovery/{}", None)]:
        r = bob.request(method, path.format("web"), json=body)
        missing = bob.request(method, path.format("zzz"), json=body)
        assert r.status_code == 404 and same(r, missing, "web", "zzz"), (method, path, r.text)
    r = bob.put("/v1/jobs/web", json=SPEC)  # (alice's entitlement, named in the spec)
    assert r.status_code == 422 and same(
        r, bob.put("/v1/jobs/web", json={**SPEC, "entitlement": "zz"}), "web", "zz")
    # owners do not grant themselves quota or touch machines and tokens
    assert alice.post("/v1/entitlements", json={"name": "more", "owner": "alice",
                                                "quota": {"machines": 99}}).status_code == 403
    assert alice.get("/v1/machines").status_code == 403
    assert alice.post("/v1/tokens", json={"role": "admin", "name": "me"}).status_code == 403
    assert live.admin.get("/v1/jobs/web").json()["spec"]["task_count"] == 6  # unchanged
    wait_for(lambda: len(events(live.admin, kind="forbidden")) >= 10)
    # and events are scoped like everything else
    wait_for(lambda: any(e["job"] == "web" for e in events(alice)))
    assert all(e["entitlement"] == "web" for e in events(alice))
    assert not any(e["job"] == "web" for e in events(bob))


# -- jobs -----------------------------------------------------------------------------------
def test_a_job_is_created_once_placed_asynchronously_and_served(live):
    entitlement(live)
    r = live.admin.post("/v1/jobs", json=SPEC)
    assert r.status_code == 201 and r.json()["created"] is True
    again = live.admin.post("/v1/jobs", json=SPEC)
    assert again.status_code == 200 and again.json()["created"] is False
    other = live.admin.post("/v1/jobs", json={**SPEC, "task_count": 7})
    assert other.status_code == 409 and "another spec" in other.json()["message"]
    wait_for(lambda: settled(live.admin, "web"))
    endpoints = live.admin.get("/v1/discovery/web").json()["endpoints"]
    assert sorted(e["index"] for e in endpoints) == list(range(6))
    tasks = live.admin.get("/v1/jobs/web/tasks").json()["tasks"]
    assert {t["state"] for t in tasks} == {"running"}
    assert len(live.admin.get("/v1/jobs").json()["jobs"]) == 1


def test_bad_input_gets_a_4xx_naming_the_field_and_writes_nothing(live):
    entitlement(live)
    cases = [
        ({**SPEC, "task_count": -1}, "task_count"),
        ({**SPEC, "name": "Bad Name"}, "name"),
        ({**SPEC, "resources": {"cpu": 0}}, "resources"),
        ({**SPEC, "update": {"max_unavailable": "200%"}}, "update.max_unavailable"),
        ({**SPEC, "surprise": 1}, "surprise"),
        ({**SPEC, "task_controller": "ftp://x"}, "task_controller"),
    ]
    for body, field in cases:
        r = live.admin.post("/v1/jobs", json=body)
        assert r.status_code == 422, (body, r.text)
        assert r.json()["field"] == field, r.json()
        assert field.split(".")[-1] in r.json()["message"]
    r = live.admin.post("/v1/jobs", json={**SPEC, "entitlement": "nope"})
    assert r.status_code == 422 and "entitlement 'nope' does not exist" in r.json()["message"]
    r = live.admin.post("/v1/jobs", content=b"{not json", headers={
        "content-type": "application/json"})
    assert r.status_code == 422
    r = live.admin.post("/v1/jobs", content=b"x" * (2 << 20), headers={
        "content-type": "application/json"})
    assert r.status_code == 413 and "over" in r.json()["message"]
    assert live.admin.get("/v1/jobs/nope").status_code == 404
    assert live.admin.post("/v1/jobs/nope/resize", json={"task_count": 1}).status_code == 404
    assert live.cp.jobs.names() == []  # nothing half-written
    # a bad change to an existing job leaves it as it was
    assert live.admin.post("/v1/jobs", json=SPEC).status_code == 201
    bad = [("PUT", "/v1/jobs/web", {**SPEC, "name": "other"}, "name"),
           ("PUT", "/v1/jobs/web", {**SPEC, "entitlement": "web2"}, "entitlement"),
           ("POST", "/v1/jobs/web/rollback", {"version": 5}, "version"),
           ("POST", "/v1/jobs/web/restart", {"index": 99}, "index"),
           ("POST", "/v1/jobs/web/resize", {"task_count": "many"}, "task_count")]
    entitlement(live, "web2")
    for method, path, body, field in bad:
        r = live.admin.request(method, path, json=body)
        assert r.status_code == 422, (path, r.text)
        assert r.json()["field"] == field
    doc = live.cp.jobs.get("web")
    assert doc.version == 1 and doc.seq == 1


def test_update_resize_restart_rollback_and_delete(live):
    entitlement(live)
    live.admin.post("/v1/jobs", json=SPEC)
    wait_for(lambda: settled(live.admin, "web"))
    r = live.admin.put("/v1/jobs/web", json={**SPEC, "command": "serve-v2"})
    assert r.status_code == 200 and r.json()["version"] == 2
    wait_for(lambda: settled(live.admin, "web"))
    tasks = live.admin.get("/v1/jobs/web/tasks").json()["tasks"]
    assert {t["version"] for t in tasks} == {2}
    for bad in (True, "3"):  # (true was taken for 1, and "3" for 3)
        r = live.admin.post("/v1/jobs/web/resize", json={"task_count": bad})
        assert r.status_code == 422 and r.json()["field"] == "task_count", r.text
    assert live.admin.post("/v1/jobs/web/resize", json={"task_count": 3}).json()["version"] == 3
    wait_for(lambda: settled(live.admin, "web"))
    assert len(live.admin.get("/v1/jobs/web/tasks").json()["tasks"]) == 3
    assert live.admin.post("/v1/jobs/web/rollback", json={"version": 1}).json()["version"] == 4
    wait_for(lambda: settled(live.admin, "web"))
    job = live.admin.get("/v1/jobs/web").json()
    assert job["spec"]["command"] == "serve" and job["task_count"] == 6
    assert live.admin.post("/v1/jobs/web/restart").status_code == 200
    assert live.admin.post("/v1/jobs/web/tasks/2/restart").status_code == 200
    wait_for(lambda: any(e["kind"] == "restart" for e in events(live.admin, job="web")))
    wait_for(lambda: settled(live.admin, "web"))
    history = live.admin.get("/v1/jobs/web/history").json()
    assert [o["op"] for o in history["operations"]] == [
        "create", "update", "resize", "rollback", "restart", "restart"]
    assert live.admin.get("/v1/jobs/web/versions/2").json()["command"] == "serve-v2"
    r = live.admin.delete("/v1/jobs/web")
    assert r.status_code == 202 and r.json()["deleting"] is True
    assert live.admin.post("/v1/jobs/web/resize", json={"task_count": 1}).status_code == 409
    wait_for(lambda: live.admin.get("/v1/jobs/web").status_code == 404)
    assert live.cp.store.children("/scheduler/jobs") == []
    assert live.admin.get("/v1/entitlements/web").json()["machines"] == 0


def test_dry_run_shows_the_plan_and_changes_nothing(live):
    entitlement(live)
    plan = live.admin.post("/v1/jobs", params={"dry_run": "true"}, json=SPEC).json()
    assert plan["action"] == "create" and plan["tasks_added"] == 6
    assert plan["placement"]["placeable"] == 6
    assert 1 <= plan["placement"]["machines_to_claim"] <= 6
    assert live.cp.jobs.names() == []
    live.admin.post("/v1/jobs", json=SPEC)
    wait_for(lambda: settled(live.admin, "web"))
    plan = live.admin.put("/v1/jobs/web", params={"dry_run": "true"},
                          json={**SPEC, "command": "v2", "task_count": 8}).json()
    assert plan["action"] == "update"
    assert set(plan["changes"]) == {"command", "task_count"}
    assert plan["changes"]["command"] == {"from": "serve", "to": "v2"}
    assert plan["tasks_added"] == 2 and plan["tasks_updated"] == 6
    assert live.cp.jobs.get("web").version == 1
    # pacing and the TaskController do not change how a task runs: nothing updated
    plan = live.admin.put("/v1/jobs/web", params={"dry_run": "true"}, json={
        **SPEC, "update": {"max_unavailable": 3}, "task_controller": "http://10.0.0.1/tc"}
                          ).json()
    assert plan["action"] == "update" and plan["tasks_updated"] == 0
    assert set(plan["changes"]) == {"update", "task_controller"}
    # another owner's dry run under the name is what its create or deploy would be
    # told (a name taken, 409), never a diff against the job's spec: the check is on
    # the very record the plan would diff
    live.admin.post("/v1/entitlements", json={"name": "mine", "owner": "bob",
                                              "quota": {"machines": 2}})
    bob = live.owner("bob")
    theirs = {**SPEC, "entitlement": "mine", "task_count": 1}
    for answer in (bob.put("/v1/jobs/web", params={"dry_run": "true"}, json=theirs),
                   bob.post("/v1/jobs", params={"dry_run": "true"}, json=theirs)):
        assert answer.status_code == 409 and "a name taken in the region" in answer.text
        assert "serve" not in answer.text
    seen: list[str] = []

    def refuse(entitlement: str) -> None:
        seen.append(entitlement)
        raise NotFound("job", "web")
    with pytest.raises(NotFound):
        live.cp.views.plan(JobSpec.model_validate(theirs), refuse)
    assert seen == [SPEC["entitlement"]]


def test_an_acknowledged_create_is_stored_before_the_scheduler_sees_it(tmp_path):
    cp = ControlPlane(store_for(tmp_path), ControlPlaneConfig(region=REGION))
    token = cp.bootstrap_admin()
    with ApiServer(cp) as server:  # the loop is not running: nothing applies the create
        cp.loop.stop()
        admin = httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {token}"})
        admin.post("/v1/entitlements", json={"name": "web", "owner": "a",
                                             "quota": {"machines": 5}})
        assert admin.post("/v1/jobs", json=SPEC).status_code == 201
        assert "web" not in cp.scheduler.jobs
        job = admin.get("/v1/jobs/web").json()
        assert job["applied_version"] == 0 and job["version"] == 1
    cp.store.close()
    # another process reading the same store sees the job
    again = ControlPlane(store_for(tmp_path))
    assert again.jobs.get("web").spec.task_count == 6
    again.loop.step()
    assert "web" in again.scheduler.jobs
    again.store.close()


# -- machines, maintenance ------------------------------------------------------------------
def test_a_failed_machine_moves_its_tasks_and_a_cordoned_one_takes_none(live):
    entitlement(live, machines=24)
    live.admin.post("/v1/jobs", json=SPEC)
    wait_for(lambda: settled(live.admin, "web"))
    before = {e["index"]: e["machine"] for e in
              live.admin.get("/v1/discovery/web").json()["endpoints"]}
    victim = before[0]
    assert live.admin.post(f"/v1/machines/{victim}/fail").status_code == 200
    assert live.admin.post(f"/v1/machines/{victim}/fail").status_code == 409

    def moved():
        now = {e["index"]: e["machine"] for e in
               live.admin.get("/v1/discovery/web").json()["endpoints"]}
        return len(now) == 6 and victim not in now.values()
    wait_for(moved)
    assert live.admin.get(f"/v1/machines/{victim}").json()["state"] == "failed"
    assert live.admin.get("/v1/machines", params={"state": "failed"}).json()["total"] == 1
    assert live.admin.post(f"/v1/machines/{victim}/repair").json()["ended"]
    # cordon: nothing new lands there, what runs stays
    on = before[1]
    there = sorted(t["index"] for t in live.admin.get("/v1/jobs/web/tasks").json()["tasks"]
                   if t["machine"] == on)
    live.admin.post(f"/v1/machines/{on}/cordon")
    assert live.admin.get(f"/v1/machines/{on}").json()["cordoned"] is True
    live.admin.post("/v1/jobs/web/resize", json={"task_count": 12})
    wait_for(lambda: settled(live.admin, "web"))
    mine = [t for t in live.admin.get("/v1/jobs/web/tasks").json()["tasks"] if t["machine"] == on]
    assert [t["index"] for t in mine] == there
    live.admin.post(f"/v1/machines/{on}/uncordon")
    assert live.admin.get(f"/v1/machines/{on}").json()["cordoned"] is False
    # drain: the tasks move off before the deadline
    r = live.admin.post(f"/v1/machines/{on}/drain", json={"deadline_seconds": 3600})
    assert r.status_code == 200
    wait_for(lambda: settled(live.admin, "web") and all(
        t["machine"] != on for t in live.admin.get("/v1/jobs/web/tasks").json()["tasks"]))
    assert any(e["kind"] == "maintenance" for e in live.admin.get("/v1/maintenance").json()[
        "events"])
    assert live.admin.post("/v1/machines/m9999999/fail").status_code == 404


def test_scheduled_maintenance_is_listed(live):
    r = live.admin.post("/v1/maintenance", json={"machines": ["m0000001", "m0000002"],
                                                 "duration_seconds": 600,
                                                 "start": live.cp.clock() + 3600})
    assert r.status_code == 201
    listed = live.admin.get("/v1/maintenance").json()["events"]
    assert [e["machines"] for e in listed] == [["m0000001", "m0000002"]]
    assert live.admin.get("/v1/machines/m0000001").json()["cordoned"] is True
    bad = live.admin.post("/v1/maintenance", json={"machines": ["nope"],
                                                   "duration_seconds": 5})
    assert bad.status_code == 404
    # a window over before now was "scheduled", and did nothing
    past = live.admin.post("/v1/maintenance", json={"machines": ["m0000003"],
                                                    "start": 1577836800, "duration_seconds": 60})
    assert past.status_code == 422 and past.json()["field"] == "start", past.text
    assert "ended before now" in past.json()["message"]
    assert len(live.admin.get("/v1/maintenance").json()["events"]) == 1


def test_resume_is_refused_for_a_rollout_that_is_not_halted(live):
    """A resume stored for a job whose rollout runs did nothing and said it had
    ("resume stored", a history entry "rollout resumed"); as ``kubectl rollout
    resume`` of a deployment not paused, it is refused."""
    live.admin.post("/v1/entitlements", json={"name": "web", "owner": "alice",
                                              "quota": {"machines": 6}})
    spec = {"name": "web", "entitlement": "web", "task_count": 2, "command": "serve",
            "resources": {"cpu": 1, "memory_gb": 1}, "update": {"max_unavailable": 1}}
    assert live.admin.post("/v1/jobs", json=spec).status_code == 201
    wait_for(lambda: live.admin.get("/v1/jobs/web").json()["settled"])
    r = live.admin.post("/v1/jobs/web/resume")
    assert r.status_code == 409, r.text
    assert r.json()["message"] == ("job web's rollout is not halted: nothing to resume "
                                   "(plait job show web)")
    history = live.admin.get("/v1/jobs/web/history").json()
    assert "rollout resumed" not in json.dumps(history)
    assert live.admin.post("/v1/jobs/nope/resume").status_code == 404
    # a version that crashes halts the rollout; that one is resumed
    assert live.admin.put("/v1/jobs/web", json={**spec, "command": "crash"}).status_code == 200
    wait_for(lambda: live.admin.get("/v1/jobs/web").json()["halted"] is not None)
    r = live.admin.post("/v1/jobs/web/resume")
    assert r.status_code == 200, r.text


# -- agents ---------------------------------------------------------------------------------
def test_agents_join_with_the_join_token_and_act_only_for_their_machine(live):
    join = live.admin.post("/v1/tokens", json={"role": "join", "name": "cluster"}).json()["token"]
    r = live.client(join).post("/v1/agents/join", json={"machine": "m0000003"})
    assert r.status_code == 201
    machine = live.client(r.json()["token"])
    assert machine.get("/v1/machines/m0000003/desired").json()["tasks"] == []
    assert machine.get("/v1/machines/m0000004/desired").status_code == 403
    assert machine.get("/v1/jobs").status_code == 403
    assert live.client(join).get("/v1/jobs").status_code == 403
    # only a join token joins
    assert live.admin.post("/v1/agents/join", json={"machine": "m0000003"}).status_code == 403
    r = live.client(join).post("/v1/agents/join", json={"machine": "zz"})
    assert r.status_code == 422 and "--fault-domain" in r.json()["message"]


def test_a_join_token_does_not_take_over_a_machine_whose_agent_is_alive(tmp_path):
    """Every agent host holds the join token: joining as a machine whose agent is
    heard from would hand its holder that machine's tasks. Refused until the agent has
    been silent for the heartbeat timeout; a join after that replaces the machine's
    credential, and the one it had stops working."""
    cp = ControlPlane(store_for(tmp_path), ControlPlaneConfig(
        region=REGION, tick_seconds=0.05, heartbeat_timeout=1.0))
    admin_token = cp.bootstrap_admin()
    with ApiServer(cp) as server:
        admin = httpx.Client(base_url=server.url,
                             headers={"Authorization": f"Bearer {admin_token}"})
        join = admin.post("/v1/tokens", json={"role": "join", "name": "c"}).json()["token"]
        joiner = httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {join}"})
        first = joiner.post("/v1/agents/join", json={"machine": "m0000003"})
        assert first.status_code == 201, first.text
        agent = httpx.Client(base_url=server.url,
                             headers={"Authorization": f"Bearer {first.json()['token']}"})
        report = {"tasks": [], "profile": {"name": None}}
        assert agent.post("/v1/machines/m0000003/status", json=report).status_code == 200
        again = joiner.post("/v1/agents/join", json={"machine": "m0000003"})
        assert again.status_code == 409, again.text
        assert "heard" in again.json()["message"] and "data dir" in again.json()["message"]
        # (a described join is refused as well: it changes nothing of the live machine)
        described = joiner.post("/v1/agents/join", json={
            "machine": "m0000003", "fault_domain": "r/d/m/w/k", "cpu": 1, "memory_gb": 1,
            "type": "t"})
        assert described.status_code == 409, described.text
        assert agent.get("/v1/machines/m0000003/desired").status_code == 200
        # another machine, never heard from, joins
        assert joiner.post("/v1/agents/join", json={"machine": "m0000004"}).status_code == 201
        # silent past the timeout: a new agent may take the machine over (a reinstalled
        # host), and the old credential is revoked
        taken = wait_for(lambda: (r := joiner.post("/v1/agents/join", json={
            "machine": "m0000003"})).status_code != 409 and r, what="the machine free to join")
        assert taken.status_code == 201, taken.text
        cp.tokens.forget()  # (as after its cache's 2 s)
        old = agent.get("/v1/machines/m0000003/desired")
        assert old.status_code == 401
        tokens = {t["id"]: t for t in admin.get("/v1/tokens").json()["tokens"]}
        assert tokens[first.json()["id"]]["revoked"] is True
        new = httpx.Client(base_url=server.url,
                           headers={"Authorization": f"Bearer {taken.json()['token']}"})
        assert new.get("/v1/machines/m0000003/desired").status_code == 200
        wait_for(lambda: any(f"replacing {first.json()['id']}, now revoked" in e["message"]
                             for e in admin.get("/v1/events", params={
                                 "kind": "machine_joined"}).json()["events"]))


# -- events ---------------------------------------------------------------------------------
def test_an_events_page_is_written_as_its_model_says_whatever_a_message_holds(tmp_path):
    """The page is written straight from the events (no model check on the way): it
    still has every field of ``EventView``, a tenant's text as it was given (a lone
    surrogate in a TaskController's answer too), and the cursor fields."""
    from pydantic import TypeAdapter

    from plait.client.types import EventPage

    cp = ControlPlane(store_for(tmp_path), ControlPlaneConfig(
        region=REGION, tick_seconds=0.05, sim_agents=True))
    token = cp.bootstrap_admin()
    cp.record("scheduler", "task_failed", "exit 3: caf\u00e9 \ud800 \u2603", job="web",
              entitlement="web", task=2, op="restart", reason="crash", decision="ack")
    cp.flush_events()
    with ApiServer(cp) as server:
        admin = httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {token}"})
        r = admin.get("/v1/events", params={"kind": "task_failed"})
        assert r.status_code == 200 and r.headers["content-type"] == "application/json"
        page = json.loads(r.content)
        TypeAdapter(EventPage).validate_python(page, strict=True)
        [event] = page["events"]
        assert event["message"] == "exit 3: caf\u00e9 \ud800 \u2603"
        assert (event["job"], event["task"], event["op"], event["reason"],
                event["decision"], event["machine"]) == ("web", 2, "restart", "crash", "ack",
                                                         None)
        assert page["next"] is None and page["last_seq"] >= event["seq"]


def test_events_are_filtered_paged_and_kept_under_the_retention_limit(tmp_path):
    cp = ControlPlane(store_for(tmp_path), ControlPlaneConfig(
        region=REGION, tick_seconds=0.05, sim_agents=True, sim_start_seconds=0.2,
        retention=Retention(max_count=20, max_age_seconds=3600)))
    token = cp.bootstrap_admin()
    with ApiServer(cp) as server:
        admin = httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {token}"})
        for i in range(30):
            admin.post("/v1/entitlements", json={"name": f"e{i}", "owner": "o",
                                                 "quota": {"machines": 1}})
        wait_for(lambda: admin.get("/v1/events").json()["last_seq"] >= 31)
        page = admin.get("/v1/events", params={"limit": 7}).json()
        assert len(page["events"]) == 7 and page["next"] == page["events"][-1]["seq"]
        rest = admin.get("/v1/events", params={"after": page["next"], "limit": 1000}).json()
        seqs = [e["seq"] for e in page["events"] + rest["events"]]
        assert seqs == sorted(seqs) and len(seqs) == 20 and seqs[-1] == rest["last_seq"]
        assert rest["next"] is None
        only = admin.get("/v1/events", params={"entitlement": "e29"}).json()["events"]
        assert [e["kind"] for e in only] == ["entitlement_created"]
        # the store holds the same 20, in pages (decision 110): before them, only the
        # oldest page may still hold events the retention dropped
        pages = []
        for key in cp.store.children("/events/log"):
            rows = json.loads(cp.store.get(f"/events/log/{key}")[0])
            pages.append([r["seq"] for r in (rows if isinstance(rows, list) else [rows])])
        stored = [seq for page in pages for seq in page]
        assert stored[-20:] == seqs and set(stored[:-20]) <= set(pages[0][:-1])
        assert admin.get("/v1/events", params={"limit": 0}).status_code == 422
    cp.store.close()


# -- restart --------------------------------------------------------------------------------
def test_a_restarted_control_plane_has_every_job_task_and_token(tmp_path):
    live = start_live(tmp_path)
    entitlement(live)
    live.admin.post("/v1/jobs", json=SPEC)
    wait_for(lambda: settled(live.admin, "web"))
    before = live.admin.get("/v1/jobs/web/tasks").json()["tasks"]
    live.server.stop()
    live.cp.store.close()

    cp = ControlPlane(store_for(tmp_path), ControlPlaneConfig(region=REGION, tick_seconds=0.05))
    assert cp.bootstrap_admin() is None  # the admin token exists already
    with ApiServer(cp) as server:
        admin = httpx.Client(base_url=server.url,
                             headers={"Authorization": f"Bearer {live.admin_token}"})
        after = admin.get("/v1/jobs/web/tasks").json()["tasks"]
        assert [(t["index"], t["machine"], t["version"]) for t in after] == [
            (t["index"], t["machine"], t["version"]) for t in before]
        assert admin.get("/v1/entitlements/web").json()["machines"] == len(
            {t["machine"] for t in before})
        assert len(admin.get("/v1/discovery/web").json()["endpoints"]) == 6
    cp.store.close()


@pytest.mark.parametrize("path", ["/openapi.json", "/docs"])
def test_the_openapi_document_is_served(live, path):
    r = live.client(None).get(path)
    assert r.status_code == 200
    if path == "/openapi.json":
        paths = r.json()["paths"]
        for p in ["/v1/entitlements", "/v1/jobs", "/v1/jobs/{name}/tasks", "/v1/machines",
                  "/v1/maintenance", "/v1/events", "/v1/discovery/{job}", "/healthz"]:
            assert p in paths


def blob(c: str, values: int) -> dict:
    """Environment of ``values`` x 60 kB (each value within its 64 KiB bound)."""
    return {f"BLOB{i}": c * 60_000 for i in range(values)}


def test_large_versions_are_trimmed_to_fit_the_stores_record_limit(live):
    """A job's record keeps its last versions: when 300 kB versions would pass the
    store's limit per record (ZooKeeper's), the oldest that no task runs go first and
    every update is stored; the versions tasks run are kept. (Each update is rolled
    out before the next: tasks mid-rollout over several 300 kB versions would need
    them all kept, and such an update is refused: the next test.)"""
    entitlement(live)
    assert live.admin.post("/v1/jobs", json={**SPEC, "env": blob("a", 5)}).status_code == 201

    def rolled_out(version):
        job = live.admin.get("/v1/jobs/web").json()
        return job["applied_version"] == version and job["settled"]

    wait_for(lambda: rolled_out(1))
    for k in range(2, 9):
        r = live.admin.put("/v1/jobs/web", json={**SPEC, "env": blob(str(k), 5)})
        assert r.status_code == 200, r.text
        wait_for(lambda k=k: rolled_out(k), timeout=120)
    history = live.admin.get("/v1/jobs/web/history").json()
    assert history["versions"] == 8 and 8 in history["kept"] and len(history["kept"]) <= 3
    running = {t["version"] for t in live.admin.get("/v1/jobs/web/tasks").json()["tasks"]}
    assert running <= set(history["kept"])
    gone = live.admin.get("/v1/jobs/web/versions/2")
    assert gone.status_code == 404 and "no longer kept" in gone.json()["message"]
    assert live.admin.get("/healthz").json()["ok"] is True


def test_a_record_over_the_stores_limit_is_refused_before_it_is_written(live):
    """When the versions a job's tasks run and the new one cannot fit in one record,
    the write is a 413 that says so, nothing is stored, and the API and the loop go
    on."""
    entitlement(live)
    assert live.admin.post("/v1/jobs", json={**SPEC, "env": blob("a", 9)}).status_code == 201
    wait_for(lambda: live.admin.get("/v1/jobs/web").json()["applied_version"] == 1)
    refused = live.admin.put("/v1/jobs/web", json={**SPEC, "env": blob("b", 9)})
    assert refused.status_code == 413, refused.text
    assert refused.json()["error"] == "too_large"
    assert "over the store's limit" in refused.json()["message"]
    job = live.admin.get("/v1/jobs/web").json()
    assert job["version"] == 1  # nothing of the refused write
    assert live.admin.get("/healthz").json()["ok"] is True
    entitlement(live, "other")
    assert live.admin.post("/v1/jobs", json={**SPEC, "name": "small", "entitlement": "other"}
                           ).status_code == 201


def test_the_store_refuses_any_value_over_its_limit(tmp_path):
    from plait.store.protocol import MAX_VALUE_BYTES, RecordTooLarge, Transaction
    from plait.store.sqlite import SqliteStore

    s = SqliteStore(str(tmp_path / "s.db"))
    with pytest.raises(RecordTooLarge):
        s.create("/a", b"x" * (MAX_VALUE_BYTES + 1))
    s.create("/a", b"x")
    with pytest.raises(RecordTooLarge):
        s.set("/a", b"x" * (MAX_VALUE_BYTES + 1), 0)
    txn = Transaction()
    txn.create("/b", b"y" * (MAX_VALUE_BYTES + 1))
    with pytest.raises(RecordTooLarge):
        s.commit(txn)
    assert s.get("/a")[0] == b"x" and not s.exists("/b")
    s.close()


def test_a_misspelt_field_is_named_beside_the_field_it_misses(live):
    entitlement(live)
    spec = {"name": "typo", "entitlement": "web", "task_count": 1, "command": "serve",
            "resouces": {"cpu": 1, "memory_gb": 1}, "helth": {"http": "/"}}
    r = live.admin.post("/v1/jobs", json=spec)
    assert r.status_code == 422
    answer = r.json()
    assert answer["field"] == "resources"  # (the first, for programs)
    for said in ("resources: Field required", "resouces: Extra inputs are not permitted",
                 "helth: Extra inputs are not permitted"):
        assert said in answer["message"], answer["message"]
    assert live.admin.get("/v1/jobs/typo").status_code == 404  # nothing half-written
    # at most ten problems are named, then how many more
    many = {**spec, **{f"x{i}": 1 for i in range(15)}}
    message = live.admin.post("/v1/jobs", json=many).json()["message"]
    assert message.count("Extra inputs are not permitted") <= 9 and "more" in message


def test_a_name_with_a_slash_is_said_to_be_no_name(live):
    """``plait job show a/b`` (sent as a%2Fb) and a spec named "a/b" were answered
    with the framework's bare "Not Found"."""
    for method, path in (("get", "/v1/jobs/a%2Fb"), ("put", "/v1/jobs/a%2Fb"),
                         ("get", "/v1/entitlements/x%2f..%2Fy")):
        r = live.admin.request(method.upper(), path, json={"name": "a/b"})
        assert r.status_code == 404, r.text
        assert "a name has no '/'" in r.json()["message"], r.text
    assert "'a/b'" in live.admin.get("/v1/jobs/a%2Fb").json()["message"]
    # a path that is not the API's is answered as before
    assert live.admin.get("/v1/nothing-here").json()["message"] == "Not Found"


def test_an_empty_body_is_said_to_be_empty(live):
    # ("Field required", naming no field)
    for method, path in (("POST", "/v1/jobs"), ("PUT", "/v1/jobs/x"),
                         ("POST", "/v1/entitlements"), ("POST", "/v1/tokens")):
        r = live.admin.request(method, path, content=b"",
                               headers={"content-type": "application/json"})
        assert r.status_code == 422, r.text
        assert r.json()["message"] == "the request body is empty: a JSON object is required"
