"""The Job Control Plane on the control plane: each job's intents, stored apart from
its spec, and the reconciler that turns them into the unified spec the scheduler runs.

A job's push, sizing and canary intents are stored together at ``/jcp/{job}``
(``plait.jcp.intents.JcpRecord``), each with who wrote it; the job intent is the job's
record itself. After each pass, off the lock, the leader reconciles every job that has
intents (decision 101):

1. the pushed and canary specs are kept as versions of the job (``JobStore.keep``);
2. a sizing intent resizes the job's spec to its count, clamped into [min, max];
3. canaries past their end are dropped; the push's progress is advanced from what
   the scheduler reports of its tasks (``plait.jcp.push``), its gate asked off the
   reconcile (a URL, with a hard total deadline of 5 s, a 64 KiB bound and a bound
   per owner: ``plait.server.controlplane.gates``) or waited for (an external verdict);
4. ``plait.jcp.unify`` computes which task runs which version, and the pins are
   written to the job's record (``JobStore.set_pins``), which the scheduler runs with
   its usual pacing and TaskControl;
5. a push whose last stage (100 %) passed becomes the job's spec; a push rolled back
   or aborted gives its tasks back to the job's spec (a rollout the scheduler halted
   is resumed, so they can go back).

Each change is an event of source ``jcp`` naming the intent's writer.

A record belongs to the job its intents were set on (``JobDoc.uid``, stored with it):
to a job made later under the same name it holds no intent; the reconciler drops it
(retiring its canaries' entitlements), and a write replaces it.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from fractions import Fraction
from typing import TYPE_CHECKING, Any, Protocol

from plait import logconfig, requestid
from plait.errors import Conflict, NotFound, PlaitError, TooLarge, ValidationError
from plait.jcp import Canary, Push, Unified, unify
from plait.jcp.intents import (
    ACTIVE,
    CanaryIntent,
    JcpRecord,
    PushIntent,
    PushStatus,
    SizingIntent,
    StoredCanary,
    StoredPush,
    StoredSizing,
)
from plait.jcp.push import StageHealth, advance, percent, verdict
from plait.model.base import parse
from plait.model.entitlement import Entitlement, Quota, canary_entitlement, check_name
from plait.model.job import JobSpec
from plait.model.redact import shown_intent
from plait.model.task import TaskState
from plait.persist.scheduler import JobDoc, usage_of
from plait.server.controlplane.gates import GateAsker
from plait.store.protocol import Namespace
from plait.tls import verify as tls_verify

if TYPE_CHECKING:
    from plait.server.controlplane.core import ControlPlane

log = logconfig.get("plait.controlplane.jcp")

SCHEMA = 1
#: the stored records are read again this often (another replica may have written)
REFRESH = 5.0
#: the reconciler runs this often (and at once after a write); it looks at the jobs
#: whose intents, records or tasks changed since it last did, and at those whose
#: intents wait for a time (a soak, a stage's timeout, a canary's end) that has come
EVERY = 1.0
#: a job whose intents wait for nothing of the above is looked at this often anyway
QUIET_EVERY = 30.0
_ATTEMPTS = 20
#: the phases of a push under way (a push holding its last stage is not)
PUSHING = frozenset({"rolling", "soaking", "gating"})


class GateAsking(Protocol):
    """What the reconciler asks a push's URL gate through: ``GateAsker`` for real, a
    stand-in answering by a rule in the simulator (``plait.sim.controlplane``)."""

    def ask(self, owner: str, url: str, job: str, stage: int) -> Future[tuple[bool, str]]: ...

    def in_flight(self, owner: str) -> int: ...

    def close(self) -> None: ...


def _actor() -> str | None:
    return requestid.actor.get()


class JobControlPlane:
    def __init__(self, cp: ControlPlane) -> None:
        self.cp = cp
        self.ns = Namespace(cp.store, "/jcp")
        self._lock = threading.Lock()
        #: job -> its intents, as last read or written here
        self.records: dict[str, JcpRecord] = {}
        self._read_at: float | None = None
        #: gates being asked: job -> ((version, stage), the answer to come)
        self._gates: dict[str, tuple[tuple[int, int], Future[tuple[bool, str]]]] = {}
        self.gates: GateAsking = GateAsker(lambda: cp.controllers.url_policy,
                               verify=lambda url: tls_verify(cp.config.ca_file, url))
        self.reconciles = 0
        self._done_at: float | None = None
        #: an intent was written here since the last reconcile
        self._poked = False
        #: jobs to look at in the next reconcile (intents written, the job's record or
        #: its tasks changed: ``touch``), and when each job held must be looked at
        #: again by time (``_next``); a job with neither is not looked at
        self._dirty: set[str] = set()
        self._due: dict[str, float] = {}
        #: the stored bytes of each record held (``_refresh`` parses the records whose
        #: bytes changed: not by version, which starts again at 0 when a record is
        #: deleted and made again)
        self._raw: dict[str, bytes] = {}
        #: jobs left with no intent whose tasks may still be pinned
        self._unpin: set[str] = set()

    # -- the stored records ---------------------------------------------------------------
    def _stored(self, job: str) -> tuple[JcpRecord, str, int | None]:
        """The record at ``job``'s name as stored: its intents, the uid of the job they
        were set on, its version (None: no record)."""
        try:
            value, version = self.ns.get(f"/{job}")
        except NotFound:
            return JcpRecord(), "", None
        rec, uid = self._parse(job, value)
        return rec, uid, version

    @staticmethod
    def _parse(job: str, value: bytes) -> tuple[JcpRecord, str]:
        """A stored record's intents and the uid of the job they were set on."""
        data = json.loads(value)
        if int(data.pop("schema", 1)) > SCHEMA:
            raise ValidationError("schema", f"the intents of job {job} have a schema newer "
                                            f"than this plait ({SCHEMA})")
        uid = str(data.pop("job_uid", ""))
        return parse(JcpRecord, data), uid

    def _uid(self, job: str, deleting: bool = True) -> str | None:
        """The uid of the job now under the name (None: no job, or with ``deleting``
        false, one being deleted)."""
        try:
            doc = self.cp.jobs.get(job)
        except NotFound:
            return None
        return None if doc.deleting and not deleting else doc.uid

    def _read(self, job: str) -> tuple[JcpRecord, int | None]:
        """The intents of the job now under the name (a former job's record holds none
        of its own) and the record's version."""
        rec, uid, version = self._stored(job)
        if version is not None and uid != self._uid(job):
            return JcpRecord(), version
        return rec, version

    def record(self, job: str) -> JcpRecord:
        return self._read(job)[0]

    def _change(self, job: str, edit: Callable[[JcpRecord], JcpRecord | None]) -> JcpRecord:
        """Read, edit, write back with compare-and-swap (an empty record is deleted)."""
        for _ in range(_ATTEMPTS):
            uid = self._uid(job) or ""
            stored, stored_uid, version = self._stored(job)
            stale = version is not None and stored_uid != uid  # (a former job's record)
            rec = JcpRecord() if stale else stored
            new = edit(rec)
            if (new is None or new == rec) and not stale:
                return rec
            new = rec if new is None else new
            value = json.dumps({"schema": SCHEMA, "job_uid": uid,
                                **new.model_dump(mode="json")}, sort_keys=True).encode()
            try:
                if version is None:
                    if not new.empty:
                        self.ns.create(f"/{job}", value)
                elif new.empty:
                    self.ns.delete(f"/{job}", version)
                else:
                    self.ns.set(f"/{job}", value, version)
            except (Conflict, NotFound):
                continue
            if stale:  # (replaced: its canaries' entitlements claim no machine more)
                self._retire_canaries(stored)
            with self._lock:
                if new.empty:
                    self.records.pop(job, None)
                    self._unpin.add(job)  # (its tasks go back to the job's spec)
                else:
                    self.records[job] = new
                self._dirty.add(job)
                self._raw.pop(job, None)  # (parsed again at the next refresh)
            self._poked = True
            self.cp.wake.set()
            return new
        raise Conflict(f"intents of job {job}", "a quiet record", "too many concurrent writers")

    def _job(self, job: str, spec: JobSpec | None = None) -> JobDoc:
        """The job's record (NotFound for an unknown job); ``spec``: a spec for it,
        checked to name it and its entitlement."""
        doc = self.cp.jobs.get(job)
        if doc.deleting:
            raise Conflict(f"job {job}", "a live job", "being deleted")
        if spec is not None:
            if spec.name != job:
                raise ValidationError("spec.name", f"the spec names job {spec.name!r}, the "
                                                   f"path {job!r}")
            if spec.entitlement != doc.entitlement:
                raise ValidationError("spec.entitlement", f"job {job} runs in entitlement "
                                      f"{doc.entitlement!r}; its intents stay there")
            if spec.task_controller is not None:
                self.cp.controllers.check_controller_url(spec.task_controller)
            self.cp.check_job(spec)
        return doc

    def _event(self, job: str, kind: str, message: str, actor: str | None = None) -> None:
        try:
            ent = self.cp.jobs.get(job).entitlement
        except NotFound:
            ent = None
        self.cp.record("jcp", kind, message, job=job, entitlement=ent,
                       actor=actor or _actor() or "jcp")

    # -- push -----------------------------------------------------------------------------
    def put_push(self, job: str, intent: PushIntent) -> dict[str, Any]:
        self._job(job, intent.spec)
        self.cp.jobs.check_keep(job, intent.spec)  # (a 413 now, not an abort later)
        if intent.gate is not None and intent.gate.url is not None:
            try:  # (the rules of TaskControllers' URLs: a tenant's URL either way)
                self.cp.controllers.check_controller_url(intent.gate.url)
            except ValidationError as exc:
                raise ValidationError("gate.url", exc.message.replace(
                    "controller URL", "gate URL")) from None
        now, actor = self.cp.clock(), _actor()

        def edit(rec: JcpRecord) -> JcpRecord:
            status = PushStatus(since=now, message=f"stage 1 ({intent.stages[0]}%) begins")
            return rec.model_copy(update={"push": StoredPush(
                intent=intent, status=status, actor=actor, created=now)})
        self._change(job, edit)
        self._event(job, "push_started", "stages " + " -> ".join(
            f"{s}%" for s in intent.stages) + (f", gate {intent.gate.url or 'external'}"
                                               if intent.gate else ", no gate"))
        return self.push_view(job)

    def push_view(self, job: str) -> dict[str, Any]:
        self._job(job)
        push = self.record(job).push
        if push is None:
            raise NotFound("push of job", job)
        return {"job": job, **shown_intent(push.model_dump(mode="json")),
                "percent": percent(push.intent, push.status)}

    def abort_push(self, job: str) -> dict[str, Any]:
        self._job(job)
        now = self.cp.clock()

        def edit(rec: JcpRecord) -> JcpRecord:
            if rec.push is None:
                raise NotFound("push of job", job)
            if rec.push.status.phase not in ACTIVE:
                raise Conflict(f"push of job {job}", "a push under way",
                               rec.push.status.phase)
            status = rec.push.status.model_copy(update={
                "phase": "aborted", "since": now, "healthy_since": None,
                "message": f"aborted at stage {rec.push.status.stage + 1}; its tasks go "
                           "back to the job's spec"})
            return rec.model_copy(update={"push": rec.push.model_copy(
                update={"status": status})})
        self._change(job, edit)
        self._resume_if_halted(job)
        self._event(job, "push_aborted", "aborted; its tasks go back to the job's spec")
        return self.push_view(job)

    def gate_verdict(self, job: str, passed: bool, message: str) -> dict[str, Any]:
        """An external gate's answer for the stage being gated."""
        self._job(job)
        now = self.cp.clock()
        told: list[PushStatus] = []

        def edit(rec: JcpRecord) -> JcpRecord:
            push = rec.push
            if push is None:
                raise NotFound("push of job", job)
            if push.intent.gate is None or not push.intent.gate.external:
                raise Conflict(f"push of job {job}", "an external gate",
                               "a gate of its own" if push.intent.gate else "no gate")
            if push.status.phase != "gating":
                raise Conflict(f"push of job {job}", "a stage waiting for its gate",
                               f"{push.status.phase}: {push.status.message}")
            status = verdict(push.intent, push.status, passed, message, now)
            told[:] = [status]
            return rec.model_copy(update={"push": push.model_copy(update={"status": status})})
        rec = self._change(job, edit)
        self._event(job, "push_gate_passed" if passed else "push_gate_failed",
                    message or ("passed" if passed else "failed"))
        if told and rec.push is not None:
            self._announce(job, rec.push, told[0])
            if told[0].phase == "rolled_back":
                self._resume_if_halted(job)
        return self.push_view(job)

    # -- sizing ---------------------------------------------------------------------------
    def put_sizing(self, job: str, intent: SizingIntent,
                   actor: str | None = None) -> dict[str, Any]:
        doc = self._job(job)
        self.check_size(doc, intent.size)
        now, actor = self.cp.clock(), actor or _actor()
        before = self.record(job).sizing
        self._change(job, lambda rec: rec.model_copy(update={
            "sizing": StoredSizing(intent=intent, actor=actor, time=now)}))
        if before is None or before.intent != intent:
            self._event(job, "sizing_set", f"{intent.size} tasks (asked {intent.task_count}, "
                        f"within {intent.min}..{intent.max})", actor)
        return self.sizing_view(job)

    def check_size(self, doc: JobDoc, size: int) -> None:
        """Refuse (422, naming the limit or the quota) a size the resize it makes would
        be refused for (``Owners.admit``): the intent is not stored."""
        if size > doc.spec.task_count:
            self.cp.owners.admit(doc.name, (doc.entitlement, size, doc.spec.resources),
                                 usage_of(doc))

    def sizing_view(self, job: str) -> dict[str, Any]:
        self._job(job)
        sizing = self.record(job).sizing
        if sizing is None:
            raise NotFound("sizing intent of job", job)
        return {"job": job, **sizing.model_dump(mode="json"), "size": sizing.intent.size}

    def delete_sizing(self, job: str) -> dict[str, Any]:
        view = self.sizing_view(job)
        self._change(job, lambda rec: rec.model_copy(update={"sizing": None}))
        self._event(job, "sizing_removed", "the job's spec sizes it again")
        return view

    # -- canaries -------------------------------------------------------------------------
    def put_canary(self, job: str, name: str, intent: CanaryIntent) -> dict[str, Any]:
        try:
            check_name(name)  # (it names the canary's role, and its entitlement)
        except ValueError as exc:
            raise ValidationError("canary", str(exc)) from None
        doc = self._job(job, intent.spec)
        if intent.tasks >= doc.spec.task_count:
            raise ValidationError("tasks", (
                f"a canary of {intent.tasks} tasks would run every task of job {job} "
                f"({doc.spec.task_count}): at most {doc.spec.task_count - 1}, so that some "
                "run the job's spec; to run it on every task, push it") if (
                doc.spec.task_count > 1) else (
                f"job {job} has {doc.spec.task_count} tasks: no room for a canary beside "
                "its spec (resize it, or push the spec)"))
        if intent.hardware is not None and intent.hardware not in self.cp.fleet.type_names:
            raise ValidationError("hardware", f"no machine of type {intent.hardware!r} in "
                                  f"this region (types: {', '.join(self.cp.fleet.type_names)})")
        if intent.host_profile is not None:
            self._check_profile_canary(doc.entitlement, intent,
                                       canary_entitlement(doc.entitlement, job, name))
        # (a 413 now, not a reconcile failing later; a host-profile canary's spec names
        # its canary entitlement, a few bytes more than checked here)
        self.cp.jobs.check_keep(job, self._canary_spec(intent))
        now, actor = self.cp.clock(), _actor()

        def edit(rec: JcpRecord) -> JcpRecord:
            old = rec.canaries.get(name)
            same = old is not None and old.intent.spec == intent.spec and (
                old.intent.hardware == intent.hardware) and (
                old.intent.host_profile == intent.host_profile)
            # (one canary entitlement per canary name: another profile rolls over it)
            entitlement = old.entitlement if old is not None and (
                intent.host_profile is not None) else None
            canary = StoredCanary(intent=intent, version=old.version if same and old else None,
                                  entitlement=entitlement, actor=actor, started=now,
                                  until=now + intent.duration_seconds)
            return rec.model_copy(update={"canaries": {**rec.canaries, name: canary}})
        before = self.record(job).canaries.get(name)
        self._change(job, edit)
        if before is not None and before.entitlement is not None and (
                intent.host_profile is None):
            self._retire(before.entitlement)
        where = f" on {intent.hardware} machines" if intent.hardware else ""
        if intent.host_profile is not None:
            where += (f" on machines of their own with host profile {intent.host_profile} "
                      f"(canary entitlement {canary_entitlement(doc.entitlement, job, name)})")
        self._event(job, "canary_started", f"canary {name}: {intent.tasks} tasks{where} for "
                    f"{intent.duration_seconds:g}s")
        return self.canary_view(job, name)

    def canary_view(self, job: str, name: str) -> dict[str, Any]:
        self._job(job)
        canary = self.record(job).canaries.get(name)
        if canary is None:
            raise NotFound("canary", f"{job}/{name}")
        return {"job": job, "name": name, **shown_intent(canary.model_dump(mode="json"))}

    def delete_canary(self, job: str, name: str) -> dict[str, Any]:
        view = self.canary_view(job, name)

        def edit(rec: JcpRecord) -> JcpRecord:
            return rec.model_copy(update={"canaries": {
                k: v for k, v in rec.canaries.items() if k != name}})
        self._change(job, edit)
        if view.get("entitlement"):
            self._retire(str(view["entitlement"]))
        self._event(job, "canary_ended", f"canary {name} ended early; its tasks go back")
        return view

    # -- the whole view -------------------------------------------------------------------
    def intents(self, job: str) -> dict[str, Any]:
        """Every intent of the job and the unified spec they make now."""
        doc = self._job(job)
        rec = self.record(job)
        push = rec.push
        with self.cp.lock:
            sched = self.cp.scheduler.jobs.get(job)
            running = {} if sched is None else {
                i: r.spec_version for i, r in sched.tasks.items()}
        roles = self._roles(doc, rec)
        tasks = [{"index": i, "role": roles.get(i, "stable"),
                  "version": doc.pins.get(i, doc.target), "running": running.get(i)}
                 for i in range(doc.spec.task_count)]
        counts: dict[str, int] = {}
        for i in range(doc.spec.task_count):
            role = roles.get(i, "stable")
            counts[role] = counts.get(role, 0) + 1
        return {
            "job": job,
            "job_intent": {"version": doc.target, "task_count": doc.spec.task_count},
            "push": None if push is None else {
                **shown_intent(push.model_dump(mode="json")),
                "percent": percent(push.intent, push.status)},
            "sizing": None if rec.sizing is None else {
                **rec.sizing.model_dump(mode="json"), "size": rec.sizing.intent.size},
            "canaries": {k: shown_intent(v.model_dump(mode="json"))
                         for k, v in rec.canaries.items()},
            "unified": {"task_count": doc.spec.task_count, "roles": counts, "tasks": tasks},
            "conflicts": list(rec.conflicts),
        }

    @staticmethod
    def _roles(doc: JobDoc, rec: JcpRecord) -> dict[int, str]:
        """The role each pinned task holds, from its pin's version."""
        by_version: dict[int, str] = {}
        for name, canary in rec.canaries.items():
            if canary.version is not None:
                by_version[canary.version] = f"canary:{name}"
        if rec.push is not None and rec.push.status.version is not None and (
                rec.push.status.phase in ACTIVE):
            by_version[rec.push.status.version] = "push"
        return {i: by_version[v] for i, v in doc.pins.items() if v in by_version}

    # -- the reconciler (the leader, after a pass, off the lock) --------------------------
    def due(self, now: float) -> bool:
        return self._read_at is None or now - self._read_at >= REFRESH

    def touch(self, jobs: Iterable[str] | None) -> None:
        """These jobs' records or tasks changed (None: every job's): the next
        reconcile looks at those that have intents."""
        with self._lock:
            if not self.records:
                return
            if jobs is None:
                self._dirty.update(self.records)
            else:
                self._dirty.update(j for j in jobs if j in self.records)

    def _refresh(self, now: float) -> None:
        if self._read_at is not None and now - self._read_at < REFRESH:
            return
        self._read_at = now
        found: dict[str, JcpRecord] = {}
        raw: dict[str, bytes] = {}
        with self._lock:
            held, known = dict(self.records), dict(self._raw)
        try:
            names = self.ns.children("/")
            # (every record in one read; one whose bytes are those held is not parsed
            # again)
            stored = self.ns.get_many([f"/{job}" for job in names])
            for job in names:
                got = stored.get(f"/{job}")
                if got is None:
                    continue  # (deleted meanwhile)
                if known.get(job) == got[0] and job in held:
                    found[job] = held[job]
                else:  # (a former job's too: reconciled away)
                    found[job] = self._parse(job, got[0])[0]
                raw[job] = got[0]
        except NotFound:
            pass
        except (OSError, PlaitError, ValueError) as exc:
            log.warning("intents not read", error=str(exc))
            return
        with self.cp.lock:  # (pins no intent explains: a record deleted before a crash)
            pinned = {n for n, j in self.cp.scheduler.jobs.items() if j.pins}
        with self._lock:
            # (a record written elsewhere, or new here: looked at in this reconcile)
            self._dirty.update(j for j, rec in found.items() if held.get(j) != rec)
            self.records, self._raw = found, raw
            self._unpin |= pinned - found.keys()
            for job in [j for j in self._due if j not in found]:
                del self._due[job]

    def reconcile(self, now: float) -> None:
        """The jobs with intents that may have moved on (``touch``, ``_next``), at most
        once a second (at once after a write)."""
        if not self._poked and self._done_at is not None and now - self._done_at < EVERY:
            return
        self._poked = False
        self._done_at = now
        self._refresh(now)
        with self._lock:
            due = self._due
            jobs = sorted(j for j in self.records if j in self._dirty or due.get(j, 0.0) <= now)
            self._dirty.clear()
            unpin, self._unpin = self._unpin - self.records.keys(), set()
        for job in sorted(unpin):
            try:
                doc = self.cp.jobs.get(job)
                if doc.pins and not doc.deleting:
                    self.cp.jobs.set_pins(job, {}, now, "no intent left: every task runs "
                                                        "the job's spec")
                    self.cp.notify(job)
            except NotFound:
                pass
            except (PlaitError, OSError, ValueError) as exc:
                log.warning("unpinning failed", job=job, error=str(exc))
                with self._lock:
                    self._unpin.add(job)
        for job in jobs:
            after: JcpRecord | None = None
            try:
                after = self._reconcile(job, now)
            except NotFound:
                self._forget(job)
            except (PlaitError, OSError, ValueError) as exc:
                log.warning("reconciling intents failed", job=job, error=str(exc))
            with self._lock:  # (a failed look is tried again in a second)
                self._due[job] = now + EVERY if after is None else self._next(job, after, now)
        with self._lock:
            pushing = {job for job, rec in self.records.items() if rec.push is not None
                       and rec.push.status.phase in PUSHING}
        with self.cp.lock:  # (a profile roll waits for these: decision 104)
            self.cp.scheduler.pushing = pushing
        self.reconciles += 1

    def _forget(self, job: str) -> None:
        """The job its record was written for is gone (deleted, or another job now
        under the name): so are its intents, and its canaries' entitlements claim no
        machine more. A record written meanwhile for the job now under the name is
        left alone."""
        with self._lock:
            kept = self.records.get(job)
        try:
            rec, uid, version = self._stored(job)
        except (PlaitError, OSError, ValueError):
            rec, uid, version = JcpRecord(), "", None
        if version is not None and uid == self._uid(job, deleting=False):
            return  # (the job now under the name's own, and not being deleted)
        for old in (kept, rec if version is not None else None):
            if old is not None:
                self._retire_canaries(old)
        if version is not None:
            with contextlib.suppress(NotFound, Conflict):
                self.ns.delete(f"/{job}", version)
        with self._lock:
            self.records.pop(job, None)
        self._gates.pop(job, None)

    def _retire_canaries(self, rec: JcpRecord) -> None:
        for canary in rec.canaries.values():
            if canary.entitlement is not None:
                self._retire(canary.entitlement)

    def _next(self, job: str, rec: JcpRecord, now: float) -> float:
        """When ``rec``'s job must be looked at again if nothing it reads changes
        (``touch`` brings it forward): the earliest time one of its intents waits for,
        ``QUIET_EVERY`` at the latest."""
        due = now + QUIET_EVERY
        push = rec.push
        if push is not None and push.status.phase in ACTIVE:
            status, intent = push.status, push.intent
            if status.version is None:
                due = now + EVERY  # (its spec is kept at the next look)
            elif status.phase == "rolling":
                due = min(due, status.since + intent.stage_timeout_seconds)
            elif status.phase == "soaking" and status.healthy_since is not None:
                due = min(due, status.healthy_since + intent.soak_seconds)
            elif status.phase == "gating" and intent.gate is not None and (
                    intent.gate.url is not None and job not in self._gates):
                due = now + EVERY  # (its gate is asked at the next look)
        for canary in rec.canaries.values():
            due = min(due, canary.until if canary.version is not None else now + EVERY)
        return due

    def _reconcile(self, job: str, now: float) -> JcpRecord:
        """Look at the job's intents: move them on, pin its tasks; the record as it is
        after."""
        doc = self.cp.jobs.get(job)
        if doc.deleting:
            raise NotFound("job", job)
        rec, uid, version = self._stored(job)
        if version is not None and uid != doc.uid:
            raise NotFound("job", job)  # (its record is a former job's: forgotten)
        if rec.empty:
            with self._lock:
                self.records.pop(job, None)
            return rec
        # 1. the specs of the push and the canaries, kept as versions
        push = rec.push
        if push is not None and push.status.phase in ACTIVE and push.status.version is None:
            try:
                doc, version = self.cp.jobs.keep(push.intent.spec, now)
            except TooLarge as exc:
                # (it never will fit: the push ends, said why, not tried every second)
                push = push.model_copy(update={"status": push.status.model_copy(update={
                    "phase": "aborted", "since": now, "healthy_since": None,
                    "message": f"its spec could not be kept: {exc}"})})
                self._event(job, "push_aborted", push.status.message, push.actor)
            else:
                push = push.model_copy(update={"status": push.status.model_copy(
                    update={"version": version})})
        canaries = dict(rec.canaries)
        for name, canary in sorted(canaries.items()):
            if canary.until <= now:
                del canaries[name]
                if canary.entitlement is not None:
                    self._retire(canary.entitlement)
                self._event(job, "canary_ended", f"canary {name}: its {canary.intent.tasks} "
                            "tasks go back to the job's spec (its time is up)", canary.actor)
                continue
            if canary.intent.host_profile is not None:
                ent = self._canary_entitlement(doc, name, canary)
                if ent != canary.entitlement:
                    canary = canaries[name] = canary.model_copy(update={"entitlement": ent})
            if canary.version is None:
                doc, version = self.cp.jobs.keep(
                    self._canary_spec(canary.intent, canary.entitlement), now,
                    canary_of=doc.entitlement)
                canaries[name] = canary.model_copy(update={"version": version})
        # 2. the size
        if rec.sizing is not None and rec.sizing.intent.size != doc.spec.task_count:
            token = requestid.actor.set(rec.sizing.actor or "jcp")
            try:
                before = doc.spec.task_count
                doc = self.cp.commands.resize_job(job, rec.sizing.intent.size)
            finally:
                requestid.actor.reset(token)
            self._event(job, "resized", f"{before} -> {doc.spec.task_count} tasks (sizing "
                        "intent)", rec.sizing.actor)
        # 3. the push's progress, from what the scheduler reports
        first = self._unify(doc, push, canaries, now)
        if push is not None and push.status.phase in ACTIVE:
            status = advance(push.intent, push.status, self._health(job, push, first), now)
            status = self._gate(job, push, status, now)
            if status.phase != push.status.phase or status.stage != push.status.stage:
                self._announce(job, push, status)
                if status.phase == "rolled_back":
                    self._resume_if_halted(job)
            push = push.model_copy(update={"status": status})
        unified = self._unify(doc, push, canaries, now)
        # 4. the pins, or the push made the job's spec
        pins = {i: v for i, v in enumerate(unified.versions) if v != doc.target}
        if push is not None and push.status.phase == "completed" and (
                push.status.promoted is None):
            # (idempotent: the same spec and pins again change nothing)
            spec = push.intent.spec.model_copy(update={"task_count": doc.spec.task_count})
            keep = {i: v for i, v in pins.items() if unified.roles[i].startswith("canary:")}
            doc = self.cp.jobs.update(spec, now, pins=keep)
            push = push.model_copy(update={"status": push.status.model_copy(
                update={"promoted": doc.target})})
            self.cp.notify(job)
        elif pins != doc.pins:
            doc = self.cp.jobs.set_pins(job, pins, now, self._describe(unified))
            self.cp.notify(job)
        new = rec.model_copy(update={"push": push, "canaries": canaries,
                                     "conflicts": unified.conflicts})
        if new != rec:
            if unified.conflicts != rec.conflicts and unified.conflicts:
                self._event(job, "intents_conflict", "; ".join(unified.conflicts))

            def edit(current: JcpRecord) -> JcpRecord:
                # (written by the API since it was read: its change wins, and the next
                # pass goes on from it)
                return new if current == rec else current
            return self._change(job, edit)
        return new

    def _canary_spec(self, intent: CanaryIntent, entitlement: str | None = None) -> JobSpec:
        """A canary's spec; by hardware, bound to machines of that type; with a host
        profile, bound to its canary entitlement."""
        spec = intent.spec
        if entitlement is not None:
            spec = spec.model_copy(update={"entitlement": entitlement})
        if intent.hardware is None:
            return spec
        req = spec.policy.requirements.model_copy(update={"machine_types": (intent.hardware,)})
        return spec.model_copy(update={"policy": spec.policy.model_copy(
            update={"requirements": req})})

    def _check_profile_canary(self, entitlement: str, intent: CanaryIntent,
                              child: str) -> None:
        """A host-profile canary needs machines of its own from its entitlement's
        unused machine quota (decision 103): refused, by name, where that cannot be."""
        try:
            self.cp.profiles.store.get(intent.host_profile or "")
        except NotFound:
            raise ValidationError("host_profile", f"host profile {intent.host_profile!r} "
                                  "does not exist") from None
        ent = self.cp.entitlement(entitlement)
        if intent.host_profile is not None and not ent.may_canary(intent.host_profile):
            allowed = ", ".join(ent.canary_host_profiles) or "none"
            wanted = ",".join((*ent.canary_host_profiles, intent.host_profile))
            raise ValidationError("host_profile", (
                f"host profile {intent.host_profile!r} is not one entitlement "
                f"{entitlement!r} may run canaries on (canary_host_profiles: {allowed}); "
                f"an admin allows it: plait entitlement update {entitlement} "
                f"--canary-host-profiles {wanted}"))
        why = None
        if ent.quota.machines is None:
            why = "its quota is in RRU: a canary's machines are counted in machines"
        elif ent.lends or ent.elastic is not None:
            why = "it lends or borrows machines (loans are counted without canaries)"
        elif ent.canary_of is not None:
            why = f"it is itself a canary entitlement of {ent.canary_of!r}"
        else:
            with self.cp.lock:
                room = self.cp.allocator.quota_of(ent).machines or 0
                held = self.cp.allocator.usage(ent.name).machines
                running = child in self.cp.allocator.entitlements and (
                    self.cp.allocator.usage(child).machines > 0)
            if room - held < 1 and not running:
                why = (f"it holds {held} of the {room} machines its quota leaves it: a "
                       "host-profile canary needs at least one unused machine of its quota")
        if why is not None:
            raise ValidationError("host_profile", f"entitlement {entitlement!r} cannot run "
                                  f"a host-profile canary: {why}")

    def _canary_entitlement(self, doc: JobDoc, name: str, canary: StoredCanary) -> str:
        """A host-profile canary's canary entitlement, defined (or brought back) as it
        must be: the job's entitlement's owner, data center and preferences, the
        canary's host profile, and a quota of one machine per canary task (shared with
        the job's entitlement's: ``Allocator.quota_of``)."""
        parent = self.cp.entitlement(doc.entitlement)
        ent = Entitlement(
            name=canary_entitlement(parent.name, doc.name, name), owner=parent.owner,
            quota=Quota(machines=canary.intent.tasks),
            host_profile=canary.intent.host_profile or parent.host_profile,
            default_preferences=parent.default_preferences, pin_dc=parent.pin_dc,
            canary_of=parent.name)
        with self.cp.lock:
            have = self.cp.allocator.entitlements.get(ent.name)
        if have is not None and have.canary_of != parent.name:
            raise Conflict(f"entitlement {ent.name}", f"a canary entitlement of {parent.name}",
                           "an entitlement of its own")
        if have != ent:
            self.cp.commands.define_entitlement(ent)
        return ent.name

    def _retire(self, name: str) -> None:
        """A host-profile canary ended: its canary entitlement claims no machine more
        (a quota of 0); its machines go back to the free pool as its tasks leave them."""
        with self.cp.lock:
            have = self.cp.allocator.entitlements.get(name)
        if have is None or have.canary_of is None or have.quota.machines == 0:
            return
        self.cp.commands.define_entitlement(have.model_copy(update={"quota": Quota(machines=0)}))

    def _unify(self, doc: JobDoc, push: StoredPush | None,
               canaries: dict[str, StoredCanary], now: float) -> Unified:
        n = doc.spec.task_count
        fleet = self.cp.fleet
        with self.cp.lock:
            sched = self.cp.scheduler.jobs.get(doc.name)
            placed = {} if sched is None else {
                i: fleet.type_names[int(fleet.type_code[r.machine])]
                for i, r in sched.tasks.items() if r.machine is not None}
        by_version: dict[int, str] = {}
        wanted = []
        hardware: dict[int, str] = {}
        for name, c in canaries.items():
            if c.version is not None:
                wanted.append(Canary(name, c.version, c.intent.tasks, c.intent.hardware,
                                     c.until))
                by_version[c.version] = f"canary:{name}"
        pushed = None
        if push is not None and push.status.version is not None:
            share = percent(push.intent, push.status)
            if share:
                pushed = Push(push.status.version, Fraction(share))
                by_version[push.status.version] = "push"
        roles = ["stable"] * n
        for i, v in doc.pins.items():
            if i < n and v in by_version:
                roles[i] = by_version[v]
                if roles[i].startswith("canary:"):
                    hw = canaries[roles[i][7:]].intent.hardware
                    if hw is not None:
                        hardware[i] = hw
        previous = Unified(n, tuple(roles), tuple(doc.pins.get(i, doc.target)
                                                  for i in range(n)), hardware)
        return unify(doc.target, n, push=pushed, canaries=wanted, previous=previous,
                     placed_on=placed, now=now)

    def _health(self, job: str, push: StoredPush, unified: Unified) -> StageHealth:
        version = push.status.version
        mine = [i for i, r in enumerate(unified.roles) if r == "push"]
        with self.cp.lock:
            sched = self.cp.scheduler.jobs.get(job)
            if sched is None:
                return StageHealth(len(mine), 0)
            running = TaskState.RUNNING
            ready = 0
            for i in mine:
                r = sched.tasks.get(i)
                if r is not None and r.spec_version == version and r.state is running and (
                        r.healthy and r.serving and r.op is None):
                    ready += 1
            room = self.cp.scheduler.waiting_for_room(sched)
            waiting = sum(1 for i in mine if i in room) if room else 0
            return StageHealth(len(mine), ready, sched.halted, waiting)

    def _gate(self, job: str, push: StoredPush, status: PushStatus, now: float) -> PushStatus:
        """A URL gate: asked off the reconcile, as its owner's (``GateAsker``); its
        answer taken when it came."""
        gate = push.intent.gate
        if status.phase != "gating" or gate is None or gate.url is None:
            self._gates.pop(job, None)
            return status
        key = (status.version or 0, status.stage)
        asked = self._gates.get(job)
        if asked is None or asked[0] != key:
            asking = self.gates.ask(self.cp.owner_of_job(job), gate.url, job, status.stage + 1)
            self._gates[job] = (key, asking)
            asking.add_done_callback(lambda _: self._answered(job))
            return status
        if not asked[1].done():
            return status
        del self._gates[job]
        passed, message = asked[1].result()
        return verdict(push.intent, status, passed, message, now)

    def _answered(self, job: str) -> None:
        """A gate answered: its job is looked at in the next reconcile."""
        with self._lock:
            self._dirty.add(job)
            self._poked = True
        self.cp.wake.set()

    def _announce(self, job: str, push: StoredPush, status: PushStatus) -> None:
        kind = {"rolling": "push_stage", "soaking": "push_soaking", "gating": "push_gating",
                "holding": "push_holding", "completed": "push_completed",
                "rolled_back": "push_rolled_back", "aborted": "push_aborted"}[status.phase]
        self._event(job, kind, status.message, push.actor)

    def _resume_if_halted(self, job: str) -> None:
        """A push rolled back: a rollout the scheduler halted on its version is resumed,
        so its tasks can go back to the job's spec."""
        with self.cp.lock:
            sched = self.cp.scheduler.jobs.get(job)
            halted = sched is not None and sched.halted is not None
        if halted:  # (seen halted under the lock: not the published view's to say)
            self.cp.commands.resume_job(job, only_halted=False)

    @staticmethod
    def _describe(unified: Unified) -> str:
        counts: dict[str, int] = {}
        for role in unified.roles:
            counts[role] = counts.get(role, 0) + 1
        return "unified spec: " + ", ".join(f"{n} {r}" for r, n in sorted(counts.items()))
