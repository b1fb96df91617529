"""Small hardening of the API on a live control plane: a push's stages are strict
integers; credentials in a TaskController's or gate's URL are never shown; request
bodies are UTF-8 JSON; an entitlement can be deleted; a maintenance can be
cancelled; a canary's host profile is one its entitlement allows."""

from __future__ import annotations

import httpx
import pytest
from livecp import Live, wait_for

JOB = {"name": "web", "entitlement": "e", "task_count": 2, "command": "serve",
       "resources": {"cpu": 1, "memory_gb": 1}, "update": {"max_unavailable": 1}}


def spec(**changes: object) -> dict:
    return {**JOB, **changes}


@pytest.fixture
def alice(live: Live) -> httpx.Client:
    assert live.admin.post("/v1/entitlements", json={
        "name": "e", "owner": "alice", "quota": {"machines": 8}}).status_code == 201
    client = live.owner("alice")
    assert client.post("/v1/jobs", json=JOB).status_code == 201
    wait_for(lambda: client.get("/v1/jobs/web").json()["settled"])
    return client


@pytest.mark.parametrize("stages", [["50"], [True], [50, "100"]])
def test_push_stages_must_be_integers(alice: httpx.Client, stages: list[object]) -> None:
    r = alice.put("/v1/jobs/web/push", json={"spec": spec(command="v2"), "stages": stages})
    assert r.status_code == 422, r.text
    assert "stages" in r.text
    assert alice.get("/v1/jobs/web/push").status_code == 404  # nothing half written


@pytest.mark.parametrize(("encoding", "named"), [
    ("utf-16", "UTF-16"), ("utf-16-le", "UTF-16-LE"), ("utf-32-be", "UTF-32-BE"),
    ("utf-8-sig", "byte order mark")])
def test_bodies_that_are_not_utf8_are_refused_naming_the_encoding(
        live: Live, alice: httpx.Client, encoding: str, named: str) -> None:
    import json
    headers = {"Content-Type": "application/json"}
    calls = [  # (a create, on the hot path and the route; a push; an admin's create)
        (alice, "POST", "/v1/jobs", spec(name="other")),
        (alice, "PUT", "/v1/jobs/other", spec(name="other")),
        (alice, "PUT", "/v1/jobs/web/push", {"spec": spec(command="v2"), "stages": [50]}),
        (live.admin, "POST", "/v1/entitlements", {"name": "f", "owner": "bob",
                                                  "quota": {"machines": 1}})]
    for client, method, path, body in calls:
        r = client.request(method, path, content=json.dumps(body).encode(encoding),
                           headers=headers)
        assert r.status_code == 422, (path, r.text)
        assert named in r.json()["message"] and "UTF-8" in r.json()["message"], r.text
    # nothing was written
    assert alice.get("/v1/jobs/other").status_code == 404
    assert alice.get("/v1/jobs/web/push").status_code == 404
    assert live.admin.get("/v1/entitlements/f").status_code == 404
    # bytes no UTF-8 text holds (Latin-1) are named too; UTF-8 itself is taken
    r = alice.post("/v1/jobs", content=json.dumps(spec(name="other", command="caf\u00e9"),
                                                  ensure_ascii=False).encode("latin-1"),
                   headers=headers)
    assert r.status_code == 422 and "0xe9" in r.json()["message"], r.text
    r = alice.post("/v1/jobs", content=json.dumps(spec(name="other", command="caf\u00e9"),
                                                  ensure_ascii=False).encode(), headers=headers)
    assert r.status_code == 201, r.text
