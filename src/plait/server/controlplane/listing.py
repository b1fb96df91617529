"""The job list, read without parsing every stored record per request.

A job's view (``Views.job_view``) joins two halves: what its stored record says
(entitlement, latest version and spec, operations logged, whether it is being
deleted) and what the last pass published of its tasks (``JobState``, in memory).
``JobIndex`` keeps the first half of every job, as a ``JobEntry``, and re-reads a
record only when it may have changed:

* a job written by this control plane's API (``touch``, called by ``notify``): read
  again by the next list, so a caller reads its own writes;
* a key the store's watch reports changed (another process: a handoff between
  shards; the scheduler dropping a job whose deletion finished);
* a name the store lists that the index lacks; a name it no longer lists is dropped
  (compared at most every ``CHECK_EVERY`` seconds: a safety net under the watch);
* everything after a rebuild (``reset``: leadership taken, records reloaded).

So a change made elsewhere than through this API shows within about a second, and a
list of 2,000 unchanged jobs reads no record at all. Each job's rendered JSON is kept with
the entry and the ``JobState`` it was made from; both are replaced, never changed,
so a job that neither wrote nor passed since is not rendered again.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from plait.client.status import JOB_STATES, job_status
from plait.model.redact import shown_spec
from plait.model.task import TaskState
from plait.paging import BadRequest, Window, page

#: at most this often (seconds) a list fires the store's watches (SQLite polls its
#: change log) and compares the job names the store lists with the index's; records
#: written through this control plane's API are read again at once (``touch``)
CHECK_EVERY = 1.0

if TYPE_CHECKING:
    from plait.persist.scheduler import JobDoc
    from plait.server.controlplane.jobstate import JobState
    from plait.server.controlplane.regionstate import RegionState


@dataclass(frozen=True)
class JobEntry:
    """What a job's stored record contributes to its view (made once per change of
    the record)."""

    name: str
    entitlement: str
    version: int
    seq: int
    deleting: bool
    task_count: int
    batch: bool
    #: the latest version's spec, serialized (bytes: a third of the memory of its
    #: JSON form as Python objects)
    spec: bytes

    @classmethod
    def of(cls, doc: JobDoc) -> JobEntry:
        spec = doc.spec
        return cls(doc.name, doc.entitlement, doc.target, doc.seq, doc.deleting,
                   spec.task_count, spec.restart.batch,
                   json.dumps(shown_spec(spec.model_dump(mode="json")),
                              separators=(",", ":")).encode())


def render(entry: JobEntry, job: JobState | None) -> dict[str, Any]:
    """A job's view but its spec: its stored half and the last pass's half."""
    counts = job.counts if job is not None else {}
    succeeded = counts.get(TaskState.SUCCEEDED.value, 0)
    failed = counts.get(TaskState.DEAD.value, 0)
    if not entry.batch:
        phase = "running"
    elif failed:
        phase = "failed"  # a task exhausted its retries (the others run on)
    elif (job is not None and job.target == entry.version
          and succeeded == entry.task_count == job.records):
        phase = "complete"
    else:
        phase = "running"
    updated = job.updated if job is not None else 0
    return {
        "name": entry.name, "entitlement": entry.entitlement, "version": entry.version,
        "applied_version": job.target if job else 0,
        "deleting": entry.deleting,
        "task_count": entry.task_count, "tasks": dict(counts),
        "serving": job.serving if job else 0,
        "updated": updated, "halted": job.halted if job else None,
        # a rollout, a restart or a move under way, or an operation stored and not
        # applied yet (a restart just asked for is under way from the start)
        "rollout_active": bool(job is None or job.rollout_active or job.busy
                               or job.applied_operation < entry.seq),
        "moving_from": job.moving_from if job else None,
        "on_entitlement": job.on_entitlement if job else 0,
        "unplaced_reason": job.unplaced_reason if job else None,
        "error": job.error if job else None,
        "unavailable": job.unavailable if job else entry.task_count,
        "batch": entry.batch, "phase": phase, "succeeded": succeeded,
        "failed": failed, "running": counts.get(TaskState.RUNNING.value, 0),
        # the operations stored so far are applied, and nothing is under way
        "applied_operation": job.applied_operation if job else 0,
        "settled": bool(job and job.target == entry.version and not entry.deleting
                        and job.applied_operation >= entry.seq and not job.busy
                        and updated == entry.task_count
                        and job.records == entry.task_count),
    }


def parse_states(raw: str | None, allowed: tuple[str, ...]) -> frozenset[str] | None:
    """A ``state`` filter: one state or several, comma-separated (None: any)."""
    if raw is None:
        return None
    wanted = frozenset(s.strip() for s in raw.split(",") if s.strip())
    unknown = sorted(wanted - set(allowed))
    if unknown or not wanted:
        raise BadRequest("state", f"{raw!r} is not one of {', '.join(allowed)} "
                                  "(several: comma-separated)")
    return wanted


class JobIndex:
    def __init__(self, state: RegionState,
                 job_states: Callable[[], dict[str, JobState]]) -> None:
        """``job_states``: what the last pass published of each job (``Views``)."""
        self.state, self.job_states = state, job_states
        #: name -> the stored half of its view
        self._entries: dict[str, JobEntry] = {}
        #: the sorted names of ``_entries``
        self._names: list[str] = []
        #: name -> (entry, state, status, JSON): the view made from both
        self._rendered: dict[str, tuple[JobEntry, JobState | None, str, bytes]] = {}
        self._lock = threading.Lock()
        self._refreshing = threading.Lock()
        self._dirty: set[str] = set()
        self._all = True
        self._cancel: Callable[[], None] | None = None
        #: records read by the last refresh (what a list cost the store)
        self.last_read = 0
        #: when the names were last compared with the store's (monotonic seconds)
        self._checked = float("-inf")

    # -- keeping current -------------------------------------------------------------------
    def touch(self, name: str) -> None:
        """The job's record was written here: read it again before the next list."""
        with self._lock:
            self._dirty.add(name)

    def reset(self) -> None:
        """Read every record again before the next list (a rebuild)."""
        with self._lock:
            self._all = True

    def _changed(self, path: str) -> None:
        head, _, name = path.rpartition("/")
        if head.endswith("/jobs") and name:
            self.touch(name)

    def _watch(self) -> None:
        if self._cancel is None:
            try:
                self._cancel = self.state.jobs.ns.watch("/jobs", self._changed)
            except Exception:  # (no watch: the names and touches still keep it current)
                self._cancel = lambda: None

    def close(self) -> None:
        if self._cancel is not None:
            self._cancel()
            self._cancel = None

    def jobs_of(self, entitlement: str) -> list[str]:
        """The stored jobs of ``entitlement`` (those being deleted too), the store's
        names compared now (a record written a moment ago included)."""
        self._checked = float("-inf")
        self.refresh()
        with self._lock:
            return sorted(n for n, e in self._entries.items() if e.entitlement == entitlement)

    def refresh(self) -> None:
        """Bring the index up to the store: re-read the records marked changed; at
        most every ``CHECK_EVERY`` seconds also fire the store's watches (SQLite
        polls them) and compare the names it lists (every record, the first time)."""
        with self._refreshing:
            self._watch()
            now = time.monotonic()
            check = self._all or now - self._checked >= CHECK_EVERY
            if check:
                poll: Any = getattr(self.state.store, "poll", None)
                if poll is not None:
                    poll()  # (SQLite: watches fire when polled)
            with self._lock:
                full, self._all = self._all, False
                dirty, self._dirty = self._dirty, set()
            have = self._entries
            try:
                listed = set(self.state.jobs.names()) if check else None
                if listed is None:
                    read = sorted(dirty)
                elif full:
                    read = sorted(listed)
                else:
                    read = sorted((dirty | (listed - have.keys())) & listed)
                docs = self.state.jobs.get_many(read) if read else {}
            except BaseException:
                with self._lock:  # tried again by the next refresh
                    self._all |= full
                    self._dirty |= dirty
                raise
            entries = {} if full else dict(have)
            for name in read:
                doc = docs.get(name)
                if doc is not None:
                    entries[name] = JobEntry.of(doc)
                else:
                    entries.pop(name, None)  # (gone meanwhile)
            if listed is not None:
                for name in [n for n in entries if n not in listed]:
                    del entries[name]
                self._checked = now
            if entries.keys() != have.keys():
                self._names = sorted(entries)
                for name in [n for n in list(self._rendered) if n not in entries]:
                    self._rendered.pop(name, None)  # (lists may add to it meanwhile)
            self._entries = entries
            self.last_read = len(read)

    # -- reading ---------------------------------------------------------------------------
    def _json(self, entry: JobEntry, state: JobState | None) -> tuple[str, bytes]:
        """The job's status and its view's JSON (made again only when its record or
        its published state was replaced)."""
        kept = self._rendered.get(entry.name)
        if kept is not None and kept[0] is entry and kept[1] is state:
            return kept[2], kept[3]
        view = render(entry, state)
        data = json.dumps(view, separators=(",", ":")).encode()
        made = (entry, state, job_status(view), data[:-1] + b',"spec":' + entry.spec + b"}")
        self._rendered[entry.name] = made
        return made[2], made[3]

    def page(self, win: Window, entitlements: set[str] | None,
             states: frozenset[str] | None) -> tuple[list[bytes], str | None]:
        """The JSON of the jobs of a page (each job once, by name), among the
        ``entitlements`` given (None: any) in one of ``states`` (None: any)."""
        self.refresh()
        entries, views = self._entries, self.job_states()

        def wanted(name: str | int) -> bytes | None:
            entry = entries.get(str(name))
            if entry is None:
                return None
            if entitlements is not None and entry.entitlement not in entitlements:
                return None
            status, data = self._json(entry, views.get(entry.name))
            if states is not None and status not in states:
                return None
            return data

        return page(self._names, win, wanted)


__all__ = ["JOB_STATES", "JobEntry", "JobIndex", "parse_states", "render"]
