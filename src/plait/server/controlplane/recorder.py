"""The region's event recorder: events made by the parts and the pass, kept until
the loop writes them to the event log (``flush``), each with its actor and request.

``EventRecorder`` is the one owner of the events not stored yet.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

from plait import requestid
from plait.model.redact import redact_text
from plait.scheduler.eventrows import Fields
from plait.server.events import CHUNK, EventLog, NewEvent, new_event


class EventRecorder:
    def __init__(self, log: EventLog, clock: Callable[[], float], metrics: Any,
                 max_kept: int, entitlement_of: Callable[[str], str | None]) -> None:
        """``entitlement_of``: a job's entitlement (None: unknown), for the scheduler's
        events; ``max_kept``: the most events kept when a flush fails (the log's
        retention); ``metrics``: counts each event by kind."""
        self.log, self.clock, self.metrics = log, clock, metrics
        self.max_kept = max_kept
        self.entitlement_of = entitlement_of
        self._pending: list[NewEvent] = []
        self._lock = threading.Lock()

    def record(self, source: str, kind: str, message: str, job: str | None = None,
               entitlement: str | None = None, machine: str | None = None,
               at: float | None = None, *, actor: str | None = None,
               task: int | None = None, op: str | None = None, reason: str | None = None,
               decision: str | None = None, request: str | None = None) -> None:
        """An event for the region's log. Within an API request, its caller is the
        actor and its id the request, unless given; else the source is the actor."""
        # (a URL in a message shows no credential: a gate's, a TaskController's)
        event = NewEvent(self.clock() if at is None else at, source, kind,
                         redact_text(message), job,
                         entitlement, machine,
                         actor or requestid.actor.get() or source, task, op, reason,
                         decision, request or requestid.current.get())
        with self._lock:
            self._pending.append(event)
        self.metrics.event(kind)

    def record_scheduler_events(self, drained: list[Fields]) -> None:
        """The scheduler's events of a pass (``EventRows.take``) for the region's log,
        each of its job's entitlement, as ``record`` makes them (the scheduler the
        actor of those no one asked for)."""
        if not drained:
            return
        counts = Counter[str]()
        made = []
        for (at, job, kind, message, task, machine, op, reason, decision, actor,
             request) in drained:
            made.append(new_event(at, "scheduler", kind, redact_text(message), job,
                                  self.entitlement_of(job), machine,
                                  actor or "scheduler", task, op, reason, decision,
                                  request or requestid.current.get()))
            counts[kind] += 1
        with self._lock:
            self._pending.extend(made)
        for kind, n in counts.items():
            self.metrics.event(kind, n)

    def pending(self) -> list[NewEvent]:
        """The events not stored yet (a copy)."""
        with self._lock:
            return list(self._pending)

    def drop(self) -> int:
        """Forget the events not stored yet (a replica that stopped leading: they tell
        of decisions its last passes could not store); how many there were."""
        with self._lock:
            dropped, self._pending = len(self._pending), []
        return dropped

    def flush(self) -> None:
        """Write the events kept to the log; those not written are kept for the next
        flush (the newest, at most ``max_kept``) and the error raised."""
        with self._lock:
            batch, self._pending = self._pending, []
        for start in range(0, len(batch), CHUNK):
            try:
                self.log.append(batch[start:start + CHUNK])
            except BaseException:
                with self._lock:  # what was not stored is kept for the next flush
                    self._pending[:0] = batch[start:][-self.max_kept:]
                raise
