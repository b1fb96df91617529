"""plait machine drain --to free|maintenance: the tasks move off through TaskControl
(the built-in pacing here), then the empty machine goes back to the free pool or stays
out of service until uncordoned; a restarted control plane finishes a drain it had
begun."""

from __future__ import annotations

import httpx
from livecp import REGION, Live, start_live, stop_live, wait_for

from plait.server.controlplane import ControlPlane, ControlPlaneConfig
from plait.server.serve import ApiServer, store_for

SPEC = {"name": "web", "entitlement": "web", "task_count": 6,
        "resources": {"cpu": 1, "memory_gb": 1}, "command": "serve",
        "update": {"max_unavailable": 1}}


def setup(live):
    r = live.admin.post("/v1/entitlements", json={"name": "web", "owner": "alice",
                                                  "quota": {"machines": 12}})
    assert r.status_code == 201, r.text
    assert live.admin.post("/v1/jobs", json=SPEC).status_code == 201
    wait_for(lambda: live.admin.get("/v1/jobs/web").json()["settled"])
    return live.admin.get("/v1/jobs/web/tasks").json()["tasks"][0]["machine"]


def tasks_on(live, machine):
    return [t for t in live.admin.get("/v1/jobs/web/tasks").json()["tasks"]
            if t["machine"] == machine]


def drained(live, machine):
    events = live.admin.get("/v1/events", params={"kind": "machine_drained",
                                                  "limit": 100}).json()["events"]
    return [e for e in events if e["machine"] == machine]


def test_a_drain_to_free_gives_the_empty_machine_back_to_the_free_pool(live):
    on = setup(live)
    r = live.admin.post(f"/v1/machines/{on}/drain",
                        json={"deadline_seconds": 3600, "to": "free"})
    assert r.status_code == 200, r.text
    wait_for(lambda: drained(live, on))
    assert tasks_on(live, on) == []
    wait_for(lambda: live.admin.get("/v1/jobs/web").json()["settled"])
    assert "back in the free pool" in drained(live, on)[0]["message"]
    machine = live.admin.get(f"/v1/machines/{on}").json()
    assert machine["state"] == "healthy" and machine["cordoned"] is False
    assert machine["entitlement"] is None
    assert not [e for e in live.admin.get("/v1/maintenance").json()["events"]
                if on in e["machines"]]


def test_what_is_left_at_a_drains_deadline_moves_and_the_machine_is_given_back(live):
    # the tasks still on the machine at its deadline were stopped and parked until the
    # drain's window ended, a year later: the job stayed short of them, and the
    # machine, never empty, never went back to the free pool
    on = setup(live)
    here = len(tasks_on(live, on))
    r = live.admin.post(f"/v1/machines/{on}/drain",
                        json={"deadline_seconds": 0, "to": "free"})
    assert r.status_code == 200, r.text
    wait_for(lambda: drained(live, on))
    wait_for(lambda: live.admin.get("/v1/jobs/web").json()["settled"])
    tasks = live.admin.get("/v1/jobs/web/tasks").json()["tasks"]
    assert sorted(t["state"] for t in tasks) == ["running"] * 6
    assert tasks_on(live, on) == []
    forced = live.admin.get("/v1/events", params={"kind": "deadline_stop", "limit": 100}
                            ).json()["events"]
    assert len(forced) == here and all("moved off" in e["message"] for e in forced)
    machine = live.admin.get(f"/v1/machines/{on}").json()
    assert machine["entitlement"] is None and machine["cordoned"] is False


def test_a_drain_to_maintenance_keeps_the_empty_machine_out_until_uncordoned(live):
    on = setup(live)
    r = live.admin.post(f"/v1/machines/{on}/drain", json={"deadline_seconds": 3600})
    assert r.status_code == 200, r.text
    wait_for(lambda: drained(live, on))
    assert "out of service until uncordoned" in drained(live, on)[0]["message"]
    machine = live.admin.get(f"/v1/machines/{on}").json()
    assert machine["cordoned"] is True
    assert [e for e in live.admin.get("/v1/maintenance").json()["events"]
            if on in e["machines"]]
    live.admin.post(f"/v1/machines/{on}/uncordon")
    assert live.admin.get(f"/v1/machines/{on}").json()["cordoned"] is False
    bad = live.admin.post(f"/v1/machines/{on}/drain", json={"to": "elsewhere"})
    assert bad.status_code == 422 and bad.json()["field"].endswith("to")


def test_a_restarted_control_plane_finishes_a_drain(tmp_path):
    live = start_live(tmp_path / "data")
    try:
        r = live.admin.post("/v1/entitlements", json={"name": "web", "owner": "alice",
                                                      "quota": {"machines": 1}})
        assert r.status_code == 201
        assert live.admin.post("/v1/jobs", json={**SPEC, "task_count": 2}).status_code == 201
        wait_for(lambda: live.admin.get("/v1/jobs/web").json()["settled"])
        on = live.admin.get("/v1/jobs/web/tasks").json()["tasks"][0]["machine"]
        # its one machine: the tasks have nowhere to go while the quota is 1
        r = live.admin.post(f"/v1/machines/{on}/drain",
                            json={"deadline_seconds": 3600, "to": "free"})
        assert r.status_code == 200
        wait_for(lambda: live.admin.get("/v1/jobs/web").json()["unavailable"] >= 1)
        assert tasks_on(live, on) and not drained(live, on)
    finally:
        stop_live(live)
    token = live.admin_token
    cp = ControlPlane(store_for(tmp_path / "data"), ControlPlaneConfig(
        region=REGION, tick_seconds=0.05, sim_agents=True, sim_start_seconds=0.2))
    assert cp.bootstrap_admin() is None
    server = ApiServer(cp).start()
    live = Live(server.url, cp, httpx.Client(base_url=server.url, timeout=30, headers={
        "Authorization": f"Bearer {token}"}), token, server)
    try:
        r = live.admin.post("/v1/entitlements", json={"name": "web", "owner": "alice",
                                                      "quota": {"machines": 4}})
        assert r.status_code == 200, r.text
        wait_for(lambda: drained(live, on))
        machine = live.admin.get(f"/v1/machines/{on}").json()
        assert machine["cordoned"] is False and machine["entitlement"] is None
        wait_for(lambda: live.admin.get("/v1/jobs/web").json()["settled"])
    finally:
        stop_live(live)


def test_an_uncordon_of_a_machine_a_profile_roll_holds_is_refused(live):
    # it answered "uncordon" and recorded machine_uncordoned; the machine stayed cordoned
    from plait.model.events import EventKind, UnavailabilityEvent

    cp = live.cp
    with cp.lock:
        now = cp.clock()
        cp.region.set_cordon(cp.machine_index("m0000001"), True)
        cp.region.add_event(UnavailabilityEvent(
            "profile-roll-web-m0000001-1", EventKind.MAINTENANCE, ("m0000001",), now + 3600,
            now + 7200, "host profile roll"), now)
    r = live.admin.post("/v1/machines/m0000001/uncordon")
    assert r.status_code == 409, r.text
    assert "held by profile-roll-web-m0000001-1 until the machine is drained" in r.json()[
        "message"]
    assert live.admin.get("/v1/machines/m0000001").json()["cordoned"] is True
    assert not live.admin.get("/v1/events", params={"kind": "machine_uncordoned"}).json()[
        "events"]


def test_a_pending_task_shows_no_machine(live):
    # a task stopped by a drain and waiting for a machine was shown on the machine it
    # had left (one that already ran another job's task)
    from plait.model.task import TaskState
    from plait.server.controlplane.views import JobState

    setup(live)
    cp = live.cp
    with cp.lock:
        job = cp.scheduler.jobs["web"]
        rec = job.tasks[0]
        assert rec.machine is not None
        was, rec.state = rec.state, TaskState.PENDING
        try:
            tasks = JobState.of(cp.scheduler, job, cp.fleet, 0).task_views()
        finally:
            rec.state = was
    assert tasks[0]["state"] == "pending"
    assert tasks[0]["machine"] is None and tasks[0]["fault_domain"] is None
    assert tasks[1]["machine"] is not None
