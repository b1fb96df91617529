"""Machines registered by their agents: a new machine joins the region with its fault
domain, resources and type; a known one must match; registration survives a restart
and moves no running task."""

from __future__ import annotations

from livecp import REGION, start_live, stop_live, wait_for

from plait.server.controlplane import ControlPlane, ControlPlaneConfig
from plait.server.serve import store_for

LAB = {"machine": "lab-1", "fault_domain": "region1/dc3/msb9/row1/rack1", "cpu": 8,
       "memory_gb": 32, "type": "lab"}


def _join(live, body):
    join = live.admin.post("/v1/tokens", json={"role": "join", "name": "j"}).json()["token"]
    return live.client(join).post("/v1/agents/join", json=body)


def _spec(name, tasks, **policy):
    return {"name": name, "entitlement": "e", "task_count": tasks,
            "resources": {"cpu": 1, "memory_gb": 1}, "command": "serve", "policy": policy}


def _placed(live, name):
    return {t["index"]: (t["machine"], t["state"])
            for t in live.admin.get(f"/v1/jobs/{name}/tasks").json()["tasks"]}


def test_an_agent_registers_its_machine_and_tasks_land_on_it(live):
    assert live.admin.post("/v1/entitlements", json={"name": "e", "owner": "o",
                                                     "quota": {"machines": 30}}).status_code == 201
    assert live.admin.post("/v1/jobs", json=_spec("web", 4)).status_code == 201
    wait_for(lambda: live.admin.get("/v1/jobs/web").json()["settled"])
    before = _placed(live, "web")
    events_before = live.admin.get("/v1/events", params={"limit": 1000}).json()["events"]

    r = _join(live, LAB)
    assert r.status_code == 201, r.text
    m = live.admin.get("/v1/machines/lab-1").json()
    assert (m["type"], m["cpu"], m["memory_gb"], m["fault_domain"]) == (
        "lab", 8, 32, {"dc": "dc3", "msb": "msb9", "row": "row1", "rack": "rack1"})
    assert live.admin.get("/v1/machines").json()["total"] == 25
    # nothing that ran moved or restarted
    assert _placed(live, "web") == before

    def new_events():
        events = live.admin.get("/v1/events", params={"limit": 1000}).json()["events"]
        return [e["kind"] for e in events[len(events_before):]]
    wait_for(lambda: "machine_registered" in new_events())
    assert "task_lost" not in new_events()

    # a job that needs the new type runs there
    assert live.admin.post("/v1/jobs", json=_spec(
        "lab", 2, requirements={"machine_types": ["lab"]})).status_code == 201
    wait_for(lambda: live.admin.get("/v1/jobs/lab").json()["settled"])
    assert {mach for mach, _ in _placed(live, "lab").values()} == {"lab-1"}

    # joining again with the same description changes nothing
    assert _join(live, LAB).status_code == 201
    assert live.admin.get("/v1/machines").json()["total"] == 25


def test_a_known_machine_must_match_and_descriptions_are_checked(live):
    r = _join(live, {"machine": "m0000003", "fault_domain": "region1/dc1/msb1/row1/rack2",
                     "cpu": 16, "memory_gb": 64, "type": "skylake"})
    assert r.status_code == 201  # as the region knows it
    r = _join(live, {"machine": "m0000003", "fault_domain": "region1/dc1/msb1/row1/rack2",
                     "cpu": 32, "memory_gb": 64, "type": "skylake"})
    assert r.status_code == 409 and "cpu 16" in r.json()["message"] and "cpu 32" in r.json()[
        "message"]
    r = _join(live, {"machine": "x1", "fault_domain": "region1/dc1/msb1/row1/rack2", "cpu": 4})
    assert r.status_code == 422 and "memory_gb" in r.json()["message"]
    r = _join(live, {**LAB, "fault_domain": "elsewhere/dc1/msb1/row1/rack1"})
    assert r.status_code == 422 and "region1" in r.json()["message"]
    r = _join(live, {**LAB, "fault_domain": "region1/dc1"})
    assert r.status_code == 422 and "region/dc/msb/row/rack" in r.json()["message"]
    r = _join(live, {**LAB, "machine": "../etc"})
    assert r.status_code == 422
    assert live.admin.get("/v1/machines").json()["total"] == 24  # none of these joined


def test_registered_machines_survive_a_restart(tmp_path):
    live = start_live(tmp_path / "data")
    try:
        live.admin.post("/v1/entitlements", json={"name": "e", "owner": "o",
                                                  "quota": {"machines": 30}})
        assert _join(live, LAB).status_code == 201
        live.admin.post("/v1/jobs", json=_spec("lab", 1, requirements={
            "machine_types": ["lab"]}))
        wait_for(lambda: live.admin.get("/v1/jobs/lab").json()["settled"])
    finally:
        stop_live(live)
    again = ControlPlane(store_for(tmp_path / "data"), ControlPlaneConfig(region=REGION))
    try:
        assert again.views.machine("lab-1")["type"] == "lab"
        assert [(t["machine"], t["state"]) for t in again.views.tasks_view("lab")] == [
            ("lab-1", "running")]
    finally:
        again.store.close()
