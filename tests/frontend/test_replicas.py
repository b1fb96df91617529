"""Replicas of one control plane on one store (SQLite here, as ``plait serve`` twice on
one data dir; ZooKeeper in tests/e2e/test_e2e_replicas.py): one leads, the others
pass requests on to it, and one of them takes over when the leader goes."""

from __future__ import annotations

import httpx
import pytest
from livecp import REGION, wait_for

from plait.frontend.proxy import FORWARDED
from plait.server.controlplane import ControlPlane, ControlPlaneConfig
from plait.server.serve import ApiServer, store_for

JOB = {"name": "j", "entitlement": "e", "task_count": 2, "command": "sleep infinity",
       "resources": {"cpu": 1, "memory_gb": 1}}


class Replica:
    def __init__(self, data_dir, token: str | None = None) -> None:
        self.cp = ControlPlane(store_for(data_dir), ControlPlaneConfig(
            region=REGION, tick_seconds=0.05, heartbeat_timeout=60))
        self.token = self.cp.bootstrap_admin() or token
        self.server = ApiServer(self.cp, replica=True, session_timeout=1.0).start()
        self.url = self.server.url
        self.api = httpx.Client(base_url=self.url, timeout=30,
                                headers={"Authorization": f"Bearer {self.token}"})

    def role(self) -> str:
        return self.api.get("/healthz").json()["role"]

    def die(self) -> None:
        """As a SIGKILL would leave it: no resignation, the lease lapses by itself."""
        lead = self.server.leadership
        assert lead is not None
        lead._stop.set()
        if lead._thread is not None:
            lead._thread.join()
        self.cp.loop.stop()
        lead.leading = False
        self.server.server.should_exit = True

    def close(self) -> None:
        self.api.close()
        self.server.stop()
        self.cp.store.close()


@pytest.fixture
def replicas(tmp_path):
    made: list[Replica] = []

    def make() -> Replica:
        r = Replica(tmp_path, made[0].token if made else None)
        made.append(r)
        return r
    yield make
    for r in made:
        r.close()


def test_one_leads_the_others_pass_requests_on(replicas):
    a = replicas()
    wait_for(lambda: a.role() == "leader")
    b = replicas()
    health = b.api.get("/healthz").json()
    assert health["role"] == "follower" and health["leader"] == a.url
    # a write through the follower is applied by the leader, and acknowledged by it
    r = b.api.post("/v1/entitlements", json={"name": "e", "owner": "o",
                                             "quota": {"machines": 4}})
    assert r.status_code == 201, r.text
    r = b.api.post("/v1/jobs", json=JOB)
    assert r.status_code == 201, r.text
    assert a.api.get("/v1/jobs/j").json()["name"] == "j"
    # the leader's own answers come back through the follower: errors too
    assert b.api.get("/v1/jobs/nope").status_code == 404
    assert httpx.post(f"{b.url}/v1/jobs", json=JOB).status_code == 401  # no token
    wait_for(lambda: len([t for t in b.api.get("/v1/jobs/j/tasks").json()["tasks"]
                          if t["machine"]]) == 2)
    # the follower never ran its loop
    assert b.cp.steps == 0 and a.cp.steps > 0


def test_a_follower_takes_over_when_the_leader_dies(replicas):
    a = replicas()
    wait_for(lambda: a.role() == "leader")
    b = replicas()
    assert b.role() == "follower"
    assert b.api.post("/v1/entitlements", json={"name": "e", "owner": "o",
                                                "quota": {"machines": 4}}).status_code == 201
    acked = []
    for k in range(5):
        if b.api.post("/v1/jobs", json={**JOB, "name": f"j{k}"}).status_code == 201:
            acked.append(f"j{k}")
    a.die()
    # until the lease lapses nobody leads: the follower says so, and applies nothing
    wait_for(lambda: b.role() == "leader")
    assert b.server.leadership is not None and b.server.leadership.terms == 1
    names = {j["name"] for j in b.api.get("/v1/jobs").json()["jobs"]}
    assert set(acked) <= names and len(acked) == 5  # no acknowledged write lost
    assert b.api.post("/v1/jobs", json={**JOB, "name": "after"}).status_code == 201
    wait_for(lambda: all(t["machine"] for t in b.api.get("/v1/jobs/after/tasks").json()["tasks"]))
    kinds = [e["kind"] for e in b.api.get("/v1/events", params={"limit": 500}).json()["events"]]
    assert kinds.count("leader_elected") == 2


def test_a_leader_that_stops_hands_over_at_once(replicas):
    a = replicas()
    wait_for(lambda: a.role() == "leader")
    b = replicas()
    a.server.stop()  # Ctrl-C: it resigns
    wait_for(lambda: b.role() == "leader", timeout=0.9 * 60)


def test_without_a_leader_a_follower_answers_503_and_applies_nothing(replicas):
    a = replicas()
    wait_for(lambda: a.role() == "leader")
    b = replicas()
    # a request forwarded to a replica that does not lead is not forwarded again
    r = b.api.get("/v1/jobs", headers={FORWARDED: "http://elsewhere"})
    assert r.status_code == 503 and r.headers["retry-after"] == "1"
    assert "not the leader" in r.json()["message"]
    a.die()
    r = b.api.post("/v1/entitlements", json={"name": "e2", "owner": "o",
                                             "quota": {"machines": 1}})
    if b.role() == "follower":  # (the lease may have lapsed already on a slow box)
        assert r.status_code == 503, r.text
    wait_for(lambda: b.role() == "leader")
    names = [e["name"] for e in b.api.get("/v1/entitlements").json()["entitlements"]]
    assert ("e2" in names) == (r.status_code == 201)


def test_a_leader_loading_its_state_for_longer_than_its_session_keeps_the_lead(
        replicas, monkeypatch):
    # the lease was renewed by the thread that loads the state: a region whose state
    # took longer than the session (1 s) to load lost the lead as soon as it won it,
    # to a follower that then lost it the same way (a cold `plait up --shards 2` lost
    # it once on this box, with an empty region)
    import threading
    import time

    slow = threading.Event()
    take_over = ControlPlane.take_over

    def slow_take_over(self, *args, **kwargs):
        if not slow.is_set():
            slow.set()
            time.sleep(3.0)  # 3 sessions (the subject: a load that outlasts the lease)
        return take_over(self, *args, **kwargs)

    monkeypatch.setattr(ControlPlane, "take_over", slow_take_over)
    a = replicas()
    wait_for(slow.is_set)
    b = replicas()  # campaigns while the leader loads
    wait_for(lambda: a.role() == "leader")
    assert b.role() == "follower"
    assert a.server.leadership is not None and a.server.leadership.terms == 1
    assert b.server.leadership is not None and b.server.leadership.terms == 0

    def kinds() -> list[str]:  # (the election's event is written by the loop's next pass)
        return [e["kind"] for e in a.api.get("/v1/events", params={"limit": 500}).json()[
            "events"]]
    wait_for(lambda: "leader_elected" in kinds())
    assert kinds().count("leader_elected") == 1 and "leadership_lost" not in kinds()
    assert a.server.leadership.terms == 1 and b.role() == "follower"


def test_a_leader_deposed_while_paused_drops_the_events_it_could_not_store(replicas):
    # a leader paused past its lease woke with heartbeats seconds old and recorded
    # what it decided (machines silent); the fence refused the decisions, but the
    # events were written when it led again, as if they had happened
    a = replicas()
    wait_for(lambda: a.role() == "leader")
    b = replicas()
    lead = a.server.leadership
    assert lead is not None and b.role() == "follower"
    lead._stop.set()  # paused: no renewal, no pass
    assert lead._thread is not None
    lead._thread.join()
    a.cp.loop.stop()
    wait_for(lambda: b.role() == "leader")  # its lease lapsed
    a.cp.record("health", "heartbeats_lost", "a decision of a stale view")  # it wakes
    lead.step()  # and finds it no longer leads
    assert not lead.leading
    pending = [(e.kind, e.message) for e in a.cp.recorder.pending()]
    assert [k for k, _ in pending] == ["leadership_lost"]
    assert "(1 events of its last passes, not stored, dropped)" in pending[0][1]
