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
