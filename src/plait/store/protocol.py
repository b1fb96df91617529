"""The Store protocol: ZooKeeper's semantics, which is what the control plane needs.

* ``get(key) -> (value, version)``; ``create`` fails if the key exists;
  ``set``/``delete`` take the version the caller read (compare-and-swap);
* ``children(prefix)`` lists the keys directly below a prefix;
* watches are level-triggered: a callback is told "it changed" (the key or a key
  below the prefix) and re-reads, so a missed notification can never leave a
  reader wrong for long;
* ephemeral keys belong to a session and vanish when it ends or expires (agent
  liveness, leader election);
* transactions are all-or-nothing over several keys;
* ``Election``: one leader per name among the sessions that campaign.

Keys are paths (``/scheduler/jobs/web``); each component works in its own
namespace (``Namespace(store, "/scheduler")``). Values are bytes; versions start at
0 on create and grow by one on every set.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from plait.errors import ValidationError

WatchCallback = Callable[[str], None]


#: the largest value one key may hold: ZooKeeper's (jute.maxbuffer, 1 MiB, less room
#: for the request around it), on every store alike, so a record SQLite takes is one
#: ZooKeeper takes too
MAX_VALUE_BYTES = 1_000_000


def check_value(key: str, value: bytes) -> bytes:
    """Refuse a value over ``MAX_VALUE_BYTES`` before it is sent (ZooKeeper would drop
    the connection every other request shares)."""
    if len(value) > MAX_VALUE_BYTES:
        raise RecordTooLarge(key, len(value))
    return value


class WouldBlock(Exception):
    """A write asked not to wait (``SqliteStore.nowait``) would have waited: for another
    thread's write, or another process's. Nothing was written."""


class RecordTooLarge(ValidationError):
    """A record over the store's limit: nothing was written."""

    def __init__(self, key: str, size: int) -> None:
        self.key, self.size = key, size
        super().__init__("record", f"{key} would be {size:,} bytes, over the store's limit "
                                   f"of {MAX_VALUE_BYTES:,} bytes per record: nothing was "
                                   "written")


def check_key(key: str) -> str:
    if not key.startswith("/") or (key != "/" and key.endswith("/")) or "//" in key:
        raise ValidationError("key", f"{key!r} is not a path like /component/kind/name")
    return key


@dataclass
class Op:
    """One step of a transaction."""

    kind: str  # "create" | "set" | "delete" | "check"
    key: str
    value: bytes = b""
    version: int = -1
    ephemeral: bool = False


@dataclass
class Transaction:
    """Steps applied together or not at all: ``store.commit(txn)``."""

    ops: list[Op] = field(default_factory=list)

    def create(self, key: str, value: bytes, ephemeral: bool = False) -> Transaction:
        self.ops.append(Op("create", check_key(key), value, ephemeral=ephemeral))
        return self

    def set(self, key: str, value: bytes, version: int) -> Transaction:
        self.ops.append(Op("set", check_key(key), value, version))
        return self

    def delete(self, key: str, version: int) -> Transaction:
        self.ops.append(Op("delete", check_key(key), version=version))
        return self

    def check(self, key: str, version: int) -> Transaction:
        self.ops.append(Op("check", check_key(key), version=version))
        return self


class Session(Protocol):
    id: str

    def alive(self) -> bool: ...

    def heartbeat(self) -> None:
        """Keep the session alive (SQLite's are leases renewed by their holder;
        ZooKeeper's client keeps its own alive)."""
        ...

    def close(self) -> None: ...


class Election(Protocol):
    def campaign(self) -> bool:
        """Try to become (or stay) the leader; True while this session leads."""
        ...

    def leader(self) -> str | None:
        """The identity of the current leader, if any."""
        ...

    def fence(self) -> tuple[str, int] | None:
        """While this contender leads: a key and version that a transaction checks so
        that it applies only while this contender still leads (None: not offered)."""
        ...

    def resign(self) -> None: ...


class Store(Protocol):
    def get(self, key: str) -> tuple[bytes, int]: ...

    def get_many(self, keys: list[str]) -> dict[str, tuple[bytes, int]]:
        """Several keys at once (a takeover reads every job): missing ones left out."""
        ...

    def exists(self, key: str) -> bool: ...

    def create(self, key: str, value: bytes, session: Session | None = None) -> int: ...

    def set(self, key: str, value: bytes, version: int) -> int: ...

    def delete(self, key: str, version: int) -> None: ...

    def children(self, prefix: str) -> list[str]: ...

    def commit(self, txn: Transaction, session: Session | None = None) -> None: ...

    def watch(self, key: str, callback: WatchCallback) -> Callable[[], None]:
        """Call ``callback(key)`` after every change at or below ``key``; returns a
        function that cancels the watch."""
        ...

    def session(self, ttl: float) -> Session: ...

    def election(self, name: str, identity: str, session: Session) -> Election: ...

    def close(self) -> None: ...


class Namespace:
    """A component's part of a store: every key is prefixed."""

    def __init__(self, store: Store, prefix: str) -> None:
        self.store = store
        self.prefix = check_key(prefix)

    def _k(self, key: str) -> str:
        return self.prefix if check_key(key) == "/" else self.prefix + key

    def get(self, key: str) -> tuple[bytes, int]:
        return self.store.get(self._k(key))

    def get_many(self, keys: list[str]) -> dict[str, tuple[bytes, int]]:
        n = len(self.prefix)
        found = self.store.get_many([self._k(k) for k in keys])
        return {k[n:]: v for k, v in found.items()}

    def exists(self, key: str) -> bool:
        return self.store.exists(self._k(key))

    def is_ephemeral(self, key: str) -> bool:
        return bool(self.store.is_ephemeral(self._k(key)))  # type: ignore[attr-defined]

    def create(self, key: str, value: bytes, session: Session | None = None) -> int:
        return self.store.create(self._k(key), value, session)

    def set(self, key: str, value: bytes, version: int) -> int:
        return self.store.set(self._k(key), value, version)

    def delete(self, key: str, version: int) -> None:
        self.store.delete(self._k(key), version)

    def children(self, prefix: str) -> list[str]:
        return self.store.children(self._k(prefix))

    def commit(self, txn: Transaction, session: Session | None = None) -> None:
        for op in txn.ops:
            op.key = self._k(op.key)
        self.store.commit(txn, session)

    def watch(self, key: str, callback: WatchCallback) -> Callable[[], None]:
        n = len(self.prefix)
        return self.store.watch(self._k(key), lambda k: callback(k[n:]))
