"""Job and entitlement commands: each a durable write of the record, acknowledged
once stored; the loop applies it at its next pass (``notify`` wakes it). Job writes do
not take the lock (a shard's create takes the creates' lock, which a handoff holds
too: a handoff must carry it or refuse it). Concurrent creates are stored together
(group commit, ``creates.CreateCommitter``).
Each operation is stored with the API request that asked for it (``JobDoc.record``):
the scheduler's record of the job remembers it as its ``cause``."""

from __future__ import annotations

import contextlib
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from plait import logconfig
from plait.errors import Conflict, Taken
from plait.model import Entitlement, JobSpec
from plait.persist.scheduler import JobDoc

if TYPE_CHECKING:
    from plait.server.controlplane.core import ControlPlane
    from plait.server.controlplane.creates import Pending

log = logconfig.get("plait.controlplane.commands")


def _setting(value: Any) -> str:
    """An entitlement's setting in an event's message (a quota as its one amount)."""
    if isinstance(value, dict) and value.keys() <= {"machines", "rru"}:
        given = {k: v for k, v in value.items() if v is not None}
        return " ".join(f"{v:g} {'machine' if k == 'machines' and v == 1 else k}"
                        for k, v in given.items()) or "none"
    return "none" if value in (None, [], {}) else str(value)[:200]


class JobCommands:
    def __init__(self, cp: ControlPlane) -> None:
        self.cp = cp

    def define_entitlement(self, ent: Entitlement) -> bool:
        """Create an entitlement, or change its quota and settings. True if new."""
        self.cp.check_dc("pin_dc", ent.pin_dc)
        self.cp.profiles.check_entitlement(ent)
        with self.cp.lock:
            old = self.cp.allocator.entitlements.get(ent.name)
            if old == ent:
                return False
            if old is not None and old.owner != ent.owner:
                raise Conflict(f"entitlement {ent.name}", f"owner {old.owner}",
                               f"owner {ent.owner} (owners do not change)")
            self.cp.allocator.define(ent)
            self.cp.scheduler.room_changed(ent.name)  # (its quota may have grown)
            self.cp.scheduler.notice_rolls()  # (its host profile may have changed)
        if old is None:
            said = f"{ent.name}: quota {ent.quota}, owner {ent.owner}"
        else:  # what changed, each setting as it was and as it is
            was, now = old.model_dump(mode="json"), ent.model_dump(mode="json")
            said = f"{ent.name}: " + "; ".join(
                f"{k} {_setting(was[k])} -> {_setting(now[k])}"
                for k in now if now[k] != was.get(k))
        over = self.over_quota(ent)
        if over:
            said += f" ({over})"
        self.cp.record("api", "entitlement_created" if old is None else "entitlement_changed",
                       said, entitlement=ent.name)
        return old is None

    def delete_entitlement(self, name: str) -> dict[str, Any]:
        """Remove an entitlement no job uses (``Conflict`` naming what does): its
        machines, and its canary entitlements', go back to the free pool. Its view as
        it was, with ``deleted`` and the machines ``released``."""
        view = self.cp.views.entitlement_view(name)  # (NotFound for an unknown one)
        ent = self.cp.entitlement(name)
        if ent.canary_of is not None:
            raise Taken(f"entitlement {name}", f"entitlement {name} is a canary entitlement of "
                        f"{ent.canary_of}: it "
                        f"goes when its canary ends, or with {ent.canary_of}")
        self._unused(name, self.cp.views.index.jobs_of(name))
        with self.cp.lock:
            self._unused(name, sorted(j for j, s in self.cp.scheduler.jobs.items()
                                      if s.entitlement == name))
            kept = [self.cp.allocator.entitlements[n]
                    for n in sorted(self.cp.allocator.canaries.get(name, ()))]
            released = self.cp.allocator.undefine(name)
        # a job stored while it went (a create that found it before): it stays
        late = self.cp.views.index.jobs_of(name)
        if late:
            with self.cp.lock:
                for e in [*kept, ent]:
                    self.cp.allocator.define(e)
            self._unused(name, late)
        machines = self.cp.fleet.names(released)
        self.cp.record("api", "entitlement_deleted", f"{name}: deleted; " + (
            f"{len(machines)} machine{'s' if len(machines) != 1 else ''} back to the free "
            "pool" if machines else "it held no machine"), entitlement=name)
        return {**view, "machines": 0, "rru": 0.0, "jobs": [], "deleted": True,
                "released": machines}

    @staticmethod
    def _unused(name: str, jobs: list[str]) -> None:
        if jobs:
            raise Taken(f"entitlement {name}",
                        f"entitlement {name} is used by job{'s' if len(jobs) > 1 else ''} "
                        f"{', '.join(jobs[:5])}" + (f" and {len(jobs) - 5} more"
                                                    if len(jobs) > 5 else "")
                        + ": delete or move them first")

    def over_quota(self, ent: Entitlement) -> str | None:
        """What an entitlement uses above its quota, said (None: nothing): a quota
        lowered below its use takes nothing back, as Kubernetes' ResourceQuota."""
        usage = self.cp.allocator.usage(ent.name)
        quota = ent.quota
        if quota.machines is not None and usage.machines > quota.machines:
            used = f"{usage.machines} machines"
        elif quota.rru is not None and usage.rru > quota.rru + 1e-9:
            used = f"{usage.rru:g} RRU"
        else:
            return None
        return (f"it uses {used}, above its quota: nothing is taken back, and its jobs' "
                "new tasks wait until it is under")

    def create_job(self, spec: JobSpec) -> tuple[JobDoc, bool]:
        # a shard checks and stores under the creates' lock, which a handoff of the
        # entitlement holds too: the handoff either carries the new record or comes
        # first (and the check refuses it)
        if spec.task_controller is not None:  # (resolving a name: never under the lock)
            self.cp.controllers.check_controller_url(spec.task_controller)
        shard = self.cp.config.shard is not None
        with self.cp.creates.lock if shard else contextlib.nullcontext():
            self.cp.check_job(spec)
            doc, created = self.cp.jobs.create(spec, self.cp.clock())
        if created:
            self.changed(doc)
        return doc, created

    def submit_create(self, spec: JobSpec) -> Future[tuple[JobDoc, bool]]:
        """``create_job`` by group commit (``creates.CreateCommitter``): the future is
        answered once the batch holding it is stored. (A TaskController's URL is
        checked here, before it is queued: resolving a name never holds a batch.)"""
        if spec.task_controller is not None:
            self.cp.controllers.check_controller_url(spec.task_controller)
        return self.cp.creates.submit(spec)

    def prepare_create(self, spec: JobSpec) -> Pending:
        """``submit_create``'s first half: the create's record, made (and its
        TaskController's URL checked) in the current request's context; queued with
        others by ``submit_prepared``."""
        if spec.task_controller is not None:
            self.cp.controllers.check_controller_url(spec.task_controller)
        return self.cp.creates.prepare(spec)

    def submit_prepared(self, pending: list[Pending]) -> None:
        """Queue prepared creates at once: stored in one transaction (a front end's
        batch), each answered through its ``answer``."""
        self.cp.creates.enqueue(pending)

    def changed(self, doc: JobDoc) -> JobDoc:
        # (the request's access line says which command; seq: its job's operation log)
        log.info("job command acknowledged", job=doc.name, seq=doc.seq, version=doc.version)
        self.cp.notify(doc.name)
        return doc

    def update_job(self, spec: JobSpec) -> JobDoc:
        if spec.task_controller is not None:
            self.cp.controllers.check_controller_url(spec.task_controller)
        self.cp.check_job(spec)
        return self.changed(self.cp.jobs.update(spec, self.cp.clock()))

    def resize_job(self, name: str, task_count: int) -> JobDoc:
        return self.changed(self.cp.jobs.resize(name, task_count, self.cp.clock()))

    def rollback_job(self, name: str, version: int) -> JobDoc:
        return self.changed(self.cp.jobs.rollback(name, version, self.cp.clock()))

    def move_job(self, name: str, entitlement: str) -> JobDoc:
        """Move a job to another entitlement (a paced rollout onto its machines); checked
        against the region as it is now, then stored."""
        doc = self.cp.jobs.get(name)
        with self.cp.lock:
            self.cp.scheduler.check_move(doc.spec, entitlement)
        return self.changed(self.cp.jobs.move(name, entitlement, self.cp.clock()))

    def restart_job(self, name: str, index: int | None = None) -> JobDoc:
        return self.changed(self.cp.jobs.restart(name, index, self.cp.clock()))

    def resume_job(self, name: str, only_halted: bool = True) -> JobDoc:
        """Resume a halted rollout; refused (409) for a job whose rollout the last
        pass left running (``kubectl rollout resume`` of a deployment not paused is
        refused too): a resume stored then would do nothing, and say it had."""
        self.cp.jobs.get(name)  # (NotFound first)
        state = self.cp.views.published().get(name)
        if only_halted and state is not None and state.halted is None:
            raise Taken(f"job {name}", f"job {name}'s rollout is not halted: nothing to "
                                       f"resume (plait job show {name})")
        return self.changed(self.cp.jobs.resume(name, self.cp.clock()))

    def delete_job(self, name: str) -> JobDoc:
        return self.changed(self.cp.jobs.delete(name, self.cp.clock()))
