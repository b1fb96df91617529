"""The autoscaler on the CPU its agents report (real processes on loopback): a job
whose tasks each burn a whole core, asking for half of one, under a cpu policy with
a target utilization of 0.5, grows to what its measured load needs. Bounded by a
liveness timeout; nothing asserts speed."""

from __future__ import annotations

import pytest
from e2e_region import Region, wait_for

BURN = {"name": "burn", "entitlement": "e", "task_count": 1,
        "resources": {"cpu": 0.5, "memory_gb": 0.1}, "command": "python3",
        "args": ["-c", "while True: pass"]}
POLICY = {"interval_seconds": 2, "policy": {
    "metric": "cpu", "target_utilization": 0.5, "min_tasks": 1, "max_tasks": 3,
    "scale_down_fraction": 0.5, "history_weight": 0}}


@pytest.fixture
def region(tmp_path):
    r = Region(tmp_path)
    yield r
    r.close()


def test_a_job_grows_to_the_cpu_its_tasks_use(region):
    for machine in ("m0000000", "m0000001"):
        region.start_agent(machine)
    region.admin.post("/v1/entitlements", json={"name": "e", "owner": "o",
                                                "quota": {"machines": 2}})
    assert region.admin.post("/v1/jobs", json=BURN).status_code == 201
    assert region.admin.put("/v1/jobs/burn/autoscale", json=POLICY).status_code == 200
    # one task burns about a core (limited to half of one where cgroups hold it):
    # at least a whole task's worth of load at 50 %: two tasks or more
    wait_for(lambda: region.admin.get("/v1/jobs/burn").json()["spec"]["task_count"] >= 2,
             timeout=90, what="the autoscaler grows the job")
    view = region.admin.get("/v1/jobs/burn/autoscale").json()
    # the load it grew on, measured from the agents (in tasks' worth: a busy box gives
    # a burning task less than the core it wants), is more than one task at 50 %
    assert view["load"]["value"] > 0.5
    sizing = region.admin.get("/v1/jobs/burn/sizing").json()
    assert sizing["actor"] == "autoscaler" and sizing["intent"]["max"] == 3
