"""The Job Control Plane's stored records (``/jcp/{job}``): read, written with
compare-and-swap, and what the region's other parts are asked for (``JcpRegion``).
The API (``plait.server.controlplane.jcp``) and the reconciler
(``plait.server.controlplane.jcp_reconcile``) build on it; the module docstring of
``jcp`` tells the whole story."""

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
from plait.model.entitlement import Entitlement, Quota
from plait.model.job import JobSpec
from plait.persist.scheduler import JobDoc
from plait.server.controlplane.gates import GateAsker
from plait.store.protocol import Namespace
from plait.tls import verify as tls_verify

if TYPE_CHECKING:
    from plait.model import Fleet
    from plait.persist import PersistentAllocator
    from plait.persist.scheduler import JobStore
    from plait.scheduler import Scheduler
    from plait.server.controlplane.commands import JobCommands
    from plait.server.controlplane.config import ControlPlaneConfig
    from plait.server.controlplane.controllers import Controllers
    from plait.server.controlplane.owners import Owners
    from plait.server.controlplane.profiles import HostProfiles
    from plait.store.protocol import Store

SCHEMA = 1
_ATTEMPTS = 20


class Wakeable(Protocol):
    def set(self) -> None: ...


class JcpRegion(Protocol):
    """What the Job Control Plane uses of the region: its store, its jobs' records
    and core (under its lock), the commands it resizes, resumes and defines canary
    entitlements through, and its event log."""

    @property
    def lock(self) -> threading.RLock: ...
    clock: Callable[[], float]
    store: Store
    config: ControlPlaneConfig
    @property
    def fleet(self) -> Fleet: ...
    @property
    def scheduler(self) -> Scheduler: ...
    @property
    def allocator(self) -> PersistentAllocator: ...
    @property
    def jobs(self) -> JobStore: ...
    commands: JobCommands
    controllers: Controllers
    profiles: HostProfiles
    owners: Owners

    @property
    def wake(self) -> Wakeable: ...

    def record(self, source: str, kind: str, message: str, job: str | None = None,
               entitlement: str | None = None, machine: str | None = None,
               at: float | None = None, *, actor: str | None = None,
               task: int | None = None, op: str | None = None, reason: str | None = None,
               decision: str | None = None, request: str | None = None) -> None: ...

    def entitlement(self, name: str) -> Entitlement: ...

    def check_job(self, spec: JobSpec) -> None: ...

    def owner_of_job(self, job: str) -> str: ...

    def notify(self, job: str) -> None: ...


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
    state the reconciler keeps of them."""

    def __init__(self, cp: JcpRegion) -> None:
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


    def _retire_canaries(self, rec: JcpRecord) -> None:
        for canary in rec.canaries.values():
            if canary.entitlement is not None:
                self._retire(canary.entitlement)


    def _retire(self, name: str) -> None:
        """A host-profile canary ended: its canary entitlement claims no machine more
        (a quota of 0); its machines go back to the free pool as its tasks leave them."""
        with self.cp.lock:
            have = self.cp.allocator.entitlements.get(name)
        if have is None or have.canary_of is None or have.quota.machines == 0:
            return
        self.cp.commands.define_entitlement(have.model_copy(update={"quota": Quota(machines=0)}))


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
