"""A job remembers the request id of the operation last applied to it (its cause):
stored with each logged operation, kept with the scheduler's state across a restart,
and given to the assignments it makes."""

from __future__ import annotations

from test_persist_scheduler import Plane

from plait.model import Entitlement, Quota
from plait.persist.scheduler import JobStore
from plait.sim.scenarios import job_spec
from plait.store import SqliteStore


def assignment_causes(plane: Plane, job: str) -> dict[int, str | None]:
    return {a.index: a.cause for tasks in plane.scheduler.desired.values()
            for a in tasks.values() if a.job == job}


def test_the_cause_follows_the_operations_and_survives_a_restart(tmp_path) -> None:
    path = str(tmp_path / "plait.db")
    a = Plane(path)
    a.scheduler.allocator.define(Entitlement(name="ent", owner="o", quota=Quota(machines=24)))
    a.jobs.create(job_spec("web", 3), now=0, cause="req-create")
    a.run(10)
    assert a.scheduler.job("web").cause == "req-create"
    assert assignment_causes(a, "web") == dict.fromkeys(range(3), "req-create")
    a.jobs.update(job_spec("web", 3, command="serve-v2"), now=a.sim.now, cause="req-update")
    a.run(60)
    assert a.scheduler.job("web").cause == "req-update"
    assert assignment_causes(a, "web") == dict.fromkeys(range(3), "req-update")
    assert [(e["op"], e.get("request")) for e in a.jobs.get("web").log] == [
        ("create", "req-create"), ("update", "req-update")]
    assert a.persist.state("web")["cause"] == "req-update"
    a.store.close()

    # stored while the scheduler is down, applied by the one that comes back
    jobs = JobStore(SqliteStore(path))
    jobs.create(job_spec("api", 1), now=70, cause="req-api")
    jobs.ns.store.close()
    b = Plane(path, now=a.sim.now)
    assert b.scheduler.job("web").cause == "req-update"  # (from the stored state)
    assert assignment_causes(b, "web") == dict.fromkeys(range(3), "req-update")
    assert b.scheduler.job("api").cause == "req-api"
    # a resize: the new task is assigned, the others retagged to its version (not
    # restarted), all by that request
    b.jobs.resize("web", 4, now=b.sim.now, cause="req-resize")
    b.run(30)
    assert assignment_causes(b, "web") == dict.fromkeys(range(4), "req-resize")
    # an operation no request made (None) is the job's cause from then on
    b.jobs.restart("web", 0, now=b.sim.now)
    b.run(1)
    assert b.scheduler.job("web").cause is None
    assert "request" not in b.jobs.get("web").log[-1]
    assert b.persist.state("web")["cause"] is None
    b.store.close()
