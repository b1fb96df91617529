"""One request id per API request, end to end: the front end takes the caller's
X-Request-Id (or replaces an unsafe one, or makes one), returns it, passes it to the
shard; the access lines of both and the shard's own lines carry it; the job the
request changed remembers it, and the desired sets of its tasks carry it to agents.
Every wait is a liveness bound, not a speed check."""

from __future__ import annotations

import io
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from livecp import Live, start_behind_front_end, stop_live, wait_for

from plait import logconfig
from plait.client.client import ApiError, Client

JOB = {"name": "web", "entitlement": "e", "task_count": 2, "command": "serve",
       "resources": {"cpu": 1, "memory_gb": 1}, "update": {"max_unavailable": 1}}
SAFE = re.compile(r"[A-Za-z0-9._:-]{1,64}")


class Logs:
    """What this process logged (JSON lines) since the test began."""

    def __init__(self) -> None:
        self.out = io.StringIO()

    def lines(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.out.getvalue().splitlines()]

    def of(self, rid: str, logger: str | None = None) -> list[dict[str, Any]]:
        return [x for x in self.lines() if x.get("request_id") == rid
                and (logger is None or x["logger"] == logger)]


@pytest.fixture
def logs() -> Iterator[Logs]:
    found = Logs()
    logconfig.configure("test", stream=found.out, fmt="json", level="info")
    yield found
    logconfig.reset()


@pytest.fixture
def region(tmp_path: Path, logs: Logs) -> Iterator[Live]:
    api = start_behind_front_end(tmp_path)
    yield api
    stop_live(api)


FRONT, SHARD = "plait.access.frontend", "plait.access.controlplane"


def accessed(logs: Logs, rid: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The front end's and the shard's access line of request ``rid`` (each logs it
    once the answer is sent: waited for)."""
    wait_for(lambda: len(logs.of(rid, FRONT)) == 1 and len(logs.of(rid, SHARD)) == 1)
    return logs.of(rid, FRONT)[0], logs.of(rid, SHARD)[0]


def desired_causes(api: Live, job: str) -> dict[int, str | None]:
    """Per task of ``job``: the request id its machine's desired set gives it."""
    found: dict[int, str | None] = {}
    for task in api.admin.get(f"/v1/jobs/{job}/tasks").json()["tasks"]:
        if task["machine"] is None:
            continue
        got = api.admin.get(f"/v1/machines/{task['machine']}/desired").json()
        for a in got["tasks"]:
            if a["job"] == job:
                found[a["index"]] = a.get("request_id")
    return found


def scheduled_causes(api: Live, job: str) -> dict[int, str | None]:
    """Per task of ``job``: the request id of its assignment in the scheduler."""
    with api.cp.lock:
        return {a.index: a.cause for tasks in api.cp.scheduler.desired.values()
                for a in tasks.values() if a.job == job}


def test_one_id_from_the_caller_through_the_front_end_to_the_shard_and_its_effects(
        region: Live, logs: Logs) -> None:
    api = region.admin
    # plait_<id>_<secret>; the secret is URL-safe base64 and can hold "_" itself
    token_id = region.admin_token.split("_", 2)[1]
    r = api.post("/v1/entitlements", json={"name": "e", "owner": "alice",
                                           "quota": {"machines": 4}},
                 headers={"X-Request-Id": "ent-1"})
    assert r.status_code == 201 and r.headers["x-request-id"] == "ent-1"
    r = api.post("/v1/jobs", json=JOB, headers={"X-Request-Id": "deploy-42"})
    assert r.status_code == 201, r.text
    assert r.headers["x-request-id"] == "deploy-42"  # the caller's id is kept

    front, shard = accessed(logs, "deploy-42")
    # the shard's line is the batch's that carried the create (a batch of one here,
    # named by its first create's id)
    assert (front["method"], front["path"], front["status"]) == ("POST", "/v1/jobs", 201)
    assert (shard["method"], shard["path"], shard["status"]) == (
        "POST", "/v1/shard/creates", 200)
    for line in (front, shard):
        assert line["level"] == "info" and line["duration_ms"] >= 0
        assert line["token_id"] == token_id and line["actor"] == "admin:admin"
        assert {"timestamp", "component", "event"} <= set(line)
    # the shard's own line about the command it took carries the id too
    (command,) = [x for x in logs.of("deploy-42") if x["event"] == "job command acknowledged"]
    assert command["job"] == "web" and command["logger"] == "plait.controlplane.commands"
    # never the token itself
    assert region.admin_token not in logs.out.getvalue()
    assert region.admin_token.split("_", 2)[2] not in logs.out.getvalue()

    # the job remembers the request that made it; so do its stored state and log, and
    # the desired set of each of its tasks
    def cause() -> str | None:
        with region.cp.lock:
            job = region.cp.scheduler.jobs.get("web")
            return None if job is None else job.cause

    wait_for(lambda: cause() == "deploy-42")
    wait_for(lambda: (region.cp.persist.state("web") or {}).get("cause") == "deploy-42")
    wait_for(lambda: desired_causes(region, "web") == {0: "deploy-42", 1: "deploy-42"})
    # an update: its request id replaces it, in the job and in the new assignments
    r = api.put("/v1/jobs/web", json={**JOB, "args": ["v2"]},
                headers={"X-Request-Id": "update-7"})
    assert r.status_code == 200 and r.headers["x-request-id"] == "update-7"
    wait_for(lambda: cause() == "update-7")
    # (read from the scheduler: with simulated agents the API's desired sets are not
    # refreshed by passes; tests/agent/test_agent_logs.py follows an update to real
    # agents through the API)
    wait_for(lambda: scheduled_causes(region, "web") == {0: "update-7", 1: "update-7"})
    history = api.get("/v1/jobs/web/history").json()["operations"]
    assert [(op["op"], op.get("request")) for op in history] == [
        ("create", "deploy-42"), ("update", "update-7")]


def test_an_unsafe_or_missing_id_is_replaced_by_one_the_whole_path_shares(
        region: Live, logs: Logs) -> None:
    api = region.admin
    for given in ("not safe!", "x" * 65, "a\tb", ""):
        r = api.get("/v1/jobs/nosuch", headers={"X-Request-Id": given})
        assert r.status_code == 404
        rid = r.headers["x-request-id"]
        assert rid != given and SAFE.fullmatch(rid)
        front, shard = accessed(logs, rid)
        assert front["status"] == shard["status"] == 404
        assert not [x for x in logs.lines() if x.get("request_id") == given]
    r = api.get("/v1/jobs/nosuch")  # (no id given: one is made)
    assert SAFE.fullmatch(r.headers["x-request-id"])
    accessed(logs, r.headers["x-request-id"])
    # no two requests share one
    ids = [api.get("/v1/jobs").headers["x-request-id"] for _ in range(3)]
    assert len(set(ids)) == 3


def test_the_sdk_sends_an_id_and_an_error_names_it(region: Live, logs: Logs) -> None:
    with Client(region.url, region.admin_token, attempts=1) as client, pytest.raises(
            ApiError) as refused:
        client.jobs.get("nosuch")
    rid = refused.value.request_id
    assert rid is not None and SAFE.fullmatch(rid)
    assert f"request {rid}" in str(refused.value)
    front, shard = accessed(logs, rid)
    assert front["status"] == shard["status"] == 404 and shard["path"] == "/v1/jobs/nosuch"


def test_a_replica_called_directly_takes_and_returns_the_id(live: Live, logs: Logs) -> None:
    r = live.admin.get("/v1/jobs", headers={"X-Request-Id": "direct-1"})
    assert r.status_code == 200 and r.headers["x-request-id"] == "direct-1"
    wait_for(lambda: len(logs.of("direct-1", SHARD)) == 1)
    (line,) = logs.of("direct-1", SHARD)
    assert (line["method"], line["path"], line["status"]) == ("GET", "/v1/jobs", 200)
    # refused before any token was verified: no token named
    r = live.client("plait_nosuch_secret").get("/v1/jobs", headers={"X-Request-Id": "bad-2"})
    assert r.status_code == 401 and r.headers["x-request-id"] == "bad-2"
    wait_for(lambda: len(logs.of("bad-2", SHARD)) == 1)
    (line,) = logs.of("bad-2", SHARD)
    assert line["status"] == 401 and "token_id" not in line and "actor" not in line
    assert "secret" not in logs.out.getvalue()
    # an agent's routine call is logged at debug (not at the info level set here)
    live.admin.get("/healthz", headers={"X-Request-Id": "probe-3"})
    r = live.admin.get("/v1/machines/m0000000/desired", headers={"X-Request-Id": "poll-4"})
    assert r.status_code == 200 and r.headers["x-request-id"] == "poll-4"
    live.admin.get("/v1/jobs", headers={"X-Request-Id": "after-5"})
    wait_for(lambda: len(logs.of("after-5", SHARD)) == 1)
    assert logs.of("probe-3") == [] and logs.of("poll-4") == []


def test_a_follower_forwards_the_id_to_its_leader(tmp_path: Path, logs: Logs) -> None:
    from test_replicas import Replica

    first = Replica(tmp_path)
    second = Replica(tmp_path, first.token)
    try:
        wait_for(lambda: {first.role(), second.role()} == {"leader", "follower"})
        follower = first if first.role() == "follower" else second
        r = follower.api.get("/v1/jobs", headers={"X-Request-Id": "fwd-1"})
        assert r.status_code == 200 and r.headers["x-request-id"] == "fwd-1"
        wait_for(lambda: len(logs.of("fwd-1", SHARD)) == 2)
        # the follower's line (it only passed the request on) and the leader's, which
        # verified the token
        assert sorted("token_id" in x for x in logs.of("fwd-1", SHARD)) == [False, True]
        assert {x["status"] for x in logs.of("fwd-1", SHARD)} == {200}
    finally:
        second.close()
        first.close()


def test_a_healthz_503_is_the_probes_answer_not_a_warning(logs: Logs) -> None:
    """Not ready yet (or no leader): ``plait up``'s readiness polls printed dozens of
    warnings while it started. Any other 5xx is still a warning."""
    import asyncio

    from plait.frontend.requestlog import RequestLog

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 503, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    async def call(path: str, rid: str) -> None:
        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: Any) -> None:
            pass
        await RequestLog(app, "controlplane")({
            "type": "http", "method": "GET", "path": path, "raw_path": path.encode(),
            "query_string": b"", "headers": [(b"x-request-id", rid.encode())]},
            receive, send)

    asyncio.run(call("/healthz", "probe-1"))
    asyncio.run(call("/v1/jobs", "jobs-2"))
    wait_for(lambda: len(logs.of("jobs-2")) == 1)
    assert logs.of("jobs-2")[0]["level"] == "warning"
    assert logs.of("probe-1") == []
