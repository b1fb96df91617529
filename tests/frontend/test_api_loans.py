"""Elastic loans through the API on a live control plane (simulated agents): an owner
sees its loans' terms but cannot tell another owner's entitlement from a missing one,
and a control plane restarted in the middle of revokes finishes them: every revoked
machine comes back to the free pool and the lender's tasks run."""

from __future__ import annotations

import httpx
from livecp import REGION, Live, start_live, stop_live, wait_for

from plait.server.controlplane import ControlPlane, ControlPlaneConfig
from plait.server.serve import ApiServer, store_for

WEB = {"name": "web", "owner": "alice", "quota": {"machines": 24}, "lends": True}
BATCH = {"name": "batch", "owner": "bob", "quota": {"machines": 24},
         "elastic": {"min_notice_seconds": 4, "max_reclaim_fraction_per_minute": 1.0}}


def job(name: str, ent: str, tasks: int) -> dict:
    return {"name": name, "entitlement": ent, "task_count": tasks, "command": "serve",
            "resources": {"cpu": 16, "memory_gb": 1}}


def loaned(live: Live) -> list[dict]:
    r = live.admin.get("/v1/machines", params={"loaned": "true", "limit": 100})
    assert r.status_code == 200, r.text
    return r.json()["machines"]


def serving(live: Live, name: str) -> int:
    return int(live.admin.get(f"/v1/jobs/{name}").json()["serving"])


def test_owners_see_their_own_terms_only(live):
    for ent in (WEB, BATCH):
        assert live.admin.post("/v1/entitlements", json=ent).status_code == 201
    bob, carol = live.owner("bob"), live.owner("carol")
    mine = bob.get("/v1/entitlements/batch")
    assert mine.status_code == 200 and mine.json()["elastic"]["min_notice_seconds"] == 4
    theirs = carol.get("/v1/entitlements/batch")
    missing = carol.get("/v1/entitlements/nothing")
    assert theirs.status_code == missing.status_code == 404
    assert theirs.json()["message"].replace("batch", "X") == (
        missing.json()["message"].replace("nothing", "X"))
    # owners do not define entitlements (loans or not)
    assert bob.post("/v1/entitlements", json={**BATCH, "name": "more"}).status_code == 403
    # bad terms are refused by name
    bad = live.admin.post("/v1/entitlements", json={
        **BATCH, "elastic": {"min_notice_seconds": -1}})
    assert bad.status_code == 422 and "min_notice_seconds" in bad.json()["field"]


def test_a_restarted_control_plane_finishes_the_revokes_it_began(tmp_path):
    live = start_live(tmp_path / "data")
    try:
        for ent in (WEB, BATCH):
            assert live.admin.post("/v1/entitlements", json=ent).status_code == 201
        assert live.admin.post("/v1/jobs", json=job("w", "web", 2)).status_code == 201
        wait_for(lambda: serving(live, "w") == 2)
        # (more tasks than the 22 machines lendable; 24 at most: its quota could never
        # hold more of these machine-sized tasks, and such a job is refused)
        assert live.admin.post("/v1/jobs", json=job("b", "batch", 24)).status_code == 201
        wait_for(lambda: len(loaned(live)) == 22)
        r = live.admin.post("/v1/jobs/w/resize", json={"task_count": 8})
        assert r.status_code == 200, r.text
        wait_for(lambda: sum(m["loan"]["revoking"] for m in loaned(live)) == 6)
        revoking = {m["id"] for m in loaned(live) if m["loan"]["revoking"]}
    finally:
        stop_live(live)
    token = live.admin_token
    cp = ControlPlane(store_for(tmp_path / "data"), ControlPlaneConfig(
        region=REGION, tick_seconds=0.05, sim_agents=True, sim_start_seconds=0.2))
    server = ApiServer(cp).start()
    live = Live(server.url, cp, httpx.Client(base_url=server.url, timeout=30, headers={
        "Authorization": f"Bearer {token}"}), token, server)
    try:
        wait_for(lambda: serving(live, "w") == 8)
        wait_for(lambda: len(loaned(live)) == 16)
        for machine in revoking:
            view = live.admin.get(f"/v1/machines/{machine}").json()
            assert view["entitlement"] == "web" and view["cordoned"] is False
            assert not [e for e in view["events"] if e.startswith("loan-revoke-")]
        assert cp.scheduler.counters["loan_revokes_late"] == 0
    finally:
        stop_live(live)
