"""A leader's writes carry its election's fence: once its session is gone (a paused
leader the ensemble gave up on), a transaction it still tries is refused whole, and
its successor's state stands."""

from plait.errors import Conflict
from plait.store.protocol import Transaction


def test_a_deposed_leaders_fenced_write_is_refused(zookeeper):
    from plait.store.zookeeper import ZkStore

    store = ZkStore(zookeeper)
    first = store.session(ttl=2)
    old = store.election("fence-test", "a", first)
    assert old.campaign()
    fence = old.fence()
    assert fence is not None
    store.commit(Transaction().create("/fenced/a", b"1").check(*fence))  # leads: applied
    first.close()  # its session ends: its lock node with it
    second = store.session(ttl=2)
    new = store.election("fence-test", "b", second)
    assert new.campaign() and new.fence() not in (None, fence)
    try:
        store.commit(Transaction().create("/fenced/b", b"2").check(*fence))
        raise AssertionError("a deposed leader's write was applied")
    except Conflict:
        pass
    assert not store.exists("/fenced/b")  # nothing of it applied
    store.commit(Transaction().create("/fenced/c", b"3").check(*new.fence()))
    assert store.children("/fenced") == ["a", "c"]
    new.resign()
    second.close()
    store.close()


def test_a_lease_offers_no_fence(tmp_path):
    from plait.store import SqliteStore

    store = SqliteStore(str(tmp_path / "plait.db"))
    election = store.election("e", "a", store.session(ttl=5))
    assert election.campaign() and election.fence() is None
    store.close()
