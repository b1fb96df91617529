"""Job operations as durable writes on the job records (``JobStore``), with the usage
every stored job holds against its owner's limits."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from plait import fastjson
from plait.errors import Conflict, NotFound, PlaitError, ValidationError
from plait.model import JobSpec, parse
from plait.model.entitlement import NAME_RE
from plait.persist.jobdoc import (
    ATTEMPTS,
    JobDoc,
    Usage,
    fits,
    new_job,
    usage_of,
)
from plait.store.protocol import Namespace, Store, Transaction


class JobStore:
    """Job operations as durable writes: each returns once the job record is stored.

    It keeps what every stored job holds (``usage``: its entitlement, task count and
    a task's resources), from the records read at a rebuild (``seed``) and each write
    since; a write that changes it is checked first by ``admit`` (the owner's limits,
    the quota: ``plait.server.controlplane.owners``), which raises to refuse it, and
    counted at once (a reservation, given back if the write fails), so concurrent
    writes cannot pass a limit together."""

    def __init__(self, store: Store) -> None:
        self.ns = Namespace(store, "/scheduler")
        #: the versions the scheduler in this process runs a job at now (its target
        #: and its tasks'), when it has the job; set by ``PersistentScheduler``
        self.live: Callable[[str], set[int]] = lambda name: set()
        #: per stored job (and each create or change under way): what it holds
        self.usage: dict[str, Usage] = {}
        #: per entitlement: [jobs, tasks] of ``usage``
        self.held: dict[str, list[int]] = {}
        #: checks a change of a job's usage, (name, new, old or None for a new job):
        #: raises to refuse it
        self.admit: Callable[[str, Usage, Usage | None], None] = lambda name, new, old: None
        self._usage_lock = threading.Lock()

    def seed(self, docs: dict[str, JobDoc]) -> None:
        """What the stored jobs hold (every record, read at a rebuild)."""
        with self._usage_lock:
            self.usage, self.held = {}, {}
            for name, doc in docs.items():
                self._count(name, usage_of(doc))

    def _count(self, name: str, new: Usage | None) -> None:
        old = self.usage.pop(name, None)
        if old is not None:
            held = self.held[old[0]]
            held[0] -= 1
            held[1] -= old[1]
            if not held[0]:
                del self.held[old[0]]
        if new is not None:
            self.usage[name] = new
            held = self.held.setdefault(new[0], [0, 0])
            held[0] += 1
            held[1] += new[1]

    def reserve(self, doc: JobDoc) -> Callable[[], None]:
        """Check and count what ``doc`` (a record about to be written) holds; returns
        what gives it back (the write failed, or stored nothing new)."""
        new = usage_of(doc)
        with self._usage_lock:
            old = self.usage.get(doc.name)
            if old == new:
                return lambda: None
            self.admit(doc.name, new, old)
            self._count(doc.name, new)

        def undo() -> None:
            with self._usage_lock:
                if self.usage.get(doc.name) == new:
                    self._count(doc.name, old)
        return undo

    def forget(self, gone: dict[str, Usage | None]) -> None:
        """Jobs whose records are gone (their deletion finished), each with what it
        held when its record was deleted (a new job of the same name since is kept)."""
        with self._usage_lock:
            for name, held in gone.items():
                if held is not None and self.usage.get(name) is held:
                    self._count(name, None)

    def names(self) -> list[str]:
        return sorted(self.ns.children("/jobs"))

    def names_cached(self) -> set[str]:
        """The stored job names (read from the store; a set for membership tests)."""
        return set(self.ns.children("/jobs"))

    def get(self, name: str) -> JobDoc:
        return self._read(name)[0]

    def get_many(self, names: list[str]) -> dict[str, JobDoc]:
        """The records of ``names`` (those still stored), read in one batch."""
        found = self.ns.get_many([f"/jobs/{name}" for name in names if NAME_RE.match(name)])
        return {key[len("/jobs/"):]: JobDoc.from_bytes(value)
                for key, (value, _) in found.items()}

    def _read(self, name: str) -> tuple[JobDoc, int]:
        if not NAME_RE.match(name):
            raise NotFound("job", name)  # no stored job has such a name
        try:
            value, version = self.ns.get(f"/jobs/{name}")
        except NotFound:
            raise NotFound("job", name) from None
        return JobDoc.from_bytes(value), version

    def create(self, spec: JobSpec, now: float) -> tuple[JobDoc, bool]:
        """Store a new job; ``(doc, False)`` when the same job already exists (creates
        are idempotent); a job of that name with another spec is a conflict."""
        doc, value = new_job(spec, now)
        undo = self.reserve(doc)
        try:
            self.ns.create(f"/jobs/{spec.name}", value)
            return doc, True
        except Conflict:
            undo()
            return self._existing(spec), False
        except BaseException:
            undo()
            raise

    def _existing(self, spec: JobSpec, doc: JobDoc | None = None) -> JobDoc:
        """The stored job of ``spec``'s name, when a create finds it: the same spec
        (an idempotent retry), else a conflict."""
        existing = self.get(spec.name) if doc is None else doc
        if existing.deleting:
            raise Conflict(f"job {spec.name}", "absent", "being deleted")
        if existing.spec != spec:
            raise Conflict(f"job {spec.name}", "absent or the same spec",
                           "a job with another spec (use update)")
        return existing

    def create_many(self, batch: list[tuple[JobDoc, bytes]]
                    ) -> list[tuple[JobDoc, bool] | Exception]:
        """Store new jobs (``new_job``'s records) in one transaction: per job what
        ``create`` returns, or the error it raises. Names stored already (and a name
        twice in the batch) are answered as ``create`` answers them, without a write;
        if the transaction fails because another writer stored one of the names
        meanwhile, each job is created by itself; any other failure is raised, with
        nothing of the batch stored."""
        # each new job checked and counted first (``reserve``): one refused is
        # answered so, and not written; one not created after all is given back
        refused: dict[str, Exception] = {}
        undos: dict[str, Callable[[], None]] = {}
        for doc, _ in batch:
            if doc.name not in refused and doc.name not in undos:
                try:
                    undos[doc.name] = self.reserve(doc)
                except PlaitError as exc:
                    refused[doc.name] = exc
        found: dict[str, JobDoc] = {}
        try:
            for attempt in (0, 1):
                results: list[tuple[JobDoc, bool] | Exception | None] = [None] * len(batch)
                txn = Transaction()
                fresh: dict[str, int] = {}
                for i, (doc, value) in enumerate(batch):
                    if doc.name in refused:
                        results[i] = refused[doc.name]
                        continue
                    if doc.name in found or doc.name in fresh:
                        continue  # answered once the batch is stored (or refused)
                    fresh[doc.name] = i
                    txn.create(f"/jobs/{doc.name}", value)
                if not txn.ops:
                    break
                try:
                    self.ns.commit(txn)
                    break
                except Conflict:
                    if attempt:  # stored meanwhile by another writer: one at a time
                        one = [refused[doc.name] if doc.name in refused
                               else self._one(doc, value) for doc, value in batch]
                        made = {r[0].name for r in one
                                if not isinstance(r, BaseException) and r[1]}
                        for name, undo in undos.items():
                            if name not in made:
                                undo()
                        return one
                    # some are stored already (a retried create, most likely): read
                    # which, and write the others
                    found = self.get_many(list(fresh))
        except BaseException:
            for undo in undos.values():
                undo()
            raise
        for name in found:
            if name in undos:
                undos[name]()
        for i in fresh.values():
            results[i] = (batch[i][0], True)
        for i, (doc, _) in enumerate(batch):
            if results[i] is None:
                stored = found.get(doc.name) or batch[fresh[doc.name]][0]
                try:
                    results[i] = (self._existing(doc.spec, stored), False)
                except Conflict as exc:
                    results[i] = exc
        return [r for r in results if r is not None]

    def _one(self, doc: JobDoc, value: bytes) -> tuple[JobDoc, bool] | Exception:
        try:
            self.ns.create(f"/jobs/{doc.name}", value)
            return doc, True
        except Conflict:
            try:
                return self._existing(doc.spec), False
            except (Conflict, NotFound) as exc:
                return exc

    def change(self, name: str, now: float,
               edit: Callable[[JobDoc], dict[str, Any] | None]) -> JobDoc:
        """Read, edit and write back with compare-and-swap, retrying on a race.
        ``edit`` returns the log entry it made, or None for no change."""
        for _ in range(ATTEMPTS):
            doc, version = self._read(name)
            if doc.deleting:
                raise Conflict(f"job {name}", "a live job", "being deleted")
            if edit(doc) is None:
                return doc
            value = fits(doc, lambda: self.running(name))
            undo = self.reserve(doc)
            try:
                self.ns.set(f"/jobs/{name}", value, version)
                return doc
            except Conflict:
                undo()
                continue
            except BaseException:
                undo()
                raise
        raise Conflict(f"job {name}", "a quiet record", "too many concurrent writers")

    def update(self, spec: JobSpec, now: float, pins: dict[int, int] | None = None) -> JobDoc:
        """A new target version. ``pins``: the tasks pinned from now on, in the same
        write (a push promoted to the job's spec: its tasks are not pinned any more)."""
        def edit(doc: JobDoc) -> dict[str, Any] | None:
            if spec.entitlement != doc.entitlement:
                raise ValidationError("entitlement", f"job {spec.name} runs in entitlement "
                                      f"{doc.entitlement!r}; update cannot move it (plait "
                                      "job move)")
            if spec == doc.spec and (pins is None or pins == doc.pins):
                return None
            version = doc.add(spec)
            if pins is not None:
                doc.pins = {i: v for i, v in pins.items() if v != version and v in doc.kept}
            return doc.record(now, "update", f"version {version}", version=version)
        return self.change(spec.name, now, edit)

    def keep(self, spec: JobSpec, now: float,
             canary_of: str | None = None) -> tuple[JobDoc, int]:
        """Keep ``spec`` as a version of its job that only pinned tasks run (a push's or
        a canary's); one identical to a version kept already is that version. Returns
        the record and the version's number. ``canary_of``: ``spec``'s entitlement is
        a canary entitlement of this one (decision 103), where the job may run it."""
        made: list[int] = []

        def edit(doc: JobDoc) -> dict[str, Any] | None:
            if spec.entitlement != doc.entitlement and canary_of != doc.entitlement:
                raise ValidationError("entitlement", f"job {spec.name} runs in entitlement "
                                      f"{doc.entitlement!r}; its versions stay there")
            before = doc.version
            made[:] = [doc.keep(spec)]
            if doc.version == before:
                return None
            return doc.record(now, "keep", f"version {made[0]} kept for pinned tasks",
                              version=made[0])
        return self.change(spec.name, now, edit), made[0]

    def check_keep(self, name: str, spec: JobSpec) -> None:
        """Refuse (``TooLarge``, a 413) a spec that ``keep`` could not store beside
        the versions the job's record holds now; nothing is written. (A push or a
        canary is refused when it is set, not accepted and then aborted.)"""
        doc, _ = self._read(name)
        before = doc.version
        doc.keep(spec)
        if doc.version != before:
            fits(doc, lambda: self.running(name))

    def set_pins(self, name: str, pins: dict[int, int], now: float,
                 message: str = "") -> JobDoc:
        """Which tasks run a kept version other than the target (the Job Control Plane's
        unified spec); tasks not named run the target."""
        def edit(doc: JobDoc) -> dict[str, Any] | None:
            want = {i: v for i, v in pins.items() if v != doc.target}
            for i, v in want.items():
                if v not in doc.kept:
                    raise ValidationError("version", doc.missing(v))
                if not 0 <= i < doc.spec.task_count:
                    raise ValidationError("index", f"job {name} has tasks "
                                          f"0..{doc.spec.task_count - 1}")
            if want == doc.pins:
                return None
            doc.pins = want
            return doc.record(now, "pin", message or f"{len(want)} tasks pinned")
        return self.change(name, now, edit)

    def resize(self, name: str, task_count: int, now: float) -> JobDoc:
        def edit(doc: JobDoc) -> dict[str, Any] | None:
            spec = parse(JobSpec, {**doc.spec.model_dump(mode="json"), "task_count": task_count})
            if spec == doc.spec:
                return None
            before = doc.spec.task_count
            version = doc.add(spec)
            doc.pins = {i: v for i, v in doc.pins.items() if i < task_count}
            return doc.record(now, "resize", f"version {version}: {before} -> {task_count} "
                              "tasks", version=version)
        return self.change(name, now, edit)

    def rollback(self, name: str, version: int, now: float) -> JobDoc:
        def edit(doc: JobDoc) -> dict[str, Any] | None:
            spec = doc.spec_of(version)  # (a version no longer kept: refused)
            if spec.entitlement != doc.entitlement:  # a rollback stays where the job is
                spec = spec.model_copy(update={"entitlement": doc.entitlement})
            made = doc.add(spec)
            return doc.record(now, "rollback", f"version {made}: rollback to version "
                              f"{version}", version=made)
        return self.change(name, now, edit)

    def move(self, name: str, entitlement: str, now: float) -> JobDoc:
        """A new version bound to ``entitlement``; the job is bound to it from now on
        (the caller checked the move: ``Scheduler.check_move``)."""
        def edit(doc: JobDoc) -> dict[str, Any] | None:
            if entitlement == doc.entitlement:
                raise ValidationError("entitlement", f"job {name} already runs in entitlement "
                                                     f"{entitlement!r}")
            source = doc.entitlement
            version = doc.add(doc.spec.model_copy(update={"entitlement": entitlement}))
            doc.entitlement = entitlement
            return doc.record(now, "move", f"version {version}: move from {source} "
                              f"to {entitlement}", version=version, source=source,
                              target=entitlement)
        return self.change(name, now, edit)

    def running(self, name: str) -> set[int]:
        """The versions the scheduler last stored as run by the job's tasks, and its
        target, with those the scheduler in this process runs them at now (the stored
        record lags it by up to a pass: a target the pass just took is not stored
        yet): kept whatever ``keep_versions`` says."""
        live = self.live(name)  # the stored state lags the scheduler by up to a pass
        try:
            value, _ = self.ns.get(f"/state/{name}")
        except NotFound:
            return live  # not applied yet: the scheduler starts at the latest version
        data = fastjson.loads(value)
        run = data["run"] if "run" in data else [row[0] for row in data["tasks"].values()]
        return live | {int(data["target"])} | {int(v) for v in run}

    def restart(self, name: str, index: int | None, now: float) -> JobDoc:
        def edit(doc: JobDoc) -> dict[str, Any] | None:
            if index is not None and not 0 <= index < doc.spec.task_count:
                raise ValidationError("index", f"job {name} has tasks 0..{doc.spec.task_count - 1}")
            what = "whole job" if index is None else f"task {index}"
            return doc.record(now, "restart", what, index=index)
        return self.change(name, now, edit)

    def resume(self, name: str, now: float) -> JobDoc:
        return self.change(name, now, lambda doc: doc.record(now, "resume", "rollout resumed"))

    def delete(self, name: str, now: float) -> JobDoc:
        def edit(doc: JobDoc) -> dict[str, Any] | None:
            doc.deleting = True
            return doc.record(now, "delete", "stopping every task")
        return self.change(name, now, edit)


