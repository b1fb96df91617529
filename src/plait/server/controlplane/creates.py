"""Group commit of job creates: concurrent creates are stored together, in one store
transaction, by one committer thread, and each request is answered once the batch that
holds it is durable.

```
request ── JobDoc + bytes (made in the request) ──> queue ──> committer thread
   ^                                                            │ takes all that waited
   │                                                            │ (up to MAX_BATCH, MAX_BYTES)
   │                                                            v
   │                                          JobStore.create_many: one transaction
   │                                          (one fsync on SQLite, one multi-op on
   │                                           ZooKeeper), then one wake of the pass
   │                                           (each request's own context: its id
   │                                           in the log line, the first one's trace
   │                                           shows the transaction)
   └──── future: (doc, created) or the error ───────────────────┘
```

While one batch is being written (an fsync takes milliseconds), the next requests
queue up, so the batch grows with the load and a quiet server writes each create at
once (no timer, no added wait). A batch is all or nothing: if its transaction fails,
every request in it gets the error and nothing of it is stored. A create of a name
that is stored already (a retried request, two requests for one name) is answered for
itself, as a single create would be (``JobStore.create_many``). A scheduler shard
checks and stores the batch under ``CreateCommitter.lock``, which a handoff of an
entitlement holds too (``JobCommands.create_job`` says why), never under the lock a
pass holds."""

from __future__ import annotations

import contextlib
import contextvars
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from plait import logconfig
from plait.model import JobSpec
from plait.persist.scheduler import JobDoc, new_job
from plait.store.protocol import WouldBlock

if TYPE_CHECKING:
    from plait.server.controlplane.inbox import Inbox
    from plait.server.controlplane.regionstate import RegionState

log = logconfig.get("plait.controlplane.commands")

#: creates stored in one transaction at most
MAX_BATCH = 256
#: bytes of records in one transaction at most (ZooKeeper takes about 1 MiB per request)
MAX_BYTES = 512 * 1024
#: a commit on an event loop (``commit_here``) slower than this (seconds: a slow disk)
#: sends the batches of the next ``INLINE_PAUSE`` seconds to the committer thread
INLINE_SLOW = 0.010
#: ... and waits this long at most for another write to the store (a pass's)
INLINE_WAIT = 0.005
INLINE_PAUSE = 5.0


@dataclass
class Pending:
    """One create waiting for its batch: the record as the request made it."""

    doc: JobDoc
    value: bytes
    answer: Future[tuple[JobDoc, bool]]
    #: the request's context (its id, its caller, its trace): what is done for it on
    #: the committer's thread is done in it
    context: contextvars.Context = field(default_factory=contextvars.copy_context)


class CreateCommitter:
    def __init__(self, state: RegionState, inbox: Inbox) -> None:
        self.state, self.inbox = state, inbox
        self._queue: list[Pending] = []
        self._cond = threading.Condition(threading.Lock())
        self._thread: threading.Thread | None = None
        #: a scheduler shard checks and stores creates under this lock, and a handoff
        #: of an entitlement holds it (``Membership.handoff``): a create either is
        #: stored before the handoff reads the jobs it carries, or is checked after
        #: the entitlement left (and refused). Not the control plane's lock, which a
        #: pass holds: a create never waits for a pass
        self.lock = threading.RLock()
        #: batches written, and the creates in them (what ``plait bench throughput``
        #: and the tests read)
        self.batches = 0
        self.written = 0
        #: a batch is being checked and stored (by the committer or ``commit_here``)
        self._busy = False
        #: ``commit_here`` hands batches to the committer until then (monotonic): its
        #: last commit was slow
        self._inline_after = float("-inf")

    def submit(self, spec: JobSpec) -> Future[tuple[JobDoc, bool]]:
        """Queue a create; the future is answered once it is durably stored (or
        refused). The record is made here, in the request (who asked, its id)."""
        pending = self.prepare(spec)
        self.enqueue([pending])
        return pending.answer

    def prepare(self, spec: JobSpec) -> Pending:
        """A create's record, made in the current context (the request's: who asked,
        its id), not queued yet (``enqueue``)."""
        doc, value = new_job(spec, self.state.clock())
        return Pending(doc, value, Future())

    def enqueue(self, pending: list[Pending]) -> None:
        """Queue creates together: the committer takes none of them before all are
        queued, so a batch from the front end is one transaction (one fsync), not
        split wherever the committer woke up."""
        if not pending:
            return
        with self._cond:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="plait-creates",
                                                daemon=True)
                self._thread.start()
            self._queue.extend(pending)
            self._cond.notify()

    def commit_here(self, pending: list[Pending]) -> bool:
        """Check and store ``pending`` on the calling thread (an event loop: a front
        end's batch), if that waits for nothing but its own fsync: no batch queued or
        being written, the store local and free (``SqliteStore.nowait``), no handoff
        holding ``lock``, and the last commit here not slow. False when it was not
        stored here: the caller queues it (``enqueue``; those already answered, the
        refused, are not taken again). Two thread hand-overs fewer per batch, each of
        which waits for the interpreter while a pass runs."""
        nowait = getattr(self.state.store, "nowait", None)
        if not pending or nowait is None or time.monotonic() < self._inline_after:
            return False
        with self._cond:
            if self._queue or self._busy:
                return False
            self._busy = True
        shard = self.state.config.shard is not None
        try:
            if shard and not self.lock.acquire(blocking=False):
                return False
            try:
                started = time.monotonic()
                with nowait(INLINE_WAIT):
                    self.commit(pending)
                if time.monotonic() - started > INLINE_SLOW:
                    self._inline_after = time.monotonic() + INLINE_PAUSE
                return True
            except WouldBlock:
                return False
            finally:
                if shard:
                    self.lock.release()
        except BaseException as exc:  # every request of the batch is answered
            for p in pending:
                if not p.answer.done():
                    p.answer.set_exception(exc)
            return True
        finally:
            with self._cond:
                self._busy = False
                if self._queue:
                    self._cond.notify()

    def take_stored(self) -> dict[str, JobDoc]:
        """The records this committer stored since the last call (``Inbox.take_stored``)."""
        return self.inbox.take_stored()

    def _take(self) -> list[Pending]:
        with self._cond:
            while not self._queue or self._busy:
                self._cond.wait()
            self._busy = True
            batch: list[Pending] = []
            size = 0
            for p in self._queue:
                if batch and (len(batch) >= MAX_BATCH or size + len(p.value) > MAX_BYTES):
                    break
                batch.append(p)
                size += len(p.value)
            del self._queue[:len(batch)]
            return batch

    def _run(self) -> None:
        while True:
            batch = self._take()
            try:
                self.commit(batch)
            except BaseException as exc:  # every request of the batch is answered
                for p in batch:
                    if not p.answer.done():
                        p.answer.set_exception(exc)
            finally:
                with self._cond:
                    self._busy = False

    def commit(self, batch: list[Pending]) -> None:
        """Check and store ``batch``, then answer each request and wake the pass once."""
        state = self.state
        ready: list[Pending] = []
        with self.lock if state.config.shard is not None else contextlib.nullcontext():
            for p in batch:
                try:
                    state.check_job(p.doc.spec)
                except Exception as exc:
                    p.answer.set_exception(exc)
                    continue
                ready.append(p)
            # (in the first request's context: its trace shows the batch's write)
            context = ready[0].context if ready else contextvars.copy_context()
            results = context.run(state.jobs.create_many, [(p.doc, p.value) for p in ready])
        self.batches += 1
        self.written += sum(1 for r in results if not isinstance(r, BaseException) and r[1])
        created = []
        for p, result in zip(ready, results, strict=True):
            if isinstance(result, BaseException):
                p.answer.set_exception(result)
                continue
            doc, new = result
            if new:
                # (the request's access line says which command; seq: its job's log)
                p.context.run(log.info, "job command acknowledged", job=doc.name,
                              seq=doc.seq, version=doc.version)
                created.append(doc.name)
        self.inbox.stored([p.doc for p, result in zip(ready, results, strict=True)
                           if not isinstance(result, BaseException) and result[1]])
        self.inbox.notify_many(created)  # one wake of the pass for the whole batch
        for p, result in zip(ready, results, strict=True):
            if not isinstance(result, BaseException):
                p.answer.set_result(result)
