"""The event log's retention per owner: one owner's volume drops its own oldest
events, never another's; past the region's bound the bucket holding the most loses
its oldest first; the store stays in step (pages emptied go, pages mostly dropped are
written again with what is left), across a restart and for a follower."""

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from plait.server.events import SYSTEM, EventLog, NewEvent, Retention, bucket_of
from plait.store import SqliteStore


def _ev(t: float, ent: str | None, message: str = "", actor: str | None = None) -> NewEvent:
    return NewEvent(t, "test", "note", message or f"{ent}", entitlement=ent, actor=actor)


def _held(log: EventLog, **filters) -> list:
    return log.query(limit=100_000, **filters)[0]


def _stored(store) -> dict[int, list[int]]:
    pages = {}
    for key in store.children("/events/log"):
        rows = json.loads(store.get(f"/events/log/{key}")[0])
        rows = rows if isinstance(rows, list) else [rows]
        assert rows[0]["seq"] == int(key)
        pages[int(key)] = [r["seq"] for r in rows]
    return pages


def test_the_bucket_of_an_event():
    assert bucket_of(_ev(1.0, "web")) == "e:web"
    assert bucket_of(_ev(1.0, None, actor="owner:alice")) == "owner:alice"
    assert bucket_of(_ev(1.0, None, actor="admin:ops")) == SYSTEM
    assert bucket_of(_ev(1.0, None, actor="scheduler")) == SYSTEM


def test_one_owners_volume_never_drops_anothers_events(tmp_path):
    store = SqliteStore(str(tmp_path / "plait.db"))
    log = EventLog(store, Retention(max_count=100, max_age_seconds=1e9, max_per_owner=30,
                                    max_system=40))
    log.append([_ev(1.0, "quiet", f"q{k}") for k in range(5)])
    log.append([_ev(1.0, None, f"s{k}", actor="scheduler") for k in range(3)])
    for k in range(1000):  # a flood, one event a write (a sizing intent's)
        log.append([_ev(2.0, "loud", f"l{k}")])
    assert [e.message for e in _held(log, entitlement="quiet")] == [f"q{k}" for k in range(5)]
    assert len(_held(log, entitlement="loud")) == 30
    assert [e.message for e in _held(log, entitlement="loud")][-1] == "l999"
    assert len([e for e in _held(log) if e.entitlement is None]) == 3
    # the store holds the same events, and no page of only dropped ones
    stored = {seq for page in _stored(store).values() for seq in page}
    assert stored == {e.seq for e in _held(log)}
    again = EventLog(store, log.retention)
    assert [e.seq for e in _held(again)] == [e.seq for e in _held(log)]
    store.close()


def test_past_the_regions_bound_the_largest_bucket_loses_its_oldest_first():
    store = SqliteStore(":memory:")
    log = EventLog(store, Retention(max_count=20, max_age_seconds=1e9, max_per_owner=15))
    log.append([_ev(1.0, "a", f"a{k}") for k in range(15)])
    log.append([_ev(2.0, "b", f"b{k}") for k in range(4)])
    log.append([_ev(3.0, "c", f"c{k}") for k in range(3)])  # 22: two too many
    assert [e.message for e in _held(log, entitlement="a")] == [f"a{k}" for k in range(2, 15)]
    assert len(_held(log, entitlement="b")) == 4 and len(_held(log, entitlement="c")) == 3
    assert len(_held(log)) == 20
    # the age limit still drops the oldest of every bucket
    aged = EventLog(store, Retention(max_count=20, max_age_seconds=1.5, max_per_owner=15))
    aged.append([_ev(4.0, "d")])
    assert {e.entitlement for e in _held(aged)} == {"c", "d"}
    store.close()


def test_pages_mostly_dropped_are_written_again_with_what_is_left(tmp_path):
    # each pass's page holds a quiet owner's event among a loud one's: the loud one's
    # cap drops those, and the store does not keep ten pages for each quiet event
    store = SqliteStore(str(tmp_path / "plait.db"))
    retention = Retention(max_count=1000, max_age_seconds=1e9, max_per_owner=20)
    log = EventLog(store, retention)
    follower = EventLog(SqliteStore(str(tmp_path / "plait.db")), retention)
    for k in range(40):
        log.append([_ev(float(k), "quiet", f"q{k}")] + [_ev(float(k), "loud") for _ in range(9)])
    held = [e.seq for e in _held(log)]
    quiet = [e.message for e in _held(log, entitlement="quiet")]
    assert quiet == [f"q{k}" for k in range(20, 40)]
    pages = _stored(store)
    stored = [seq for page in pages.values() for seq in page]
    assert set(held) <= set(stored) and len(stored) <= 4 * len(held) + 10
    assert len(stored) < 100  # (400 written)
    # a restart and a follower read the same events
    assert [e.seq for e in _held(EventLog(store, retention))] == held
    follower.refresh()
    assert [e.seq for e in _held(follower)] == held
    # and the follower, leading, goes on from there
    follower.append([_ev(50.0, "quiet", "after")])
    assert _held(EventLog(store, retention), entitlement="quiet")[-1].message == "after"
    store.close()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.sampled_from(["a", "b", "c", None]), min_size=1, max_size=12),
                min_size=1, max_size=40))
def test_the_retention_keeps_each_buckets_newest_within_every_bound(appends):
    store = SqliteStore(":memory:")
    retention = Retention(max_count=25, max_age_seconds=1e9, max_per_owner=10, max_system=8)
    log = EventLog(store, retention)
    written: dict[str, list[int]] = {}
    for t, batch in enumerate(appends):
        made = log.append([_ev(float(t), ent) for ent in batch])
        for e in made:
            written.setdefault(bucket_of(e), []).append(e.seq)
    held = _held(log)
    assert len(held) <= 25
    mine: dict[str, list[int]] = {}
    for e in held:
        mine.setdefault(bucket_of(e), []).append(e.seq)
    for k, seqs in mine.items():
        assert len(seqs) <= retention.cap(k)
        assert seqs == written[k][-len(seqs):]  # the newest of the bucket
    # a bucket under every other's size lost nothing past its cap
    for k, seqs in written.items():
        if len(seqs) <= min(retention.cap(k), 25 // 4):
            assert mine.get(k) == seqs
    pages = _stored(store)
    stored = {seq for page in pages.values() for seq in page}
    assert {e.seq for e in held} <= stored
    assert len(stored) <= 4 * len(held) + 12
    assert [e.seq for e in _held(EventLog(store, retention))] == [e.seq for e in held]
    store.close()


def test_with_many_owners_a_full_log_drops_to_a_little_under_its_bound():
    store = SqliteStore(":memory:")
    log = EventLog(store, Retention(max_count=100, max_age_seconds=1e9, max_per_owner=10))
    for t in range(10):
        log.append([_ev(float(t), f"o{k}") for k in range(40)])  # 40 owners, 400 events
        assert len(_held(log)) <= 100
    assert 95 <= len(_held(log)) <= 100
    counts = [len(_held(log, entitlement=f"o{k}")) for k in range(40)]
    assert max(counts) - min(counts) <= 1  # the largest lose first: they stay level
    store.close()
