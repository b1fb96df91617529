"""The Job Control Plane's stored records (``/jcp/{job}``): read, written with
compare-and-swap, and which jobs the reconciler is to look at because of a write.
The API (``plait.server.controlplane.jcp``) and the reconciler
(``plait.server.controlplane.jcp_reconcile``) each hold this one ``IntentRecords``;
the module docstring of ``jcp`` tells the whole story."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Protocol

from plait import requestid
from plait.errors import Conflict, NotFound, ValidationError
from plait.jcp.intents import JcpRecord, PushStatus, StoredPush
from plait.model.base import parse
from plait.model.entitlement import Quota
from plait.model.job import JobSpec
from plait.persist.scheduler import JobDoc
from plait.store.protocol import Namespace

if TYPE_CHECKING:
    from plait.server.controlplane.commands import JobCommands
    from plait.server.controlplane.controllers import Controllers
    from plait.server.controlplane.inbox import Inbox
    from plait.server.controlplane.recorder import EventRecorder
    from plait.server.controlplane.regionstate import RegionState

SCHEMA = 1
_ATTEMPTS = 20


class GateAsking(Protocol):
    """What the reconciler asks a push's URL gate through: ``GateAsker`` for real, a
    stand-in answering by a rule in the simulator (``plait.sim.controlplane``)."""

    def ask(self, owner: str, url: str, job: str, stage: int) -> Future[tuple[bool, str]]: ...

    def in_flight(self, owner: str) -> int: ...

    def close(self) -> None: ...


def _actor() -> str | None:
    return requestid.actor.get()


class IntentRecords:
    """The stored intents of every job: read, written with compare-and-swap, and the
    jobs a write leaves for the reconciler to look at."""

    def __init__(self, state: RegionState, inbox: Inbox, recorder: EventRecorder,
                 commands: JobCommands, controllers: Controllers) -> None:
        self.state, self.inbox, self.recorder = state, inbox, recorder
        self.commands, self.controllers = commands, controllers
        self.ns = Namespace(state.store, "/jcp")
        #: guards what follows (shared with the reconciler)
        self.lock = threading.Lock()
        #: job -> its intents, as last read or written here
        self.records: dict[str, JcpRecord] = {}
        #: an intent was written here since the last reconcile
        self.poked = False
        #: jobs to look at in the next reconcile (intents written, the job's record or
        #: its tasks changed: ``IntentReconciler.touch``); a job with neither, and not
        #: due by time, is not looked at
        self.dirty: set[str] = set()
        #: the stored bytes of each record held (``IntentReconciler._refresh`` parses the
        #: records whose bytes changed: not by version, which starts again at 0 when a
        #: record is deleted and made again)
        self.raw: dict[str, bytes] = {}
        #: jobs left with no intent whose tasks may still be pinned
        self.unpin: set[str] = set()

    # -- the stored records ---------------------------------------------------------------
    def stored(self, job: str) -> tuple[JcpRecord, str, int | None]:
        """The record at ``job``'s name as stored: its intents, the uid of the job they
        were set on, its version (None: no record)."""
        try:
            value, version = self.ns.get(f"/{job}")
        except NotFound:
            return JcpRecord(), "", None
        rec, uid = self.parse_record(job, value)
        return rec, uid, version

    @staticmethod
    def parse_record(job: str, value: bytes) -> tuple[JcpRecord, str]:
        """A stored record's intents and the uid of the job they were set on."""
        data = json.loads(value)
        if int(data.pop("schema", 1)) > SCHEMA:
            raise ValidationError("schema", f"the intents of job {job} have a schema newer "
                                            f"than this plait ({SCHEMA})")
        uid = str(data.pop("job_uid", ""))
        return parse(JcpRecord, data), uid

    def uid(self, job: str, deleting: bool = True) -> str | None:
        """The uid of the job now under the name (None: no job, or with ``deleting``
        false, one being deleted)."""
        try:
            doc = self.state.jobs.get(job)
        except NotFound:
            return None
        return None if doc.deleting and not deleting else doc.uid

    def read(self, job: str) -> tuple[JcpRecord, int | None]:
        """The intents of the job now under the name (a former job's record holds none
        of its own) and the record's version."""
        rec, uid, version = self.stored(job)
        if version is not None and uid != self.uid(job):
            return JcpRecord(), version
        return rec, version

    def record(self, job: str) -> JcpRecord:
        return self.read(job)[0]

    def change(self, job: str, edit: Callable[[JcpRecord], JcpRecord | None]) -> JcpRecord:
        """Read, edit, write back with compare-and-swap (an empty record is deleted)."""
        for _ in range(_ATTEMPTS):
            uid = self.uid(job) or ""
            stored, stored_uid, version = self.stored(job)
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
                self.retire_canaries(stored)
            with self.lock:
                if new.empty:
                    self.records.pop(job, None)
                    self.unpin.add(job)  # (its tasks go back to the job's spec)
                else:
                    self.records[job] = new
                self.dirty.add(job)
                self.raw.pop(job, None)  # (parsed again at the next refresh)
            self.poked = True
            self.inbox.wake.set()
            return new
        raise Conflict(f"intents of job {job}", "a quiet record", "too many concurrent writers")

    def job_doc(self, job: str, spec: JobSpec | None = None) -> JobDoc:
        """The job's record (NotFound for an unknown job); ``spec``: a spec for it,
        checked to name it and its entitlement."""
        doc = self.state.jobs.get(job)
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
                self.controllers.check_controller_url(spec.task_controller)
            self.state.check_job(spec)
        return doc

    def event(self, job: str, kind: str, message: str, actor: str | None = None) -> None:
        try:
            ent = self.state.jobs.get(job).entitlement
        except NotFound:
            ent = None
        self.recorder.record("jcp", kind, message, job=job, entitlement=ent,
                             actor=actor or _actor() or "jcp")

    def retire_canaries(self, rec: JcpRecord) -> None:
        for canary in rec.canaries.values():
            if canary.entitlement is not None:
                self.retire(canary.entitlement)

    def retire(self, name: str) -> None:
        """A host-profile canary ended: its canary entitlement claims no machine more
        (a quota of 0); its machines go back to the free pool as its tasks leave them."""
        with self.state.lock:
            have = self.state.allocator.entitlements.get(name)
        if have is None or have.canary_of is None or have.quota.machines == 0:
            return
        self.commands.define_entitlement(have.model_copy(update={"quota": Quota(machines=0)}))

    def announce(self, job: str, push: StoredPush, status: PushStatus) -> None:
        kind = {"rolling": "push_stage", "soaking": "push_soaking", "gating": "push_gating",
                "holding": "push_holding", "completed": "push_completed",
                "rolled_back": "push_rolled_back", "aborted": "push_aborted"}[status.phase]
        self.event(job, kind, status.message, push.actor)

    def resume_if_halted(self, job: str) -> None:
        """A push rolled back: a rollout the scheduler halted on its version is resumed,
        so its tasks can go back to the job's spec."""
        with self.state.lock:
            sched = self.state.scheduler.jobs.get(job)
            halted = sched is not None and sched.halted is not None
        if halted:  # (seen halted under the lock: not the published view's to say)
            self.commands.resume_job(job, only_halted=False)
