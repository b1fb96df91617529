"""A job remembers the request id of the operation last applied to it (its cause):
stored with each logged operation (by the request that stored it), kept with the
scheduler's state across a restart, and given to the assignments it makes."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from test_persist_scheduler import Plane

from plait import requestid
from plait.model import Entitlement, Quota
from plait.persist.scheduler import JobStore
from plait.sim.scenarios import job_spec
from plait.store import SqliteStore


@contextlib.contextmanager
def asking(rid: str) -> Iterator[None]:
    """Within the handling of API request ``rid`` (as the command path is)."""
    token = requestid.current.set(rid)
    try:
        yield
    finally:
        requestid.current.reset(token)


def assignment_causes(plane: Plane, job: str) -> dict[int, str | None]:
    return {a.index: a.cause for tasks in plane.scheduler.desired.values()
            for a in tasks.values() if a.job == job}


def test_the_cause_follows_the_operations_and_survives_a_restart(tmp_path) -> None:
    path = str(tmp_path / "plait.db")
    a = Plane(path)
    a.scheduler.allocator.define(Entitlement(name="ent", owner="o", quota=Quota(machines=24)))
    with asking("req-create"):
        a.jobs.create(job_spec("web", 3), now=0)
    a.run(10)
    assert a.scheduler.job("web").cause == "req-create"
    assert assignment_causes(a, "web") == dict.fromkeys(range(3), "req-create")
    with asking("req-update"):
        a.jobs.update(job_spec("web", 3, command="serve-v2"), now=a.sim.now)
    a.run(60)
    assert a.scheduler.job("web").cause == "req-update"
    assert assignment_causes(a, "web") == dict.fromkeys(range(3), "req-update")
    assert [(e["op"], e.get("request")) for e in a.jobs.get("web").log] == [
        ("create", "req-create"), ("update", "req-update")]
    assert a.persist.state("web")["cause"] == "req-update"
    a.store.close()

    # stored while the scheduler is down, applied by the one that comes back
    jobs = JobStore(SqliteStore(path))
    with asking("req-api"):
        jobs.create(job_spec("api", 1), now=70)
    jobs.ns.store.close()
    b = Plane(path, now=a.sim.now)
    assert b.scheduler.job("web").cause == "req-update"  # (from the stored state)
    assert assignment_causes(b, "web") == dict.fromkeys(range(3), "req-update")
    assert b.scheduler.job("api").cause == "req-api"
    # a resize: the new task is assigned, the others retagged to its version (not
    # restarted), all by that request
    with asking("req-resize"):
        b.jobs.resize("web", 4, now=b.sim.now)
    b.run(30)
    assert assignment_causes(b, "web") == dict.fromkeys(range(4), "req-resize")
    # an operation no request made (None) is the job's cause from then on
    b.jobs.restart("web", 0, now=b.sim.now)
    b.run(1)
    assert b.scheduler.job("web").cause is None
    assert "request" not in b.jobs.get("web").log[-1]
    assert b.persist.state("web")["cause"] is None
    b.store.close()
