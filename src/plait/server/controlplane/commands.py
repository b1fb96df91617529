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
    from plait.server.controlplane.controllers import Controllers
    from plait.server.controlplane.creates import CreateCommitter, Pending
    from plait.server.controlplane.inbox import Inbox
    from plait.server.controlplane.profiles import HostProfiles
    from plait.server.controlplane.recorder import EventRecorder
    from plait.server.controlplane.regionstate import RegionState
    from plait.server.controlplane.views import Views

log = logconfig.get("plait.controlplane.commands")


def _setting(value: Any) -> str:
    """An entitlement's setting in an event's message (a quota as its one amount)."""
    if isinstance(value, dict) and value.keys() <= {"machines", "rru"}:
        given = {k: v for k, v in value.items() if v is not None}
        return " ".join(f"{v:g} {'machine' if k == 'machines' and v == 1 else k}"
                        for k, v in given.items()) or "none"
    return "none" if value in (None, [], {}) else str(value)[:200]


class JobCommands:
    def __init__(self, state: RegionState, inbox: Inbox, recorder: EventRecorder,
                 views: Views, creates: CreateCommitter, controllers: Controllers,
                 profiles: HostProfiles) -> None:
        self.state, self.inbox, self.recorder = state, inbox, recorder
        self.views, self.creates = views, creates
        self.controllers, self.profiles = controllers, profiles

    def define_entitlement(self, ent: Entitlement) -> bool:
        """Create an entitlement, or change its quota and settings. True if new."""
        self.state.check_dc("pin_dc", ent.pin_dc)
        self.profiles.check_entitlement(ent)
        with self.state.lock:
            old = self.state.allocator.entitlements.get(ent.name)
            if old == ent:
                return False
            if old is not None and old.owner != ent.owner:
                raise Conflict(f"entitlement {ent.name}", f"owner {old.owner}",
                               f"owner {ent.owner} (owners do not change)")
            self.state.allocator.define(ent)
            self.state.scheduler.room_changed(ent.name)  # (its quota may have grown)
            self.state.scheduler.notice_rolls()  # (its host profile may have changed)
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
        for warning in self.quota_warnings(ent):
            said += f" (warning: {warning})"
        self.recorder.record("api", "entitlement_created" if old is None else "entitlement_changed",
                             said, entitlement=ent.name)
        return old is None

    def delete_entitlement(self, name: str) -> dict[str, Any]:
        """Remove an entitlement no job uses (``Conflict`` naming what does): its
        machines, and its canary entitlements', go back to the free pool. Its view as
        it was, with ``deleted`` and the machines ``released``."""
        view = self.views.entitlement_view(name)  # (NotFound for an unknown one)
        ent = self.state.entitlement(name)
        if ent.canary_of is not None:
            raise Taken(f"entitlement {name}", f"entitlement {name} is a canary entitlement of "
                        f"{ent.canary_of}: it "
                        f"goes when its canary ends, or with {ent.canary_of}")
        self._unused(name, self.views.index.jobs_of(name))
        with self.state.lock:
            self._unused(name, sorted(j for j, s in self.state.scheduler.jobs.items()
                                      if s.entitlement == name))
            kept = [self.state.allocator.entitlements[n]
                    for n in sorted(self.state.allocator.canaries.get(name, ()))]
            released = self.state.allocator.undefine(name)
        # a job stored while it went (a create that found it before): it stays
        late = self.views.index.jobs_of(name)
        if late:
            with self.state.lock:
                for e in [*kept, ent]:
                    self.state.allocator.define(e)
            self._unused(name, late)
        machines = self.state.fleet.names(released)
        self.recorder.record("api", "entitlement_deleted", f"{name}: deleted; " + (
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

    def quota_warnings(self, ent: Entitlement) -> list[str]:
        """What the region cannot give the entitlement, said (accepted all the same:
        capacity grows as machines join and come back, and quotas are promises, as a
        Kubernetes ResourceQuota is never checked against the nodes): a quota above the
        whole region, and the quotas of the entitlements this control plane manages
        adding up to more than the region (loans and revokes count on quotas). An
        elastic entitlement's quota caps what it borrows and a canary's shares its
        parent's: neither is counted."""
        fleet = self.state.fleet
        machines = len(fleet)
        milli = int(fleet.cpu.sum())
        rru = milli / 1000
        each = rru / max(1, machines)  # (a machine quota in RRU: the region's mean)
        out = []
        quota = ent.quota
        if quota.machines is not None and quota.machines > machines:
            out.append(f"its quota of {quota.machines} machines is above the region's "
                       f"{machines} machines: its jobs can hold {machines} at most")
        elif quota.rru is not None and quota.rru > rru + 1e-9:
            out.append(f"its quota of {quota.rru:g} RRU is above the region's {rru:g} RRU "
                       f"({machines} machines)")
        if ent.elastic is None and ent.canary_of is None:
            ents = dict(self.state.allocator.entitlements)
            ents[ent.name] = ent
            total = sum(e.quota.machines * each if e.quota.machines is not None
                        else (e.quota.rru or 0.0) for e in ents.values()
                        if e.elastic is None and e.canary_of is None)
            if total > rru * (1 + 1e-9):
                out.append(f"the quotas of the region's entitlements add up to {total:g} "
                           f"RRU ({total / each:.4g} machines' worth), more than its "
                           f"{rru:g} RRU ({machines} machines): not all can be met at once")
        return out

    def over_quota(self, ent: Entitlement) -> str | None:
        """What an entitlement uses above its quota, said (None: nothing): a quota
        lowered below its use takes nothing back, as Kubernetes' ResourceQuota."""
        usage = self.state.allocator.usage(ent.name)
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
            self.controllers.check_controller_url(spec.task_controller)
        shard = self.state.config.shard is not None
        with self.creates.lock if shard else contextlib.nullcontext():
            self.state.check_job(spec)
            doc, created = self.state.jobs.create(spec, self.state.clock())
        if created:
            self.changed(doc)
        return doc, created

    def submit_create(self, spec: JobSpec) -> Future[tuple[JobDoc, bool]]:
        """``create_job`` by group commit (``creates.CreateCommitter``): the future is
        answered once the batch holding it is stored. (A TaskController's URL is
        checked here, before it is queued: resolving a name never holds a batch.)"""
        if spec.task_controller is not None:
            self.controllers.check_controller_url(spec.task_controller)
        return self.creates.submit(spec)

    def prepare_create(self, spec: JobSpec) -> Pending:
        """``submit_create``'s first half: the create's record, made (and its
        TaskController's URL checked) in the current request's context; queued with
        others by ``submit_prepared``."""
        if spec.task_controller is not None:
            self.controllers.check_controller_url(spec.task_controller)
        return self.creates.prepare(spec)

    def submit_prepared(self, pending: list[Pending]) -> None:
        """Queue prepared creates at once: stored in one transaction (a front end's
        batch), each answered through its ``answer``."""
        self.creates.enqueue(pending)

    def changed(self, doc: JobDoc) -> JobDoc:
        # (the request's access line says which command; seq: its job's operation log)
        log.info("job command acknowledged", job=doc.name, seq=doc.seq, version=doc.version)
        self.inbox.notify(doc.name)
        return doc

    def update_job(self, spec: JobSpec) -> JobDoc:
        if spec.task_controller is not None:
            self.controllers.check_controller_url(spec.task_controller)
        self.state.check_job(spec)
        return self.changed(self.state.jobs.update(spec, self.state.clock()))

    def resize_job(self, name: str, task_count: int) -> JobDoc:
        return self.changed(self.state.jobs.resize(name, task_count, self.state.clock()))

    def rollback_job(self, name: str, version: int) -> JobDoc:
        return self.changed(self.state.jobs.rollback(name, version, self.state.clock()))

    def move_job(self, name: str, entitlement: str) -> JobDoc:
        """Move a job to another entitlement (a paced rollout onto its machines); checked
        against the region as it is now, then stored."""
        doc = self.state.jobs.get(name)
        with self.state.lock:
            self.state.scheduler.check_move(doc.spec, entitlement)
        return self.changed(self.state.jobs.move(name, entitlement, self.state.clock()))

    def restart_job(self, name: str, index: int | None = None) -> JobDoc:
        return self.changed(self.state.jobs.restart(name, index, self.state.clock()))

    def resume_job(self, name: str, only_halted: bool = True) -> JobDoc:
        """Resume a halted rollout; refused (409) for a job whose rollout the last
        pass left running (``kubectl rollout resume`` of a deployment not paused is
        refused too): a resume stored then would do nothing, and say it had."""
        self.state.jobs.get(name)  # (NotFound first)
        state = self.views.published().get(name)
        if only_halted and state is not None and state.halted is None:
            raise Taken(f"job {name}", f"job {name}'s rollout is not halted: nothing to "
                                       f"resume (plait job show {name})")
        return self.changed(self.state.jobs.resume(name, self.state.clock()))

    def delete_job(self, name: str) -> JobDoc:
        return self.changed(self.state.jobs.delete(name, self.state.clock()))
