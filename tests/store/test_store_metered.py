"""A metered store (``plait.store.metered``) times every data operation of either
backend into the control plane's metrics, counts the failed ones by error, and
changes nothing of what the store answers."""

import pytest

from plait.errors import Conflict, NotFound
from plait.metrics import Metrics, NullMetrics
from plait.store import Namespace, Transaction
from plait.store.metered import MeteredStore


def samples(metrics: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in metrics.registry.collect() for s in family.samples}


def count(metrics: Metrics, op: str) -> float:
    return samples(metrics).get(("plait_store_operation_duration_seconds_count",
                                 (("op", op),)), 0.0)


def errors(metrics: Metrics, op: str, error: str) -> float:
    return samples(metrics).get(("plait_store_operation_errors_total",
                                 (("error", error), ("op", op))), 0.0)


def test_each_operation_is_timed_and_failures_counted_by_error(env) -> None:
    metrics = Metrics()
    store = Namespace(metrics.metered(env.store), "/m")  # (a component's view of it)
    assert store.create("/a", b"1") == 0
    assert store.get("/a") == (b"1", 0)
    assert store.set("/a", b"2", 0) == 1
    assert store.get_many(["/a", "/none"]) == {"/a": (b"2", 1)}
    assert store.exists("/a") and not store.exists("/none")
    assert store.children("/") == ["a"]
    store.commit(Transaction().create("/b", b"x").set("/a", b"3", 1))
    store.delete("/b", 0)
    with pytest.raises(NotFound):
        store.get("/none")
    with pytest.raises(Conflict):
        store.create("/a", b"again")
    with pytest.raises(Conflict):
        store.set("/a", b"4", 0)  # (an old version: a lost compare-and-swap)
    assert store.get("/a") == (b"3", 2)  # what the store answers is unchanged
    for op, n in {"create": 2, "get": 3, "set": 2, "get_many": 1, "exists": 2,
                  "children": 1, "commit": 1, "delete": 1}.items():
        assert count(metrics, op) == n, op  # failed ones are timed too
    assert errors(metrics, "get", "not_found") == 1
    assert errors(metrics, "create", "conflict") == 1
    assert errors(metrics, "set", "conflict") == 1
    assert errors(metrics, "get", "conflict") == 0
    assert samples(metrics)[("plait_store_operation_duration_seconds_sum",
                             (("op", "get"),))] > 0


def test_sessions_elections_and_the_backends_own_calls_pass_through(tmp_path) -> None:
    from plait.store import SqliteStore

    base = SqliteStore(str(tmp_path / "plait.db"))
    metrics = Metrics()
    store = metrics.metered(base)
    try:
        assert isinstance(store, MeteredStore)
        session = store.session(5.0)
        assert store.election("lead", "me", session).campaign()
        store.create("/e", b"", session)
        assert store.is_ephemeral("/e")  # type: ignore[attr-defined]
        assert store.poll() >= 0  # type: ignore[attr-defined]
        assert count(metrics, "create") == 1
        assert NullMetrics().metered(base) is base  # metrics off: not wrapped at all
    finally:
        store.close()
