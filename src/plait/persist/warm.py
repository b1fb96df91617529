"""A follower's copy of the scheduler's records, kept current by store watches.

A replica that does not lead holds every job record (parsed) and every task-state
record as the store has them. Watches mark the keys the leader writes; ``refresh``
re-reads only those (the first one reads everything). On election the new leader
refreshes once more and rebuilds the scheduler from this copy, so a takeover reads
what changed in the last moments, not every record of the region (on ZooKeeper a
read of a thousand jobs costs about a second; decision 39).

A refresh that fails (the store unreachable) leaves the copy marked for a full read:
a missed change can never leave it wrong.
"""

from __future__ import annotations

import threading
from typing import Any

from plait.errors import NotFound
from plait.persist.scheduler import JobDoc
from plait.store.protocol import Store

JOBS = "/scheduler/jobs"
STATES = "/scheduler/state"


class WarmRecords:
    def __init__(self, store: Store) -> None:
        self.store = store
        #: job name -> (record, version)
        self.docs: dict[str, tuple[JobDoc, int]] = {}
        #: job name -> (task-state record, version)
        self.states: dict[str, tuple[bytes, int]] = {}
        self._lock = threading.Lock()
        self._dirty: set[str] = set()
        self._all = True
        self._cancel = [store.watch(JOBS, self._changed), store.watch(STATES, self._changed)]
        #: keys read by the last refresh
        self.last_read = 0

    def forget(self) -> None:
        """Read every record at the next refresh (the copy was found behind the store:
        a change whose watch never fired)."""
        with self._lock:
            self._all = True

    def _changed(self, path: str) -> None:
        with self._lock:
            self._dirty.add(path)

    def _children(self, prefix: str) -> list[str]:
        try:
            return [f"{prefix}/{name}" for name in self.store.children(prefix)]
        except NotFound:
            return []

    def refresh(self) -> int:
        """Re-read what changed since the last refresh (everything, the first time).
        Returns how many records were read."""
        poll: Any = getattr(self.store, "poll", None)
        if poll is not None:
            poll()  # (SQLite: watches fire when polled)
        with self._lock:
            full, self._all = self._all, False
            dirty, self._dirty = self._dirty, set()
        try:
            if full:
                keys = self._children(JOBS) + self._children(STATES)
            else:
                keys = sorted(k for k in dirty if k.startswith((JOBS + "/", STATES + "/")))
            found = self.store.get_many(keys)
            docs = {} if full else self.docs
            states = {} if full else self.states
            for key in keys:
                prefix, name = key.rsplit("/", 1)
                if key in found:
                    value, version = found[key]
                    if prefix == JOBS:
                        docs[name] = (JobDoc.from_bytes(value), version)
                    else:
                        states[name] = (value, version)
                else:
                    (docs if prefix == JOBS else states).pop(name, None)
        except Exception:
            with self._lock:
                self._all = True  # read everything next time
            raise
        self.docs, self.states = docs, states
        self.last_read = len(keys)
        return len(keys)

    def close(self) -> None:
        for cancel in self._cancel:
            cancel()
