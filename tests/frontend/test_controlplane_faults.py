"""The control plane's loop outlives store outages and bad records, and retries what
it could not apply."""

from __future__ import annotations

import time

import httpx
from livecp import REGION, wait_for

from plait.errors import TransientError
from plait.model import Entitlement, JobSpec, Quota, parse
from plait.server.controlplane import ControlPlane, ControlPlaneConfig
from plait.server.serve import ApiServer, store_for

SPEC = parse(JobSpec, {"name": "web", "entitlement": "web", "task_count": 2,
                       "resources": {"cpu": 1, "memory_gb": 1}, "command": "serve"})


def plane(tmp_path, **config):
    cp = ControlPlane(store_for(tmp_path), ControlPlaneConfig(
        region=REGION, tick_seconds=0.05, sim_agents=True, sim_start_seconds=0.2, **config))
    cp.commands.define_entitlement(Entitlement(name="web", owner="alice", quota=Quota(machines=6)))
    return cp


def test_the_loop_survives_a_store_outage_and_health_says_so(tmp_path):
    cp = plane(tmp_path)
    store = cp.store
    real = store.commit
    down = {"on": False}

    def commit(txn, session=None):
        if down["on"]:
            raise TransientError("store unreachable")
        return real(txn, session)

    store.commit = commit
    token = cp.bootstrap_admin()
    with ApiServer(cp) as server:
        client = httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {token}"})
        wait_for(lambda: cp.steps > 2)
        down["on"] = True
        cp.record("test", "ping", "written during the outage")
        wait_for(lambda: cp.failures >= 5)
        last = cp.last_step
        assert client.get("/healthz").json()["failed_passes"] >= 5
        down["on"] = False
        cp.commands.create_job(SPEC)
        wait_for(lambda: cp.views.job_view("web")["settled"])
        assert cp.last_step != last
        assert client.get("/healthz").json()["ok"] is True
        # what happened while the store was down was recorded once it came back
        kinds = [e.kind for e in cp.events.query(limit=1000)[0]]
        assert "step_failed" in kinds and "ping" in kinds
    store.close()


def test_a_stalled_loop_makes_healthz_fail(tmp_path):
    cp = plane(tmp_path)
    token = cp.bootstrap_admin()
    with ApiServer(cp) as server:
        anon = httpx.Client(base_url=server.url)
        wait_for(lambda: anon.get("/healthz").json()["ok"])
        with cp.lock:  # the loop is stalled: no pass can end while this is held
            cp.last_step = -1e9  # as if no pass had ended for ages
            r = anon.get("/healthz")
        assert r.status_code == 503 and "no pass finished" in r.json()["status"]
        assert token
    cp.store.close()


def test_a_job_record_that_could_not_be_read_is_tried_again(tmp_path):
    cp = plane(tmp_path)
    cp.loop.step()
    real = cp.jobs.get
    fail = {"left": 1}

    def get(name):
        if name == "web" and fail["left"]:
            fail["left"] -= 1
            raise TransientError("read timed out")
        return real(name)

    cp.jobs.get = get
    cp.commands.create_job(SPEC)
    cp.loop.step()  # the read fails: web is not applied yet
    assert "web" not in cp.scheduler.jobs
    cp.loop.step()  # and is tried again without another request
    assert "web" in cp.scheduler.jobs
    cp.store.close()


def test_owners_see_the_last_events_of_a_deleted_job(live):
    live.admin.post("/v1/entitlements", json={"name": "web", "owner": "alice",
                                              "quota": {"machines": 6}})
    alice = live.owner("alice")
    alice.post("/v1/jobs", json=SPEC.model_dump(mode="json"))
    wait_for(lambda: alice.get("/v1/jobs/web").json()["settled"])
    alice.delete("/v1/jobs/web")
    wait_for(lambda: alice.get("/v1/jobs/web").status_code == 404)
    wait_for(lambda: "deleted" in [e["kind"] for e in alice.get(
        "/v1/events", params={"job": "web"}).json()["events"]])


def test_a_dry_run_does_not_show_another_owners_job(live):
    for name, owner in (("web", "alice"), ("db", "bob")):
        live.admin.post("/v1/entitlements", json={"name": name, "owner": owner,
                                                  "quota": {"machines": 6}})
    secret = {**SPEC.model_dump(mode="json"), "env": {"DB_PASSWORD": "hunter2"}}
    assert live.owner("alice").post("/v1/jobs", json=secret).status_code == 201
    bob = live.owner("bob")
    probe = {**SPEC.model_dump(mode="json"), "entitlement": "db"}
    # the name is taken, as the create itself would say, and nothing else is shown
    r = bob.post("/v1/jobs", params={"dry_run": "true"}, json=probe)
    assert r.status_code == 409 and "hunter2" not in r.text and "'web'" not in r.text
    r = bob.put("/v1/jobs/web", params={"dry_run": "true"}, json=probe)
    assert r.status_code == 409 and "hunter2" not in r.text and "'web'" not in r.text


def test_a_save_that_finds_the_store_ahead_of_memory_reads_the_store_again(tmp_path):
    """A takeover from a follower's copy that missed the old leader's last writes holds
    records older than the store's: its save is refused (nothing written), and the next
    pass reads everything from the store and goes on, instead of failing for ever."""

    import pytest

    from plait.errors import Conflict

    cp = plane(tmp_path)

    def passes_until(done, seconds=30.0):
        # (a liveness bound: simulated agents start late)
        return wait_for(lambda: (cp.loop.step(), done())[1], seconds, poll=0.02)

    cp.commands.create_job(SPEC)
    assert passes_until(lambda: cp.views.job_view("web")["settled"])
    value, version = cp.store.get("/scheduler/state/web")
    cp.store.set("/scheduler/state/web", value, version)  # written by another leader
    cp.commands.resize_job("web", 3)
    with pytest.raises(Conflict):
        cp.loop.step()  # the save meets the newer record: nothing of this pass is kept
    assert passes_until(lambda: len(cp.scheduler.job("web").tasks) == 3
                        and cp.views.job_view("web")["settled"])
    cp.store.close()


def test_an_entitlements_new_profile_makes_its_machines_pending_before_the_next_pass(
        tmp_path):
    """An entitlement given another host profile: its machines take no task that has
    not started from the moment the change is stored, not from the next pass (an
    agent that asks for its tasks in between would start them on the old profile)."""
    from plait.model.hostprofile import HostProfileSpec

    cp = plane(tmp_path)
    cp.loop.prepare()
    cp.commands.create_job(SPEC)
    wait_for(lambda: (cp.loop.step(), len(cp.views.discovery("web")) == 2)[1], 60)
    machines = {r.machine for r in cp.scheduler.jobs["web"].tasks.values()}
    cp.profiles.put(HostProfileSpec(name="big", hugepages_2m=512))
    cp.commands.define_entitlement(Entitlement(name="web", owner="alice", host_profile="big",
                                               quota=Quota(machines=6)))
    assert machines <= cp.scheduler.profiles.pending  # (no pass since)


def test_an_autoscale_policy_reads_its_job_once_an_interval_not_every_pass(tmp_path):
    """The autoscaler, after each pass, read and parsed the record of every job with a
    policy before it looked whether the policy's interval had passed: 2,000 policies
    cost every pass 74 ms. Now a job is looked at once an interval."""
    from plait.server.controlplane.autoscaling import JobAutoscale

    cp = plane(tmp_path)
    cp.loop.prepare()
    cp.commands.create_job(SPEC)
    cp.autoscaling.put("web", JobAutoscale.model_validate(
        {"policy": {"metric": "cpu"}, "interval_seconds": 60}))
    reads: list[str] = []
    real = cp.jobs.get

    def counted(name: str, *args: object, **kwargs: object) -> object:
        reads.append(name)
        return real(name, *args, **kwargs)

    cp.jobs.get = counted  # type: ignore[method-assign]
    now = cp.clock()
    for k in range(20):  # 20 passes' decisions within 10 s
        cp.autoscaling.decide(now + k * 0.5)
    assert reads.count("web") == 1, reads
    cp.autoscaling.decide(now + 61)  # the next interval
    assert reads.count("web") == 2, reads


def test_a_push_whose_spec_cannot_be_kept_ends_with_why_and_is_not_tried_again(tmp_path):
    """A push of a spec the job's record cannot hold beside the version it runs (two
    of 500 kB, over the store's 1 MB a record) was tried, and failed, every second for
    ever (200 such pushes cost every pass a second). Now it ends, aborted, saying why."""
    from plait.jcp.intents import PushIntent

    cp = plane(tmp_path)
    cp.loop.prepare()
    big = SPEC.model_copy(update={"args": ("x" * 500,) * 1000})
    cp.commands.create_job(big)
    # (a push is refused when set if it cannot be kept then: the next test; here the
    # record is as if it grew between the push and the reconcile)
    cp.jobs.check_keep = lambda *args: None  # type: ignore[method-assign]
    cp.jcp.put_push("web", PushIntent.model_validate({
        "spec": big.model_copy(update={"args": (*big.args, "v2")}).model_dump(mode="json"),
        "stages": [50, 100], "soak_seconds": 86_400}))
    kept: list[str] = []
    real = cp.jobs.keep

    def counted(spec: JobSpec, *args: object, **kwargs: object) -> object:
        kept.append(spec.name)
        return real(spec, *args, **kwargs)

    cp.jobs.keep = counted  # type: ignore[method-assign]
    now = cp.clock()
    for k in range(5):
        cp.jcp.reconcile(now + 2 * k)
    assert kept == ["web"]  # (tried once)
    push = cp.jcp.push_view("web")
    assert push["status"]["phase"] == "aborted"
    assert "could not be kept" in push["status"]["message"]
    assert "over the store's limit" in push["status"]["message"]
    assert cp.jobs.get("web").version == 1  # nothing half-written


def test_a_push_or_canary_whose_spec_cannot_be_kept_is_refused_when_set(tmp_path):
    """A push whose spec the job's record could not hold was accepted, then aborted
    within a second. Now it is refused when set (a 413 naming the limit), and nothing
    of it is stored."""
    import pytest

    from plait.errors import TooLarge
    from plait.jcp.intents import CanaryIntent, PushIntent

    cp = plane(tmp_path)
    big = SPEC.model_copy(update={"args": ("x" * 500,) * 1000})
    cp.commands.create_job(big)
    other = big.model_copy(update={"args": (*big.args, "v2")}).model_dump(mode="json")
    with pytest.raises(TooLarge, match="over the store's limit"):
        cp.jcp.put_push("web", PushIntent.model_validate({"spec": other, "stages": [50, 100]}))
    with pytest.raises(TooLarge, match="over the store's limit"):
        cp.jcp.put_canary("web", "c1", CanaryIntent.model_validate(
            {"spec": other, "tasks": 1, "duration_seconds": 60}))
    assert not cp.jcp.ns.exists("/web")  # no intent stored
    assert cp.jobs.get("web").version == 1  # nor a version
    assert not [e for e in cp.events.query(limit=1000)[0] if e.source == "jcp"]
    # a spec that fits is taken as before
    small = SPEC.model_copy(update={"name": "small"})
    cp.commands.create_job(small)
    cp.jcp.put_push("small", PushIntent.model_validate({
        "spec": small.model_copy(update={"args": ("v2",)}).model_dump(mode="json"),
        "stages": [50, 100]}))
    assert cp.jcp.push_view("small")["status"]["phase"] == "rolling"


def looks(cp: ControlPlane) -> list[str]:
    """The jobs the intents reconcile looks at from now on, in order."""
    seen: list[str] = []
    real = cp.jcp.reconciler._reconcile

    def counted(job: str, at: float) -> object:
        seen.append(job)
        return real(job, at)

    cp.jcp.reconciler._reconcile = counted  # type: ignore[method-assign]
    return seen


def test_the_intents_reconcile_looks_only_at_jobs_whose_intents_may_move_on(tmp_path):
    """The Job Control Plane's reconcile looked at every job with intents each second:
    2,000 pushes soaking for a day cost the loop 218 ms a second. Now a job is looked
    at when its intents, its record or its tasks changed, or when what its intents
    wait for (here, the soak's end) has come."""

    from plait.jcp.intents import PushIntent
    from plait.server.controlplane.jcp import QUIET_EVERY

    cp = plane(tmp_path)
    cp.loop.prepare()
    names = [f"w{k}" for k in range(8)]
    for name in names:
        cp.commands.create_job(SPEC.model_copy(update={"name": name, "task_count": 1}))
        cp.jcp.put_push(name, PushIntent.model_validate({
            "spec": SPEC.model_copy(update={"name": name, "task_count": 1,
                                            "args": ("v2",)}).model_dump(mode="json"),
            "stages": [100], "soak_seconds": 86_400}))

    def phases() -> set[str]:
        return {cp.jcp.push_view(n)["status"]["phase"] for n in names}

    wait_for(lambda: (cp.loop.step(), phases() == {"soaking"})[1], what="every push soaks")
    for _ in range(5):  # (the last changes of the tasks, looked at)
        cp.loop.step()
    seen = looks(cp)
    now = cp.clock()
    cp.jcp.reconcile(now + 1)  # (what the last passes changed, if anything: looked at)
    looked = len(seen)
    quiet = int(QUIET_EVERY) - 1
    for k in range(2, quiet):  # reconciles for nearly 30 s, nothing changing: no look
        cp.jcp.reconcile(now + k)
    assert len(seen) == looked
    cp.jcp.reconcile(now + quiet + 2)  # (each is looked at again after 30 s anyway)
    assert len(seen) == looked + len(names)
    looked = len(seen)
    # a job whose record changes is looked at, the others are not
    cp.commands.update_job(SPEC.model_copy(update={"name": "w0", "task_count": 1,
                                                  "env": {"A": "1"}}))
    cp.loop.step()
    cp.jcp.reconcile(now + quiet + 4)
    assert seen[looked:] == ["w0"]
    # the soak's end: each is looked at, and its push is done
    for k in range(3):
        cp.jcp.reconcile(now + 86_400 + 1 + 2 * k)
    assert phases() == {"completed"}
    assert set(seen[looked + 1:]) == set(names)


def test_a_record_made_again_elsewhere_under_the_same_version_is_read_again(tmp_path):
    """A record deleted and made again starts at version 0 again: the 5-second re-read
    compares what is stored, not versions, so another writer's new intents are seen
    (and their job looked at) whatever the version says."""
    import json

    from plait.jcp.intents import SizingIntent

    cp = plane(tmp_path)
    cp.commands.create_job(SPEC.model_copy(update={"task_count": 1}))
    cp.jcp.put_sizing("web", SizingIntent(task_count=1))
    uid = cp.jobs.get("web").uid

    def made_elsewhere(size: int) -> int:
        _, version = cp.jcp.ns.get("/web")
        cp.jcp.ns.delete("/web", version)
        rec = cp.jcp.record("web").model_copy(update={"sizing": None})
        value = {"schema": 1, "job_uid": uid, **rec.model_dump(mode="json"),
                 "sizing": {"intent": {"task_count": size}, "actor": "owner:other",
                            "time": 0.0}}
        return cp.jcp.ns.create("/web", json.dumps(value).encode())

    seen = looks(cp)
    now = cp.clock()
    assert made_elsewhere(1) == 0
    cp.jcp.reconcile(now + 6)
    assert cp.jcp.records["web"].sizing.intent.task_count == 1  # type: ignore[union-attr]
    looked = len(seen)
    assert made_elsewhere(2) == 0  # (the version it had)
    cp.jcp.reconcile(now + 12)
    assert cp.jcp.records["web"].sizing.intent.task_count == 2  # type: ignore[union-attr]
    assert seen[looked:] == ["web"]


def test_a_passs_scheduler_events_are_logged_as_record_would_log_each(tmp_path):
    cp = plane(tmp_path)
    cp.commands.create_job(parse(JobSpec, {
        "name": "api", "entitlement": "web", "task_count": 2,
        "resources": {"cpu": 1, "memory_gb": 0.1}, "command": "serve"}))
    events = cp.scheduler.events
    expected = []
    real = cp.recorder.record_scheduler_events

    def alongside(drained):  # what ``record`` made of each before
        for (at, job, kind, message, task, machine, op, reason, decision, actor,
             request) in drained:
            expected.append((job, kind, message, cp.scheduler.jobs[job].entitlement,
                             machine, at, actor or "scheduler", task, op, reason,
                             decision, request))
        real(drained)
    cp.recorder.record_scheduler_events = alongside  # type: ignore[method-assign]
    cp.loop.step()
    assert len(events) == 0 and expected
    logged, _ = cp.events.query(job="api", limit=100)
    assert [(e.job, e.kind, e.message, e.entitlement, e.machine, e.time, e.actor, e.task,
             e.op, e.reason, e.decision, e.request) for e in logged] == expected
    assert {e.source for e in logged} == {"scheduler"}
    placed = [e for e in logged if e.kind == "task_placed"]
    assert len(placed) == 2 and all(e.machine and e.entitlement == "web" for e in placed)


def test_a_burst_keeps_the_passes_apart_and_its_end_waits_for_no_more_of_it(
        tmp_path, monkeypatch):
    from plait.server.controlplane import loop as loop_module

    monkeypatch.setattr(loop_module, "QUIET", 0.3)  # (room for a loaded box's stalls)
    cp = ControlPlane(store_for(tmp_path), ControlPlaneConfig(
        region=REGION, tick_seconds=60.0, min_pass_gap=10.0, sim_agents=True))
    cp.loop.start()
    try:
        wait_for(lambda: cp.steps >= 1)
        time.sleep(0.2)  # (the subject is time: the pass gap and its quiet)
        steps = cp.steps
        started = time.monotonic()
        cp.notify_many(["nothing"])  # (a lone create: the gap's first half holds)
        # creates keep coming: no pass for the first half of the gap, nor while they
        # come after it
        while time.monotonic() - started < 7.0:
            cp.notify_many(["nothing"])
            time.sleep(0.02)  # (a burst: creates keep coming, this far apart)
            assert cp.steps == steps
        # they stop: the pass takes them QUIET later, not at the gap's end (10 s)
        wait_for(lambda: cp.steps > steps, timeout=20)
        assert time.monotonic() - started < 9.5
    finally:
        cp.loop.stop()
        cp.store.close()
