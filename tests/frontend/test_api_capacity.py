"""Jobs larger than their room, through the API on a live control plane (simulated
agents): a push goes on over the tasks that run while others wait for room."""

from __future__ import annotations

import httpx
from livecp import Live, wait_for

JOB = {"name": "web", "entitlement": "e", "task_count": 4, "command": "serve",
       "resources": {"cpu": 16, "memory_gb": 1}, "update": {"max_unavailable": 1}}


def serving(client: httpx.Client) -> int:
    return int(client.get("/v1/jobs/web").json()["serving"])


def test_a_push_goes_on_while_a_task_waits_for_room(live: Live) -> None:
    """Four whole-machine tasks on a region with three machines left (another
    entitlement holds the other 21): one waits for room, and a push of the other
    three completes (before, the waiting task spent the job's max_unavailable and the
    push froze at "3 of 4 tasks ready")."""
    admin = live.admin
    fill_all_but_three(live)
    assert admin.post("/v1/entitlements", json={
        "name": "e", "owner": "alice", "quota": {"machines": 4}}).status_code == 201
    alice = live.owner("alice")
    assert alice.post("/v1/jobs", json=JOB).status_code == 201
    wait_for(lambda: serving(alice) == 3)
    wait_for(lambda: alice.get("/v1/jobs/web").json()["unplaced_reason"] is not None)
    r = alice.put("/v1/jobs/web/push", json={
        "spec": {**JOB, "command": "serve-v2"}, "stages": [100], "soak_seconds": 0})
    assert r.status_code == 200, r.text
    wait_for(lambda: alice.get("/v1/jobs/web/push").json()["status"]["phase"] == "completed")
    wait_for(lambda: alice.get("/v1/jobs/web").json()["spec"]["command"] == "serve-v2")
    cp = live.cp

    def on_v2() -> int:
        with cp.lock:
            job = cp.scheduler.jobs["web"]
            return sum(1 for r in job.tasks.values() if r.serving and r.op is None
                       and job.versions[r.spec_version - 1].command == "serve-v2")
    wait_for(lambda: on_v2() == 3)
    assert serving(alice) == 3


def fill_all_but_three(live: Live) -> None:
    """Another owner's entitlement takes 21 of the live region's 24 machines."""
    admin = live.admin
    assert admin.post("/v1/entitlements", json={
        "name": "hog", "owner": "carol", "quota": {"machines": 21}}).status_code == 201
    assert admin.post("/v1/jobs", json=whole("h", "hog", 21)).status_code == 201
    wait_for(lambda: admin.get("/v1/jobs/h").json()["serving"] == 21)


def whole(name: str, ent: str, tasks: int) -> dict:
    return {"name": name, "entitlement": ent, "task_count": tasks, "command": "serve",
            "resources": {"cpu": 16, "memory_gb": 1}}


def test_a_lender_short_of_machines_revokes_its_loans_when_quotas_exceed_the_region(
        live: Live) -> None:
    """24 machines: another entitlement holds 20, the borrower the other 4 (on the
    lender's unused quota of 10). The lender's 6 tasks wait for machines: every loan
    is revoked, on the borrower's terms, and the lender runs 4 tasks on them."""
    admin = live.admin
    for ent in ({"name": "plain", "owner": "carol", "quota": {"machines": 24}},
                {"name": "web", "owner": "alice", "quota": {"machines": 10}, "lends": True},
                {"name": "batch", "owner": "bob", "quota": {"machines": 24},
                 "elastic": {"min_notice_seconds": 1, "max_reclaim_fraction_per_minute": 1.0}}):
        assert admin.post("/v1/entitlements", json=ent).status_code == 201
    assert admin.post("/v1/jobs", json=whole("p", "plain", 20)).status_code == 201
    wait_for(lambda: admin.get("/v1/jobs/p").json()["serving"] == 20)
    assert admin.post("/v1/jobs", json=whole("b", "batch", 8)).status_code == 201
    wait_for(lambda: admin.get("/v1/jobs/b").json()["serving"] == 4)
    assert admin.post("/v1/jobs", json=whole("w", "web", 6)).status_code == 201
    wait_for(lambda: admin.get("/v1/jobs/w").json()["serving"] == 4)
    assert admin.get("/v1/jobs/b").json()["serving"] == 0
    revoked = admin.get("/v1/events", params={"kind": "loan_revoked"}).json()["events"]
    assert revoked



def test_the_autoscaler_sizes_within_the_room_and_says_so(live: Live) -> None:
    """A load that asks for 8 whole-machine tasks on a quota of 8 machines, in a region
    with 3 machines left (another entitlement holds the other 21): the job is sized
    to 3, with an event that says what was wanted and what capped it. A quota that
    could never hold what is wanted is the owner's limit: clamped to it, said too."""
    admin = live.admin
    fill_all_but_three(live)
    assert admin.post("/v1/entitlements", json={
        "name": "e", "owner": "alice", "quota": {"machines": 8}}).status_code == 201
    alice = live.owner("alice")
    assert alice.post("/v1/jobs", json={**JOB, "task_count": 1}).status_code == 201
    assert alice.put("/v1/jobs/web/autoscale", json={"interval_seconds": 1, "policy": {
        "metric": "external", "target_utilization": 0.5, "min_tasks": 1,
        "max_tasks": 20, "history_weight": 0}}).status_code == 200
    assert alice.post("/v1/jobs/web/load", json={"value": 4}).status_code == 200

    def events(kind: str) -> list[dict]:
        return live.admin.get("/v1/events", params={"job": "web", "kind": kind}
                              ).json()["events"]
    wait_for(lambda: bool(events("autoscale_capped")))
    capped = events("autoscale_capped")[0]
    assert capped["actor"] == "autoscaler"
    assert capped["message"].startswith("wanted 8 tasks, capped at 3: region capacity")
    wait_for(lambda: alice.get("/v1/jobs/web").json()["spec"]["task_count"] == 3)
    assert "1 -> 3 tasks" in events("autoscaled")[0]["message"]
    assert "wanted 8, capped: region capacity" in events("autoscaled")[0]["message"]
    wait_for(lambda: serving(alice) == 3)
    passes = live.cp.steps
    wait_for(lambda: live.cp.steps >= passes + 20)
    assert alice.get("/v1/jobs/web").json()["spec"]["task_count"] == 3  # (never past)
    assert len(events("autoscale_capped")) == 1  # (said once while it holds)
    # a load past what the quota could ever hold: clamped to the quota's reach
    assert alice.post("/v1/jobs/web/load", json={"value": 6}).status_code == 200
    wait_for(lambda: bool(events("autoscale_clamped")))
    clamped = events("autoscale_clamped")[0]["message"]
    assert clamped.startswith("12 tasks wanted, 8 at most") and "quota" in clamped
    assert alice.get("/v1/jobs/web").json()["spec"]["task_count"] <= 8


def test_a_quota_the_region_cannot_give_is_accepted_with_a_warning(live: Live) -> None:
    """The live region has 24 machines: a quota of 30 is stored (capacity can grow),
    and the answer and the event say so; two quotas that add up to more than the
    region are said too; a quota within it says nothing."""
    admin = live.admin
    r = admin.post("/v1/entitlements", json={"name": "big", "owner": "alice",
                                              "quota": {"machines": 30}})
    assert r.status_code == 201, r.text
    assert r.json()["quota"]["machines"] == 30
    warnings = r.json()["warnings"]
    assert "its quota of 30 machines is above the region's 24 machines" in warnings[0]
    assert any("add up to" in w for w in warnings)

    def said() -> bool:
        events = admin.get("/v1/events", params={"kind": "entitlement_created"}).json()[
            "events"]
        return any("(warning: its quota of 30 machines is above the region's 24 machines"
                   in e["message"] for e in events)
    wait_for(said)
    r = admin.post("/v1/entitlements", json={"name": "big", "owner": "alice",
                                              "quota": {"machines": 20}})
    assert r.status_code == 200 and "warnings" not in r.json()
    r = admin.post("/v1/entitlements", json={"name": "more", "owner": "bob",
                                              "quota": {"machines": 10}})
    assert r.status_code == 201
    (warning,) = r.json()["warnings"]
    assert "add up to" in warning and "30 machines' worth" in warning
    assert "more than its 384 RRU (24 machines)" in warning
    # an elastic entitlement's quota caps its borrowing: not a promise, not counted
    r = admin.post("/v1/entitlements", json={
        "name": "loans", "owner": "bob", "quota": {"machines": 24},
        "elastic": {"min_notice_seconds": 1}})
    assert r.status_code == 201 and "warnings" not in r.json()
    # (an owner reads its entitlement without the warnings of a create)
    assert "warnings" not in live.owner("alice").get("/v1/entitlements/big").json()


def test_the_example_entitlements_fit_the_demo_region(tmp_path) -> None:
    """``make demo`` creates examples/entitlements.yaml on ``plait up``'s region of 6
    machines: no warning."""
    from pathlib import Path

    import yaml

    from plait.model import Entitlement, RegionSpec, parse
    from plait.server.controlplane import ControlPlane, ControlPlaneConfig
    from plait.server.serve import store_for

    region = RegionSpec.sized(6, dcs=2, msbs_per_dc=3, rows_per_msb=1, racks_per_row=1)
    cp = ControlPlane(store_for(tmp_path / "data"), ControlPlaneConfig(region=region))
    path = Path(__file__).resolve().parents[2] / "examples" / "entitlements.yaml"
    for doc in yaml.safe_load(path.read_text())["entitlements"]:
        ent = parse(Entitlement, doc)
        assert cp.commands.quota_warnings(ent) == [], ent.name
        cp.commands.define_entitlement(ent)


def test_a_profile_roll_on_a_full_region_says_why_a_moved_task_waits(tmp_path) -> None:
    """Every machine busy (22 of another entitlement's, 2 of front's, two tasks of a
    job of max_unavailable 1 on each): a new version of front's profile drains one
    machine; the task moved off it has nowhere to go until that machine switches, and
    the job's events say so (and when the drain's deadline moves the other); the roll
    completes machine by machine."""
    from livecp import start_live, stop_live

    from plait.scheduler import SchedulerConfig

    live = start_live(tmp_path / "data", scheduler=SchedulerConfig(profile_roll_deadline=2))
    try:
        admin = live.admin
        assert admin.put("/v1/hostprofiles/web", json={
            "name": "web", "sysctls": {"net.core.somaxconn": "4096"}}).status_code in (200, 201)
        for ent in ({"name": "plain", "owner": "carol", "quota": {"machines": 22}},
                    {"name": "front", "owner": "alice", "quota": {"machines": 2},
                     "host_profile": "web"}):
            assert admin.post("/v1/entitlements", json=ent).status_code == 201
        assert admin.post("/v1/jobs", json=whole("p", "plain", 22)).status_code == 201
        wait_for(lambda: admin.get("/v1/jobs/p").json()["serving"] == 22)
        front = {"name": "front", "entitlement": "front", "task_count": 4,
                 "command": "serve", "resources": {"cpu": 8, "memory_gb": 1},
                 "update": {"max_unavailable": 1}}
        assert admin.post("/v1/jobs", json=front).status_code == 201
        wait_for(lambda: admin.get("/v1/jobs/front").json()["serving"] == 4)
        assert admin.put("/v1/hostprofiles/web", json={
            "name": "web", "sysctls": {"net.core.somaxconn": "8192"}}).status_code in (200, 201)

        def waits() -> list[dict]:
            return admin.get("/v1/events", params={
                "job": "front", "kind": "profile_roll_waiting"}).json()["events"]
        wait_for(lambda: bool(waits()))
        assert "waits for room" in waits()[0]["message"]
        wait_for(lambda: len(admin.get("/v1/events", params={
            "kind": "profile_roll_drained"}).json()["events"]) == 2, 120)
        wait_for(lambda: admin.get("/v1/jobs/front").json()["serving"] == 4, 120)
        cp = live.cp
        with cp.lock:
            assert not cp.scheduler.rolling and not cp.scheduler.stale
    finally:
        stop_live(live)
