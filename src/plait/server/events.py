"""The region's event log: what happened to jobs, machines and requests.

Events are stored in the ``/events`` namespace in pages: each append (a pass's events,
a request's) writes its events as one record, a JSON array under the sequence number
of its first event (``/log/000000000042``), split only past ``PAGE_BYTES``; a record
written by an older plait holds one event (a JSON object) and reads as a page of one.
They are kept under a retention limit (a count and an age, both configurable): older
ones are dropped as new ones arrive, from memory at once and from the store a page
at a time, once all of its events are dropped (the store holds at most one page more
than the limit). Appends are batched, one transaction per batch. Readers page with
``after`` (the last sequence number they saw), so a client that follows the log
misses nothing still retained.

One record per page, not per event: a pass stores three events per new job, and a
record costs the store a row, a change-log row and their indexes (about 20 µs an
event with SQLite, a third of that as pages).

The process that writes also keeps the retained events in memory for queries.
"""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from dataclasses import dataclass, fields
from typing import Any

from plait import fastjson
from plait.errors import NotFound
from plait.store.protocol import Namespace, Store, Transaction


@dataclass(frozen=True)
class NewEvent:
    """An event as a writer gives it to the log (``Event`` once stored)."""

    time: float
    #: who raised it: scheduler, broker, api, auth
    source: str
    kind: str
    message: str
    job: str | None = None
    entitlement: str | None = None
    machine: str | None = None
    #: who did it: the API caller (``owner:alice``, ``admin:ops``) for what a request
    #: did, else the component (scheduler, broker, health, ...)
    actor: str | None = None
    #: the task it is about (its index in ``job``)
    task: int | None = None
    #: the operation on the task, for a job's ops chart: start, update, restart, move,
    #: stop, maintenance, failure
    op: str | None = None
    #: why it happened (a maintenance, a new version, a machine failure, ...)
    reason: str | None = None
    #: the TaskControl decision behind it (acked by the job's TaskController, paced by
    #: the scheduler alone, forced at a deadline, ...)
    decision: str | None = None
    #: the id of the API request that caused it (``X-Request-Id``)
    request: str | None = None


@dataclass(frozen=True)
class Event(NewEvent):
    """A stored event: its sequence number in the log."""

    seq: int = 0


#: an event stored by an older plait has no ``actor``...``request``: read as None
_FIELDS = frozenset(Event.__dataclass_fields__)


def _decode(raw: bytes) -> list[Event]:
    """A stored page's events (a record of one event, as older plaits wrote: a page
    of one)."""
    data = fastjson.loads(raw)
    rows = data if isinstance(data, list) else [data]
    return [Event(**{k: v for k, v in row.items() if k in _FIELDS}) for row in rows]


#: a stored event's fields, in their order (the stored JSON's keys)
_ORDER = tuple(f.name for f in fields(Event))


def new_event(time: float, source: str, kind: str, message: str, job: str | None,
              entitlement: str | None, machine: str | None, actor: str | None,
              task: int | None, op: str | None, reason: str | None,
              decision: str | None, request: str | None) -> NewEvent:
    """``NewEvent(...)`` of every field, made as ``_numbered`` makes an ``Event``
    (without the frozen dataclass's ``__init__``): a pass records three per new job."""
    event = object.__new__(NewEvent)
    event.__dict__.update(time=time, source=source, kind=kind, message=message, job=job,
                          entitlement=entitlement, machine=machine, actor=actor, task=task,
                          op=op, reason=reason, decision=decision, request=request)
    return event


def _numbered(new: NewEvent, seq: int) -> Event:
    """``new`` as the stored event number ``seq``: its fields copied as they are
    (what ``Event(**fields, seq=seq)`` makes, without a frozen dataclass's
    ``__init__``, which sets each of its 14 fields through ``object.__setattr__``:
    a tenth of the cost, and a pass stores three events per new job)."""
    event = object.__new__(Event)
    attrs = event.__dict__
    attrs.update(new.__dict__)
    attrs["seq"] = seq
    return event


def _fields(event: Event) -> dict[str, Any]:
    # the fields left empty are not stored (most events have no task, op, decision);
    # (every field is a plain value: read as it is, not copied as ``asdict`` would)
    return {k: v for k in _ORDER if (v := getattr(event, k)) is not None}


def _pages(events: list[Event]) -> list[tuple[list[Event], bytes]]:
    """``events`` as the pages that store them, each with its record: as few as fit
    ``PAGE_BYTES`` (an event larger than that is a page of its own)."""
    pages: list[tuple[list[Event], bytes]] = []
    page: list[Event] = []
    rows: list[bytes] = []
    size = 0
    for event in events:
        row = fastjson.dumps(_fields(event))
        if page and size + len(row) > PAGE_BYTES:
            pages.append((page, b"[" + b",".join(rows) + b"]"))
            page, rows, size = [], [], 0
        page.append(event)
        rows.append(row)
        size += len(row) + 1
    if page:
        pages.append((page, b"[" + b",".join(rows) + b"]"))
    return pages


#: the events stored in one transaction at most (a ZooKeeper multi-op must stay under
#: its 1 MB packet bound; an event is well under 1 kB)
CHUNK = 500
#: bytes of one page's record at most (well under the store's bound per record)
PAGE_BYTES = 256 * 1024


@dataclass(frozen=True)
class Retention:
    max_count: int = 10_000
    max_age_seconds: float = 7 * 86400.0


class Budget:
    """How many events of one kind may be recorded: a bucket of ``burst`` that fills
    at ``per_second``. The refusals of requests (anyone may send them, with no token)
    spend one each, so a flood of them can take only its share of the retained events
    (``Retention.max_count`` is one pool for all): a burst is recorded whole, a flood
    at ``per_second``, and what is left out is counted (``take`` gives the count of
    those left out since the last recorded one, to be said with it)."""

    def __init__(self, burst: float, per_second: float) -> None:
        self.burst, self.per_second = burst, per_second
        self._left, self._skipped = burst, 0
        self._at: float | None = None

    def take(self, now: float) -> int | None:
        """None: not to be recorded (counted); else record it, with how many before it
        were not."""
        if self._at is not None:
            self._left = min(self.burst, self._left + (now - self._at) * self.per_second)
        self._at = now
        if self._left < 1:
            self._skipped += 1
            return None
        self._left -= 1
        skipped, self._skipped = self._skipped, 0
        return skipped


class EventLog:
    def __init__(self, store: Store, retention: Retention | None = None) -> None:
        self.ns = Namespace(store, "/events")
        self.retention = retention or Retention()
        #: (key, version) every append checks in its transaction: the election's fence
        #: of the replica that leads (``Election.fence``), or None. A leader deposed
        #: while it flushed stores none of the events of passes the fence refused
        self.fence: tuple[str, int] | None = None
        self._lock = threading.Lock()
        self._events: deque[Event] = deque()
        #: the pages stored, oldest first: (the key's sequence number, the last event's)
        self._pages: deque[tuple[int, int]] = deque()
        self._seq = 0
        self._seq_version: int | None = None
        self._load()

    def _load(self) -> None:
        try:
            value, self._seq_version = self.ns.get("/seq")
            self._seq = int(value)
        except NotFound:
            self._seq_version = None
        for key in sorted(self.ns.children("/log")):
            value, _ = self.ns.get(f"/log/{key}")
            self._add_page(int(key), _decode(value))
        self._trim()

    def _add_page(self, key: int, events: list[Event]) -> None:
        if events:
            self._pages.append((key, events[-1].seq))
            self._events.extend(events)

    def _trim(self) -> None:
        """Hold no more events than the retention's count (a page partly dropped stays
        stored until its last event is dropped: it may hold older ones)."""
        extra = len(self._events) - self.retention.max_count
        for _ in range(max(extra, 0)):
            self._events.popleft()

    def refresh(self) -> int:
        """Catch up with what another process (the previous leader) stored since this
        log was read: the new sequence and the events after the newest held, without
        the dropped ones; one listing and one read per new page (a follower refreshes
        now and then, so a takeover reads only the last few). Returns how many events
        were read."""
        with self._lock:
            try:
                value, version = self.ns.get("/seq")
            except NotFound:
                return 0
            if version == self._seq_version:
                return 0
            stored = {int(k) for k in self.ns.children("/log")}
            held = self._events[-1].seq if self._events else 0
            while self._pages and self._pages[0][0] not in stored:
                _, last = self._pages.popleft()  # dropped by the retention meanwhile
                while self._events and self._events[0].seq <= last:
                    self._events.popleft()
            read = 0
            for key in sorted(k for k in stored if k > held):
                with contextlib.suppress(NotFound):
                    events = _decode(self.ns.get(f"/log/{key:012d}")[0])
                    self._add_page(key, events)
                    read += len(events)
            self._trim()
            self._seq, self._seq_version = int(value), version
            return read

    def append(self, events: list[NewEvent]) -> list[Event]:
        """Store a batch of events, in one transaction (callers keep batches within
        ``CHUNK``)."""
        if not events:
            return []
        with self._lock:
            txn = Transaction()
            made = []
            seq = self._seq
            for new in events:
                seq += 1
                made.append(_numbered(new, seq))
            # a batch larger than the whole retention keeps only its newest events
            kept = made[-self.retention.max_count:]
            pages = _pages(kept)
            for page, record in pages:
                txn.create(f"/log/{page[0].seq:012d}", record)
            if self._seq_version is None:
                txn.create("/seq", str(seq).encode())
            else:
                txn.set("/seq", str(seq).encode(), self._seq_version)
            now = events[-1].time
            dropped = self._expired(kept, now)
            # the oldest event held once this batch is in: the pages before it go
            first = (self._events[len(dropped)].seq if len(dropped) < len(self._events)
                     else kept[0].seq)
            gone = 0
            for key, last in self._pages:
                if last >= first:
                    break
                txn.delete(f"/log/{key:012d}", 0)
                gone += 1
            if self.fence is None:
                self.ns.commit(txn)
            else:  # stored only while this replica still leads
                for op in txn.ops:
                    op.key = self.ns.prefix + op.key
                txn.check(*self.fence)
                self.ns.store.commit(txn)
            self._seq_version = 0 if self._seq_version is None else self._seq_version + 1
            self._seq = seq
            for _ in dropped:
                self._events.popleft()
            for _ in range(gone):
                self._pages.popleft()
            for page, _ in pages:
                self._add_page(page[0].seq, page)
            return made

    def _expired(self, incoming: list[Event], now: float) -> list[Event]:
        """The oldest events that the retention limits drop once ``incoming`` is in."""
        keep = self.retention.max_count - len(incoming)
        oldest = now - self.retention.max_age_seconds
        dropped: list[Event] = []
        total = len(self._events)
        for event in self._events:
            if total - len(dropped) > max(keep, 0) or event.time < oldest:
                dropped.append(event)
            else:
                break
        return dropped

    def query(self, after: int = 0, limit: int = 100, job: str | None = None,
              kind: str | None = None, source: str | None = None,
              entitlement: str | None = None, machine: str | None = None,
              since: float | None = None, entitlements: set[str] | None = None,
              task: int | None = None, actor: str | None = None,
              request: str | None = None) -> tuple[list[Event], int | None]:
        """Events after sequence ``after`` that match every filter given, oldest first,
        at most ``limit``; and the cursor for the next page (None at the end).
        ``entitlements`` restricts to events of those entitlements (an owner's view)."""
        found: list[Event] = []
        with self._lock:
            # the events after the cursor, found from the newest back: a poll asks
            # for what is new, a few of thousands held (sequence numbers only grow)
            snapshot: list[Event] = []
            for event in reversed(self._events):
                if event.seq <= after:
                    break
                snapshot.append(event)
        snapshot.reverse()
        for event in snapshot:
            if ((job is not None and event.job != job)
                    or (kind is not None and event.kind != kind)
                    or (source is not None and event.source != source)
                    or (entitlement is not None and event.entitlement != entitlement)
                    or (machine is not None and event.machine != machine)
                    or (since is not None and event.time < since)
                    or (task is not None and event.task != task)
                    or (actor is not None and event.actor != actor)
                    or (request is not None and event.request != request)
                    or (entitlements is not None and event.entitlement not in entitlements)):
                continue
            if len(found) == limit:
                return found, found[-1].seq
            found.append(event)
        return found, None

    @property
    def last_seq(self) -> int:
        return self._seq
