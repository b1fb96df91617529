"""A follower's event log catches up with what the leader stored since (a takeover
reads only what is new), including the events the retention dropped meanwhile."""

import json

from plait.server.events import EventLog, NewEvent, Retention
from plait.store import SqliteStore


def _ev(t: float, message: str):
    return NewEvent(t, "test", "note", message)


def test_a_follower_catches_up_with_the_leaders_events(tmp_path):
    leader_store = SqliteStore(str(tmp_path / "plait.db"))
    follower_store = SqliteStore(str(tmp_path / "plait.db"))
    retention = Retention(max_count=5, max_age_seconds=1e9)
    leader = EventLog(leader_store, retention)
    leader.append([_ev(1.0, "a"), _ev(2.0, "b")])
    follower = EventLog(follower_store, retention)
    assert [e.message for e in follower.query(limit=100)[0]] == ["a", "b"]
    assert follower.refresh() == 0  # nothing new
    leader.append([_ev(3.0, f"n{k}") for k in range(4)])  # 6 stored: "a" dropped
    assert follower.refresh() == 4
    assert [e.message for e in follower.query(limit=100)[0]] == ["b", "n0", "n1", "n2", "n3"]
    # the follower takes over: its own events continue the sequence
    made = follower.append([_ev(4.0, "mine")])
    assert made[0].seq == 7 and follower.last_seq == 7
    assert [e.seq for e in EventLog(leader_store, retention).query(limit=100)[0]] == [
        3, 4, 5, 6, 7]
    leader_store.close()
    follower_store.close()


def test_a_batch_larger_than_the_retention_keeps_only_its_newest_events(tmp_path):
    store = SqliteStore(str(tmp_path / "plait.db"))
    log = EventLog(store, Retention(max_count=5, max_age_seconds=1e9))
    log.append([_ev(1.0, "old")])
    made = log.append([_ev(2.0, f"n{k}") for k in range(8)])
    assert [e.seq for e in made] == list(range(2, 10)) and log.last_seq == 9
    assert [e.message for e in log.query(limit=100)[0]] == ["n3", "n4", "n5", "n6", "n7"]
    assert len(store.children("/events/log")) == 5
    assert [e.seq for e in EventLog(store, Retention(max_count=5)).query(limit=100)[0]] == [
        5, 6, 7, 8, 9]
    store.close()


def test_who_what_why_is_kept_and_an_older_record_still_reads():
    store = SqliteStore(":memory:")
    log = EventLog(store, Retention(max_count=100, max_age_seconds=1e9))
    log.append([NewEvent(1.0, "scheduler", "op_started", "task 3: update", job="web",
                         entitlement="ads", machine="m7", actor="scheduler", task=3,
                         op="update", reason="version 2",
                         decision="acked by the job's TaskController", request="r1")])
    # a record written before events had who/what/why, and one with a field this
    # version does not know (written by a newer one)
    log.ns.create("/log/000000000002", json.dumps(
        {"seq": 2, "time": 2.0, "source": "api", "kind": "old", "message": "m",
         "job": None, "entitlement": None, "machine": None}).encode())
    log.ns.create("/log/000000000003", json.dumps(
        {"seq": 3, "time": 3.0, "source": "api", "kind": "newer", "message": "m",
         "colour": "red"}).encode())
    log.ns.set("/seq", b"3", 0)
    again = EventLog(store, Retention(max_count=100, max_age_seconds=1e9))
    first, old, newer = again.query(limit=10)[0]
    assert (first.actor, first.task, first.op, first.reason, first.decision,
            first.request, first.machine) == (
        "scheduler", 3, "update", "version 2", "acked by the job's TaskController", "r1", "m7")
    assert (old.kind, old.actor, old.task) == ("old", None, None)
    assert newer.kind == "newer"
    # the empty fields are not stored
    assert json.loads(log.ns.get("/log/000000000001")[0])["decision"].startswith("acked")
    (plain,) = again.append([NewEvent(4.0, "api", "note", "no task")])
    stored = json.loads(again.ns.get(f"/log/{plain.seq:012d}")[0])
    assert "task" not in stored and "decision" not in stored and stored["kind"] == "note"
    # filters on the new fields
    assert [e.seq for e in again.query(limit=10, task=3)[0]] == [1]
    assert [e.seq for e in again.query(limit=10, request="r1")[0]] == [1]
    assert [e.seq for e in again.query(limit=10, actor="scheduler")[0]] == [1]


def test_a_cursor_reads_only_the_events_after_it_page_by_page(tmp_path):
    """Polls with a cursor (``after``) see each event once, in order, with filters
    and pages; a cursor at or past the newest event reads nothing."""
    store = SqliteStore(str(tmp_path / "plait.db"))
    log = EventLog(store, Retention(max_count=50, max_age_seconds=1e9))
    log.append([NewEvent(float(k), "test", "even" if k % 2 == 0 else "odd", f"m{k}")
                for k in range(1, 31)])  # seq 1..30
    seen: list[int] = []
    cursor = 0
    while True:
        page, nxt = log.query(after=cursor, limit=4, kind="even")
        seen += [e.seq for e in page]
        if nxt is None:
            break
        cursor = nxt
    assert seen == list(range(2, 31, 2))
    assert [e.seq for e in log.query(after=27)[0]] == [28, 29, 30]
    assert log.query(after=30) == ([], None) and log.query(after=99) == ([], None)
    log.append([NewEvent(31.0, "test", "even", "new")])
    assert [e.message for e in log.query(after=30)[0]] == ["new"]
    store.close()
