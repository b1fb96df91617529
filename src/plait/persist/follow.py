"""What a scheduler shard learns from the others through the store.

Shards share the region's machines and their brokers' records: another shard claims
a free machine, cordons one, raises a maintenance event, or a machine registers
through shard 0. ``SharedRecords`` watches those keys and hands the ones that
changed to the shard's loop, which makes its in-memory brokers agree
(``PersistentRegion.adopt`` / ``adopt_event``), or rebuilds when the region gained
a machine. Watches are level-triggered: a key is re-read, never trusted from the
notification.
"""

from __future__ import annotations

import threading
from typing import Any

from plait.store.protocol import Store

MACHINES = "/broker/machines"
EVENTS = "/broker/events"
REGISTERED = "/region/machines"


class SharedRecords:
    def __init__(self, store: Store) -> None:
        self.store = store
        self._lock = threading.Lock()
        self._dirty: set[str] = set()
        self._cancel = [store.watch(key, self._changed)
                        for key in (MACHINES, EVENTS, REGISTERED)]

    def _changed(self, path: str) -> None:
        with self._lock:
            self._dirty.add(path)

    def take(self) -> tuple[list[str], list[str], bool]:
        """(machine ids whose broker record changed, event ids that changed, whether a
        machine registered) since the last call."""
        poll: Any = getattr(self.store, "poll", None)
        if poll is not None:
            poll()  # (SQLite: watches fire when polled)
        with self._lock:
            dirty, self._dirty = self._dirty, set()
        machines = sorted(k[len(MACHINES) + 1:] for k in dirty
                          if k.startswith(MACHINES + "/"))
        events = sorted(k[len(EVENTS) + 1:] for k in dirty if k.startswith(EVENTS + "/"))
        return machines, events, any(k.startswith(REGISTERED + "/") for k in dirty)

    def close(self) -> None:
        for cancel in self._cancel:
            cancel()
