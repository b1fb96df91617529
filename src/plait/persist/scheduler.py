"""The scheduler's records in the store, and the rebuild after a restart.

Layout in the ``/scheduler`` namespace (records carry a schema version):

    /scheduler/jobs/{job}    what users asked for: the versions it keeps (its last
                             ``keep_versions`` and those its tasks run, each with its
                             revision) and a log of the operations on the job (create,
                             update, resize, rollback, move, restart, resume, delete),
                             each with a sequence number.
                             Written by the front end with compare-and-swap; a write
                             that returned is an acknowledged operation.
    /scheduler/state/{job}   the scheduler's view of its tasks: version, state, machine,
                             discovery flag, the operation under way; and the last
                             operation of the log it applied. Written by the scheduler.
                             A job whose record would pass ``PART_BYTES`` keeps its
                             tasks in parts, /scheduler/state/{job}~1, ~2, ...

The scheduler follows the job records (level-triggered): ``sync`` applies every
logged operation it has not applied yet, ``save`` writes the state of the jobs
that changed, and ``load`` rebuilds a scheduler from both after a restart. Offers
and acks that were not carried out yet are not kept: the rebuilt scheduler offers
them again under new operation ids (``op_counter`` is kept, so ids never repeat).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import secrets
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from plait import fastjson, requestid
from plait.errors import Conflict, NotFound, PlaitError, TooLarge, ValidationError
from plait.model import JobSpec, parse
from plait.model.entitlement import NAME_RE
from plait.model.job import spans
from plait.model.task import TaskState
from plait.persist.allocator import PersistentAllocator
from plait.persist.parts import index_parts
from plait.scheduler import Scheduler
from plait.scheduler.machinesets import DesiredSet
from plait.scheduler.records import NOT_RUNTIME, SEQUENCE_BLOCK, JobRecord, TaskRecord
from plait.store.protocol import MAX_VALUE_BYTES, Namespace, Store, Transaction
from plait.taskcontrol import signing
from plait.taskcontrol.protocol import (
    RemoteController,
    TaskController,
    op_from_wire,
    op_to_wire,
)

SCHEMA = 1
#: the schema of a state record split into parts (``PersistentScheduler.records``)
SPLIT_SCHEMA = 2
#: a state record above this size is split: its tasks go into parts of at most this
#: size (``/state/{job}~1``, ``~2``...: ``~`` is never in a job's name), under the
#: store's limit per record
PART_BYTES = 800_000
#: tasks of a job past which its state record is split, and tasks per part
PART_TASKS = 2048
#: tasks in a machine's desired set past which a save reads it whole, once, by job
#: (a look-up per task searches the set in C; a read goes over it once in Python)
_READ_SET_AFTER = 16
#: the job record's schema (2: kept versions by number, each with its revision)
JOB_SCHEMA = 2
#: operations kept in a job's log (its history)
LOG_LIMIT = 200
_ATTEMPTS = 20

ControllerFor = Callable[[JobSpec], TaskController | RemoteController | None]


def runtime_key(spec: JobSpec, dumped: dict[str, Any] | None = None) -> str:
    """What a version runs, as a short digest: two versions with the same key run the
    same way (``same_runtime``), so a task moved between them is not restarted.
    ``dumped``: the spec's JSON form, when the caller made it already. (The digest is
    of the spec's JSON form with the fields that do not change how it runs set to
    fixed values; keys are stored with versions, so it never changes.)"""
    return _runtime_of(spec.model_dump(mode="json") if dumped is None else dumped)


def _runtime_of(dumped: dict[str, Any]) -> str:
    """``runtime_key`` of a spec's JSON form."""
    runs = dict(dumped)
    for key, default in ADDED_FIELDS.items():
        if runs.get(key, default) == default:
            runs.pop(key, None)  # (as versions stored before the field existed say)
    for key, value in _fixed_not_runtime().items():
        if value is _ABSENT_FIELD:
            runs.pop(key, None)
        else:
            runs[key] = value
    return hashlib.blake2b(json.dumps(runs, sort_keys=True).encode(),
                           digest_size=12).hexdigest()


_ABSENT_FIELD = object()

#: spec fields added after versions were stored, with their JSON default: a version
#: that leaves one at its default runs as the stored versions without it did (its
#: ``runtime_key`` is theirs: an upgrade of plait restarts no task)
ADDED_FIELDS: dict[str, Any] = {"fence": None}


@functools.cache
def _fixed_not_runtime() -> dict[str, Any]:
    """``NOT_RUNTIME``'s fields in a spec's JSON form (or absent from it)."""
    any_spec = JobSpec.model_validate({"name": "x", "entitlement": "x", "command": "x",
                                       "task_count": 1, "resources": {"cpu": 1}})
    fixed = any_spec.model_copy(update=NOT_RUNTIME).model_dump(mode="json")
    return {key: fixed.get(key, _ABSENT_FIELD) for key in NOT_RUNTIME}


@dataclass
class JobDoc:
    """A job as its users asked for it: its latest version and the versions it keeps
    (``spec.keep_versions`` of the latest, and those its tasks still run).

    Kept versions stay as stored (JSON) until one is asked for (``spec_of``): a write
    parses only the latest. Each kept version carries its *revision*, the first
    version that runs the same way (``runtime_key``); the scheduler takes revisions
    from here, so a trimmed version never changes what a running task is."""

    name: str
    entitlement: str
    #: the latest version's number (versions are numbered 1, 2, ... for good)
    version: int
    #: kept versions: number -> {"spec": JSON, "revision": int, "runtime": key}; a
    #: job's first version is stored without its key until a second is added
    kept: dict[int, dict[str, Any]]
    seq: int = 0
    log: list[dict[str, Any]] = field(default_factory=list)
    deleting: bool = False
    #: the version the job's tasks run (its target), when it is not the latest: the
    #: Job Control Plane keeps versions (``keep``) that only pinned tasks run
    stable: int | None = None
    #: task index -> the version it runs instead of the target (``plait.jcp``'s
    #: unified spec), as the Job Control Plane last wrote it
    pins: dict[int, int] = field(default_factory=dict)
    #: this job's id, made at its create: state kept apart from the record (its
    #: autoscale policy, its intents, its TaskControl key) belongs to this job and to
    #: no job made later under the same name. "": a job stored before jobs had ids
    uid: str = ""
    _parsed: dict[int, JobSpec] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def new(cls, spec: JobSpec) -> JobDoc:
        doc = cls(spec.name, spec.entitlement, 0, {})
        doc.add(spec)
        return doc

    @property
    def target(self) -> int:
        """The version the job's tasks run unless pinned: the latest, but for versions
        kept for pinned tasks since."""
        return self.version if self.stable is None else self.stable

    @property
    def spec(self) -> JobSpec:
        """The target version's spec (the job intent)."""
        return self.spec_of(self.target)

    def spec_of(self, version: int) -> JobSpec:
        """Version ``version``'s spec; a version never made, or no longer kept, is a
        ``ValidationError`` that names the versions kept."""
        found = self._parsed.get(version)
        if found is None:
            entry = self.kept.get(version)
            if entry is None:
                raise ValidationError("version", self.missing(version))
            found = self._parsed[version] = parse(JobSpec, entry["spec"])
        return found

    def missing(self, version: int) -> str:
        if not 1 <= version <= self.version:
            kept = sorted(self.kept)
            if kept and kept[0] > 1:  # (those before are gone: name the ones to use)
                return (f"job {self.name} has versions 1..{self.version}, of which it "
                        f"keeps {spans(kept)}")
            return f"job {self.name} has versions 1..{self.version}"
        return (f"version {version} of job {self.name} is no longer kept (it keeps its "
                f"last {self.spec.keep_versions} versions and those its tasks run: "
                f"{spans(sorted(self.kept))})")

    def revision(self, version: int) -> int:
        return int(self.kept[version]["revision"])

    def standin(self, version: int) -> JobSpec:
        """Version ``version``'s spec, or for one no longer kept the next kept one: the
        scheduler's versions are a list by number, and a trimmed version is one no
        task runs (``JobStore.running``) nor will (tasks only move to the target)."""
        if version in self.kept:
            return self.spec_of(version)
        return self.spec_of(min(v for v in self.kept if v > version))

    def pin(self, job: JobRecord, versions: range) -> None:
        """Give the scheduler's record the stored revisions of ``versions``."""
        for v in versions:
            if v in self.kept:
                job.pin_revision(v, self.revision(v))

    def add(self, spec: JobSpec) -> int:
        """Append ``spec`` as the next version, the job's target; returns its number."""
        self.stable = None
        return self._append(spec)

    def keep(self, spec: JobSpec) -> int:
        """Append ``spec`` as the next version without making it the target (tasks run
        it once pinned to it); an identical version already kept is reused. Returns
        its number."""
        for version, _entry in sorted(self.kept.items()):
            if version != self.target and self.spec_of(version) == spec:
                return version
        target = self.target
        made = self._append(spec)
        self.stable = target
        return made

    def needed(self) -> set[int]:
        """The versions the record itself needs: its target and those tasks are pinned
        to."""
        return {self.target, *self.pins.values()}

    def _append(self, spec: JobSpec) -> int:
        dumped = spec.model_dump(mode="json")
        self.version += 1
        entry: dict[str, Any] = {"spec": dumped, "revision": self.version}
        if self.kept:
            # the first kept version that runs the same way gives the revision; a
            # version stored without its key (a job's first: nothing to compare it
            # with then, and a create is the hot path) gets it now, from its stored
            # form, the digest it would have had
            key = entry["runtime"] = _runtime_of(dumped)
            for _, e in sorted(self.kept.items()):
                if "runtime" not in e:
                    e["runtime"] = _runtime_of(e["spec"])
                if e["runtime"] == key:
                    entry["revision"] = int(e["revision"])
                    break
        self.kept[self.version] = entry
        self._parsed[self.version] = spec
        return self.version

    def trim(self, needed: set[int]) -> None:
        """Drop the versions past the latest ``keep_versions`` that are not
        ``needed`` (run by tasks, or the scheduler's target)."""
        keep = self.spec.keep_versions
        for version in sorted(self.kept):
            if len(self.kept) <= keep:
                break
            if version not in needed and version != self.version and (
                    version not in self.needed()):
                del self.kept[version]
                self._parsed.pop(version, None)

    def record(self, now: float, op: str, message: str, **args: Any) -> dict[str, Any]:
        self.seq += 1
        entry = {"seq": self.seq, "time": now, "op": op, "message": message, **args}
        # who asked (within an API request): the events the operation raises say so
        for key, var in (("actor", requestid.actor), ("request", requestid.current)):
            value = var.get()
            if value is not None:
                entry.setdefault(key, value)
        self.log.append(entry)
        del self.log[:-LOG_LIMIT]
        return entry

    def to_bytes(self) -> bytes:
        return fastjson.dumps({
            "schema": JOB_SCHEMA, "name": self.name, "entitlement": self.entitlement,
            "version": self.version,
            "versions": {str(v): entry for v, entry in self.kept.items()},
            "seq": self.seq, "log": self.log, "deleting": self.deleting,
            **({} if self.stable is None else {"stable": self.stable}),
            **({"pins": {str(i): v for i, v in sorted(self.pins.items())}}
               if self.pins else {}),
            **({"uid": self.uid} if self.uid else {}),
        }, sort_keys=True)

    @classmethod
    def from_bytes(cls, value: bytes) -> JobDoc:
        data = fastjson.loads(value)
        schema = int(data.get("schema", 1))
        if schema > JOB_SCHEMA:
            raise ValidationError("schema", f"job record schema {data['schema']} is newer than "
                                            f"this plait ({JOB_SCHEMA})")
        doc = cls(data["name"], data["entitlement"], 0, {}, int(data["seq"]),
                  list(data["log"]), bool(data.get("deleting", False)),
                  uid=str(data.get("uid", "")))
        if schema >= 2:
            doc.version = int(data["version"])
            doc.kept = {int(v): entry for v, entry in data["versions"].items()}
            if data.get("stable") is not None:
                doc.stable = int(data["stable"])
            doc.pins = {int(i): int(v) for i, v in data.get("pins", {}).items()}
        else:  # every version in a list (records before versions were trimmed)
            for raw in data["versions"]:
                doc.add(parse(JobSpec, raw))
        return doc


def new_job(spec: JobSpec, now: float) -> tuple[JobDoc, bytes]:
    """A new job's record and its stored form (who asked, within an API request, is
    recorded with its create)."""
    doc = JobDoc.new(spec)
    doc.uid = secrets.token_hex(8)
    doc.record(now, "create", f"created with {spec.task_count} tasks", version=1)
    return doc, _fits(doc)


def _fits(doc: JobDoc, needed: Callable[[], set[int]] = set) -> bytes:
    """The job's record, trimmed to the versions it keeps; if it is still too large for
    the store, the oldest versions that nothing needs go first; else a 413 that says
    so, with nothing written. ``needed``: the versions tasks run (read when used)."""
    if len(doc.kept) > doc.spec.keep_versions:
        doc.trim(needed())
    value = doc.to_bytes()
    if len(value) > MAX_VALUE_BYTES:
        must = needed() | {doc.version} | doc.needed()
        for version in sorted(doc.kept):
            if len(value) <= MAX_VALUE_BYTES:
                break
            if version not in must:
                del doc.kept[version]
                doc._parsed.pop(version, None)
                value = doc.to_bytes()
    if len(value) > MAX_VALUE_BYTES:
        raise TooLarge(f"job {doc.name}: its record would be {len(value):,} bytes even with "
                       "only the versions its tasks run, over the store's limit of "
                       f"{MAX_VALUE_BYTES:,} bytes: nothing was stored (make the spec "
                       "smaller)")
    return value


#: what a job's record holds against its owner's limits: its entitlement, its task
#: count and a task's resources (of its latest version)
Usage = tuple[str, int, Any]


def usage_of(doc: JobDoc) -> Usage:
    spec = doc.spec
    return doc.entitlement, spec.task_count, spec.resources


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
        for _ in range(_ATTEMPTS):
            doc, version = self._read(name)
            if doc.deleting:
                raise Conflict(f"job {name}", "a live job", "being deleted")
            if edit(doc) is None:
                return doc
            value = _fits(doc, lambda: self.running(name))
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
            _fits(doc, lambda: self.running(name))

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


# -- the scheduler's side ------------------------------------------------------------------
_TASK_STATES = {s.value: s for s in TaskState}


def _task_state(job: JobRecord, rec: TaskRecord, desired: bool, fleet_name: Callable[[int], str]
                ) -> list[Any]:
    if rec.apart is None:  # (the fields kept apart all at their defaults)
        return [rec.spec_version, rec.state.value,
                None if rec.machine is None else fleet_name(rec.machine), desired,
                rec.serving, rec.healthy, None if rec.op is None else op_to_wire(rec.op),
                rec.op_costly, rec.restart, None, None, rec.healthy_since, None, None, False,
                rec.endpoint]
    return [rec.spec_version, rec.state.value,
            None if rec.machine is None else fleet_name(rec.machine), desired, rec.serving,
            rec.healthy, None if rec.op is None else op_to_wire(rec.op), rec.op_costly,
            rec.restart, rec.parked, rec.lost_since, rec.healthy_since, rec.exit_code,
            rec.unhealthy_since, rec.served, rec.endpoint]


class WarmCopy(Protocol):
    """The records as a follower keeps them: ``plait.persist.warm.WarmRecords``."""

    docs: dict[str, tuple[JobDoc, int]]
    states: dict[str, tuple[bytes, int]]


class PersistentScheduler:
    """Keeps a scheduler and the store in step: ``sync`` applies stored operations,
    ``save`` writes the state of the jobs that changed."""

    def __init__(self, scheduler: Scheduler, store: Store,
                 controller_for: ControllerFor = lambda spec: None) -> None:
        self.scheduler = scheduler
        self.jobs = JobStore(store)
        self.jobs.live = self._live_versions
        self.ns = self.jobs.ns
        self.controller_for = controller_for
        #: per job: the last logged operation applied
        self.applied: dict[str, int] = {}
        #: per job held: what its key is derived from (``signing.key_name``: its name
        #: and id), set whenever its record is made or its controller changes; its
        #: tasks' credentials come from that key (``AgentGateway.credentials``)
        self.key_names: dict[str, str] = {}
        #: per job: (stored version, bytes) of its state record
        self._saved: dict[str, tuple[int, bytes]] = {}
        #: per job whose state record is split: how many parts it has
        self._parts: dict[str, int] = {}
        #: (key, version) every save checks: the election's fence of the replica that
        #: leads (``Election.fence``), or None
        self.fence: tuple[str, int] | None = None
        #: (a scheduler shard) jobs of entitlements this scheduler does not hold are
        #: another shard's, or moved here and not read yet (``ControlPlane.reload``)
        self.only_held = False
        #: from now on the scheduler tells which jobs changed (the first save writes all)
        scheduler.changed_jobs = set(scheduler.jobs)
        #: jobs whose records could not be read or applied by the last ``sync``
        self.failed: set[str] = set()
        #: (stored version, bytes) of the scheduler's own records, kept across a
        #: takeover: ``loans``, when each borrower's revokes of its reclaim window began
        #: (``Scheduler.revoke_starts``: a new leader keeps to the published rate), and
        #: ``rolls``, the machines a profile roll cordoned (``roll_cordoned``: a new
        #: leader lifts those, and never an operator's cordon)
        self._own: dict[str, tuple[int, bytes]] = {}

    # -- stored operations -> scheduler ----------------------------------------------------
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
                    sched.create_job(doc.spec, now, self._controller(doc, doc.spec), cause)
                finally:
                    sched.acting = (None, None)
            else:
                target = doc.target
                job = JobRecord(doc.name, doc.entitlement,
                                [doc.standin(v) for v in range(1, doc.version + 1)], target,
                                self._controller(doc, doc.spec))
                doc.pin(job, range(1, doc.version + 1))
                job.tasks = {i: TaskRecord(i, target) for i in range(doc.spec.task_count)}
                job.cause = cause
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
            doc.pin(current, range(len(current.versions) + 1, doc.version + 1))
            for v in range(len(current.versions) + 1, doc.version + 1):
                sched.append_version(doc.standin(v), now, f"version {v}")
        if current is not None and current.target != doc.target and not current.deleting:
            # (versions kept for pinned tasks were appended as targets above, where
            # their log entries were trimmed)
            sched.retarget(doc.name, doc.target, now, f"version {doc.target}")
        if current is not None:
            self._pins(doc, now)
        self.applied[doc.name] = doc.seq

    def _controller(self, doc: JobDoc, spec: JobSpec) -> TaskController | RemoteController | None:
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

    def _live_versions(self, name: str) -> set[int]:
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
        job = self.scheduler.jobs.get(name)
        if job is not None and job.cause != cause:
            job.cause = cause
            self.scheduler.mark(name)

    def _apply_one(self, doc: JobDoc, entry: dict[str, Any], now: float) -> None:
        sched = self.scheduler
        op = entry["op"]
        job = sched.job(doc.name)
        if op == "keep":  # a version kept for pinned tasks: not the target
            version = int(entry["version"])
            doc.pin(job, range(len(job.versions) + 1, version + 1))
            for v in range(len(job.versions) + 1, version + 1):
                sched.add_version(doc.standin(v), now)
        elif op in ("update", "resize", "rollback", "move"):
            version = int(entry["version"])
            if version > len(job.versions):
                doc.pin(job, range(len(job.versions) + 1, version + 1))
                for v in range(len(job.versions) + 1, version + 1):
                    spec = doc.standin(v)
                    if spec.task_controller != job.spec.task_controller:
                        job.controller = self._controller(doc, spec)  # paces from now on
                        job.in_flight = None  # (an answer of the old one is dropped)
                        job.recheck = None
                    sched.append_version(spec, now,
                                         entry["message"] if v == version else f"version {v}")
        elif op == "restart":
            sched.restart(doc.name, now, entry.get("index"))
        elif op == "resume":
            sched.resume(doc.name, now)
        elif op == "delete" and not job.deleting:
            sched.delete_job(doc.name, now)

    # -- scheduler -> stored state ---------------------------------------------------------
    def snapshot(self, job: JobRecord) -> bytes:
        """The job's state as one record (see ``records``)."""
        return self._whole(job)

    def records(self, job: JobRecord, read: dict[int, dict[str, set[int]]] | None = None
                ) -> list[bytes]:
        """The job's state as the records that store it: one, or for a job of more
        than ``PART_TASKS`` tasks or whose record would pass ``PART_BYTES``, a header
        (every field but the tasks, the number of parts and the versions its tasks
        run) and parts holding the tasks, ``PART_TASKS`` by index each (a part past
        ``PART_BYTES`` split further). A pass that changes a few tasks of a big job
        rewrites their parts only, and nothing is made twice: a job of 100,000 tasks
        is saved at every pass that changes it, for as long as it is deleted."""
        fields = self._fields(job)
        rows = self._rows(job, read)
        if len(rows) <= PART_TASKS:
            whole = fastjson.dumps({**fields, "tasks": rows}, sort_keys=True)
            if len(whole) <= PART_BYTES:
                return [whole]
        parts = index_parts(job.tasks, rows, PART_TASKS, PART_BYTES)
        header = {**fields, "schema": SPLIT_SCHEMA, "tasks": {}, "parts": len(parts),
                  "run": sorted({int(row[0]) for row in rows.values()})}
        return [fastjson.dumps(header, sort_keys=True), *parts]

    def _whole(self, job: JobRecord) -> bytes:
        return fastjson.dumps({**self._fields(job), "tasks": self._rows(job)},
                              sort_keys=True)

    def _rows(self, job: JobRecord, read: dict[int, dict[str, set[int]]] | None = None
              ) -> dict[str, list[Any]]:
        """Each task's row, by its index (as a string). ``read``: machines' desired
        sets read whole, by job, kept by the caller for the other jobs it writes."""
        sched = self.scheduler
        fleet_name = sched.fleet.name
        names: dict[int, str] = {}

        def name(m: int) -> str:  # (made once per machine of the job; a closure and a
            got = names.get(m)    # dict cost a job of one task less than a cache would)
            if got is None:
                got = names[m] = fleet_name(m)
            return got
        tasks = {}
        # whether each task is in its machine's desired set: a search in C of a short
        # set; a large one (hundreds of small tasks, of this job or of many) is read
        # whole once, by job, for every job the save writes (a job of 40 tasks over
        # 40 machines of thousands of other jobs' tasks: a search per task made the
        # job's list of each set, and reading each set for each job cost as much)
        sets, nothing = sched.desired, DesiredSet()
        if read is None:
            read = {}
        for index, rec in job.tasks.items():
            m = rec.machine
            desired = False
            if m is not None:
                have = sets.get(m, nothing)
                if len(have) <= _READ_SET_AFTER:
                    desired = job.ref(index) in have
                else:
                    jobs = read.get(m)
                    if jobs is None:
                        jobs = read[m] = have.by_job()
                    desired = index in jobs.get(job.name, ())
            tasks[str(index)] = _task_state(job, rec, desired, name)
        return tasks

    def _fields(self, job: JobRecord) -> dict[str, Any]:
        """Every field of the job's state record but its tasks."""
        return {
            "schema": SCHEMA, "applied": self.applied.get(job.name, 0),
            "versions": len(job.versions), "target": job.target, "deleting": job.deleting,
            "halted": job.halted, "rollout_active": job.rollout_active,
            "moving_from": job.moving_from, "cause": job.cause,
            "rollout_failures": job.rollout_failures, "failed_tasks": sorted(job.failed_tasks),
            "op_counter": job.op_counter,
            **({"surges": {str(k): v for k, v in sorted(job.surges.items())}}
               if job.surges else {}),
            # a block reserved ahead (records.SEQUENCE_BLOCK)
            "sequence_number": -(-job.sequence_number // SEQUENCE_BLOCK) * SEQUENCE_BLOCK,
        }

    def save(self, allocator: PersistentAllocator | None = None) -> int:
        """Write the state of every job that changed, drop the records of jobs whose
        deletion finished, and (given a deferring allocator) write the placements
        that changed, all in one transaction. Returns the job records written."""
        sched = self.scheduler
        changed = sched.changed_jobs
        sched.changed_jobs = set()
        try:
            return self._save(changed, allocator)
        except BaseException:
            # nothing was written: those jobs are saved on the next pass
            sched.changed_jobs |= set(sched.jobs) if changed is None else changed
            raise

    def _save(self, changed: set[str] | None, allocator: PersistentAllocator | None) -> int:
        sched = self.scheduler
        names = sched.jobs.keys() if changed is None else changed
        txn = Transaction()
        p = self.ns.prefix
        #: by key (a job's name, or a part's ``name~j``): what is written, None: deleted
        pending: dict[str, bytes | None] = {}
        parts: dict[str, int] = {}
        written = 0
        read: dict[int, dict[str, set[int]]] = {}  # (large desired sets, read once)
        for name in sorted(names):
            job = sched.jobs.get(name)
            if job is None:
                continue
            records = self.records(job, read)
            keys = [name] + [f"{name}~{j}" for j in range(1, len(records))]
            touched = False
            for key, data in zip(keys, records, strict=True):
                saved = self._saved.get(key)
                if saved is not None and saved[1] == data:
                    continue
                if saved is None:
                    txn.create(f"{p}/state/{key}", data)
                else:
                    txn.set(f"{p}/state/{key}", data, saved[0])
                pending[key] = data
                touched = True
            for j in range(len(records), self._parts.get(name, 0) + 1):
                saved = self._saved.get(f"{name}~{j}")  # (parts it no longer needs)
                if j and saved is not None:
                    txn.delete(f"{p}/state/{name}~{j}", saved[0])
                    pending[f"{name}~{j}"] = None
                    touched = True
            parts[name] = len(records) - 1
            written += touched
        gone = [n for n in self.applied if n not in sched.jobs] if changed is None else [
            n for n in changed if n not in sched.jobs and n in self.applied]
        for name in gone:
            # the deletion finished: both records go (the state's parts too)
            for key in [name] + [f"{name}~{j}" for j in range(1, self._parts.get(name, 0) + 1)]:
                saved = self._saved.get(key)
                if saved is not None:
                    txn.delete(f"{p}/state/{key}", saved[0])
                pending[key] = None
            try:
                _, version = self.ns.get(f"/jobs/{name}")
                txn.delete(f"{p}/jobs/{name}", version)
            except NotFound:
                pass
            parts[name] = -1
            written += 1
        own: dict[str, bytes] = {}
        for key, data in (
                ("loans", fastjson.dumps({b: sorted(ts) for b, ts in
                                          sched.revoke_starts.items() if ts}, sort_keys=True)),
                ("rolls", fastjson.dumps({"cordoned": sorted(
                    sched.fleet.name(m) for m in sched.roll_cordoned)}))):
            had = self._own.get(key)
            if had is None and data in (b"{}", b'{"cordoned":[]}'):
                continue
            if had is None:
                txn.create(f"{p}/{key}", data)
            elif had[1] != data:
                txn.set(f"{p}/{key}", data, had[0])
            else:
                continue
            own[key] = data
        placed = allocator.flush_into(txn) if allocator is not None else None
        if not txn.ops:
            return 0
        if self.fence is not None:  # applied only while this replica still leads
            txn.check(*self.fence)
        held = {name: self.jobs.usage.get(name) for name in gone}
        self.ns.store.commit(txn)
        if held:
            self.jobs.forget(held)
        for key, data in own.items():
            had = self._own.get(key)
            self._own[key] = (0 if had is None else had[0] + 1, data)
        if placed is not None:
            placed()
        for key, stored in pending.items():
            if stored is None:
                self._saved.pop(key, None)
            else:
                saved = self._saved.get(key)
                self._saved[key] = (0 if saved is None else saved[0] + 1, stored)
        for name, count in parts.items():
            if count < 0:  # (deleted)
                self._parts.pop(name, None)
                self.applied.pop(name, None)
                self.key_names.pop(name, None)
            elif count:
                self._parts[name] = count
            else:
                self._parts.pop(name, None)
        return written

    def part_keys(self, name: str) -> list[str]:
        """The keys (under the namespace) of the parts of the job's split state record,
        as last written."""
        return [f"/state/{name}~{j}" for j in range(1, self._parts.get(name, 0) + 1)]

    def state(self, name: str) -> dict[str, Any] | None:
        """The job's state as last written (its parts' tasks merged in)."""
        saved = self._saved.get(name)
        if saved is None:
            return None
        data = dict(fastjson.loads(saved[1]))
        for j in range(1, self._parts.get(name, 0) + 1):
            part = self._saved.get(f"{name}~{j}")
            if part is not None:
                data["tasks"].update(fastjson.loads(part[1])["tasks"])
        return data

    # -- rebuild ---------------------------------------------------------------------------
    @classmethod
    def load(cls, scheduler: Scheduler, store: Store, now: float,
             controller_for: ControllerFor = lambda spec: None,
             warm: WarmCopy | None = None) -> PersistentScheduler:
        """Rebuild ``scheduler`` (over an allocator already loaded) from the store, then
        apply the operations stored after the state was last written. ``warm``: the
        records as a follower keeps them (``plait.persist.warm``), current already."""
        self = cls(scheduler, store, controller_for)
        if warm is not None:
            docs = {name: doc for name, (doc, _) in warm.docs.items()}
            states = {f"/state/{name}": rec for name, rec in warm.states.items()}
        else:
            # every record in two batched reads (on ZooKeeper: pipelined, not a round
            # trip per job)
            docs = self.jobs.get_many(self.jobs.names())
            states = self.ns.get_many([f"/state/{name}" for name in docs])
        self.jobs.seed(docs)
        for name, doc in docs.items():
            try:
                value, version = states[f"/state/{name}"]
            except KeyError:
                continue  # never applied: sync creates it
            data = fastjson.loads(value)
            if int(data.get("schema", 1)) > SPLIT_SCHEMA:
                raise ValidationError("schema", f"state record of job {name} has schema "
                                      f"{data['schema']}, newer than this plait "
                                      f"({SPLIT_SCHEMA})")
            self._saved[name] = (version, value)
            count = int(data.get("parts", 0))
            if count:  # a split record: its tasks are in its parts
                keys = [f"/state/{name}~{j}" for j in range(1, count + 1)]
                missing = [k for k in keys if k not in states]
                found = {**{k: states[k] for k in keys if k in states},
                         **(self.ns.get_many(missing) if missing else {})}
                for j, key in enumerate(keys, 1):
                    if key not in found:
                        raise ValidationError("state", f"state record of job {name} lacks "
                                              f"part {j} of {count}")
                    part, part_version = found[key]
                    self._saved[f"{name}~{j}"] = (part_version, part)
                    data["tasks"].update(fastjson.loads(part)["tasks"])
                self._parts[name] = count
            self.applied[name] = int(data["applied"])
            self._restore(doc, data)
        for own_key, (own_value, own_version) in self.ns.get_many(
                ["/loans", "/rolls"]).items():
            self._own[own_key.rsplit("/", 1)[1]] = (own_version, own_value)
            kept = fastjson.loads(own_value)
            if own_key.endswith("/loans"):
                scheduler.revoke_starts = {str(b): [float(t) for t in ts]
                                           for b, ts in kept.items()}
            else:
                for machine in kept.get("cordoned", ()):
                    with contextlib.suppress(NotFound):  # (a machine gone since)
                        scheduler.roll_cordoned.add(scheduler.fleet.index_of(machine))
        self.sync(now, docs=docs)
        return self

    def _restore(self, doc: JobDoc, data: dict[str, Any]) -> None:
        sched = self.scheduler
        fleet = sched.fleet
        count = int(data["versions"])
        versions = [doc.standin(v) for v in range(1, count + 1)]
        target = int(data["target"])
        # the entitlement of the version applied (a move stored since is applied by
        # the ``sync`` that follows)
        job = JobRecord(doc.name, versions[target - 1].entitlement, versions, target,
                        self._controller(doc, versions[-1]))
        doc.pin(job, range(1, count + 1))
        job.deleting = bool(data["deleting"])
        job.halted = data["halted"]
        job.rollout_active = bool(data["rollout_active"])
        job.moving_from = data.get("moving_from")  # (absent from records before moves)
        job.cause = data.get("cause")  # (absent from records before request ids)
        job.rollout_failures = int(data["rollout_failures"])
        if data["failed_tasks"]:  # (none: the shared empty set it was made with)
            job.failed_tasks = set(data["failed_tasks"])
        job.op_counter = int(data["op_counter"])
        job.sequence_number = int(data["sequence_number"])
        job.pins = {i: v for i, v in doc.pins.items() if v != target and v <= count} or None
        job.surges = {int(k): int(v) for k, v in data.get("surges", {}).items()} or None
        booked = sched.allocator.jobs.get(doc.name)
        placement = booked.placement if booked is not None else {}
        desired = []
        for key, row in data["tasks"].items():
            (version, state, machine, want, serving, healthy, op, costly, restart, parked,
             lost_since, healthy_since) = row[:12]
            exit_code = row[12] if len(row) > 12 else None  # (records before batch jobs)
            # (records before probe failures were timed)
            unhealthy_since, served = row[13:15] if len(row) > 14 else (None, False)
            endpoint = row[15] if len(row) > 15 else None  # (before endpoints were kept)
            index = int(key)
            m = None if machine is None else fleet.index_of(machine)
            if placement.get(index) != m:
                # the allocator's booking is the truth: a task it holds nowhere waits
                # for placement, one it holds elsewhere is placed there again
                m, state, want, serving, op = None, TaskState.PENDING.value, False, False, None
            rec = TaskRecord(index, int(version), _TASK_STATES[state], m, bool(serving),
                             bool(healthy), None if op is None else op_from_wire(op),
                             bool(costly), bool(restart), parked, lost_since, healthy_since,
                             exit_code, unhealthy_since, bool(served), endpoint)
            job.tasks[index] = rec
            if want:
                desired.append(index)
        sched.restore(job, desired)
