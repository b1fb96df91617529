"""Stored operations -> the scheduler: ``LogApplier.sync`` applies each job record's
logged operations the scheduler has not applied yet (level-triggered), creating the
job first when it is new here."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

from plait.errors import NotFound, PlaitError
from plait.model import JobSpec
from plait.persist.jobdoc import JobDoc
from plait.persist.jobstore import JobStore
from plait.scheduler import Scheduler
from plait.scheduler.records import JobRecord, TaskRecord
from plait.taskcontrol import signing
from plait.taskcontrol.protocol import (
    RemoteController,
    TaskController,
)

ControllerFor = Callable[[JobSpec], TaskController | RemoteController | None]


class LogApplier:
    def __init__(self, scheduler: Scheduler, jobs: JobStore,
                 controller_for: ControllerFor) -> None:
        self.scheduler = scheduler
        self.jobs = jobs
        self.controller_for = controller_for
        #: per job: the last logged operation applied
        self.applied: dict[str, int] = {}
        #: per job held: what its key is derived from (``signing.key_name``: its name
        #: and id), set whenever its record is made or its controller changes; its
        #: tasks' credentials come from that key (``AgentGateway.credentials``)
        self.key_names: dict[str, str] = {}
        #: (a scheduler shard) jobs of entitlements this scheduler does not hold are
        #: another shard's, or moved here and not read yet (``ControlPlane.reload``)
        self.only_held = False
        #: jobs whose records could not be read or applied by the last ``sync``
        self.failed: set[str] = set()

    def sync(self, now: float, names: list[str] | None = None,
             docs: dict[str, JobDoc] | None = None,
             known: dict[str, JobDoc] | None = None) -> list[str]:
        """Apply the operations of ``names`` (every stored job if None) not applied yet;
        ``docs``: the records of every stored job, read already. ``known``: records
        this process stored itself (a batch of creates): a record read that is still
        the same one (same operations, same latest spec) takes its parsed specs from
        there instead of parsing them again. Returns the errors met (an operation that
        cannot apply is skipped and reported)."""
        errors: list[str] = []
        self.failed = set()
        if names is None and docs is None:
            docs = self.jobs.get_many(self.jobs.names())
        elif docs is None and names and len(names) > 1:
            # the records of a batch of jobs in one read (a burst of creates is
            # hundreds of them; those no longer stored are left out)
            try:
                docs = self.jobs.get_many(list(names))
            except Exception:  # one that cannot be read: each read by itself below
                docs = None
        for name in (names if names is not None else list(docs or ())) or []:
            try:
                if docs is not None:
                    if name not in docs:
                        continue  # no longer stored
                    doc = docs[name]
                else:
                    doc = self.jobs.get(name)
                mine = known.get(name) if known else None
                if (mine is not None and mine.seq == doc.seq and mine.version == doc.version
                        and mine.kept.get(doc.version) == doc.kept.get(doc.version)):
                    doc._parsed.update(mine._parsed)
                errors.extend(self._apply(doc, now))
            except NotFound:
                continue
            except Exception as exc:  # a record that cannot apply must not stall the rest
                self.failed.add(name)  # the caller tries it again
                errors.append(f"job {name}: {type(exc).__name__}: {exc}")
        return errors
    def _apply(self, doc: JobDoc, now: float) -> Iterator[str]:
        sched = self.scheduler
        done = self.applied.get(doc.name, 0)
        if doc.seq <= done:
            return
        entries = [e for e in doc.log if e["seq"] > done]
        if doc.name not in sched.jobs:
            if done:  # finished and removed; the record is gone or about to be
                return
            if self.only_held and doc.entitlement not in sched.allocator.entitlements:
                return
            # the first entries may have been trimmed from the log: start at the
            # latest version
            # (its cause: the latest of the operations it starts from)
            cause = entries[-1].get("request") if entries else None
            if doc.version == 1:
                first = doc.log[0] if doc.log and doc.log[0]["seq"] == 1 else {}
                sched.acting = (first.get("actor"), first.get("request"))
                try:
                    sched.create_job(doc.spec, now, self.controller(doc, doc.spec), cause)
                finally:
                    sched.acting = (None, None)
            else:
                # (a record made whole here, then taken by the scheduler's restore)
                target = doc.target
                job = JobRecord(doc.name, doc.entitlement,
                                [doc.standin(v) for v in range(1, doc.version + 1)], target,
                                self.controller(doc, doc.spec),
                                {i: TaskRecord(i, target) for i in range(doc.spec.task_count)},
                                cause=cause)
                doc.pin(job, range(1, doc.version + 1))
                sched.restore(job, ())
            entries = [e for e in entries if e["op"] in ("restart", "resume", "delete")]
            self._pins(doc, now)
        for entry in entries:
            sched.acting = (entry.get("actor"), entry.get("request"))
            self._caused(doc.name, entry.get("request"))
            try:
                self._apply_one(doc, entry, now)
            except PlaitError as exc:  # refused for good: reported, not retried
                yield f"job {doc.name}: operation {entry['seq']} ({entry['op']}): {exc}"
            finally:
                sched.acting = (None, None)
            self.applied[doc.name] = entry["seq"]  # an unexpected error retries from here
        current = sched.jobs.get(doc.name)
        if current is not None and doc.version > len(current.versions):
            # versions whose log entries were trimmed away before they were applied
            for v in range(len(current.versions) + 1, doc.version + 1):
                sched.append_version(doc.standin(v), now, f"version {v}",
                                     doc.kept_revision(v))
        if current is not None and current.target != doc.target and not current.deleting:
            # (versions kept for pinned tasks were appended as targets above, where
            # their log entries were trimmed)
            sched.retarget(doc.name, doc.target, now, f"version {doc.target}")
        if current is not None:
            self._pins(doc, now)
        self.applied[doc.name] = doc.seq
    def controller(self, doc: JobDoc, spec: JobSpec) -> TaskController | RemoteController | None:
        """``controller_for(spec)``, a remote one signing with this job's key (and the
        job's key name noted, for its tasks' credentials)."""
        self.key_names[doc.name] = signing.key_name(doc.name, doc.uid)
        ctl = self.controller_for(spec)
        if isinstance(ctl, RemoteController) and doc.uid:
            ctl = dataclasses.replace(ctl, key_name=signing.key_name(doc.name, doc.uid))
        return ctl
    def _pins(self, doc: JobDoc, now: float) -> None:
        """The tasks pinned to versions other than the target, as the record says
        (level-triggered: the record holds the Job Control Plane's latest)."""
        job = self.scheduler.jobs.get(doc.name)
        if job is None or job.deleting:
            return
        want = {i: v for i, v in doc.pins.items() if v != job.target and v <= len(job.versions)}
        if want != (job.pins or {}):
            self.scheduler.pin(doc.name, want, now)
    def live_versions(self, name: str) -> set[int]:
        """The versions the in-memory job runs now: its target and its tasks'. Read
        without the pass's lock (an API write trimming versions): the copy of the
        tasks is one step under the interpreter's lock, the pass may change them
        right after, and only ever towards its target."""
        job = self.scheduler.jobs.get(name)
        if job is None:
            return set()
        target = job.target
        return {target} | {task.spec_version for task in list(job.tasks.values())}
    def _caused(self, name: str, cause: str | None) -> None:
        """The job remembers the request of the operation being applied (the desired
        sets it makes name it), and keeps it with its state."""
        self.scheduler.set_cause(name, cause)
    def _apply_one(self, doc: JobDoc, entry: dict[str, Any], now: float) -> None:
        sched = self.scheduler
        op = entry["op"]
        job = sched.job(doc.name)
        if op == "keep":  # a version kept for pinned tasks: not the target
            version = int(entry["version"])
            for v in range(len(job.versions) + 1, version + 1):
                sched.add_version(doc.standin(v), now, doc.kept_revision(v))
        elif op in ("update", "resize", "rollback", "move"):
            version = int(entry["version"])
            if version > len(job.versions):
                for v in range(len(job.versions) + 1, version + 1):
                    spec = doc.standin(v)
                    if spec.task_controller != job.spec.task_controller:
                        # (paces from now on; an answer of the old one is dropped)
                        sched.set_controller(doc.name, self.controller(doc, spec))
                    sched.append_version(spec, now,
                                         entry["message"] if v == version else f"version {v}",
                                         doc.kept_revision(v))
        elif op == "restart":
            sched.restart(doc.name, now, entry.get("index"))
        elif op == "resume":
            sched.resume(doc.name, now)
        elif op == "delete" and not job.deleting:
            sched.delete_job(doc.name, now)
