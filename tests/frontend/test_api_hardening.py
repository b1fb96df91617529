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


SECRET_GATE = "http://gateuser:hunter2@127.0.0.1:{port}/gate?api_key=K3Y9&Token=T0K3N&stage_hint=1"
SECRET_TC = "http://bob:s3cr3tpw@127.0.0.1:9/tc?access_token=AT0K&x=1"
SECRETS = ("hunter2", "K3Y9", "T0K3N", "s3cr3tpw", "AT0K")


def shows_no_secret(text: str) -> None:
    for secret in SECRETS:
        assert secret not in text, (secret, text)


def test_credentials_in_urls_are_never_shown(live: Live, alice: httpx.Client) -> None:
    import base64
    import http.server
    import threading

    from plait.taskcontrol.urlpolicy import UrlPolicy, networks

    asked: list[tuple[str, str]] = []

    class Gate(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append((self.path, self.headers.get("Authorization", "")))
            self.send_response(500)
            self.end_headers()
            self.wfile.write(b"error rate 9%")

        def log_message(self, *args: object) -> None:
            pass
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Gate)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        live.cp.controllers.url_policy = UrlPolicy(allow=networks(("loopback", "any")))
        url = SECRET_GATE.format(port=server.server_address[1])
        r = alice.put("/v1/jobs/web/push", json={
            "spec": spec(command="v2"), "stages": [50, 100], "soak_seconds": 0,
            "gate": {"url": url}})
        assert r.status_code == 200, r.text
        shows_no_secret(r.text)
        assert r.json()["intent"]["gate"]["url"] == (
            f"http://gateuser:***@127.0.0.1:{server.server_address[1]}/gate"
            "?api_key=***&Token=***&stage_hint=1")
        wait_for(lambda: alice.get("/v1/jobs/web/push").json()["status"]["phase"]
                 == "rolled_back")
        # the gate was asked with the credentials (the stored intent keeps them)...
        assert live.cp.jcp.record("web").push.intent.gate.url == url
        assert asked[0][1] == "Basic " + base64.b64encode(b"gateuser:hunter2").decode()
        # ... and no view shows them: the push, the intents, the events
        push = alice.get("/v1/jobs/web/push")
        assert "500: error rate 9%" in push.json()["status"]["message"], push.text
        assert "***" in push.json()["status"]["message"]
        shows_no_secret(push.text)
        shows_no_secret(alice.get("/v1/jobs/web/intents").text)
        wait_for(lambda: bool(live.admin.get("/v1/events", params={
            "job": "web", "kind": "push_rolled_back"}).json()["events"]))
        events = live.admin.get("/v1/events", params={"job": "web"})
        assert "gateuser:***@" in events.text
        shows_no_secret(events.text)
    finally:
        server.shutdown()
    # a TaskController's URL: stored as given, shown redacted wherever a spec is
    tc = spec(name="paced", task_controller=SECRET_TC)
    r = alice.post("/v1/jobs", json=tc)
    assert r.status_code == 201, r.text
    assert live.cp.jobs.get("paced").spec.task_controller == SECRET_TC
    shown = alice.get("/v1/jobs/paced").json()["spec"]["task_controller"]
    assert shown == "http://bob:***@127.0.0.1:9/tc?access_token=***&x=1"
    plan = alice.post("/v1/jobs", params={"dry_run": True}, json={
        **tc, "task_controller": SECRET_TC.replace("s3cr3tpw", "n3wpw")})
    assert plan.status_code == 200, plan.text
    assert plan.json()["changes"]["task_controller"]["to"] == shown  # (a change, hidden)
    assert "n3wpw" not in plan.text
    for path in ("/v1/jobs/paced", "/v1/jobs", "/v1/jobs/paced/versions/1"):
        text = alice.get(path).text
        assert "bob:***@" in text, path
        shows_no_secret(text)
    # the controller cannot be reached: what the events say of it names no credential
    wait_for(lambda: "127.0.0.1:9" in live.admin.get(
        "/v1/events", params={"job": "paced"}).text)
    shows_no_secret(live.admin.get("/v1/events").text)
    # a URL refused by the rules is named without its credentials
    live.cp.controllers.url_policy = UrlPolicy(allow=networks(()))
    r = alice.put("/v1/jobs/paced", json={**tc, "command": "v3"})
    assert r.status_code == 422 and "bob:***@" in r.text, r.text
    shows_no_secret(r.text)


def test_an_entitlement_is_deleted_once_no_job_uses_it(live: Live, alice: httpx.Client
                                                        ) -> None:
    def held() -> list[str]:
        return [m["id"] for m in live.admin.get("/v1/machines", params={
            "entitlement": "e"}).json()["machines"]]

    assert held(), "the job's tasks hold machines of e"
    # an owner may not delete it (as it may not create one); nobody can while it is used
    r = alice.delete("/v1/entitlements/e")
    assert r.status_code == 403, r.text
    r = live.admin.delete("/v1/entitlements/e")
    assert r.status_code == 409 and "job web" in r.json()["message"], r.text
    assert live.admin.get("/v1/entitlements/e").status_code == 200  # nothing changed
    assert live.admin.delete("/v1/entitlements/nope").status_code == 404
    # its job deleted: the entitlement goes, and every machine still bound to it (one
    # left bound with no task, as a crash between a claim and a placement leaves it)
    # goes back to the free pool
    assert alice.delete("/v1/jobs/web").status_code == 202
    wait_for(lambda: alice.get("/v1/jobs/web").status_code == 404)
    cp = live.cp
    with cp.lock:
        m = int(cp.region.free_machines()[0])
        cp.region.claim(m, "e", cp.region.version(m))
    leftover = cp.fleet.name(m)
    assert held() == [leftover]
    r = live.admin.delete("/v1/entitlements/e")
    assert r.status_code == 200, r.text
    assert r.json()["deleted"] is True and r.json()["released"] == [leftover], r.text
    assert live.admin.get("/v1/entitlements/e").status_code == 404
    assert held() == []
    assert live.admin.get(f"/v1/machines/{leftover}").json()["entitlement"] is None
    assert not cp.allocator.ns.exists("/entitlements/e")  # (a restart does not bring it back)
    wait_for(lambda: any(e["kind"] == "entitlement_deleted" and "1 machine back" in
                         e["message"] for e in live.admin.get(
                             "/v1/events", params={"entitlement": "e"}).json()["events"]))
    # a job naming it now is refused; an entitlement of that name can be made again
    r = alice.post("/v1/jobs", json=JOB)
    assert r.status_code in (403, 404, 422), r.text
    assert live.admin.post("/v1/entitlements", json={
        "name": "e", "owner": "alice", "quota": {"machines": 8}}).status_code == 201
    assert alice.post("/v1/jobs", json=JOB).status_code == 201
    wait_for(lambda: alice.get("/v1/jobs/web").json()["settled"])


def test_a_maintenance_is_cancelled_before_its_start_or_ended_early(
        live: Live, alice: httpx.Client) -> None:
    import time

    def machine(name: str) -> dict:
        return live.admin.get(f"/v1/machines/{name}").json()

    def tasks_on(name: str) -> list[int]:
        return [t["index"] for t in alice.get("/v1/jobs/web/tasks").json()["tasks"]
                if t["machine"] == name and t["state"] == "running"]

    used = sorted({t["machine"] for t in alice.get("/v1/jobs/web/tasks").json()["tasks"]})
    target = used[0]
    # announced, not started: its machine is under notice (cordoned by the notice)
    r = live.admin.post("/v1/maintenance", json={
        "machines": [target], "start": time.time() + 3600, "duration_seconds": 600})
    assert r.status_code == 201, r.text
    event = r.json()["event"]
    wait_for(lambda: machine(target)["cordoned"] and event in machine(target)["events"])
    assert alice.delete(f"/v1/maintenance/{event}").status_code == 403  # (admin only)
    r = live.admin.delete(f"/v1/maintenance/{event}")
    assert r.status_code == 200, r.text
    assert r.json() == {"event": event, "state": "cancelled", "machines": [target]}
    view = machine(target)
    assert not view["cordoned"] and view["events"] == [] and view["state"] == "healthy"
    assert event not in [e["id"] for e in live.admin.get("/v1/maintenance").json()["events"]]
    assert live.admin.delete(f"/v1/maintenance/{event}").status_code == 404
    wait_for(lambda: any("cancelled before its start" in e["message"] for e in live.admin.get(
        "/v1/events", params={"kind": "maintenance_cancelled"}).json()["events"]))
    # under way: its machine is in maintenance and its tasks stopped; ended early, the
    # machine is back in service and the job's tasks run again
    r = live.admin.post("/v1/maintenance", json={"machines": [target],
                                                 "duration_seconds": 3600})
    event = r.json()["event"]
    wait_for(lambda: machine(target)["state"] == "maintenance" and not tasks_on(target))
    r = live.admin.delete(f"/v1/maintenance/{event}")
    assert r.status_code == 200 and r.json()["state"] == "ended", r.text
    wait_for(lambda: machine(target)["state"] == "healthy" and not machine(target)["cordoned"])
    wait_for(lambda: alice.get("/v1/jobs/web").json()["settled"] and len(
        [t for t in alice.get("/v1/jobs/web/tasks").json()["tasks"]
         if t["state"] == "running"]) == JOB["task_count"])
    wait_for(lambda: any("ended early" in e["message"] for e in live.admin.get(
        "/v1/events", params={"kind": "maintenance_cancelled"}).json()["events"]))
    # a drain is not a maintenance to cancel: its own command ends it
    drain = live.admin.post(f"/v1/machines/{used[-1]}/drain", json={
        "deadline_seconds": 3600}).json()["event"]
    r = live.admin.delete(f"/v1/maintenance/{drain}")
    assert r.status_code == 409 and "uncordon" in r.json()["message"], r.text


def test_an_entitlement_is_deleted_through_the_front_end(tmp_path) -> None:
    from livecp import start_behind_front_end, stop_live

    live = start_behind_front_end(tmp_path)
    try:
        assert live.admin.post("/v1/entitlements", json={
            "name": "e", "owner": "alice", "quota": {"machines": 2}}).status_code == 201
        r = live.admin.delete("/v1/entitlements/e")
        assert r.status_code == 200 and r.json()["deleted"] is True, r.text
        assert live.admin.get("/v1/entitlements/e").status_code == 404
        assert "e" not in [e["name"] for e in live.admin.get(
            "/v1/entitlements").json()["entitlements"]]
        # made again, on the shard the front end placed it on before
        assert live.admin.post("/v1/entitlements", json={
            "name": "e", "owner": "alice", "quota": {"machines": 2}}).status_code == 201
    finally:
        stop_live(live)
