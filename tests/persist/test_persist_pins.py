"""Versions kept for pinned tasks, and the pins themselves, are stored with the job
and survive a restart of the scheduler: the Job Control Plane's unified spec is
acknowledged once written, like any other operation."""

from dataclasses import replace

from test_persist_scheduler import Plane

from plait.model import Entitlement, Quota
from plait.sim.scenarios import job_spec


def versions(plane, name):
    job = plane.scheduler.job(name)
    return {i: r.spec_version for i, r in job.tasks.items()}


def test_kept_versions_and_pins_survive_a_restart(tmp_path):
    path = str(tmp_path / "plait.db")
    a = Plane(path)
    a.scheduler.allocator.define(Entitlement(name="ent", owner="o", quota=Quota(machines=24)))
    a.jobs.create(job_spec("web", 6), now=0)
    a.run(10)
    doc, pushed = a.jobs.keep(job_spec("web", 6, command="serve-v2"), now=a.sim.now)
    assert pushed == 2 and doc.target == 1 and doc.version == 2
    again, same = a.jobs.keep(job_spec("web", 6, command="serve-v2"), now=a.sim.now)
    assert same == 2 and again.seq == doc.seq  # kept once
    a.jobs.set_pins("web", {0: 2, 1: 2, 2: 2}, now=a.sim.now)
    a.run(60)
    assert versions(a, "web") == {0: 2, 1: 2, 2: 2, 3: 1, 4: 1, 5: 1}
    assert a.scheduler.job("web").target == 1
    a.store.close()

    b = Plane(path, now=a.sim.now)
    b.sim.agents = a.sim.agents
    job = b.scheduler.job("web")
    assert job.target == 1 and job.pins == {0: 2, 1: 2, 2: 2}
    assert versions(b, "web") == {0: 2, 1: 2, 2: 2, 3: 1, 4: 1, 5: 1}
    # a resize keeps the pins within the new count; an update that unpins promotes
    b.jobs.resize("web", 2, now=b.sim.now)
    b.run(60)
    job = b.scheduler.job("web")
    assert job.target == 3 and job.pins == {0: 2, 1: 2}
    assert b.jobs.get("web").pins == {0: 2, 1: 2}
    b.jobs.update(job_spec("web", 2, command="serve-v2"), now=b.sim.now, pins={})
    b.run(60)
    job = b.scheduler.job("web")
    assert job.target == 4 and job.pins is None
    assert set(versions(b, "web").values()) == {4}
    b.store.close()


def test_pins_written_while_the_scheduler_was_down_are_applied(tmp_path):
    path = str(tmp_path / "plait.db")
    a = Plane(path)
    a.scheduler.allocator.define(Entitlement(name="ent", owner="o", quota=Quota(machines=24)))
    a.jobs.create(job_spec("web", 4), now=0)
    a.run(10)
    a.store.close()

    b = Plane(path, now=11)
    _, canary = b.jobs.keep(job_spec("web", 4, command="canary"), now=11)
    b.jobs.set_pins("web", {3: canary}, now=11)
    b.run(60)
    assert versions(b, "web") == {0: 1, 1: 1, 2: 1, 3: canary}


def test_kept_versions_are_not_trimmed_while_pinned(tmp_path):
    p = Plane(str(tmp_path / "plait.db"))
    p.scheduler.allocator.define(Entitlement(name="ent", owner="o", quota=Quota(machines=24)))
    p.jobs.create(job_spec("web", 2), now=0)
    _, kept = p.jobs.keep(job_spec("web", 2, command="old-canary"), now=0)
    p.jobs.set_pins("web", {0: kept}, now=0)
    for n in range(3, 30):  # far more versions than the job keeps
        p.jobs.resize("web", n % 2 + 2, now=0)
    doc = p.jobs.get("web")
    assert kept in doc.kept and doc.pins == {0: kept}


def test_a_surge_task_under_way_survives_a_restart(tmp_path):
    from plait.model import UpdatePolicy

    path = str(tmp_path / "plait.db")
    a = Plane(path)
    a.scheduler.allocator.define(Entitlement(name="ent", owner="o", quota=Quota(machines=24),
                                             surge_buffer=1))
    surging = UpdatePolicy(surge=True)
    a.jobs.create(job_spec("web", 1, update=surging), now=0)
    a.run(10)
    a.jobs.update(job_spec("web", 1, update=surging, command="v2"), now=a.sim.now)
    while not a.scheduler.job("web").surges:
        a.run(0.5)
    surges = dict(a.scheduler.job("web").surges)
    a.store.close()

    b = Plane(path, now=a.sim.now)
    b.sim.agents = a.sim.agents
    assert b.scheduler.job("web").surges == surges  # still covering task 0
    b.run(120)
    job = b.scheduler.job("web")
    assert list(job.tasks) == [0] and job.tasks[0].spec_version == 2 and job.surges is None


def test_a_version_kept_in_a_canary_entitlement_survives_a_restart(tmp_path):
    """A host-profile canary's version runs in its canary entitlement (decision 103):
    its tasks are placed there, and after a restart they stay there, not restarted."""
    path = str(tmp_path / "plait.db")
    a = Plane(path)
    a.scheduler.allocator.define(Entitlement(name="ent", owner="o", quota=Quota(machines=24)))
    child = "ent.canary-0123456789"
    a.scheduler.allocator.define(Entitlement(name=child, owner="o", quota=Quota(machines=2),
                                             canary_of="ent"))
    a.jobs.create(job_spec("web", 4), now=0)
    a.run(10)
    canary = job_spec("web", 4, command="serve-canary", entitlement=child)
    _, version = a.jobs.keep(canary, now=a.sim.now, canary_of="ent")
    a.jobs.set_pins("web", {0: version}, now=a.sim.now)
    a.run(60)
    rec = a.scheduler.job("web").tasks[0]
    assert rec.spec_version == version and rec.serving
    assert a.sim.region.broker_of(rec.machine).entitlement_of(rec.machine) == child
    machine = rec.machine
    a.store.close()

    b = Plane(path, now=a.sim.now)
    b.sim.agents = a.sim.agents
    b.run(30)
    rec = b.scheduler.job("web").tasks[0]
    assert rec.spec_version == version and rec.machine == machine and rec.serving
    assert sum(1 for r in b.scheduler.job("web").tasks.values() if r.serving) == 4


def test_a_profile_roll_under_way_is_finished_after_a_restart(tmp_path):
    """A control plane restarted while a machine drains for a profile roll goes on
    with that drain (its event is in the brokers' records): the machine comes back,
    uncordoned, and the roll ends with every task on machines carrying the new
    version and no roll's event left."""
    from plait.model import UpdatePolicy
    from plait.model.events import PROFILE_ROLL_PREFIX
    from plait.model.hostprofile import HostProfile, HostProfileSpec

    web = HostProfileSpec(name="web", turbo=True)
    path = str(tmp_path / "plait.db")
    a = Plane(path)
    a.scheduler.define_profile(HostProfile(spec=web, version=1))
    a.scheduler.allocator.define(Entitlement(name="ent", owner="o", quota=Quota(machines=24),
                                             host_profile="web"))
    spec = job_spec("web", 4, cpu=16, update=UpdatePolicy(max_unavailable=1))
    a.jobs.create(spec, now=0)
    a.run(30)
    assert len(a.running("web")) == 4
    # an operator's cordon of a busy machine, before the roll: it is still there after
    quarantined = max(a.running("web").values())
    a.scheduler.region.set_cordon(quarantined, True)
    a.scheduler.define_profile(HostProfile(spec=web, version=2))
    while not a.scheduler.rolling:
        a.run(0.5)
    rolling = dict(a.scheduler.rolling)
    assert quarantined not in rolling
    a.store.close()

    b = Plane(path, now=a.sim.now)  # profiles are the control plane's to load: given
    b.sim.agents = a.sim.agents
    for version in (1, 2):
        b.scheduler.define_profile(HostProfile(spec=web, version=version))
    s = b.scheduler
    # several drains at once: the machine found again must not be drained twice
    s.config = replace(s.config, profile_roll_at_once=4)
    for m, agent in b.sim.agents.items():  # (a real agent's every heartbeat tells it)
        agent.profile_changed = True
        b.sim.wake(m)
    for _ in range(1200):
        b.run(0.5)
        if (not s.stale and not s.rolling and len(b.running("web")) == 4
                and not [e for e in s.region.events() if e.id.startswith(PROFILE_ROLL_PREFIX)]):
            break
    assert not [e.id for e in s.region.events() if e.id.startswith(PROFILE_ROLL_PREFIX)]
    assert len(b.running("web")) == 4
    for m in rolling:  # the machine drained before the restart is back in service
        assert not s.region.broker_of(m).cordoned(m), s.fleet.name(m)
    assert s.region.broker_of(quarantined).operator_cordoned(quarantined)
    assert quarantined not in b.running("web").values()
    for m in b.running("web").values():
        assert b.sim.agents[m].profile == ("web", 2)
    events = [e for e in s.profile_transitions if e.kind == "profile_roll_drained"]
    assert len({e.machine for e in events}) == len(events)  # each drained once


def test_a_restart_keeps_to_a_borrowers_reclaim_rate(tmp_path):
    """The revokes of a borrower's reclaim window are stored with the scheduler's
    state: a restarted control plane began another revoke 10 s after the last one,
    at 1 revoke a minute (the first had already completed: its event was gone)."""
    from plait.model import ElasticTerms
    from plait.model.hostprofile import HostProfile, HostProfileSpec

    profiles = [HostProfile(spec=HostProfileSpec(name=n, turbo=True), version=1)
                for n in ("web", "batch")]
    path = str(tmp_path / "plait.db")
    a = Plane(path)
    for p in profiles:
        a.scheduler.define_profile(p)
    terms = ElasticTerms(min_notice_seconds=60, max_reclaim_fraction_per_minute=0.05)
    a.scheduler.allocator.define(Entitlement(name="web", owner="o", lends=True,
                                             host_profile="web", quota=Quota(machines=24)))
    a.scheduler.allocator.define(Entitlement(name="batch", owner="o", host_profile="batch",
                                             quota=Quota(machines=24), elastic=terms))
    for agent in (a.sim.agent(m) for m in range(24)):
        agent.guard = False
    a.jobs.create(job_spec("w", 2, "web", cpu=16), now=0)
    a.jobs.create(job_spec("b", 20, "batch", cpu=16), now=0)
    a.run(120)
    assert len(a.running("b")) == 20
    a.jobs.resize("w", 10, now=a.sim.now)
    while not [e for e in a.scheduler.loan_events if e.kind == "loan_revoked"]:
        a.run(0.5)
    a.run(10)
    a.store.close()

    b = Plane(path, now=a.sim.now)
    b.sim.agents = a.sim.agents
    for p in profiles:
        b.scheduler.define_profile(p)
    for _ in range(7200):
        b.run(0.5)
        if len(b.running("w")) == 10:
            break
    assert len(b.running("w")) == 10
    times = sorted(e.at for s in (a.scheduler, b.scheduler) for e in s.loan_events
                   if e.kind == "loan_revoked")
    assert len(times) >= 3
    for k, t in enumerate(times):
        assert [u for u in times[k:] if u < t + 60] == [t], (t, times)
