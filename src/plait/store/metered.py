"""A store that says how long each of its operations took and which failed.

``MeteredStore(store, sink)`` is the Store protocol over any backend (SQLite,
ZooKeeper, a shard's view): every data operation (``get``, ``get_many``,
``exists``, ``create``, ``set``, ``delete``, ``children``, ``commit``) goes to the
store underneath, and the seconds it took to what ``sink.timer(op)`` returned,
failed ones too; one that raised is also told to ``sink.failed(op, error)`` (and
re-raised unchanged). Sessions, elections, watches and whatever else the backend
offers (``poll``, ``backup``, ...) pass through untimed.

The control plane wraps its store in one when its metrics are on
(``plait.metrics.Metrics.metered``), so both backends are timed at one point.
"""

from __future__ import annotations

from collections.abc import Callable
from time import perf_counter
from typing import Any, Protocol, TypeVar

from plait.store.protocol import Election, Session, Store, Transaction, WatchCallback

T = TypeVar("T")

#: the operations timed, as the sink is told of them
OPERATIONS = ("get", "get_many", "exists", "create", "set", "delete", "children", "commit")


class OperationSink(Protocol):
    def timer(self, op: str) -> Callable[[float], None]:
        """What to call with the seconds each ``op`` takes (asked once per op)."""
        ...

    def failed(self, op: str, error: BaseException) -> None:
        """``op`` raised ``error``."""
        ...


class MeteredStore:
    """``base``, each data operation timed into ``sink`` (the Store protocol)."""

    def __init__(self, base: Store, sink: OperationSink) -> None:
        self.base = base
        self.sink = sink
        self._took = {op: sink.timer(op) for op in OPERATIONS}

    def _timed(self, op: str, call: Callable[..., T], *args: Any) -> T:
        started = perf_counter()
        try:
            return call(*args)
        except BaseException as exc:
            self.sink.failed(op, exc)
            raise
        finally:
            self._took[op](perf_counter() - started)

    def get(self, key: str) -> tuple[bytes, int]:
        return self._timed("get", self.base.get, key)

    def get_many(self, keys: list[str]) -> dict[str, tuple[bytes, int]]:
        return self._timed("get_many", self.base.get_many, keys)

    def exists(self, key: str) -> bool:
        return self._timed("exists", self.base.exists, key)

    def create(self, key: str, value: bytes, session: Session | None = None) -> int:
        return self._timed("create", self.base.create, key, value, session)

    def set(self, key: str, value: bytes, version: int) -> int:
        return self._timed("set", self.base.set, key, value, version)

    def delete(self, key: str, version: int) -> None:
        self._timed("delete", self.base.delete, key, version)

    def children(self, prefix: str) -> list[str]:
        return self._timed("children", self.base.children, prefix)

    def commit(self, txn: Transaction, session: Session | None = None) -> None:
        self._timed("commit", self.base.commit, txn, session)

    def watch(self, key: str, callback: WatchCallback) -> Callable[[], None]:
        return self.base.watch(key, callback)

    def session(self, ttl: float) -> Session:
        return self.base.session(ttl)

    def election(self, name: str, identity: str, session: Session) -> Election:
        return self.base.election(name, identity, session)

    def close(self) -> None:
        self.base.close()

    def __getattr__(self, name: str) -> Any:  # poll, is_ephemeral, backup, leader_of, ...
        return getattr(self.base, name)
