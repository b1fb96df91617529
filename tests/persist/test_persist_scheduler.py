"""The scheduler follows the stored job records and rebuilds after a restart."""

import json

import pytest

from plait.allocator import MachineIndex
from plait.errors import Conflict, NotFound, ValidationError
from plait.model import Entitlement, Quota, RegionSpec, generate
from plait.model.task import TaskState
from plait.persist import PersistentAllocator, PersistentRegion
from plait.persist.scheduler import LOG_LIMIT, JobStore, PersistentScheduler
from plait.scheduler import Scheduler, SchedulerConfig
from plait.sim import Simulation
from plait.sim.scenarios import job_spec
from plait.store import SqliteStore

FLEET = generate(RegionSpec(dcs=2, msbs_per_dc=2, rows_per_msb=1, racks_per_row=2,
                            machines_per_rack=3))


class Plane:
    """A control plane over a store: persistent brokers, allocator and scheduler,
    with simulated agents."""

    def __init__(self, path, now=0.0):
        self.store = SqliteStore(path)
        region = PersistentRegion.load(FLEET, self.store, now)
        allocator = PersistentAllocator.load(MachineIndex(FLEET, region), self.store)
        self.scheduler = Scheduler(allocator, now=now)
        self.persist = PersistentScheduler.load(self.scheduler, self.store, now)
        self.sim = Simulation(FLEET, scheduler=self.scheduler, now=now)
        self.jobs = JobStore(self.store)

    def run(self, seconds):
        end = self.sim.now + seconds
        while self.sim.now < end:
            self.persist.sync(self.sim.now)
            self.sim.step()
            self.persist.save()

    def running(self, name):
        job = self.scheduler.jobs.get(name)
        if job is None:
            return {}
        return {i: r.machine for i, r in job.tasks.items() if r.state is TaskState.RUNNING}


def test_a_stored_job_runs_and_comes_back_after_a_restart(tmp_path):
    path = str(tmp_path / "plait.db")
    a = Plane(path)
    a.scheduler.allocator.define(Entitlement(name="ent", owner="o", quota=Quota(machines=24)))
    doc, created = a.jobs.create(job_spec("web", 6), now=0)
    assert created and doc.seq == 1
    a.run(10)
    placed = a.running("web")
    assert len(placed) == 6
    serving = a.scheduler.discovery("web")
    assert len(serving) == 6
    a.store.close()

    b = Plane(path, now=a.sim.now)  # a restarted control plane
    assert b.running("web") == placed
    assert b.scheduler.discovery("web") == serving
    assert b.persist.applied["web"] == 1
    # the agents still run the same tasks: nothing is restarted
    b.sim.agents = a.sim.agents
    before = {ref: p.started_at for ag in a.sim.agents.values() for ref, p in ag.processes.items()}
    b.run(5)
    after = {ref: p.started_at for ag in b.sim.agents.values() for ref, p in ag.processes.items()}
    assert after == before
    # and it goes on following the stored operations
    b.jobs.update(job_spec("web", 6, command="serve-v2"), now=b.sim.now)
    b.run(60)
    job = b.scheduler.job("web")
    assert job.target == 2 and all(r.spec_version == 2 for r in job.tasks.values())
    assert len(b.running("web")) == 6
    b.store.close()


def test_operations_stored_while_the_scheduler_was_down_are_applied(tmp_path):
    path = str(tmp_path / "plait.db")
    a = Plane(path)
    a.scheduler.allocator.define(Entitlement(name="ent", owner="o", quota=Quota(machines=24)))
    a.jobs.create(job_spec("web", 4), now=0)
    a.run(10)
    a.store.close()

    jobs = JobStore(SqliteStore(path))  # the front end goes on while the scheduler is down
    jobs.resize("web", 6, now=11)
    jobs.restart("web", 0, now=11)
    jobs.create(job_spec("api", 2), now=11)  # never seen by the scheduler before
    jobs.ns.store.close()

    b = Plane(path, now=12)
    assert b.scheduler.job("web").spec.task_count == 6
    assert b.scheduler.job("web").tasks[0].restart
    assert "api" in b.scheduler.jobs
    b.run(30)
    assert len(b.running("web")) == 6 and len(b.running("api")) == 2
    assert [e["op"] for e in b.jobs.get("web").log] == ["create", "resize", "restart"]


def test_a_deleted_job_leaves_no_record(tmp_path):
    p = Plane(str(tmp_path / "plait.db"))
    p.scheduler.allocator.define(Entitlement(name="ent", owner="o", quota=Quota(machines=24)))
    p.jobs.create(job_spec("web", 3), now=0)
    p.run(10)
    p.jobs.delete("web", now=p.sim.now)
    with pytest.raises(Conflict):  # no change while it is being deleted
        p.jobs.resize("web", 5, now=p.sim.now)
    p.run(20)
    assert "web" not in p.scheduler.jobs
    assert p.store.children("/scheduler/jobs") == []
    assert p.store.children("/scheduler/state") == []
    assert p.store.children("/allocator/jobs") == []
    with pytest.raises(NotFound):
        p.jobs.get("web")


def test_creates_are_idempotent_and_a_different_spec_conflicts(tmp_path):
    jobs = JobStore(SqliteStore(str(tmp_path / "plait.db")))
    first, created = jobs.create(job_spec("web", 3), now=0)
    again, created_again = jobs.create(job_spec("web", 3), now=5)
    assert created and not created_again and again.seq == first.seq
    with pytest.raises(Conflict, match="another spec"):
        jobs.create(job_spec("web", 4), now=5)
    with pytest.raises(ValidationError, match="entitlement"):
        jobs.update(job_spec("web", 3, entitlement="other"), now=6)
    with pytest.raises(ValidationError, match=r"versions 1\.\.1"):
        jobs.rollback("web", 2, now=6)
    with pytest.raises(ValidationError, match=r"tasks 0\.\.2"):
        jobs.restart("web", 3, now=6)
    # an update to the same spec changes nothing
    assert jobs.update(job_spec("web", 3), now=7).seq == 1


def test_the_log_is_bounded_and_records_carry_a_schema(tmp_path):
    jobs = JobStore(SqliteStore(str(tmp_path / "plait.db")))
    jobs.create(job_spec("web", 1), now=0)
    for i in range(LOG_LIMIT + 10):
        jobs.restart("web", None, now=i)
    doc = jobs.get("web")
    assert len(doc.log) == LOG_LIMIT and doc.seq == LOG_LIMIT + 11
    raw = json.loads(jobs.ns.get("/jobs/web")[0])
    assert raw["schema"] == 2
    raw["schema"] = 99
    _, version = jobs.ns.get("/jobs/web")
    jobs.ns.set("/jobs/web", json.dumps(raw).encode(), version)
    with pytest.raises(ValidationError, match="newer"):
        jobs.get("web")


def test_a_version_whose_log_entry_was_trimmed_is_still_rolled_out(tmp_path):
    p = Plane(str(tmp_path / "plait.db"))
    p.scheduler.allocator.define(Entitlement(name="ent", owner="o", quota=Quota(machines=24)))
    p.jobs.create(job_spec("web", 2), now=0)
    p.run(10)
    p.jobs.update(job_spec("web", 2, command="v2"), now=p.sim.now)
    for _i in range(LOG_LIMIT + 5):  # the update's entry falls out of the log
        p.jobs.restart("web", None, now=p.sim.now)
    assert all(e["op"] == "restart" for e in p.jobs.get("web").log)
    p.run(120)
    job = p.scheduler.job("web")
    assert job.target == 2 and {r.spec_version for r in job.tasks.values()} == {2}


def test_an_update_that_names_a_task_controller_uses_it_from_then_on(tmp_path):
    made = []

    def controller_for(spec):
        if spec.task_controller is None:
            return None
        made.append(spec.task_controller)
        return object()  # never called here: the test only looks at the wiring

    p = Plane(str(tmp_path / "plait.db"))
    p.persist.controller_for = controller_for
    p.scheduler.allocator.define(Entitlement(name="ent", owner="o", quota=Quota(machines=24)))
    p.jobs.create(job_spec("web", 2), now=0)
    p.persist.sync(0)
    assert p.scheduler.job("web").controller is None
    p.jobs.update(job_spec("web", 2, task_controller="http://127.0.0.1:9/tc"), now=1)
    p.persist.sync(1)
    assert made == ["http://127.0.0.1:9/tc"] and p.scheduler.job("web").controller is not None


def test_finished_batch_tasks_stay_finished_after_a_restart(tmp_path):
    path = str(tmp_path / "plait.db")
    a = Plane(path)
    a.scheduler.allocator.define(Entitlement(name="ent", owner="o", quota=Quota(machines=24)))
    a.jobs.create(job_spec("ok", 2, command="finish", restart={"policy": "on-failure"}), now=0)
    a.jobs.create(job_spec("bad", 1, command="fail", restart={"policy": "never"}), now=0)
    a.run(30)
    finished = {n: {i: (r.state, r.exit_code) for i, r in a.scheduler.jobs[n].tasks.items()}
                for n in ("ok", "bad")}
    assert finished == {"ok": {0: (TaskState.SUCCEEDED, 0), 1: (TaskState.SUCCEEDED, 0)},
                        "bad": {0: (TaskState.DEAD, 1)}}
    a.store.close()

    b = Plane(path, now=a.sim.now)
    assert {n: {i: (r.state, r.exit_code) for i, r in b.scheduler.jobs[n].tasks.items()}
            for n in ("ok", "bad")} == finished
    b.run(30)  # and nothing runs them again
    assert {n: {i: (r.state, r.exit_code) for i, r in b.scheduler.jobs[n].tasks.items()}
            for n in ("ok", "bad")} == finished
    assert not any(b.scheduler.desired.values())


def test_a_move_between_entitlements_resumes_after_a_restart_midway(tmp_path):
    from plait.testing import Cluster, check_invariants

    path = str(tmp_path / "plait.db")
    a = Plane(path)
    for name in ("a", "b"):
        a.scheduler.allocator.define(Entitlement(name=name, owner="o", quota=Quota(machines=24)))
    spec = job_spec("web", 6, entitlement="a",
                    policy={"requirements": {"max_tasks_per_machine": 1}})
    a.jobs.create(spec, now=0)
    a.run(10)
    assert len(a.running("web")) == 6
    a.scheduler.check_move(a.jobs.get("web").spec, "b")
    doc = a.jobs.move("web", "b", now=a.sim.now)
    assert doc.entitlement == "b" and doc.spec.entitlement == "b" and doc.version == 2
    assert doc.log[-1]["op"] == "move" and (doc.log[-1]["source"], doc.log[-1]["target"]) == (
        "a", "b")
    job = a.scheduler.job("web")
    # part of the way, then the control plane dies
    while job.entitlement != "b" or a.scheduler.on_entitlement(job) < 2:
        a.run(1)
        assert a.sim.now < 300
    assert job.moving_from == "a"
    on_b = {i: r.machine for i, r in job.tasks.items() if r.spec_version == 2
            and r.state is TaskState.RUNNING}
    assert 2 <= len(on_b) < 6
    a.store.close()

    b = Plane(path, now=a.sim.now)
    b.sim.agents = a.sim.agents  # the agents and their tasks live on
    job = b.scheduler.job("web")
    assert job.entitlement == "b" and job.moving_from == "a" and job.target == 2
    assert {i: job.tasks[i].machine for i in on_b} == on_b  # moved tasks stay where they are
    check_invariants(Cluster(FLEET, b.scheduler.region, b.scheduler.allocator.index,
                             b.scheduler.allocator))
    before = {ref: p.started_at for ag in b.sim.agents.values()
              for ref, p in ag.processes.items() if ref.index in on_b}
    b.run(120)
    assert job.moving_from is None and b.scheduler.on_entitlement(job) == 6
    assert len(b.running("web")) == 6
    assert set(b.scheduler.allocator.machines_of("b")) == {
        FLEET.name(m) for m in b.running("web").values()}
    assert b.scheduler.allocator.machines_of("a") == []
    after = {ref: p.started_at for ag in b.sim.agents.values()
             for ref, p in ag.processes.items() if ref.index in on_b}
    assert after == before  # what had moved was not moved again
    b.store.close()

    c = Plane(path, now=b.sim.now)  # and the finished move stays finished
    assert c.scheduler.job("web").moving_from is None
    assert c.scheduler.job("web").entitlement == "b"
    c.store.close()


def test_a_move_stored_while_the_scheduler_was_down_is_applied(tmp_path):
    path = str(tmp_path / "plait.db")
    a = Plane(path)
    for name in ("a", "b"):
        a.scheduler.allocator.define(Entitlement(name=name, owner="o", quota=Quota(machines=24)))
    a.jobs.create(job_spec("web", 3, entitlement="a"), now=0)
    a.run(10)
    a.store.close()

    jobs = JobStore(SqliteStore(path))
    jobs.move("web", "b", now=11)
    with pytest.raises(ValidationError, match="already runs in entitlement 'b'"):
        jobs.move("web", "b", now=11)
    with pytest.raises(ValidationError, match="update cannot move it"):
        jobs.update(job_spec("web", 3, entitlement="a"), now=11)
    jobs.rollback("web", 1, now=11)  # a rollback stays on the job's entitlement
    assert jobs.get("web").spec == job_spec("web", 3, entitlement="b")
    jobs.ns.store.close()

    b = Plane(path, now=12)
    job = b.scheduler.job("web")
    assert job.target == 3 and job.entitlement == "b" and job.moving_from == "a"
    b.run(120)
    assert job.moving_from is None and len(b.running("web")) == 3
    assert b.scheduler.allocator.machines_of("a") == []


def test_a_job_keeps_its_last_versions_and_those_its_tasks_run(tmp_path):
    """`keep_versions` (10 by default) bounds the record; versions tasks still run are
    kept past it; a rollback to a version no longer kept is refused with the versions
    kept; and trimming never changes what a running task is (its revision): neither
    the live scheduler nor a restarted one restarts a task for it."""
    path = str(tmp_path / "plait.db")
    a = Plane(path)
    a.scheduler.allocator.define(Entitlement(name="ent", owner="o", quota=Quota(machines=24)))
    a.jobs.create(job_spec("web", 4), now=0)
    a.run(10)
    started = {ref: p.started_at for ag in a.sim.agents.values()
               for ref, p in ag.processes.items()}
    assert len(started) == 4
    for k in range(15):  # sizes only: the tasks run as they did
        a.jobs.resize("web", 4 + (k + 1) % 2, now=a.sim.now)
        a.run(2)
    a.jobs.resize("web", 4, now=a.sim.now)
    a.run(5)
    doc = a.jobs.get("web")
    assert doc.version == 17
    running = {r.spec_version for r in a.scheduler.job("web").tasks.values()}
    assert set(doc.kept) == set(range(8, 18)) | running
    assert len(doc.kept) <= 10 + len(running)
    with pytest.raises(ValidationError, match=r"version 3 of job web is no longer kept"):
        a.jobs.rollback("web", 3, now=a.sim.now)
    # a version past the last names the ones kept too (not 1.., which are gone)
    with pytest.raises(ValidationError, match=r"job web has versions 1\.\.17, of which it "
                                              r"keeps \d"):
        a.jobs.rollback("web", 99, now=a.sim.now)
    a.store.close()

    b = Plane(path, now=a.sim.now)  # restarted over the trimmed record
    b.sim.agents = a.sim.agents
    b.run(10)
    now = {ref: p.started_at for ag in b.sim.agents.values() for ref, p in ag.processes.items()}
    assert {ref: now[ref] for ref in started} == started  # nothing restarted
    # a new runtime rolls out and is kept; the old one goes once no task runs it
    b.jobs.update(job_spec("web", 4, command="serve-v2"), now=b.sim.now)
    b.run(60)
    job = b.scheduler.job("web")
    assert job.target == 18 and all(r.spec_version == 18 for r in job.tasks.values())
    b.jobs.resize("web", 5, now=b.sim.now)
    doc = b.jobs.get("web")
    assert set(doc.kept) == set(range(10, 20))
    assert b.jobs.rollback("web", 10, now=b.sim.now).version == 20
    b.jobs.update(job_spec("web", 4, command="serve-v2"), now=b.sim.now)
    b.run(60)
    started = {ref: p.started_at for ag in b.sim.agents.values()
               for ref, p in ag.processes.items()}
    for k in range(12):  # serve-v2's first version (21) falls out of the record
        b.jobs.resize("web", 4 + (k + 1) % 2, now=b.sim.now)
        b.run(2)
    assert 21 not in b.jobs.get("web").kept
    b.store.close()
    c = Plane(path, now=b.sim.now)
    c.sim.agents = b.sim.agents
    c.run(10)
    now = {ref: p.started_at for ag in c.sim.agents.values() for ref, p in ag.processes.items()}
    assert {ref: now[ref] for ref in started if ref.index < 4} == {
        ref: t for ref, t in started.items() if ref.index < 4}
    c.store.close()


def test_a_job_record_of_schema_1_is_read_with_its_revisions(tmp_path):
    """Records written before versions were trimmed (every version in a list) read as
    before: numbers, specs, and the revision of each version (the first one that runs
    the same way)."""
    jobs = JobStore(SqliteStore(str(tmp_path / "plait.db")))
    specs = [job_spec("web", 2), job_spec("web", 3), job_spec("web", 3, command="v2"),
             job_spec("web", 4, command="v2")]
    raw = {"schema": 1, "name": "web", "entitlement": "ent", "seq": 4, "log": [],
           "versions": [s.model_dump(mode="json") for s in specs]}
    jobs.ns.create("/jobs/web", json.dumps(raw).encode())
    doc = jobs.get("web")
    assert doc.version == 4 and doc.spec == specs[-1] and doc.spec_of(2) == specs[1]
    assert [doc.revision(v) for v in (1, 2, 3, 4)] == [1, 1, 3, 3]
    doc = jobs.update(job_spec("web", 4, command="v3"), now=1)
    assert json.loads(jobs.ns.get("/jobs/web")[0])["schema"] == 2
    assert doc.version == 5 and jobs.get("web").spec_of(1) == specs[0]


def test_an_update_never_trims_the_version_a_pass_just_took_as_target(tmp_path):
    """The stored state lags the scheduler by up to a pass: a pass has taken version 2
    as the job's target (its tasks move to it) but not stored its state yet. An update
    made then, trimming to one kept version, keeps version 2 as well."""
    p = Plane(str(tmp_path / "plait.db"))
    p.scheduler.allocator.define(Entitlement(name="ent", owner="o", quota=Quota(machines=24)))
    jobs = p.persist.jobs  # the control plane's own job store, beside its scheduler
    jobs.create(job_spec("web", 2, keep_versions=1), now=0)
    p.run(10)
    jobs.update(job_spec("web", 2, command="v2", keep_versions=1), now=p.sim.now)
    p.persist.sync(p.sim.now)  # the pass takes version 2 ...
    assert p.scheduler.job("web").target == 2
    stored = json.loads(p.store.get("/scheduler/state/web")[0])
    assert stored["target"] == 1  # ... and has not stored its state yet
    doc = jobs.update(job_spec("web", 2, command="v3", keep_versions=1), now=p.sim.now)
    assert {2, 3} <= set(doc.kept)
    assert 2 in jobs.get("web").kept


def _plane(path, fleet, now, config):
    """A control plane's persistent core over SQLite at ``path``, read back from it,
    with a simulation of its agents: (store, scheduler, persist, simulation)."""
    store = SqliteStore(path)
    region = PersistentRegion.load(fleet, store, now)
    allocator = PersistentAllocator.load(MachineIndex(fleet, region), store)
    allocator.defer()  # placements written with the pass's state, as a control plane does
    scheduler = Scheduler(allocator, config, now=now)
    persist = PersistentScheduler.load(scheduler, store, now)
    return store, scheduler, persist, Simulation(fleet, scheduler=scheduler, now=now)


def test_a_job_too_large_for_one_record_is_stored_in_parts(tmp_path):
    """A job of 9,000 tasks: its state passes the store's limit per record, so its
    tasks are kept in parts; it comes back whole after a restart, and the parts go
    when it shrinks, and with it."""
    from plait.persist.scheduler import PART_BYTES

    big = generate(RegionSpec(dcs=2, msbs_per_dc=2, rows_per_msb=1, racks_per_row=5,
                              machines_per_rack=30))
    path = str(tmp_path / "plait.db")

    def plane(now=0.0):
        # (a rate limit that lets the 9,000 stops of the shrink go in a few passes)
        return _plane(path, big, now, SchedulerConfig(rate=1e6, burst=1e6))

    store, sched, persist, sim = plane()
    sched.allocator.define(Entitlement(name="ent", owner="o", quota=Quota(machines=600)))
    jobs = JobStore(store)
    jobs.create(job_spec("huge", 9_000, cpu=0.5, memory_gb=0.1), now=0)
    for _ in range(20):
        persist.sync(sim.now)
        sim.step()
        persist.save(allocator=sched.allocator)
    parts = persist.part_keys("huge")
    assert len(parts) >= 2
    assert all(len(store.get(f"/scheduler{k}")[0]) <= PART_BYTES for k in parts)
    running = {i: r.machine for i, r in sched.job("huge").tasks.items()}
    assert len(persist.state("huge")["tasks"]) == 9_000
    store.close()

    store, sched, persist, sim = plane(now=sim.now)  # a restart
    assert {i: r.machine for i, r in sched.job("huge").tasks.items()} == running
    JobStore(store).resize("huge", 10, now=sim.now)
    for _ in range(600):
        persist.sync(sim.now)
        sim.step()
        persist.save(allocator=sched.allocator)
        if len(sched.job("huge").tasks) == 10:
            break
    assert persist.part_keys("huge") == []
    assert [k for k in store.children("/scheduler/state")] == ["huge"]
    JobStore(store).delete("huge", now=sim.now)
    for _ in range(30):
        persist.sync(sim.now)
        sim.step()
        persist.save(allocator=sched.allocator)
    assert store.children("/scheduler/state") == []
    store.close()


def test_a_pass_that_changes_one_task_of_a_big_job_rewrites_its_part_only(tmp_path):
    """A job of more than ``PART_TASKS`` tasks is kept in parts by index: a change to
    one task rewrites the part that holds it, not the job's 100,000 tasks (a delete of
    such a job changes it at every pass for an hour); a restart reads it back whole."""
    from plait.persist.scheduler import PART_TASKS

    big = generate(RegionSpec(dcs=1, msbs_per_dc=2, rows_per_msb=1, racks_per_row=2,
                              machines_per_rack=10))
    path = str(tmp_path / "plait.db")

    def plane(now=0.0):
        return _plane(path, big, now, SchedulerConfig())

    n = 2 * PART_TASKS + 100
    store, sched, persist, sim = plane()
    sched.allocator.define(Entitlement(name="ent", owner="o", quota=Quota(machines=40)))
    JobStore(store).create(job_spec("huge", n, cpu=0.01, memory_gb=0.001), now=0)
    for _ in range(20):
        persist.sync(sim.now)
        sim.step()
        persist.save(allocator=sched.allocator)
    job = sched.job("huge")
    assert len(job.tasks) == n and all(r.serving for r in job.tasks.values())
    keys = ["huge", *(k.removeprefix("/state/") for k in persist.part_keys("huge"))]
    assert len(keys) == 4  # a header and three parts, by index

    def versions() -> list[int]:
        return [store.get(f"/scheduler/state/{k}")[1] for k in keys]

    before = versions()
    job.tasks[PART_TASKS + 5].serving = False  # (a task of the second part changes)
    sched.mark("huge")
    assert persist.save() == 1
    after = versions()
    assert [b != a for b, a in zip(before, after, strict=True)] == [False, False, True, False]
    assert persist.state("huge")["tasks"][str(PART_TASKS + 5)][4] is False
    rows = persist.state("huge")["tasks"]
    store.close()

    store, sched, persist, sim = plane(now=sim.now)  # a restart: read back whole
    assert len(sched.job("huge").tasks) == n
    assert persist.state("huge")["tasks"] == rows
    store.close()


def test_a_versions_runtime_key_is_the_digest_stored_keys_were_made_with() -> None:
    """Keys are stored with versions: the key of a spec is the digest of its JSON form
    with the fields that do not change how it runs set to fixed values, as it was
    made by copying the spec with those values, whatever the spec holds."""
    import hashlib
    import json

    from plait.model import JobSpec
    from plait.persist.scheduler import runtime_key
    from plait.scheduler.records import NOT_RUNTIME

    def made_by_copy(spec: JobSpec) -> str:
        runs = spec.model_copy(update=NOT_RUNTIME).model_dump(mode="json")
        if runs["fence"] is None:
            del runs["fence"]  # (stored keys were made before the field existed)
        return hashlib.blake2b(json.dumps(runs, sort_keys=True).encode(),
                               digest_size=12).hexdigest()
    base = {"name": "web", "entitlement": "e", "command": "serve", "task_count": 1,
            "resources": {"cpu": 1, "memory_gb": 1}}
    specs = [JobSpec.model_validate({**base, **extra}) for extra in (
        {},
        {"task_count": 7, "keep_versions": 3, "kill_timeout_seconds": 2.5},
        {"task_controller": "http://127.0.0.1:9/tc",
         "update": {"max_unavailable": 3}},
        {"args": ["--port", "8080"], "env": {"A": "1"},
         "resources": {"cpu": 2, "memory_gb": 1.5}},
    )]
    keys = [runtime_key(s) for s in specs]
    assert keys == [made_by_copy(s) for s in specs]
    assert keys == [runtime_key(s, s.model_dump(mode="json")) for s in specs]
    # count, pacing, TaskController and kept versions change nothing of how it runs
    assert keys[0] == keys[1] == keys[2] != keys[3]
    # a fence does (its tasks restart with it: their agents must know it)
    assert runtime_key(JobSpec.model_validate({**base, "fence": {"seconds": 5}})) != keys[0]


def test_a_first_version_gets_its_runtime_key_when_a_second_is_added(tmp_path) -> None:
    """A create stores its one version without the runtime key (nothing to compare it
    with); the next version made gives it the key it would have had, so an update of
    count or pacing keeps the revision and one of the command makes a new one, through
    the store and a restart alike."""
    from plait.model import JobSpec
    from plait.persist.scheduler import runtime_key

    base = {"name": "web", "entitlement": "e", "command": "serve", "task_count": 1,
            "resources": {"cpu": 1, "memory_gb": 1}}
    first = JobSpec.model_validate(base)
    store = SqliteStore(str(tmp_path / "s.db"))
    jobs = JobStore(store)
    jobs.create(first, now=1.0)
    assert "runtime" not in jobs.get("web").kept[1]
    jobs.update(first.model_copy(update={"task_count": 3}), now=2.0)
    store.close()
    store = SqliteStore(str(tmp_path / "s.db"))  # (read back as stored)
    doc = JobStore(store).get("web")
    assert doc.kept[1]["runtime"] == doc.kept[2]["runtime"] == runtime_key(first)
    assert [doc.revision(v) for v in (1, 2)] == [1, 1]
    JobStore(store).update(first.model_copy(update={"command": "serve2"}), now=3.0)
    doc = JobStore(store).get("web")
    assert doc.revision(3) == 3 and doc.kept[3]["runtime"] != doc.kept[1]["runtime"]
    store.close()


def test_a_job_waiting_for_room_is_not_stored_again_while_nothing_changes(tmp_path):
    """A job whose tasks cannot all be placed is stored once it settles, and not again
    at every pass: a job of many pending tasks cost each pass its whole record."""
    path = str(tmp_path / "plait.db")
    a = Plane(path)
    a.scheduler.allocator.define(Entitlement(name="ent", owner="o", quota=Quota(machines=2)))
    a.jobs.create(job_spec("big", 5000, memory_gb=0.1), now=0)
    a.run(30)
    job = a.scheduler.job("big")
    assert job.unplaced_reason is not None and 0 < len(a.running("big")) < 5000
    stored = dict(a.persist.stored._saved)
    made: list[str] = []
    whole = a.persist.stored._whole
    a.persist.stored._whole = lambda job: (made.append(job.name), whole(job))[1]
    a.run(60)
    assert dict(a.persist.stored._saved) == stored
    assert made.count("big") <= 1, len(made)  # (its record not even made again)
    # a larger quota: its jobs waiting for room are tried at once, and take it
    a.scheduler.allocator.define(Entitlement(name="ent", owner="o", quota=Quota(machines=4)))
    a.scheduler.room_changed("ent")
    before = len(a.running("big"))
    a.run(3)
    assert len([r for r in job.tasks.values() if r.machine is not None]) > before


def test_a_save_reads_each_large_desired_set_once_whatever_the_jobs_it_writes(
        tmp_path, monkeypatch):
    """Jobs spread one task per machine over machines that each hold many other jobs'
    tasks: whether each task is in its machine's desired set is read from each large
    set once per save, for every job written (a search per task, or a read of each
    set per job, made 300 jobs of 40 tasks over 40 full machines cost a pass 1 s)."""
    from plait.scheduler import machinesets

    fleet = generate(RegionSpec(dcs=1, msbs_per_dc=2, rows_per_msb=1, racks_per_row=2,
                                machines_per_rack=6))  # 24 machines
    store, sched, persist, sim = _plane(str(tmp_path / "plait.db"), fleet, 0.0,
                                        SchedulerConfig())
    sched.allocator.define(Entitlement(name="ent", owner="o", quota=Quota(machines=24)))
    jobs = JobStore(store)
    for k in range(30):
        jobs.create(job_spec(f"j{k}", 20, cpu=0.01, memory_gb=0.001, policy={
            "requirements": {"max_tasks_per_machine": 1}}), now=0)
    for _ in range(20):
        persist.sync(sim.now)
        sim.step()
        persist.save(allocator=sched.allocator)
    assert all(len(sched.job(f"j{k}").tasks) == 20 for k in range(30))
    large = [m for m, d in sched.desired.items() if len(d) > 16]
    assert len(large) >= 12
    reads, searches = [], []
    real_by_job, real_find = machinesets.DesiredSet.by_job, machinesets.DesiredSet._find
    monkeypatch.setattr(machinesets.DesiredSet, "by_job",
                        lambda self: (reads.append(1), real_by_job(self))[1])
    monkeypatch.setattr(machinesets.DesiredSet, "_find",
                        lambda self, job, index: (searches.append(1),
                                                  real_find(self, job, index))[1])
    before = persist.state("j3")
    sched.changed_jobs = None  # (every job written again)
    persist.save()
    # each large set read once; a task on a short set searched for in it
    on_short = sum(1 for k in range(30) for r in sched.job(f"j{k}").tasks.values()
                   if r.machine is not None and len(sched.desired.get(r.machine, ())) <= 16)
    assert len(reads) == len(large), (len(reads), len(large))
    assert len(searches) == on_short, (len(searches), on_short)
    assert persist.state("j3") == before  # (the same record: every task still desired)
    store.close()
