"""A scheduler shard's view of the region's store.

A region's control plane may run as several scheduler shards (``plait serve --shard
S``), each managing the jobs of the entitlements mapped to it. They share one store:
what is the region's (its machines, the brokers' records, tokens, elections, the front
end's maps) is read and written as it is, and what is the shard's own (its scheduler,
allocator and event log) lives below ``/shards/S``. ``ShardStore`` makes that split
for every component at once, so a shard runs the same control-plane code as a
control plane that is not sharded:

    /region, /broker, /auth, /frontend, /_elections, /hostprofiles    shared by every shard
    /scheduler/...  ->  /shards/S/scheduler/...         the shard's own
    /allocator/...  ->  /shards/S/allocator/...
    /events/...     ->  /shards/S/events/...

Moving an entitlement between shards moves its records from one shard's part of the
tree to another's in one transaction (``plait.frontend.shards``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from plait.store.protocol import Election, Session, Store, Transaction, WatchCallback, check_key

#: top-level keys every shard shares
SHARED = ("/region", "/broker", "/auth", "/frontend", "/_elections", "/hostprofiles")


def shard_prefix(shard: int) -> str:
    return f"/shards/{shard}"


_SHARED_UNDER = tuple(p + "/" for p in SHARED)


def _shared(key: str) -> bool:
    return key in SHARED or key.startswith(_SHARED_UNDER)


class ShardStore:
    """``store`` as shard ``shard`` sees it (the Store protocol; sessions, elections
    and polling are the underlying store's)."""

    def __init__(self, store: Store, shard: int) -> None:
        if shard < 0:
            raise ValueError("a shard is numbered from 0")
        self.base = store
        self.shard = shard
        self.prefix = shard_prefix(shard)

    def _k(self, key: str) -> str:
        check_key(key)
        return key if _shared(key) else self.prefix + (key if key != "/" else "")

    def _back(self, key: str) -> str:
        return key[len(self.prefix):] if key.startswith(self.prefix + "/") else key

    def get(self, key: str) -> tuple[bytes, int]:
        return self.base.get(self._k(key))

    def get_many(self, keys: list[str]) -> dict[str, tuple[bytes, int]]:
        found = self.base.get_many([self._k(k) for k in keys])
        return {self._back(k): v for k, v in found.items()}

    def exists(self, key: str) -> bool:
        return self.base.exists(self._k(key))

    def is_ephemeral(self, key: str) -> bool:
        return bool(self.base.is_ephemeral(self._k(key)))  # type: ignore[attr-defined]

    def create(self, key: str, value: bytes, session: Session | None = None) -> int:
        return self.base.create(self._k(key), value, session)

    def set(self, key: str, value: bytes, version: int) -> int:
        return self.base.set(self._k(key), value, version)

    def delete(self, key: str, version: int) -> None:
        self.base.delete(self._k(key), version)

    def children(self, prefix: str) -> list[str]:
        return self.base.children(self._k(prefix))

    def commit(self, txn: Transaction, session: Session | None = None) -> None:
        for op in txn.ops:
            op.key = self._k(op.key)
        self.base.commit(txn, session)

    def watch(self, key: str, callback: WatchCallback) -> Callable[[], None]:
        return self.base.watch(self._k(key), lambda k: callback(self._back(k)))

    def session(self, ttl: float) -> Session:
        return self.base.session(ttl)

    def election(self, name: str, identity: str, session: Session) -> Election:
        return self.base.election(name, identity, session)

    def poll(self) -> int:
        poll: Any = getattr(self.base, "poll", None)
        return int(poll()) if poll is not None else 0

    def close(self) -> None:
        self.base.close()

    def __getattr__(self, name: str) -> Any:  # backup, snapshot, leader_of, ...
        return getattr(self.base, name)
