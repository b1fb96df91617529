"""The Store contract (ZooKeeper's semantics), run against both backends."""

import pytest

from plait.errors import Conflict, NotFound, ValidationError
from plait.store import Namespace, Transaction


def test_create_get_and_compare_and_swap(env):
    s = env.store
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
    for bad in ("a", "/a/", "//a", ""):
        with pytest.raises(ValidationError):
            env.store.create(bad, b"")


def test_children_list_direct_children_and_parents_are_made(env):
    s = env.store
    for key in ("/jobs/web", "/jobs/db", "/jobs/web/tasks", "/other/x/y"):
        s.create(key, b"")
    assert s.children("/jobs") == ["db", "web"]
    assert s.children("/jobs/web") == ["tasks"]
    assert s.children("/other") == ["x"] and s.get("/other/x") == (b"", 0)
    assert s.children("/nothing") == []


def test_watch_fires_after_every_change_and_a_reread_sees_it(env):
    s = env.store
    seen: list[str] = []
    s.watch("/jobs", seen.append)
    s.create("/jobs/web", b"v1")
    assert env.settle(lambda: "/jobs/web" in seen)
    assert s.get("/jobs/web")[0] == b"v1"
    seen.clear()
    s.set("/jobs/web", b"v2", 0)
    assert env.settle(lambda: "/jobs/web" in seen)
    assert s.get("/jobs/web")[0] == b"v2"
    seen.clear()
    s.delete("/jobs/web", 1)
    assert env.settle(lambda: "/jobs/web" in seen)
    assert not s.exists("/jobs/web")


def test_watch_sees_changes_made_by_another_client(env):
    s = env.store
    seen: list[str] = []
    cancel = s.watch("/x", seen.append)
    other = env.other()
    other.create("/x/1", b"")
    assert env.settle(lambda: "/x/1" in seen)
    cancel()
    other.create("/x/2", b"")
    assert not env.settle(lambda: "/x/2" in seen, timeout=1.0)  # cancelled: not told


def test_an_ephemeral_vanishes_when_its_session_dies(env):
    s = env.store
    session = s.session(ttl=5)
    s.create("/agents/m1", b"alive", session)
    assert s.exists("/agents/m1") and session.alive()
    seen: list[str] = []
    s.watch("/agents", seen.append)
    env.kill(session)
    assert env.settle(lambda: not s.exists("/agents/m1"))
    assert s.children("/agents") == []
    assert env.settle(lambda: "/agents/m1" in seen)
    s.create("/agents/m1", b"new owner")  # the key can be taken again


def test_transactions_are_all_or_nothing(env):
    s = env.store
    s.create("/counter", b"0")
    s.commit(Transaction().check("/counter", 0).create("/a", b"1").create("/b", b"2"))
    assert s.exists("/a") and s.exists("/b")
    bad = Transaction().set("/counter", b"1", 0).create("/c", b"").create("/a", b"dup")
    with pytest.raises(Conflict):
        s.commit(bad)
    assert s.get("/counter") == (b"0", 0) and not s.exists("/c")
    with pytest.raises(Conflict):
        s.commit(Transaction().check("/counter", 7).delete("/a", 0))
    assert s.exists("/a")


def test_many_creates_in_one_transaction_are_all_or_nothing_too(env):
    """A run of creates (a pass's events, new jobs' state) with one key taken: none of
    them is stored; without it, all of them,
    with their parents; a set at a stale version likewise."""
    s = env.store
    s.create("/log/0003", b"taken")
    many = Transaction()
    for k in range(1, 7):
        many.create(f"/log/{k:04d}", b"x")
    many.create("/fresh/deep/key", b"y")
    with pytest.raises(Conflict):
        s.commit(many)
    assert s.children("/log") == ["0003"] and not s.exists("/fresh/deep/key")
    assert s.get("/log/0003") == (b"taken", 0)
    ok = Transaction()
    for k in (1, 2, 4, 5):
        ok.create(f"/log/{k:04d}", b"x")
    ok.create("/fresh/deep/key", b"y").set("/log/0003", b"again", 0)
    s.commit(ok)
    assert s.children("/log") == ["0001", "0002", "0003", "0004", "0005"]
    assert s.get("/fresh/deep/key") == (b"y", 0) and s.get("/fresh/deep") == (b"", 0)
    assert s.get("/log/0003") == (b"again", 1)
    stale = Transaction().create("/log/0006", b"x").create("/log/0007", b"x").create(
        "/log/0008", b"x").set("/log/0003", b"stale", 0)
    with pytest.raises(Conflict):
        s.commit(stale)
    assert not s.exists("/log/0006") and s.get("/log/0003") == (b"again", 1)
    with pytest.raises((NotFound, Conflict)):  # (ZooKeeper's transaction: a conflict)
        s.commit(Transaction().set("/log/0099", b"x", 0))
    assert not s.exists("/log/0099")


def test_many_sets_in_one_transaction_are_all_or_nothing_too(env):
    """A run of sets at a version (a pass's job states) with one stale or missing: none
    of them applies, and the error names it; all current: each moves one version."""
    s = env.store
    for k in range(1, 6):
        s.create(f"/state/{k}", b"v0")
    s.set("/state/3", b"v1", 0)  # /state/3 is at version 1, the others at 0
    stale = Transaction()
    for k in range(1, 6):
        stale.set(f"/state/{k}", b"new", 0)
    with pytest.raises(Conflict):
        s.commit(stale)
    assert [s.get(f"/state/{k}") for k in range(1, 6)] == [
        (b"v0", 0), (b"v0", 0), (b"v1", 1), (b"v0", 0), (b"v0", 0)]
    missing = Transaction()
    for k in (1, 2, 9):
        missing.set(f"/state/{k}", b"new", 0)
    with pytest.raises((NotFound, Conflict)):  # (ZooKeeper's transaction: a conflict)
        s.commit(missing)
    assert s.get("/state/1") == (b"v0", 0) and not s.exists("/state/9")
    ok = Transaction()
    for k in range(1, 6):
        ok.set(f"/state/{k}", f"s{k}".encode(), 1 if k == 3 else 0)
    ok.create("/state/6", b"c")
    s.commit(ok)
    assert [s.get(f"/state/{k}") for k in range(1, 7)] == [
        (b"s1", 1), (b"s2", 1), (b"s3", 2), (b"s4", 1), (b"s5", 1), (b"c", 0)]
    seen: list[str] = []
    s.watch("/state", seen.append)  # each set is a change a watcher hears of
    again = Transaction()
    for k in range(1, 4):
        again.set(f"/state/{k}", b"again", 1 if k != 3 else 2)
    s.commit(again)
    assert env.settle(lambda: {"/state/1", "/state/2", "/state/3"} <= set(seen))


def test_election_hands_over_when_the_leaders_session_dies(env):
    s = env.store
    a, b = s.session(ttl=5), s.session(ttl=60)
    ea, eb = s.election("scheduler-1", "a", a), s.election("scheduler-1", "b", b)
    assert ea.campaign() and not eb.campaign()
    assert ea.campaign()  # still leads
    assert eb.leader() == "a"
    env.kill(a)
    assert env.settle(lambda: eb.campaign())
    assert eb.leader() == "b"
    eb.resign()
    b.close()


def test_namespaces_keep_components_apart(env):
    s = env.store
    sched, broker = Namespace(s, "/scheduler"), Namespace(s, "/broker")
    sched.create("/jobs/web", b"s")
    broker.create("/jobs/web", b"b")
    assert sched.get("/jobs/web")[0] == b"s" and broker.get("/jobs/web")[0] == b"b"
    assert s.children("/scheduler/jobs") == ["web"]
    sched.commit(Transaction().create("/jobs/db", b""))
    assert s.exists("/scheduler/jobs/db")


def test_backup_and_restore_round_trip(env):
    from plait.store.backup import backup, restore

    s = env.store
    s.create("/scheduler/jobs/web", b"spec \x00 bytes")
    s.create("/broker/dc1/m1", b"free")
    session = s.session(ttl=60)
    s.create("/agents/m1", b"alive", session)  # ephemeral: not in a backup
    document = backup(s)
    keys = {e["key"] for e in document["keys"]}
    assert "/scheduler/jobs/web" in keys and "/agents/m1" not in keys
    with pytest.raises(Conflict):
        restore(s, document)  # only into an empty store
    session.close()


def test_get_many_reads_several_keys_and_leaves_out_missing_ones(env):
    s = env.store
    s.create("/many/a", b"1")
    s.create("/many/b", b"2")
    s.set("/many/b", b"3", 0)
    assert s.get_many(["/many/a", "/many/b", "/many/none"]) == {
        "/many/a": (b"1", 0), "/many/b": (b"3", 1)}
    assert s.get_many([]) == {}
    ns = Namespace(s, "/many")
    assert ns.get_many(["/a", "/c"]) == {"/a": (b"1", 0)}


def test_a_value_over_the_limit_is_refused_before_it_is_sent(env):
    """ZooKeeper drops the connection of a request over its buffer: such a value is
    refused first, on every store alike, and the store (its session) goes on."""
    from plait.store.protocol import MAX_VALUE_BYTES, RecordTooLarge, Transaction

    s = env.store
    s.create("/big/ok", b"v")
    session = s.session(5.0)
    for attempt in range(3):
        with pytest.raises(RecordTooLarge):
            s.create(f"/big/no{attempt}", b"x" * (MAX_VALUE_BYTES + 1))
        with pytest.raises(RecordTooLarge):
            s.set("/big/ok", b"x" * (MAX_VALUE_BYTES + 1), 0)
        txn = Transaction()
        txn.set("/big/ok", b"y", 0)
        txn.create("/big/also", b"z" * (MAX_VALUE_BYTES + 1))
        with pytest.raises(RecordTooLarge):
            s.commit(txn)
    assert s.get("/big/ok") == (b"v", 0) and s.children("/big") == ["ok"]
    assert session.alive()
    s.create("/big/near", b"n" * (MAX_VALUE_BYTES - 1000))  # under the limit: taken
    assert len(s.get("/big/near")[0]) == MAX_VALUE_BYTES - 1000
    session.close()
