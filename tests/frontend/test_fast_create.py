"""A plain ``POST /v1/jobs`` is answered by ``FastCreate`` without FastAPI's routing;
its answers are the route's, word for word, and everything but a plain create goes to
the route with its body given again."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
from livecp import Live, wait_for

from plait.api import fastcreate
from plait.api.fastcreate import FastCreate
from plait.frontend.proxy import replaying as fastcreate_replaying


def spec(name: str, entitlement: str = "web", **extra: Any) -> dict[str, Any]:
    return {"name": name, "entitlement": entitlement, "task_count": 1,
            "resources": {"cpu": 1, "memory_gb": 1}, "command": "serve", **extra}


def owner_client(live: Live, name: str) -> httpx.Client:
    r = live.admin.post("/v1/tokens", json={"role": "owner", "name": name})
    assert r.status_code == 201, r.text
    return httpx.Client(base_url=live.url, timeout=30,
                        headers={"Authorization": f"Bearer {r.json()['token']}"})


def test_a_plain_create_is_answered_as_the_route_answers_it(live: Live, monkeypatch) -> None:
    handed: list[bytes] = []  # bodies FastCreate read and handed to the route

    def replaying(body, receive):
        handed.append(body)
        return fastcreate_replaying(body, receive)
    monkeypatch.setattr(fastcreate, "replaying", replaying)
    r = live.admin.post("/v1/entitlements", json={"name": "web", "owner": "alice",
                                                  "quota": {"machines": 12}})
    assert r.status_code in (200, 201), r.text
    alice = owner_client(live, "alice")
    with alice:
        alice.get("/v1/jobs")  # (her token's record cached, as after any first call)
        plain = alice.post("/v1/jobs", json=spec("fast"))
        # a query (even one that changes nothing) takes the route
        routed = alice.post("/v1/jobs", params={"dry_run": "false"}, json=spec("slow"))
        assert (plain.status_code, routed.status_code) == (201, 201)
        assert plain.headers["content-type"] == routed.headers["content-type"]
        assert plain.content == routed.content.replace(b'"slow"', b'"fast"')
        again, again_routed = (alice.post("/v1/jobs", json=spec("fast")),
                               alice.post("/v1/jobs", params={"dry_run": "false"},
                                          json=spec("slow")))
        assert (again.status_code, again_routed.status_code) == (200, 200)
        assert again.content == again_routed.content.replace(b'"slow"', b'"fast"')
        assert json.loads(again.content)["created"] is False
        assert handed == []  # the plain creates never reached the route
        # refusals are the route's own: a changed spec under the name, another
        # owner's entitlement, a spec that does not validate, a bad token
        conflict = alice.post("/v1/jobs", json=spec("fast", args=["--other"]))
        assert conflict.status_code == 409, conflict.text
        live.admin.post("/v1/entitlements", json={"name": "db", "owner": "bob",
                                                  "quota": {"machines": 2}})
        theirs = alice.post("/v1/jobs", json=spec("x", entitlement="db"))
        unknown = alice.post("/v1/jobs", json=spec("x", entitlement="nowhere"))
        assert theirs.status_code == unknown.status_code
        assert theirs.content == unknown.content.replace(b"'nowhere'", b"'db'")
        assert theirs.status_code == 422 and "does not exist" in theirs.json()["message"]
        bad = alice.post("/v1/jobs", json={**spec("y"), "task_count": -1})
        assert bad.status_code == 422 and bad.json()["field"] == "task_count", bad.text
        anon = httpx.post(f"{live.url}/v1/jobs", json=spec("z"),
                          headers={"Authorization": "Bearer plait_nope_nope"})
        assert anon.status_code == 401 and anon.json()["message"] == "invalid token"
        assert len(handed) == 5  # each refusal was the route's (the 409's: a second try)
        # another owner's create of her job's name learns that the name is taken, and
        # nothing else (job names are region-wide); hers says what it found
        with owner_client(live, "bob") as bob:
            taken = bob.post("/v1/jobs", json=spec("fast", entitlement="db"))
            assert taken.status_code == 409, taken.text
            assert taken.json()["message"] == ("job fast: expected 'a free name', found "
                                               "'a name taken in the region (job names are "
                                               "region-wide)'")
            assert bob.get("/v1/jobs/fast").status_code == 404
            # a deploy (PUT) and a dry run say the same (they said "job 'fast' not
            # found", and the deploy failed naming the wrong problem)
            for answer in (bob.put("/v1/jobs/fast", json=spec("fast", entitlement="db")),
                           bob.put("/v1/jobs/fast", params={"dry_run": "true"},
                                   json=spec("fast", entitlement="db")),
                           bob.post("/v1/jobs", params={"dry_run": "true"},
                                    json=spec("fast", entitlement="db"))):
                assert answer.status_code == 409, answer.text
                assert answer.json()["message"] == taken.json()["message"]
            assert live.admin.get("/v1/jobs/fast").json()["entitlement"] == "web"
        assert "another spec" in conflict.json()["message"]
    # the stored job names who created it, as the route's does (recorded by a pass)

    def created_events() -> list[dict]:
        return [e for e in live.admin.get("/v1/events", params={"kind": "created"}
                                          ).json()["events"] if e["job"] in ("fast", "slow")]
    wait_for(lambda: len(created_events()) == 2)
    created = created_events()
    assert {e["job"]: e["actor"] for e in created} == {"fast": "owner:alice",
                                                      "slow": "owner:alice"}


def test_a_repeated_header_or_another_json_type_is_read_as_the_route_reads_it(
        live: Live, monkeypatch) -> None:
    """The hot path answers a create only with one Authorization and one Content-Type,
    ``application/json`` itself: anything else is the route's, which reads the first of
    repeated headers (as Starlette does) and its own JSON types."""
    handed: list[bytes] = []

    def replaying(body, receive):
        handed.append(body)
        return fastcreate_replaying(body, receive)
    monkeypatch.setattr(fastcreate, "replaying", replaying)
    live.admin.post("/v1/entitlements", json={"name": "web", "owner": "alice",
                                              "quota": {"machines": 12}})
    alice = owner_client(live, "alice")
    bob = owner_client(live, "bob")
    alice.get("/v1/jobs")
    bob.get("/v1/jobs")  # (both cached)
    body = json.dumps(spec("h1")).encode()

    def post(headers: list[tuple[str, str]]) -> httpx.Response:
        return httpx.post(f"{live.url}/v1/jobs", content=body, headers=headers)
    a, b = alice.headers["authorization"], bob.headers["authorization"]
    ctype = ("Content-Type", "application/json")
    # a bad token first, alice's after: the first one is the caller's
    r = post([("Authorization", "Bearer plait_nope_nope"), ("Authorization", a), ctype])
    assert r.status_code == 401 and r.json()["message"] == "invalid token"
    # bob's first, alice's after: bob asks, for alice's entitlement (refused as unknown)
    r = post([("Authorization", b), ("Authorization", a), ctype])
    assert r.status_code == 422 and "does not exist" in r.json()["message"]
    # a type that is not JSON first: the route's 422
    r = post([("Authorization", a), ("Content-Type", "text/plain"), ctype])
    assert r.status_code == 422, r.text
    for other in ("application/json-seq", "application/jsonx"):
        r = post([("Authorization", a), ("Content-Type", other)])
        assert r.status_code == 422, (other, r.text)
    assert len(handed) == 5 and alice.get("/v1/jobs").json()["jobs"] == []
    # JSON itself, with a parameter, or another JSON type the route takes: created
    r = post([("Authorization", a), ("Content-Type", "application/json; charset=utf-8")])
    assert r.status_code == 201 and len(handed) == 5, r.text
    body = json.dumps(spec("h2")).encode()
    r = post([("Authorization", a), ("Content-Type", "application/merge-patch+json")])
    assert r.status_code == 201 and len(handed) == 6, r.text


def test_only_a_plain_create_is_answered_without_the_route() -> None:
    """FastCreate against a stand-in route: what reaches the route, with which body."""
    routed: list[tuple[str, str, bytes]] = []

    async def route(scope, receive, send) -> None:
        message = await receive()
        routed.append((scope["method"], scope["path"], message.get("body", b"")))
        await send({"type": "http.response.start", "status": 418, "headers": []})
        await send({"type": "http.response.body", "body": b"route"})

    async def create(scope, body: bytes):
        return None if b"refuse" in body else (201, b'{"made":' + body + b"}")

    async def batch(scope, body: bytes):
        return 200, b"batch:" + body, b"application/x-plait-creates"

    async def call(method: str, path: str, body: bytes, query: bytes = b""):
        sent: list[dict[str, Any]] = []
        parts = [body[:3], body[3:]]

        async def receive():
            chunk = parts.pop(0)
            return {"type": "http.request", "body": chunk, "more_body": bool(parts)}

        async def send(message):
            sent.append(message)
        scope = {"type": "http", "method": method, "path": path, "query_string": query,
                 "headers": []}
        await FastCreate(route, create, batch)(scope, receive, send)
        return sent[0]["status"], sent[1]["body"]

    async def scenario() -> None:
        assert await call("POST", "/v1/jobs", b'"ok"') == (201, b'{"made":"ok"}')
        assert await call("POST", "/v1/jobs", b"refuse me") == (418, b"route")
        assert await call("POST", "/v1/jobs", b"x", b"dry_run=true") == (418, b"route")
        assert await call("GET", "/v1/jobs", b"") == (418, b"route")
        assert await call("POST", "/v1/jobs/web", b"abcdef") == (418, b"route")
        # the front end's batches of creates: answered by ``batch``, never the route
        assert await call("POST", "/v1/shard/creates", b"xyz") == (200, b"batch:xyz")

    asyncio.run(scenario())
    # the route got each body whole: read whole and given again, or never read
    assert routed == [("POST", "/v1/jobs", b"refuse me"), ("POST", "/v1/jobs", b"x"),
                      ("GET", "/v1/jobs", b""), ("POST", "/v1/jobs/web", b"abc")]


def test_an_agents_plain_report_is_answered_as_the_route_answers_it(tmp_path, monkeypatch
                                                                    ) -> None:
    handed: list[bytes] = []

    def replaying(body, receive):
        handed.append(body)
        return fastcreate_replaying(body, receive)
    monkeypatch.setattr(fastcreate, "replaying", replaying)
    from livecp import start_live, stop_live

    live = start_live(tmp_path / "data", sim_agents=False)
    try:
        agent, token = live.agent("m0000003")
        agent.get("/v1/machines/m0000003/desired")  # (its credential cached, as it runs)
        report = {"tasks": [], "profile": {"name": None}}
        plain = agent.post("/v1/machines/m0000003/status", json=report)
        routed = agent.post("/v1/machines/m0000003/status", params={"x": "1"}, json=report)
        assert (plain.status_code, routed.status_code) == (200, 200)
        # (the same answer; the machine's desired set may have moved on to a new
        # generation between the two, its first report having been taken: a pass
        # then hands it its host profile)
        first, second = plain.json(), routed.json()
        assert first.pop("generation") <= second.pop("generation")
        assert first == second and first["accepted"] == 0
        assert handed == []  # the plain report never reached the route
        # the heartbeat was taken: the pass gives the machine's agent a beat
        wait_for(lambda: live.cp.liveness.last.get("m0000003") is not None)
        # refusals are the route's own: another machine, a malformed report, an
        # unknown machine (an admin's token), a bad token
        other = agent.post("/v1/machines/m0000004/status", json=report)
        assert other.status_code == 403, other.text
        bad = agent.post("/v1/machines/m0000003/status", json={"tasks": [
            {"job": "j", "index": -1, "revision": 1, "phase": "running"}]})
        assert bad.status_code == 422 and bad.json()["field"] == "tasks.0.index", bad.text
        gone = live.admin.post("/v1/machines/nowhere/status", json=report)
        assert gone.status_code == 404, gone.text
        anon = httpx.post(f"{live.url}/v1/machines/m0000003/status", json=report,
                          headers={"Authorization": "Bearer plait_nope_nope"})
        assert anon.status_code == 401
        # a bad token first and the machine's after: the first is the caller's
        twice = httpx.post(f"{live.url}/v1/machines/m0000003/status", json=report, headers=[
            ("Authorization", "Bearer plait_nope_nope"), ("Authorization", f"Bearer {token}")])
        assert twice.status_code == 401
        assert len(handed) == 5
    finally:
        stop_live(live)


def test_a_report_that_repeats_the_last_one_wakes_no_pass(tmp_path) -> None:
    """An agent's heartbeat while nothing changes is taken (its beat counts) without
    waking the pass (decision 111); a report with news wakes it."""
    from livecp import REGION

    from plait.scheduler.records import TaskStatus
    from plait.server.controlplane import ControlPlane, ControlPlaneConfig
    from plait.server.serve import store_for

    cp = ControlPlane(store_for(tmp_path), ControlPlaneConfig(region=REGION))
    try:
        running = [TaskStatus("j", 0, 1, "running", True)]
        woken = []
        for statuses in ([], [], running, running, [TaskStatus("j", 0, 1, "running", False)]):
            cp.wake.clear()
            cp.gateway.report("m0000001", statuses, {})
            woken.append(cp.wake.is_set())
        assert woken == [True, False, True, False, True]
        reports, beats = cp.gateway.take()
        assert len(reports) == 5 and set(beats) == {"m0000001"}  # (every one taken)
        cp.wake.clear()
        cp.gateway.report("m0000001", [], {}, usage={("j", 0): 0.5})  # (cpu: no news)
        assert cp.wake.is_set()  # (the statuses changed back: news)
        cp.wake.clear()
        cp.gateway.report("m0000002", [], {})  # (another machine's first: news)
        assert cp.wake.is_set()
    finally:
        cp.store.close()
