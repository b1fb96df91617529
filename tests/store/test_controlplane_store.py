"""The control plane runs on either store and comes back from it after a restart."""

from plait.model import Entitlement, JobSpec, Quota, RegionSpec, parse
from plait.server.controlplane import ControlPlane, ControlPlaneConfig

REGION = RegionSpec.sized(24, dcs=2, msbs_per_dc=2, rows_per_msb=1, racks_per_row=2)
SPEC = parse(JobSpec, {"name": "web", "entitlement": "web", "task_count": 5,
                       "resources": {"cpu": 1, "memory_gb": 1}, "command": "serve"})


def test_a_job_settles_and_survives_a_restart_of_the_control_plane(env):
    now = [1000.0]
    config = ControlPlaneConfig(region=REGION, sim_agents=True, sim_start_seconds=1.0)
    cp = ControlPlane(env.store, config, clock=lambda: now[0])
    cp.commands.define_entitlement(Entitlement(name="web", owner="o", quota=Quota(machines=10)))
    cp.commands.create_job(SPEC)
    for _ in range(30):
        now[0] += 0.5
        cp.loop.step()
    view = cp.views.job_view("web")
    assert view["settled"] and view["serving"] == 5
    tasks = cp.views.tasks_view("web")
    cp.commands.resize_job("web", 3)
    cp.loop.step()

    again = ControlPlane(env.other(), config, clock=lambda: now[0])
    assert again.views.job_view("web")["task_count"] == 3
    assert [(t["index"], t["machine"]) for t in again.views.tasks_view("web")] == [
        (t["index"], t["machine"]) for t in tasks]
    assert again.entitlement("web").quota.machines == 10
    assert [e.kind for e in again.events.query(limit=1000)[0]
            if e.job == "web"][:1] == ["created"]
