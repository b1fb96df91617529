"""The region's event log: what happened to jobs, machines and requests.

Events are stored in the ``/events`` namespace in pages: each append (a pass's events,
a request's) writes its events as one record, a JSON array under the sequence number
of its first event (``/log/000000000042``), split only past ``PAGE_BYTES``; a record
written by an older plait holds one event (a JSON object) and reads as a page of one.
They are kept under a retention limit (``Retention``: a count in all, an age, and a
count per owner and for the region's own events, all configurable): one owner's
events past its count, or the oldest of the owner holding the most once the count in
all is reached, are dropped as new ones arrive, so one owner's volume never drops
another's events. They go from memory at once and from the store a page at a time,
once all of its events are dropped; a page left holding under a quarter of its
events is written again with only those (the store holds at most about four times
what is kept). Appends are batched, one transaction per batch. Readers page with
``after`` (the last sequence number they saw), so a client that follows the log
misses nothing still retained.

One record per page, not per event: a pass stores three events per new job, and a
record costs the store a row, a change-log row and their indexes (about 20 µs an
event with SQLite, a third of that as pages).

The process that writes also keeps the retained events in memory for queries.
"""

from __future__ import annotations

import bisect
import contextlib
import heapq
import itertools
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
    """What the log keeps: at most ``max_count`` events in all and none older than
    ``max_age_seconds``; of each owner's events (``bucket_of``: an entitlement's, or
    an owner's own requests') at most ``max_per_owner``, and of the region's own
    (admins' and plait's components') at most ``max_system``. Past ``max_count``, the
    oldest events of the bucket holding the most go first, so one owner's volume
    drops its own events, never another's that hold fewer."""

    max_count: int = 10_000
    max_age_seconds: float = 7 * 86400.0
    max_per_owner: int = 2_000
    max_system: int = 5_000

    def cap(self, bucket: str) -> int:
        return self.max_system if bucket == SYSTEM else self.max_per_owner


#: with more buckets than this, the retention drops to 5 % under its count in all
SLACK_AT = 32

#: the bucket of the events of no owner: admins', and plait's components'
SYSTEM = ""


def bucket_of(event: NewEvent) -> str:
    """The retention's bucket of an event: its entitlement's (an entitlement is one
    owner's, and only admins make them), else the owner's whose request raised it
    (``owner:alice``), else the region's own (``SYSTEM``)."""
    if event.entitlement is not None:
        return "e:" + event.entitlement
    actor = event.actor
    if actor is not None and actor.startswith("owner:"):
        return actor
    return SYSTEM

class Budget:
    """How many events of one kind may be recorded: a bucket of ``burst`` that fills
    at ``per_second``. The refusals of requests (anyone may send them, with no token)
    spend one each, so a flood of them can take only its share of the retained events
    (they fall in the retention's bucket of the region's own events, ``SYSTEM``): a
    burst is recorded whole, a flood at ``per_second``, and what is left out is
    counted (``take`` gives the count of those left out since the last recorded one,
    to be said with it)."""

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
        #: the events held, by sequence number, oldest first (a dict: the retention
        #: drops an owner's oldest from anywhere in the log)
        self._events: dict[int, Event] = {}
        #: the events held of each bucket (``bucket_of``), oldest first
        self._buckets: dict[str, deque[Event]] = {}
        #: the pages stored, by key (their first event's sequence number), oldest
        #: first: [the last event's sequence number, events held, events stored]
        self._pages: dict[int, list[int]] = {}
        #: the keys of ``_pages``, sorted (which page holds an event: a bisection),
        #: and some of pages gone (``_retire``)
        self._keys: list[int] = []
        #: the pages stored whose events are all dropped, not deleted yet (the next
        #: append deletes them)
        self._empty: set[int] = set()
        self._seq = 0
        self._seq_version: int | None = None
        self._load()

    def _load(self) -> None:
        try:
            value, self._seq_version = self.ns.get("/seq")
            self._seq = int(value)
        except NotFound:
            self._seq_version = None
        for key in sorted(int(k) for k in self.ns.children("/log")):
            value, _ = self.ns.get(f"/log/{key:012d}")
            self._add_page(key, _decode(value))
        self._drop(self._plan([], None))

    def _add_page(self, key: int, events: list[Event]) -> None:
        if not events:
            return
        self._pages[key] = [events[-1].seq, len(events), len(events)]
        if not self._keys or key > self._keys[-1]:
            self._keys.append(key)
        else:
            bisect.insort(self._keys, key)
        held, buckets = self._events, self._buckets
        for event in events:
            held[event.seq] = event
            bucket = buckets.get(bucket_of(event))
            if bucket is None:
                bucket = buckets[bucket_of(event)] = deque()
            bucket.append(event)

    def _plan(self, incoming: list[Event], now: float | None) -> dict[str, int]:
        """How many of each bucket's oldest events the retention drops once
        ``incoming`` (newer than every event held) is in: past its bucket's cap, older
        than the age limit (``now``: None, none), then, while more than ``max_count``
        are held, the oldest of the bucket holding the most (with more than
        ``SLACK_AT`` buckets, down to 5 % under ``max_count``: a full log looks for
        the largest of many buckets once per 5 % of it, not at each append)."""
        retention, buckets = self.retention, self._buckets
        added: dict[str, list[Event]] = {}
        for event in incoming:
            k = bucket_of(event)
            got = added.get(k)
            if got is None:
                added[k] = [event]
            else:
                got.append(event)
        # (only the buckets given events may be over their caps; a load's all may)
        drop: dict[str, int] = {}
        for k in (added if incoming else buckets):
            n = len(buckets.get(k, ())) + len(added.get(k, ()))
            if n > retention.cap(k):
                drop[k] = n - retention.cap(k)
        if now is not None:
            oldest = now - retention.max_age_seconds
            aged: dict[str, int] = {}
            for event in self._events.values():
                if event.time >= oldest:
                    break
                k = bucket_of(event)
                aged[k] = aged.get(k, 0) + 1
            for event in incoming:
                if event.time >= oldest:
                    break
                k = bucket_of(event)
                aged[k] = aged.get(k, 0) + 1
            for k, n in aged.items():
                drop[k] = max(drop.get(k, 0), n)
        held = len(self._events) + len(incoming) - sum(drop.values())
        if held > retention.max_count:
            sizes = {k: len(q) for k, q in buckets.items()}
            for k, new in added.items():
                sizes[k] = sizes.get(k, 0) + len(new)
            goal = retention.max_count - (retention.max_count // 20 if len(sizes) > SLACK_AT
                                          else 0)

            def front(k: str, i: int) -> int:  # the i-th oldest event of bucket k
                q = buckets.get(k, ())
                return q[i].seq if i < len(q) else added[k][i - len(q)].seq
            heap = [(drop.get(k, 0) - n, front(k, drop.get(k, 0)), k)
                    for k, n in sizes.items() if n > drop.get(k, 0)]
            heapq.heapify(heap)
            while held > goal and heap:
                negative, _, k = heapq.heappop(heap)
                gone = drop[k] = drop.get(k, 0) + 1
                held -= 1
                if negative + 1 < 0:
                    heapq.heappush(heap, (negative + 1, front(k, gone), k))
        return {k: n for k, n in drop.items() if n > 0}

    def _dropped(self, plan: dict[str, int], incoming: list[Event]) -> list[Event]:
        """The events ``plan`` drops (of those held and of ``incoming``)."""
        added: dict[str, list[Event]] = {}
        if incoming:
            for event in incoming:
                added.setdefault(bucket_of(event), []).append(event)
        out: list[Event] = []
        for k, n in plan.items():
            q = self._buckets.get(k, deque())
            out.extend(itertools.islice(q, min(n, len(q))))
            if n > len(q):
                out.extend(added[k][:n - len(q)])
        return out

    def _page_of(self, seq: int) -> int:
        return self._keys[bisect.bisect_right(self._keys, seq) - 1]

    def _drop(self, plan: dict[str, int]) -> None:
        """Drop the events ``plan`` says from memory (the pages emptied or compacted
        were handled in the store by the caller; ``_pages`` follows)."""
        held, pages, empty = self._events, self._pages, self._empty
        for k, n in plan.items():
            q = self._buckets.get(k)
            if q is None:
                continue
            for _ in range(n):
                event = q.popleft()
                del held[event.seq]
                key = self._page_of(event.seq)
                page = pages[key]
                page[1] -= 1
                if page[1] <= 0:
                    empty.add(key)
            if not q:
                del self._buckets[k]

    def _retire(self, keys: set[int]) -> None:
        """Forget pages (deleted from the store). Their keys stay in ``_keys`` until
        it is twice as long as needed (no event held is in their range, so a
        bisection never lands on one for an event held)."""
        for key in keys:
            self._pages.pop(key, None)
        self._empty -= keys
        if len(self._keys) > 2 * len(self._pages) + 64:
            self._keys = sorted(self._pages)

    def _compact(self, key: int) -> list[Event]:
        """The events held of page ``key``, oldest first."""
        last = self._pages[key][0]
        held = self._events
        return [held[seq] for seq in range(key, last + 1) if seq in held]

    def refresh(self) -> int:
        """Catch up with what another process (the previous leader) stored since this
        log was read: the new sequence and the events after the newest held, without
        the dropped ones; one listing and one read per new page (a follower refreshes
        now and then, so a takeover reads only the last few). A page the leader
        rewrote with fewer events (compacted) reads the whole log again. Returns how
        many events were read."""
        with self._lock:
            try:
                value, version = self.ns.get("/seq")
            except NotFound:
                return 0
            if version == self._seq_version:
                return 0
            stored = {int(k) for k in self.ns.children("/log")}
            held = next(reversed(self._events)) if self._events else 0
            if any(k <= held and k not in self._pages for k in stored):
                before = len(self._events)
                self._events, self._buckets, self._pages, self._keys = {}, {}, {}, []
                self._empty = set()
                self._load()
                return max(len(self._events) - before, 0)
            missing = {k for k in self._pages if k not in stored}
            for key in missing:
                last = self._pages[key][0]  # dropped by the retention meanwhile
                for seq in range(key, last + 1):
                    event = self._events.pop(seq, None)
                    if event is not None:
                        q = self._buckets[bucket_of(event)]
                        q.remove(event)
                        if not q:
                            del self._buckets[bucket_of(event)]
            self._retire(missing)
            read = 0
            for key in sorted(k for k in stored if k > held):
                with contextlib.suppress(NotFound):
                    events = _decode(self.ns.get(f"/log/{key:012d}")[0])
                    self._add_page(key, events)
                    read += len(events)
            self._drop(self._plan([], None))
            self._seq, self._seq_version = int(value), version
            return read

    def append(self, events: list[NewEvent]) -> list[Event]:
        """Store a batch of events, in one transaction (callers keep batches within
        ``CHUNK``). The pages whose events are all dropped are deleted in it, and a
        page left holding under a quarter of its events is written again with only
        those (so the store holds at most about four times what is retained)."""
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
            plan = self._plan(kept, events[-1].time)
            dropped = self._dropped(plan, kept)
            gone = {e.seq for e in dropped if e.seq >= kept[0].seq}
            fresh = [e for e in kept if e.seq not in gone] if gone else kept
            pages = _pages(fresh)
            for page, record in pages:
                txn.create(f"/log/{page[0].seq:012d}", record)
            if self._seq_version is None:
                txn.create("/seq", str(seq).encode())
            else:
                txn.set("/seq", str(seq).encode(), self._seq_version)
            lost: dict[int, int] = {}
            for event in dropped:
                if event.seq < kept[0].seq:
                    key = self._page_of(event.seq)
                    lost[key] = lost.get(key, 0) + 1
            for key in self._empty:  # (emptied by a load's or a refresh's retention)
                txn.delete(f"/log/{key:012d}", 0)
            rewrites: list[tuple[int, list[Event]]] = []
            gone_held = {e.seq for e in dropped} if lost else set()
            for key, n in lost.items():
                _, live, total = self._pages[key]
                if live - n <= 0:
                    txn.delete(f"/log/{key:012d}", 0)
                elif (live - n) * 4 < total:
                    left = [e for e in self._compact(key) if e.seq not in gone_held]
                    txn.delete(f"/log/{key:012d}", 0)
                    for page, record in _pages(left):
                        txn.create(f"/log/{page[0].seq:012d}", record)
                    rewrites.append((key, left))
            if self.fence is None:
                self.ns.commit(txn)
            else:  # stored only while this replica still leads
                for op in txn.ops:
                    op.key = self.ns.prefix + op.key
                txn.check(*self.fence)
                self.ns.store.commit(txn)
            self._seq_version = 0 if self._seq_version is None else self._seq_version + 1
            self._seq = seq
            for page, _ in pages:
                self._add_page(page[0].seq, page)
            if gone:  # (the batch's own dropped events were never held)
                for event in dropped:
                    if event.seq in gone:
                        plan[bucket_of(event)] -= 1
            self._drop(plan)
            # the pages emptied are deleted; those rewritten hold their events now
            self._retire(self._empty | {key for key, _ in rewrites})
            for _, left in rewrites:
                for page, _ in _pages(left):
                    self._pages[page[0].seq] = [page[-1].seq, len(page), len(page)]
                    bisect.insort(self._keys, page[0].seq)
            return made

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
            for event in reversed(self._events.values()):
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
