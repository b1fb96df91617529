"""A job's record as its users asked for it (``/scheduler/jobs/{job}``): the versions it
keeps, each with its revision and runtime key, and the log of the operations on it
(see ``plait.persist.scheduler`` for the layout)."""

from __future__ import annotations

import functools
import hashlib
import json
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from plait import fastjson, requestid
from plait.errors import TooLarge, ValidationError
from plait.model import JobSpec, parse
from plait.model.job import spans
from plait.scheduler.records import NOT_RUNTIME, JobRecord
from plait.store.protocol import MAX_VALUE_BYTES

#: the job record's schema (2: kept versions by number, each with its revision)
JOB_SCHEMA = 2
#: operations kept in a job's log (its history)
LOG_LIMIT = 200
ATTEMPTS = 20


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

    def kept_revision(self, version: int) -> int | None:
        """The stored revision of ``version``, None when it is not kept."""
        return self.revision(version) if version in self.kept else None

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
    return doc, fits(doc)


def fits(doc: JobDoc, needed: Callable[[], set[int]] = set) -> bytes:
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

