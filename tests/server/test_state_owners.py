"""The control plane's state owners, each on its own: the region's core objects
(``RegionState``), what arrives between passes (``Inbox``), what the last pass
published (``Published``) and the events not stored yet (``EventRecorder``). No
HTTP, no threads: each is built from an in-memory store and hand-made collaborators."""

from __future__ import annotations

import pytest

from plait import requestid
from plait.errors import NotFound, ValidationError
from plait.model import Entitlement, JobSpec, Quota, RegionSpec, parse
from plait.scheduler.records import TaskStatus
from plait.server.controlplane.config import ControlPlaneConfig
from plait.server.controlplane.inbox import Inbox
from plait.server.controlplane.published import Published
from plait.server.controlplane.recorder import EventRecorder
from plait.server.controlplane.regionstate import RegionState
from plait.server.events import NewEvent
from plait.store.sqlite import SqliteStore
from plait.taskcontrol.protocol import ControllerAnswer

REGION = RegionSpec.sized(8, dcs=2, msbs_per_dc=1, rows_per_msb=1, racks_per_row=2)


def job(name: str, entitlement: str = "web", **more: object) -> JobSpec:
    return parse(JobSpec, {"name": name, "entitlement": entitlement, "task_count": 2,
                           "resources": {"cpu": 1, "memory_gb": 1}, "command": "serve",
                           **more})


def region_state(store: SqliteStore | None = None, *, now: float = 1000.0,
                 region: RegionSpec = REGION) -> RegionState:
    state = RegionState(store or SqliteStore(":memory:"), ControlPlaneConfig(region=region),
                        lambda: now)
    state.build(now)
    return state


# -- RegionState ---------------------------------------------------------------------------
def test_the_region_is_built_from_its_spec_and_answers_lookups_of_its_machines():
    state = region_state()
    assert len(state.fleet) == 8
    first = state.fleet.name(0)
    assert state.known(first) and state.machine_index(first) == 0
    assert not state.known("nowhere")
    with pytest.raises(NotFound):
        state.machine_index("nowhere")
    assert state.sim is None  # (real agents: none simulated)


def test_the_region_spec_stored_first_wins_over_a_later_replicas_config():
    store = SqliteStore(":memory:")
    region_state(store)
    bigger = RegionSpec.sized(16, dcs=2, msbs_per_dc=1, rows_per_msb=1, racks_per_row=2)
    again = region_state(store, region=bigger)
    assert again.region_spec == REGION and len(again.fleet) == 8


def test_a_job_is_checked_against_the_entitlements_and_data_centers_the_region_has():
    state = region_state()
    with pytest.raises(ValidationError) as missing:
        state.check_job(job("api"))
    assert missing.value.field == "entitlement"
    state.allocator.define(Entitlement(name="web", owner="alice", quota=Quota(machines=2)))
    state.check_job(job("api"))  # (now it exists)
    dc = state.fleet.level_names["dc"][0]
    state.check_job(job("api", policy={"requirements": {"dc": dc}}))
    with pytest.raises(ValidationError) as unknown:
        state.check_job(job("api", policy={"requirements": {"dc": "atlantis"}}))
    assert unknown.value.field == "policy.requirements.dc" and "atlantis" in str(unknown.value)
    assert state.entitlement("web").owner == "alice"
    with pytest.raises(NotFound):
        state.entitlement("db")


def test_a_jobs_owner_is_its_entitlements_and_unknown_jobs_have_none():
    state = region_state()
    state.allocator.define(Entitlement(name="web", owner="alice", quota=Quota(machines=2)))
    state.jobs.create(job("api"), 1000.0)
    assert state.entitlement_of("api") == "web" == state.held_entitlement_of("api")
    assert state.owner_of_job("api") == "alice"
    assert state.owner_of_job("ghost") == "" and state.entitlement_of("ghost") is None


def test_a_rebuild_reads_the_store_again_and_keeps_the_fence():
    store = SqliteStore(":memory:")
    state = region_state(store)
    state.allocator.define(Entitlement(name="web", owner="alice", quota=Quota(machines=2)))
    state.persist.save(state.allocator)
    state.persist.fence = ("/leader", 7)
    old_scheduler = state.scheduler
    state.build(2000.0)
    assert state.scheduler is not old_scheduler
    assert "web" in state.allocator.entitlements  # (read back from the store)
    assert state.persist.fence == ("/leader", 7) and state.region.fence == ("/leader", 7)


def test_simulated_agents_live_on_through_a_rebuild():
    state = RegionState(SqliteStore(":memory:"), ControlPlaneConfig(
        region=REGION, sim_agents=True), lambda: 1000.0)
    state.build(1000.0)
    assert state.sim is not None
    agents = state.sim.agents
    state.build(1001.0)
    assert state.sim.agents is agents and state.sim.scheduler is state.scheduler


def test_liveness_starts_again_from_nothing_heard():
    state = region_state()
    state.liveness.watch(state.fleet.name(0), 1000.0)
    fresh = state.new_liveness()
    assert state.liveness is fresh and not fresh.last


# -- Inbox ---------------------------------------------------------------------------------
def test_jobs_put_in_the_inbox_wake_the_pass_and_are_taken_once():
    inbox = Inbox()
    touched: list[str] = []
    inbox.touch = touched.append
    inbox.notify("a")
    assert inbox.wake.is_set() and inbox.wake.at > float("-inf")
    inbox.wake.clear()
    inbox.notify_many(["b", "c"])
    inbox.notify_many([])
    assert inbox.wake.is_set() and touched == ["a", "b", "c"]
    assert inbox.take_jobs() == {"a", "b", "c"}
    assert inbox.take_jobs() == set()


def test_stored_creates_are_kept_for_the_pass_within_a_bound(monkeypatch):
    from plait.persist.scheduler import new_job
    from plait.server.controlplane import inbox as inbox_module

    inbox = Inbox()
    docs = [new_job(job(f"j{i}"), 1000.0)[0] for i in range(4)]
    inbox.stored(docs[:2])
    assert set(inbox.take_stored()) == {"j0", "j1"} and inbox.take_stored() == {}
    monkeypatch.setattr(inbox_module, "STORED_KEPT", 2)
    inbox.stored(docs[:3])
    inbox.stored(docs[3:])  # (no pass took them: a follower's are let go)
    assert set(inbox.take_stored()) == {"j3"}


def test_a_report_that_repeats_the_machines_last_wakes_no_pass_but_counts_as_a_beat():
    inbox = Inbox()
    statuses: list[TaskStatus] = []  # (an idle machine)
    inbox.report(("m1", statuses, {}, 10.0, None, {}))
    assert inbox.wake.is_set()
    inbox.wake.clear()
    inbox.report(("m1", statuses, {}, 11.0, None, {}))  # the same again
    assert not inbox.wake.is_set()
    assert inbox.beat_of("m1") == 11.0 and inbox.beats() == {"m1": 11.0}
    reports, beats = inbox.take_reports()
    assert [r[3] for r in reports] == [10.0, 11.0] and beats == {"m1": 11.0}
    assert inbox.take_reports() == ([], {}) and inbox.beat_of("m1") is None
    inbox.report(("m1", statuses, {("api", 0): "h:1"}, 12.0, None, {}))  # news
    assert inbox.wake.is_set()


def test_controller_answers_wake_the_pass_and_are_taken_once():
    inbox = Inbox()
    answer = ControllerAnswer(job="api", sequence_number=3, response=None, error="deadline")
    inbox.answer(answer)
    assert inbox.wake.is_set()
    assert inbox.take_answers() == [answer] and inbox.take_answers() == []


# -- Published -----------------------------------------------------------------------------
def test_generations_count_from_a_base_and_a_renumbering_starts_above_every_earlier():
    published = Published()
    assert published.generation_of("m1") == 0
    published.bump("m1")
    published.bump("m1")
    assert published.generation_of("m1") == 2 and published.generation_of("m2") == 0
    before = published.generation_of("m1")
    published.renumber()
    assert published.generation == {} and published.generation_of("m1") > before


def test_kept_sets_are_forgotten_at_a_rebuild():
    published = Published()
    published.keep("m1", (5, [], [], None))
    assert published.kept("m1") == (5, [], [], None)
    published.forget_sets()
    assert published.kept("m1") is None and published.desired_view == {}


# -- EventRecorder -------------------------------------------------------------------------
class Log:
    def __init__(self, fail_after: int | None = None) -> None:
        self.stored: list[NewEvent] = []
        self.fail_after = fail_after

    def append(self, events: list[NewEvent]) -> list[object]:
        if self.fail_after is not None and len(self.stored) >= self.fail_after:
            raise OSError("the store went away")
        self.stored.extend(events)
        return []


class Counted:
    def __init__(self) -> None:
        self.kinds: dict[str, int] = {}

    def event(self, kind: str, n: int = 1) -> None:
        self.kinds[kind] = self.kinds.get(kind, 0) + n


def recorder(log: Log, max_kept: int = 100) -> tuple[EventRecorder, Counted]:
    counted = Counted()
    return EventRecorder(log, lambda: 42.0, counted, max_kept,  # type: ignore[arg-type]
                         {"api": "web"}.get), counted


def test_an_event_is_kept_until_flushed_with_its_actor_and_request():
    log = Log()
    rec, counted = recorder(log)
    token = requestid.actor.set("owner:alice")
    try:
        rec.record("api", "job_created", "api: created with https://u:secret@x/", job="api")
    finally:
        requestid.actor.reset(token)
    rec.record("health", "heartbeats_lost", "m1: silent", machine="m1", at=7.0)
    assert log.stored == [] and len(rec.pending()) == 2
    rec.flush()
    first, second = log.stored
    assert (first.time, first.actor, first.job) == (42.0, "owner:alice", "api")
    assert "secret" not in first.message
    assert (second.time, second.actor) == (7.0, "health")  # (no caller: its source)
    assert rec.pending() == [] and counted.kinds == {"job_created": 1, "heartbeats_lost": 1}


def test_the_schedulers_events_carry_their_jobs_entitlement():
    log = Log()
    rec, counted = recorder(log)
    rec.record_scheduler_events([
        (5.0, "api", "task_placed", "api/0 on m1", 0, "m1", "start", None, None, None, None),
        (6.0, "gone", "task_stopped", "gone/0", 0, None, "stop", None, None, "admin:x", "r1")])
    rec.flush()
    placed, stopped = log.stored
    assert (placed.entitlement, placed.actor, placed.source) == ("web", "scheduler", "scheduler")
    assert (stopped.entitlement, stopped.actor, stopped.request) == (None, "admin:x", "r1")
    assert counted.kinds == {"task_placed": 1, "task_stopped": 1}


def test_what_a_failed_flush_did_not_store_is_kept_for_the_next_within_its_bound():
    log = Log(fail_after=0)
    rec, _ = recorder(log, max_kept=3)
    for i in range(5):
        rec.record("api", "k", f"e{i}")
    with pytest.raises(OSError):
        rec.flush()
    assert [e.message for e in rec.pending()] == ["e2", "e3", "e4"]  # the newest
    log.fail_after = None
    rec.flush()
    assert [e.message for e in log.stored] == ["e2", "e3", "e4"]
    rec.record("api", "k", "late")
    assert rec.drop() == 1 and rec.pending() == []
