"""One tenant's volume does not evict or crowd out another's: events kept per owner,
through the API as owners use it."""

from __future__ import annotations

from livecp import start_live, stop_live, wait_for

from plait.server.events import Retention

JOB = {"name": "web", "entitlement": "web", "task_count": 2,
       "resources": {"cpu": 1, "memory_gb": 1}, "command": "serve"}


def _events(client, **params) -> list[dict]:
    found, after = [], 0
    while True:
        page = client.get("/v1/events", params={"after": after, "limit": 1000,
                                                **params}).json()
        found.extend(page["events"])
        if page["next"] is None:
            return found
        after = page["next"]


def test_one_owners_sizing_writes_do_not_evict_anothers_events(tmp_path):
    live = start_live(tmp_path / "data", retention=Retention(
        max_count=120, max_age_seconds=3600, max_per_owner=60, max_system=30))
    try:
        for ent, owner in (("web", "alice"), ("noisy", "bob")):
            assert live.admin.post("/v1/entitlements", json={
                "name": ent, "owner": owner, "quota": {"machines": 4}}).status_code == 201
        alice, bob = live.owner("alice"), live.owner("bob")
        assert alice.post("/v1/jobs", json=JOB).status_code == 201
        assert bob.post("/v1/jobs", json={**JOB, "name": "loud",
                                          "entitlement": "noisy"}).status_code == 201
        wait_for(lambda: alice.get("/v1/jobs/web").json()["settled"])
        mine = _events(alice, job="web")
        assert len(mine) >= 3
        for k in range(150):  # bob's sizing writes: an event each, and their passes'
            r = bob.put("/v1/jobs/loud/sizing", json={"task_count": 1 + k % 2})
            assert r.status_code == 200, r.text
        wait_for(lambda: len(_events(bob, entitlement="noisy")) >= 60)
        assert len(_events(live.admin, entitlement="noisy")) <= 60
        assert [e["seq"] for e in _events(alice, job="web")][:len(mine)] == [
            e["seq"] for e in mine]
    finally:
        stop_live(live)
