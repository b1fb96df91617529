"""Limits per owner on jobs and tasks, and jobs no quota could ever hold, through the
API as owners and admins use it: refused with a 422 naming the limit or the quota,
nothing of a refused write stored; an admin sets an owner's limits; the autoscaler
clamps to them and says so."""

from __future__ import annotations

import concurrent.futures

import pytest
from livecp import start_live, stop_live, wait_for

from plait.model import Resources
from plait.server.controlplane.owners import never_fits

JOB = {"name": "web", "entitlement": "web", "task_count": 2, "command": "serve",
       "resources": {"cpu": 1, "memory_gb": 1}}


def test_what_no_quota_could_ever_hold() -> None:
    one = Resources(cpu=1, memory_gb=1)
    largest = (16_000, 65_536, 1_048_576)  # 16 RRU, 64 GB, 1 TB
    assert never_fits(None, 200.0, 200, one, largest) is None
    assert "200 RRU" in (never_fits(None, 200.0, 201, one, largest) or "")
    assert never_fits(2, None, 32, one, largest) is None  # tasks stack: 16 a machine
    assert "CPU" in (never_fits(2, None, 33, one, largest) or "")
    assert "memory" in (never_fits(1, None, 5, Resources(cpu=0.1, memory_gb=16), largest)
                        or "")
    assert never_fits(2, None, 10**6, one, None) is None  # no machine known: no refusal
    # one task larger than every machine: it waits for such machines to join
    assert never_fits(2, None, 10, Resources(cpu=640, memory_gb=1), largest) is None
    assert never_fits(0, None, 0, one, largest) is None


@pytest.fixture
def region(tmp_path):
    live = start_live(tmp_path / "data", owner_max_jobs=3, owner_max_tasks=10)
    yield live
    stop_live(live)


def _events(client, **params) -> list[dict]:
    return client.get("/v1/events", params={"limit": 1000, **params}).json()["events"]


def test_a_job_its_quota_could_never_hold_is_refused_naming_the_quota(tmp_path) -> None:
    live = start_live(tmp_path / "data")
    try:
        admin = live.admin
        assert admin.post("/v1/entitlements", json={
            "name": "web", "owner": "alice", "quota": {"rru": 200}}).status_code == 201
        assert admin.post("/v1/entitlements", json={
            "name": "two", "owner": "alice", "quota": {"machines": 2}}).status_code == 201
        alice = live.owner("alice")
        r = alice.post("/v1/jobs", json={**JOB, "task_count": 100_000})
        assert r.status_code == 422, r.text
        assert r.json()["field"] == "task_count"
        assert "quota of 200 RRU" in r.json()["message"]
        assert alice.get("/v1/jobs/web").status_code == 404  # nothing stored
        # a machines quota: tasks stack on the region's largest machines (16 RRU)
        r = alice.post("/v1/jobs", json={**JOB, "entitlement": "two", "task_count": 40})
        assert r.status_code == 422 and "quota of 2 machines" in r.json()["message"]
        assert alice.post("/v1/jobs", json={**JOB, "entitlement": "two",
                                            "task_count": 20}).status_code == 201
        # growing it past what the quota could hold: refused, the job as it was
        r = alice.post("/v1/jobs/web/resize", json={"task_count": 40})
        assert r.status_code == 422 and "quota" in r.json()["message"]
        assert alice.get("/v1/jobs/web").json()["spec"]["task_count"] == 20
    finally:
        stop_live(live)


def test_an_owners_limits_refuse_creates_updates_resizes_and_intents(region) -> None:
    admin = region.admin
    for ent, owner in (("web", "alice"), ("bobs", "bob")):
        assert admin.post("/v1/entitlements", json={
            "name": ent, "owner": owner, "quota": {"machines": 8}}).status_code == 201
    alice, bob = region.owner("alice"), region.owner("bob")
    for name in ("a1", "a2", "a3"):
        assert alice.post("/v1/jobs", json={**JOB, "name": name}).status_code == 201
    r = alice.post("/v1/jobs", json={**JOB, "name": "a4"})
    assert r.status_code == 422 and r.json()["field"] == "limits.jobs"
    assert "at most 3 jobs" in r.json()["message"] and "holds 3" in r.json()["message"]
    assert alice.get("/v1/jobs/a4").status_code == 404
    r = alice.put("/v1/jobs/a4", json={**JOB, "name": "a4"})  # a create by PUT as well
    assert r.status_code == 422 and r.json()["field"] == "limits.jobs"
    # bob has limits of his own
    assert bob.post("/v1/jobs", json={**JOB, "name": "b1", "entitlement": "bobs",
                                      "task_count": 10}).status_code == 201
    # 6 tasks held of 10: a resize, an update and a sizing intent past it are refused
    r = alice.post("/v1/jobs/a1/resize", json={"task_count": 7})
    assert r.status_code == 422 and r.json()["field"] == "limits.tasks"
    assert "at most 10 tasks" in r.json()["message"]
    r = alice.put("/v1/jobs/a1", json={**JOB, "name": "a1", "task_count": 7})
    assert r.status_code == 422 and r.json()["field"] == "limits.tasks"
    r = alice.put("/v1/jobs/a1/sizing", json={"task_count": 7})
    assert r.status_code == 422 and r.json()["field"] == "limits.tasks"
    assert alice.get("/v1/jobs/a1/sizing").status_code == 404
    doc = alice.get("/v1/jobs/a1").json()
    assert doc["spec"]["task_count"] == 2 and doc["version"] == 1
    assert alice.post("/v1/jobs/a1/resize", json={"task_count": 6}).status_code == 200
    assert alice.post("/v1/jobs/a1/resize", json={"task_count": 1}).status_code == 200
    # what each owner holds, and an owner sees its own limits only
    mine = alice.get("/v1/owners/alice/limits").json()
    assert (mine["jobs"], mine["tasks"], mine["used"]) == (3, 10, {"jobs": 3, "tasks": 5})
    assert alice.get("/v1/owners/bob/limits").status_code == 404
    assert alice.put("/v1/owners/alice/limits", json={"jobs": 100}).status_code == 403
    # an admin raises alice's: her fourth job is taken
    r = admin.put("/v1/owners/alice/limits", json={"jobs": 4})
    assert r.status_code == 200 and r.json()["jobs"] == 4 and r.json()["set"] == {"jobs": 4}
    assert alice.post("/v1/jobs", json={**JOB, "name": "a4"}).status_code == 201
    listed = {o["owner"]: o for o in admin.get("/v1/owners/limits").json()["owners"]}
    assert listed["alice"]["used"]["jobs"] == 4 and listed["bob"]["used"]["tasks"] == 10
    assert admin.get("/v1/owners/limits").json()["defaults"] == {"jobs": 3, "tasks": 10}
    bad = admin.put("/v1/owners/alice/limits", json={"jobs": -1})
    assert bad.status_code == 422
    # a job whose deletion finished no longer counts
    assert alice.delete("/v1/jobs/a4").status_code == 202
    wait_for(lambda: alice.get("/v1/jobs/a4").status_code == 404)
    assert admin.put("/v1/owners/alice/limits", json={}).json()["jobs"] == 3
    wait_for(lambda: alice.get("/v1/owners/alice/limits").json()["used"]["jobs"] == 3)
    assert alice.post("/v1/jobs", json={**JOB, "name": "a5"}).status_code == 422


def test_concurrent_creates_cannot_pass_the_limit_together(region) -> None:
    assert region.admin.post("/v1/entitlements", json={
        "name": "web", "owner": "alice", "quota": {"machines": 8}}).status_code == 201
    alice = region.owner("alice")
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        codes = list(pool.map(
            lambda i: alice.post("/v1/jobs", json={**JOB, "name": f"j{i}",
                                                   "task_count": 1}).status_code,
            range(12)))
    assert codes.count(201) == 3 and codes.count(422) == 9
    assert len(alice.get("/v1/jobs").json()["jobs"]) == 3


def test_the_autoscaler_clamps_to_the_owners_limit_and_says_so(region) -> None:
    assert region.admin.post("/v1/entitlements", json={
        "name": "web", "owner": "alice", "quota": {"machines": 8}}).status_code == 201
    alice = region.owner("alice")
    assert alice.post("/v1/jobs", json=JOB).status_code == 201
    assert alice.put("/v1/jobs/web/autoscale", json={"interval_seconds": 1, "policy": {
        "metric": "external", "target_utilization": 0.5, "min_tasks": 1, "max_tasks": 50,
        "scale_down_fraction": 0.5, "history_weight": 0}}).status_code == 200
    # 10 tasks' worth at 50 %: 20 wanted, 10 at most
    assert alice.post("/v1/jobs/web/load", json={"value": 10}).status_code == 200
    wait_for(lambda: alice.get("/v1/jobs/web").json()["spec"]["task_count"] == 10)
    wait_for(lambda: bool(_events(alice, job="web", kind="autoscale_clamped")))
    said = _events(alice, job="web", kind="autoscale_clamped")[0]["message"]
    assert "20 tasks wanted, 10 at most" in said and "limit of 10 tasks" in said
    assert alice.get("/v1/jobs/web").json()["spec"]["task_count"] == 10
