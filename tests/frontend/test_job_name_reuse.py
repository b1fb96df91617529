"""A job deleted and made again under its name (by another owner, say) is a new job:
nothing kept for the first one apart from its record (its tasks' output, its
autoscale policy and load, its Job Control Plane intents, its TaskControl key) shows
through, or acts on, the second (live control plane, simulated agents)."""

from __future__ import annotations

import httpx
from livecp import Live, wait_for

from plait.model import JobSpec
from plait.persist.scheduler import JobDoc, new_job
from plait.taskcontrol import signing


def job(entitlement: str, command: str, tasks: int = 1) -> dict:
    return {"name": "web", "entitlement": entitlement, "task_count": tasks,
            "command": command, "resources": {"cpu": 1, "memory_gb": 1}}


def setup(live: Live) -> tuple[httpx.Client, httpx.Client]:
    for name, owner in (("ea", "alice"), ("eb", "bob")):
        assert live.admin.post("/v1/entitlements", json={
            "name": name, "owner": owner, "quota": {"machines": 12}}).status_code == 201
    return live.owner("alice"), live.owner("bob")


def size(client: httpx.Client) -> int:
    return int(client.get("/v1/jobs/web").json()["spec"]["task_count"])


def delete_and_make_again(live: Live, alice: httpx.Client, bob: httpx.Client) -> None:
    assert alice.delete("/v1/jobs/web").status_code in (200, 202)
    wait_for(lambda: alice.get("/v1/jobs/web").status_code == 404)
    assert bob.post("/v1/jobs", json=job("eb", "bob-serve")).status_code == 201


def test_the_output_of_a_deleted_job_is_not_the_next_ones(live: Live) -> None:
    alice, bob = setup(live)
    assert alice.post("/v1/jobs", json=job("ea", "alice-secret", tasks=2)).status_code == 201

    def logs(client: httpx.Client, index: int) -> str:
        r = client.get(f"/v1/jobs/web/tasks/{index}/logs")
        return str(r.json().get("data", "")) if r.status_code == 200 else ""
    wait_for(lambda: "alice-secret" in logs(alice, 0) and "alice-secret" in logs(alice, 1))
    delete_and_make_again(live, alice, bob)
    for index in (0, 1):
        assert "alice-secret" not in logs(bob, index)
    wait_for(lambda: "bob-serve" in logs(bob, 0))
    assert "alice-secret" not in logs(bob, 0) + logs(bob, 1)


def test_an_autoscale_policy_belongs_to_the_job_it_was_set_on(live: Live) -> None:
    alice, bob = setup(live)
    assert alice.post("/v1/jobs", json=job("ea", "serve")).status_code == 201
    assert alice.put("/v1/jobs/web/autoscale", json={"interval_seconds": 1, "policy": {
        "metric": "external", "target_utilization": 0.5, "min_tasks": 1, "max_tasks": 8,
        "scale_down_fraction": 0.5, "history_weight": 0}}).status_code == 200
    assert alice.post("/v1/jobs/web/load", json={"value": 0.5}).status_code == 200
    delete_and_make_again(live, alice, bob)
    assert bob.get("/v1/jobs/web/autoscale").status_code == 404
    assert bob.post("/v1/jobs/web/load", json={"value": 3.5}).status_code == 404
    # decisions go on (a second a job): none for the new job, and the record goes
    wait_for(lambda: "web" not in live.cp.autoscaling.ns.children("/"))
    passes = live.cp.steps  # (the Job Control Plane acts on a sizing intent in a pass)
    wait_for(lambda: live.cp.steps >= passes + 5)
    assert size(bob) == 1 and bob.get("/v1/jobs/web/autoscale").status_code == 404
    # the new job's owner sets a policy of its own: it starts with no load measured
    assert bob.put("/v1/jobs/web/autoscale", json={"interval_seconds": 1, "policy": {
        "metric": "external", "target_utilization": 0.5, "min_tasks": 1,
        "max_tasks": 4}}).status_code == 200
    assert bob.get("/v1/jobs/web/autoscale").json()["load"] is None


def test_intents_belong_to_the_job_they_were_set_on(live: Live) -> None:
    alice, bob = setup(live)
    assert alice.post("/v1/jobs", json=job("ea", "serve")).status_code == 201
    assert alice.put("/v1/jobs/web/sizing", json={"task_count": 3, "min": 2,
                                                  "max": 5}).status_code == 200
    wait_for(lambda: size(alice) == 3)
    # the record is left as a job deleted between two reconciles leaves it
    record = live.cp.jcp.ns.get("/web")[0]
    delete_and_make_again(live, alice, bob)
    if not live.cp.jcp.ns.exists("/web"):
        live.cp.jcp.ns.create("/web", record)
    intents = bob.get("/v1/jobs/web/intents").json()
    assert intents["sizing"] is None and intents["push"] is None and not intents["canaries"]
    assert bob.get("/v1/jobs/web/sizing").status_code == 404
    live.cp.jcp.store.poked = True  # (a reconcile at once, as after a write)
    wait_for(lambda: not live.cp.jcp.ns.exists("/web"))
    assert size(bob) == 1
    # the new job's own intent replaces nothing of the former one's
    assert bob.put("/v1/jobs/web/sizing", json={"task_count": 2}).status_code == 200
    wait_for(lambda: size(bob) == 2)


def test_a_jobs_taskcontrol_key_is_its_own(live: Live) -> None:
    alice, bob = setup(live)
    assert alice.post("/v1/jobs", json=job("ea", "serve")).status_code == 201
    first = alice.get("/v1/jobs/web/controller-key").json()["key"]
    delete_and_make_again(live, alice, bob)
    again = bob.get("/v1/jobs/web/controller-key").json()["key"]
    assert again != first and len(again) == 64
    # a job stored before jobs had ids keeps the key of its name
    doc, _ = new_job(JobSpec.model_validate(job("ea", "serve")), 0.0)
    assert doc.uid and JobDoc.from_bytes(doc.to_bytes()).uid == doc.uid
    doc.uid = ""
    assert "uid" not in JobDoc.from_bytes(doc.to_bytes()).to_bytes().decode()
    assert signing.key_name("web", "") == "web" and signing.key_name("web", "ab") == "web#ab"
