"""A follower's event log catches up with what the leader stored since (a takeover
reads only what is new), including the events the retention dropped meanwhile."""

import json

import pytest

from plait.errors import Conflict
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
    # what is stored is what is held: one page, the batch's newest five
    assert store.children("/events/log") == [f"{5:012d}"]
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
    assert json.loads(log.ns.get("/log/000000000001")[0])[0]["decision"].startswith("acked")
    (plain,) = again.append([NewEvent(4.0, "api", "note", "no task")])
    (stored,) = json.loads(again.ns.get(f"/log/{plain.seq:012d}")[0])
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


def _stored(store) -> list[list[int]]:
    """The sequence numbers of each stored page, oldest first."""
    pages = []
    for key in store.children("/events/log"):
        rows = json.loads(store.get(f"/events/log/{key}")[0])
        rows = rows if isinstance(rows, list) else [rows]
        assert rows[0]["seq"] == int(key)  # (a page is keyed by its first event)
        pages.append([r["seq"] for r in rows])
    return pages


def test_an_append_is_one_page_and_a_page_goes_once_all_its_events_are_dropped(tmp_path):
    store = SqliteStore(str(tmp_path / "plait.db"))
    log = EventLog(store, Retention(max_count=6, max_age_seconds=1e9))
    log.append([_ev(1.0, f"a{k}") for k in range(3)])
    log.append([_ev(2.0, f"b{k}") for k in range(3)])
    assert _stored(store) == [[1, 2, 3], [4, 5, 6]]
    log.append([_ev(3.0, "c0"), _ev(3.0, "c1")])  # drops 1 and 2: page 1 still holds 3
    assert [e.seq for e in log.query(limit=100)[0]] == [3, 4, 5, 6, 7, 8]
    assert _stored(store) == [[1, 2, 3], [4, 5, 6], [7, 8]]
    # a restart holds what the retention keeps, not the page's older events
    assert [e.seq for e in EventLog(store, Retention(max_count=6)).query(limit=100)[0]] == [
        3, 4, 5, 6, 7, 8]
    log.append([_ev(4.0, "d0")])  # drops 3: the first page goes
    assert _stored(store) == [[4, 5, 6], [7, 8], [9]]
    # the age limit drops whole pages as well
    aged = EventLog(store, Retention(max_count=6, max_age_seconds=10.0))
    aged.append([_ev(13.5, "late")])  # 4..8 are older than 3.5: dropped, with their pages
    assert [e.seq for e in aged.query(limit=100)[0]] == [9, 10]
    assert _stored(store) == [[9], [10]]
    store.close()


def test_a_large_append_is_split_into_pages_under_the_bound(tmp_path, monkeypatch):
    monkeypatch.setattr("plait.server.events.PAGE_BYTES", 400)
    store = SqliteStore(str(tmp_path / "plait.db"))
    log = EventLog(store, Retention(max_count=100, max_age_seconds=1e9))
    log.append([_ev(1.0, "x" * 150) for _ in range(5)])  # about 230 bytes an event
    pages = _stored(store)
    assert [seq for page in pages for seq in page] == [1, 2, 3, 4, 5] and len(pages) > 1
    for key in store.children("/events/log"):
        value = store.get(f"/events/log/{key}")[0]
        assert len(value) <= 400 or len(json.loads(value)) == 1
    assert [e.seq for e in EventLog(store).query(limit=100)[0]] == [1, 2, 3, 4, 5]
    store.close()


def test_records_of_one_event_and_pages_read_together_and_follow(tmp_path):
    """An older plait stored one event a record: a log holding both reads them in
    order, drops the old ones by the same rule, and a follower catches up on both."""
    store = SqliteStore(str(tmp_path / "plait.db"))
    ns_log = EventLog(store, Retention(max_count=4, max_age_seconds=1e9))
    for seq in (1, 2):
        ns_log.ns.create(f"/log/{seq:012d}", json.dumps(
            {"seq": seq, "time": 1.0, "source": "api", "kind": "old",
             "message": f"o{seq}"}).encode())
    ns_log.ns.create("/seq", b"2")
    log = EventLog(store, Retention(max_count=4, max_age_seconds=1e9))
    follower = EventLog(SqliteStore(str(tmp_path / "plait.db")),
                        Retention(max_count=4, max_age_seconds=1e9))
    log.append([_ev(2.0, "n0"), _ev(2.0, "n1")])
    assert [e.message for e in log.query(limit=100)[0]] == ["o1", "o2", "n0", "n1"]
    log.append([_ev(3.0, "n2")])  # drops o1: its record goes
    assert _stored(store) == [[2], [3, 4], [5]]
    assert follower.refresh() == 3
    assert [e.message for e in follower.query(limit=100)[0]] == ["o2", "n0", "n1", "n2"]
    store.close()


def test_a_deposed_leader_stores_no_event(tmp_path):
    # a leader deposed while it flushed wrote the events of passes the fence refused
    # (a failed machine, a task lost) into the region's history
    store = SqliteStore(str(tmp_path / "plait.db"))
    store.create("/election/leader", b"a")
    log = EventLog(store, Retention(max_count=50, max_age_seconds=1e9))
    log.fence = ("/election/leader", 0)
    log.append([_ev(1.0, "while it leads")])
    store.set("/election/leader", b"b", 0)  # another replica was elected meanwhile
    with pytest.raises(Conflict):
        log.append([_ev(2.0, "after")])
    reader = EventLog(SqliteStore(str(tmp_path / "plait.db")))
    assert [e.message for e in reader.query(limit=100)[0]] == ["while it leads"]
    assert reader.last_seq == 1
    store.close()
