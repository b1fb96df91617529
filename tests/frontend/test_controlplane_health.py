"""With real agents, a machine is available only while its agent heartbeats."""

import json

from livecp import REGION

from plait.model import Entitlement, JobSpec, Quota, parse
from plait.scheduler.records import Phase, TaskStatus
from plait.server.controlplane import ControlPlane, ControlPlaneConfig
from plait.server.serve import store_for

SPEC = parse(JobSpec, {"name": "web", "entitlement": "web", "task_count": 2,
                       "resources": {"cpu": 1, "memory_gb": 1}, "command": "serve"})


def test_silent_machines_fail_heartbeating_ones_take_the_tasks_and_come_back(tmp_path):
    now = [1000.0]
    cp = ControlPlane(store_for(tmp_path), ControlPlaneConfig(
        region=REGION, heartbeat_timeout=5, startup_grace=0), clock=lambda: now[0])
    alive = ["m0000001", "m0000007"]

    def beat():
        for m in alive:
            statuses = [TaskStatus(a.job, a.index, a.revision, Phase.RUNNING)
                        for a in cp.gateway.desired(m)]
            cp.gateway.report(m, statuses, {(s.job, s.index): f"127.0.0.1:{9000 + s.index}"
                                            for s in statuses})

    cp.commands.define_entitlement(Entitlement(name="web", owner="o", quota=Quota(machines=4)))
    for _ in range(8):  # past the timeout: only the two heartbeating machines are up
        now[0] += 1
        beat()
        cp.loop.step()
    states = {m["id"]: m["state"] for m in cp.views.machines(limit=1000)[0]}
    assert {m for m, s in states.items() if s == "healthy"} == set(alive)
    cp.commands.create_job(SPEC)
    for _ in range(4):
        now[0] += 1
        cp.loop.step()
        beat()
    assert {t["machine"] for t in cp.views.tasks_view("web")} <= set(alive)
    assert sorted(e["endpoint"] for e in cp.views.discovery("web")) == ["127.0.0.1:9000",
                                                                        "127.0.0.1:9001"]
    alive.append("m0000002")  # an agent starts: its machine is back
    now[0] += 1
    beat()
    cp.loop.step()
    assert cp.views.machine("m0000002")["state"] == "healthy"
    kinds = [e.kind for e in cp.events.query(limit=1000)[0]]
    assert "machine_unreachable" in kinds and "machine_back" in kinds
    cp.store.close()


def test_after_a_start_agents_have_a_grace_for_their_first_heartbeat(tmp_path):
    now = [1000.0]
    cp = ControlPlane(store_for(tmp_path), ControlPlaneConfig(
        region=REGION, heartbeat_timeout=5, startup_grace=20), clock=lambda: now[0])
    for _ in range(15):  # past the timeout, within the grace: nothing failed
        now[0] += 1
        cp.gateway.report("m0000001", [])
        cp.loop.step()
    assert {m["state"] for m in cp.views.machines(limit=1000)[0]} == {"healthy"}
    for _ in range(6):  # the grace is over
        now[0] += 1
        cp.gateway.report("m0000001", [])
        cp.loop.step()
    states = {m["id"]: m["state"] for m in cp.views.machines(limit=1000)[0]}
    assert {m for m, s in states.items() if s == "healthy"} == {"m0000001"}
    cp.store.close()


def test_a_loop_starting_makes_no_full_collection(tmp_path):
    # a full collection holds the interpreter for all of its length; made as a replica
    # became leader, it kept the lease from being renewed (stretched to 2.5 s on a busy
    # box, the new leader lost its lease at once)
    import gc

    cp = ControlPlane(store_for(tmp_path), ControlPlaneConfig(region=REGION))
    generations: list[int] = []

    def seen(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            generations.append(info["generation"])

    thresholds = gc.get_threshold()
    gc.callbacks.append(seen)
    try:
        cp.loop.prepare()
    finally:
        gc.callbacks.remove(seen)
        gc.unfreeze()
        gc.set_threshold(*thresholds)
        cp.store.close()
    assert generations and 2 not in generations  # (the young ones: collected)


def test_a_full_collection_longer_than_its_bound_is_skipped(tmp_path):
    # a full collection holds the interpreter (0.52 s for 20,000 jobs of 2 tasks):
    # longer than gc_full_max_pause, the leader's lease would go unrenewed
    import gc
    import threading

    cp = ControlPlane(store_for(tmp_path), ControlPlaneConfig(region=REGION))
    loop = cp.loop
    frozen_at_full: list[int] = []
    me = threading.get_ident()

    def seen(phase: str, info: dict[str, int]) -> None:
        # (this thread's collections only: a thread another test left running may
        # collect, and freeze, meanwhile)
        if phase == "start" and info["generation"] == 2 and threading.get_ident() == me:
            frozen_at_full.append(gc.get_freeze_count())

    thresholds = gc.get_threshold()
    gc.callbacks.append(seen)
    try:
        loop.prepare()
        assert gc.get_freeze_count() > 0

        def collect() -> None:
            # (a second past the interval: _last_full + interval - _last_full can round
            # to just under the interval, and the full collection was not due; and
            # gc.collect() does nothing while another thread collects: then again)
            seen_before = len(frozen_at_full)
            for _ in range(20):
                loop.collect(loop._last_full + cp.config.gc_full_seconds + 1)
                if len(frozen_at_full) > seen_before:
                    return

        loop.full_seconds_per_object = 1.0  # (an estimate past any bound)
        collect()
        assert loop.full_skipped >= 1 and frozen_at_full and frozen_at_full[-1] > 0
        skipped = loop.full_skipped
        loop.full_seconds_per_object = 0.0  # (an estimate within it)
        collect()
        assert loop.full_skipped == skipped and frozen_at_full[-1] == 0  # (all of the heap)
        assert loop.full_seconds_per_object > 0  # (timed, for the next one)
    finally:
        gc.callbacks.remove(seen)
        gc.unfreeze()
        gc.set_threshold(*thresholds)
        cp.store.close()


def test_most_machines_silent_at_once_fail_none_and_the_region_says_so(tmp_path):
    """A front end down (every agent's only route) silences every machine at once: no
    machine fails and no task is replaced; one machine silent alone still fails."""
    now = [1000.0]
    cp = ControlPlane(store_for(tmp_path), ControlPlaneConfig(
        region=REGION, heartbeat_timeout=5, startup_grace=0), clock=lambda: now[0])
    machines = [m["id"] for m in cp.views.machines(limit=1000)[0]]
    alive = set(machines)

    def tick(n=1):
        for _ in range(n):
            now[0] += 1
            for m in sorted(alive):
                statuses = [TaskStatus(a.job, a.index, a.revision, Phase.RUNNING)
                            for a in cp.gateway.desired(m)]
                cp.gateway.report(m, statuses)
            cp.loop.step()

    cp.commands.define_entitlement(Entitlement(name="web", owner="o", quota=Quota(machines=4)))
    cp.commands.create_job(SPEC)
    tick(3)
    placed = {t["index"]: t["machine"] for t in cp.views.tasks_view("web")}
    assert len(placed) == 2 and all(placed.values())
    alive.clear()  # every agent's heartbeats stop together
    tick(12)
    assert {m["state"] for m in cp.views.machines(limit=1000)[0]} == {"healthy"}
    assert {t["index"]: t["machine"] for t in cp.views.tasks_view("web")} == placed
    kinds = [e.kind for e in cp.events.query(limit=1000)[0]]
    assert kinds.count("heartbeats_lost") == 1 and "machine_unreachable" not in kinds
    assert "task_lost" not in kinds
    alive.update(machines)  # the path is back
    tick(2)
    kinds = [e.kind for e in cp.events.query(limit=1000)[0]]
    assert kinds.count("heartbeats_resumed") == 1 and "machine_back" not in kinds
    alive.discard(placed[0])  # one machine dies: failed, its task placed elsewhere
    tick(8)
    assert cp.views.machine(placed[0])["state"] == "failed"
    assert placed[0] not in {t["machine"] for t in cp.views.tasks_view("web")}
    cp.store.close()


def test_a_failure_another_process_stored_first_is_taken_as_it_is(tmp_path):
    """Two shards can both find a machine silent as it moves between them: the second
    takes the stored failure instead of failing its pass."""
    now = [1000.0]
    store = store_for(tmp_path)
    cp = ControlPlane(store, ControlPlaneConfig(
        region=REGION, heartbeat_timeout=5, startup_grace=0), clock=lambda: now[0])
    machines = [m["id"] for m in cp.views.machines(limit=1000)[0]]
    dead = machines[0]
    store.create(f"/broker/events/health-{dead}", json.dumps({
        "schema": 1, "kind": "failure", "machines": [dead], "start": now[0], "end": None,
        "reason": "no heartbeat for 5s"}).encode())
    for _ in range(8):
        now[0] += 1
        for m in machines[1:]:
            cp.gateway.report(m, [])
        cp.loop.step()
    assert cp.failures == 0
    assert cp.views.machine(dead)["state"] == "failed"
    assert [e.machine for e in cp.events.query(limit=1000)[0]
            if e.kind == "machine_unreachable"] == [dead]
    cp.store.close()
