"""The Store contract (ZooKeeper's semantics), run against every backend.

Backends so far: SQLite. The ZooKeeper backend will join the ``store`` fixture's
parameters and must pass the same tests.
"""

import pytest

from plait.errors import Conflict, NotFound, ValidationError
from plait.store import Namespace, SqliteStore, Transaction


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


@pytest.fixture(params=["sqlite"])
def env(request, tmp_path):
    clock = Clock()
    store = SqliteStore(str(tmp_path / "plait.db"), clock=clock)
    yield store, clock
    store.close()


def test_create_get_and_compare_and_swap(env):
    s, _ = env
    assert s.create("/a/b", b"one") == 0
    assert s.get("/a/b") == (b"one", 0)
    with pytest.raises(Conflict):
        s.create("/a/b", b"again")
    assert s.set("/a/b", b"two", 0) == 1
    with pytest.raises(Conflict) as err:
        s.set("/a/b", b"stale", 0)
    assert err.value.expected == 0 and err.value.actual == 1
    assert s.get("/a/b") == (b"two", 1)
    with pytest.raises(Conflict):
        s.delete("/a/b", 0)
    s.delete("/a/b", 1)
    with pytest.raises(NotFound):
        s.get("/a/b")
    with pytest.raises(NotFound):
        s.set("/a/b", b"x", 0)


def test_keys_are_paths(env):
    s, _ = env
    for bad in ("a", "/a/", "//a", ""):
        with pytest.raises(ValidationError):
            s.create(bad, b"")


def test_children_list_direct_children_only(env):
    s, _ = env
    for key in ("/jobs/web", "/jobs/db", "/jobs/web/tasks", "/other/x/y"):
        s.create(key, b"")
    assert s.children("/jobs") == ["db", "web"]
    assert s.children("/other") == ["x"] and s.get("/other/x") == (b"", 0)  # parents made
    assert s.children("/jobs/web") == ["tasks"]
    assert s.children("/nothing") == []


def test_watch_fires_after_every_change_and_a_reread_sees_it(env):
    s, _ = env
    seen = []
    s.watch("/jobs", lambda key: seen.append((key, s.exists(key) and s.get(key)[0])))
    s.create("/jobs/web", b"v1")
    s.set("/jobs/web", b"v2", 0)
    s.create("/other", b"not watched")
    s.delete("/jobs/web", 1)
    assert seen == [("/jobs/web", b"v1"), ("/jobs/web", b"v2"), ("/jobs/web", False)]


def test_watch_sees_changes_made_by_another_process(env, tmp_path):
    s, clock = env
    other = SqliteStore(s.path, clock=clock)  # a second connection, as another process
    seen = []
    cancel = s.watch("/x", seen.append)
    other.create("/x/1", b"")
    assert seen == []  # not yet polled
    assert s.poll() == 1 and seen == ["/x/1"]
    cancel()
    other.create("/x/2", b"")
    s.poll()
    assert seen == ["/x/1"]
    other.close()


def test_an_ephemeral_vanishes_when_its_session_dies(env):
    s, clock = env
    session = s.session(ttl=10)
    s.create("/agents/m1", b"alive", session)
    seen = []
    s.watch("/agents", seen.append)
    clock.now += 5
    session.heartbeat()
    clock.now += 9  # within the extended lease
    assert s.exists("/agents/m1") and session.alive()
    clock.now += 2  # expired: invisible at once
    assert not session.alive()
    assert not s.exists("/agents/m1") and s.children("/agents") == []
    s.poll()
    assert seen == ["/agents/m1"]
    s.create("/agents/m1", b"new owner")  # the key can be taken again
    closed = s.session(ttl=10)
    s.create("/agents/m2", b"", closed)
    closed.close()
    assert not s.exists("/agents/m2")


def test_transactions_are_all_or_nothing(env):
    s, _ = env
    s.create("/counter", b"0")
    txn = Transaction().check("/counter", 0).create("/a", b"1").create("/b", b"2")
    s.commit(txn)
    assert s.exists("/a") and s.exists("/b")
    bad = Transaction().set("/counter", b"1", 0).create("/c", b"").create("/a", b"dup")
    with pytest.raises(Conflict):
        s.commit(bad)
    assert s.get("/counter") == (b"0", 0) and not s.exists("/c")
    stale = Transaction().check("/counter", 7).delete("/a", 0)
    with pytest.raises(Conflict):
        s.commit(stale)
    assert s.exists("/a")


def test_election_hands_over_when_the_leaders_session_dies(env):
    s, clock = env
    a, b = s.session(ttl=5), s.session(ttl=5)
    ea, eb = s.election("scheduler-1", "a", a), s.election("scheduler-1", "b", b)
    assert ea.campaign() and not eb.campaign()
    assert ea.campaign()  # still leads
    assert eb.leader() == "a"
    clock.now += 3
    b.heartbeat()
    clock.now += 3  # a's lease lapsed, b's did not
    assert eb.campaign() and eb.leader() == "b"
    assert not ea.campaign()
    eb.resign()
    assert ea.leader() is None


def test_namespaces_keep_components_apart(env):
    s, _ = env
    sched, broker = Namespace(s, "/scheduler"), Namespace(s, "/broker")
    sched.create("/jobs/web", b"s")
    broker.create("/jobs/web", b"b")
    assert sched.get("/jobs/web")[0] == b"s" and broker.get("/jobs/web")[0] == b"b"
    assert s.children("/scheduler/jobs") == ["web"]
    seen = []
    sched.watch("/jobs", seen.append)
    broker.set("/jobs/web", b"b2", 0)
    sched.set("/jobs/web", b"s2", 0)
    assert seen == ["/jobs/web"]
    sched.commit(Transaction().create("/jobs/db", b""))
    assert s.exists("/scheduler/jobs/db")


def test_the_store_records_its_schema_version(env):
    s, _ = env
    assert s._read("SELECT value FROM meta WHERE key = 'schema_version'", ()) == [("1",)]
