"""Push gates are their owner's: a gate that trickles its answer is cut off at a hard
total deadline, and one owner's slow gates never hold up another owner's.

First the gate asker alone (``plait.server.controlplane.gates``) against a farm of
gates on loopback, then two owners' pushes through the API."""

from __future__ import annotations

import time

import httpx
import pytest
from livecp import Live, wait_for

from plait.bench.controllers import ControllerFarm
from plait.server.controlplane.gates import GateAsker
from plait.taskcontrol.urlpolicy import UrlPolicy, networks

LOOPBACK = UrlPolicy(allow=networks(("loopback",)))


@pytest.fixture
def farm():
    farm = ControllerFarm(keep=False)
    yield farm
    farm.stop()


@pytest.fixture
def asker():
    asker = GateAsker(lambda: LOOPBACK, deadline=2.0, per_owner=2)
    yield asker
    asker.close()


def test_a_trickling_gate_fails_at_its_total_deadline(farm, asker) -> None:
    # the tarpit sends a byte every 2 s: a limit per read would never end it
    started = time.monotonic()
    passed, message = asker.ask("mallory", f"{farm.url}/tarpit/j", "j", 1).result(timeout=60)
    assert not passed and "no whole answer within the 2s deadline" in message
    assert time.monotonic() - started < 30  # (liveness: cut off, not held)


def test_an_owners_tarpits_never_hold_up_another_owners_gates(farm, asker) -> None:
    # mallory's gates fill her two slots and four more wait behind them
    held = [asker.ask("mallory", f"{farm.url}/tarpit/m{i}", f"m{i}", 1) for i in range(6)]
    wait_for(lambda: asker.in_flight("mallory") == 6)
    # alice's gate is asked and answered while every one of mallory's is still held
    passed, message = asker.ask("alice", f"{farm.url}/ack/web", "web", 2).result(timeout=60)
    assert passed and "answered 200" in message
    assert not any(f.done() for f in held)
    # mallory's own: two at a time, each cut off at the deadline
    verdicts = [f.result(timeout=120) for f in held]
    assert all(not ok and "deadline" in why for ok, why in verdicts)
    assert asker.in_flight("mallory") == 0


def test_a_gate_answer_over_the_cap_or_a_refused_url_fails(farm) -> None:
    small = GateAsker(lambda: LOOPBACK, max_bytes=1024)
    try:
        passed, message = small.ask("a", f"{farm.url}/huge/j", "j", 1).result(timeout=60)
        assert not passed and "over the 1024 byte cap" in message
        # the policy is checked on the addresses at call time: metadata is refused
        passed, message = small.ask("a", "http://169.254.169.254/latest", "j", 1).result(
            timeout=60)
        assert not passed and "metadata" in message
        # the job and the stage are sent, and a non-2xx fails with the answer's text
        passed, message = small.ask("a", f"{farm.url}/nosuchmode/j", "j", 3).result(
            timeout=60)
        assert not passed and "answered 404" in message and "unknown mode" in message
    finally:
        small.close()


def _push(client: httpx.Client, job: str, gate: str) -> httpx.Response:
    return client.put(f"/v1/jobs/{job}/push", json={
        "spec": {"name": job, "entitlement": job, "task_count": 1, "command": "serve-v2",
                 "resources": {"cpu": 1, "memory_gb": 1}},
        "stages": [100], "soak_seconds": 0, "gate": {"url": gate}})


def _phase(client: httpx.Client, job: str) -> str:
    return str(client.get(f"/v1/jobs/{job}/push").json()["status"]["phase"])


def test_through_the_api_a_tarpit_gate_rolls_back_and_another_owners_push_completes(
        live: Live, farm) -> None:
    live.cp.controllers.url_policy = UrlPolicy(allow=networks(("loopback",)))
    clients = {}
    for owner, job in (("mallory", "slow"), ("alice", "web")):
        assert live.admin.post("/v1/entitlements", json={
            "name": job, "owner": owner, "quota": {"machines": 4}}).status_code == 201
        clients[job] = live.owner(owner)
        assert clients[job].post("/v1/jobs", json={
            "name": job, "entitlement": job, "task_count": 1, "command": "serve",
            "resources": {"cpu": 1, "memory_gb": 1}}).status_code == 201
    for job, client in clients.items():
        wait_for(lambda c=client, j=job: c.get(f"/v1/jobs/{j}").json()["settled"])
    assert _push(clients["slow"], "slow", f"{farm.url}/tarpit/slow").status_code == 200
    assert _push(clients["web"], "web", f"{farm.url}/ack/web").status_code == 200
    wait_for(lambda: _phase(clients["web"], "web") == "completed")
    wait_for(lambda: _phase(clients["slow"], "slow") == "rolled_back")
    message = clients["slow"].get("/v1/jobs/slow/push").json()["status"]["message"]
    assert "the gate failed" in message and "5s deadline" in message
    # the gate is asked as its owner's: the bound per owner holds nothing of alice's
    assert live.cp.jcp.gates.in_flight("alice") == 0


def test_a_gate_url_keeps_its_own_query_and_gets_the_job_and_stage() -> None:
    import http.server
    import threading

    seen: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.path)
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    asker = GateAsker(lambda: LOOPBACK)
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/gate?api_key=K"
        passed, _ = asker.ask("a", url, "web", 2).result(timeout=60)
        assert passed and seen == ["/gate?api_key=K&job=web&stage=2"]
    finally:
        asker.close()
        server.shutdown()
