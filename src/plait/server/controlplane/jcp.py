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

from typing import TYPE_CHECKING, Any

from plait.errors import Conflict, NotFound, ValidationError
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
from plait.jcp.push import percent, verdict
from plait.model.entitlement import canary_entitlement, check_name
from plait.model.redact import shown_intent
from plait.persist.scheduler import JobDoc, usage_of
from plait.server.controlplane.gates import GateAsker
from plait.server.controlplane.jcp_reconcile import (
    EVERY,
    PUSHING,
    QUIET_EVERY,
    REFRESH,
    IntentReconciler,
    canary_spec,
)
from plait.server.controlplane.jcp_records import SCHEMA, GateAsking, IntentRecords, _actor
from plait.tls import verify as tls_verify

if TYPE_CHECKING:
    from plait.jcp.intents import JcpRecord
    from plait.server.controlplane.commands import JobCommands
    from plait.server.controlplane.controllers import Controllers
    from plait.server.controlplane.inbox import Inbox
    from plait.server.controlplane.owners import Owners
    from plait.server.controlplane.profiles import HostProfiles
    from plait.server.controlplane.recorder import EventRecorder
    from plait.server.controlplane.regionstate import RegionState
    from plait.store.protocol import Namespace

__all__ = ["EVERY", "PUSHING", "QUIET_EVERY", "REFRESH", "SCHEMA", "GateAsking",
           "IntentReconciler", "IntentRecords", "JobControlPlane"]


class JobControlPlane:
    """The Job Control Plane's API: each intent written, read and removed. It holds
    the stored records (``store``: ``IntentRecords``) and the reconciler that runs after
    each pass (``reconciler``: ``IntentReconciler``), and answers for both under the
    names the pass and the HTTP layer call (``touch``, ``due``, ``reconcile``,
    ``record``, ``records``, ``gates``)."""

    def __init__(self, state: RegionState, inbox: Inbox, recorder: EventRecorder,
                 commands: JobCommands, controllers: Controllers, profiles: HostProfiles,
                 owners: Owners) -> None:
        self.state, self.controllers = state, controllers
        self.profiles, self.owners = profiles, owners
        self.store = store = IntentRecords(state, inbox, recorder, commands, controllers)
        gates = GateAsker(lambda: controllers.url_policy,
                          verify=lambda url: tls_verify(state.config.ca_file, url))
        self.reconciler = IntentReconciler(store, state, inbox, commands, gates)
        # (the records' and the reconciler's, under the names the API uses)
        self.record, self._job, self._change = store.record, store.job_doc, store.change
        self._event, self._retire, self._announce = store.event, store.retire, store.announce
        self._resume_if_halted = store.resume_if_halted
        self.touch, self.due = self.reconciler.touch, self.reconciler.due
        self.reconcile = self.reconciler.reconcile

    @property
    def ns(self) -> Namespace:
        """Where the records are stored (``/jcp``)."""
        return self.store.ns

    @property
    def records(self) -> dict[str, JcpRecord]:
        """Each job's intents, as last read or written here."""
        return self.store.records

    @property
    def gates(self) -> GateAsking:
        """What a push's URL gate is asked through (the simulator sets a stand-in)."""
        return self.reconciler.gates

    @gates.setter
    def gates(self, gates: GateAsking) -> None:
        self.reconciler.gates = gates

    # -- push -----------------------------------------------------------------------------
    def put_push(self, job: str, intent: PushIntent) -> dict[str, Any]:
        self._job(job, intent.spec)
        self.state.jobs.check_keep(job, intent.spec)  # (a 413 now, not an abort later)
        if intent.gate is not None and intent.gate.url is not None:
            try:  # (the rules of TaskControllers' URLs: a tenant's URL either way)
                self.controllers.check_controller_url(intent.gate.url)
            except ValidationError as exc:
                raise ValidationError("gate.url", exc.message.replace(
                    "controller URL", "gate URL")) from None
        now, actor = self.state.clock(), _actor()

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
        now = self.state.clock()

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
        now = self.state.clock()
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
        now, actor = self.state.clock(), actor or _actor()
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
            self.owners.admit(doc.name, (doc.entitlement, size, doc.spec.resources),
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
        if intent.hardware is not None and intent.hardware not in self.state.fleet.type_names:
            raise ValidationError("hardware", f"no machine of type {intent.hardware!r} in "
                                  f"this region (types: {', '.join(self.state.fleet.type_names)})")
        if intent.host_profile is not None:
            self._check_profile_canary(doc.entitlement, intent,
                                       canary_entitlement(doc.entitlement, job, name))
        # (a 413 now, not a reconcile failing later; a host-profile canary's spec names
        # its canary entitlement, a few bytes more than checked here)
        self.state.jobs.check_keep(job, canary_spec(intent))
        now, actor = self.state.clock(), _actor()

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
        with self.state.lock:
            sched = self.state.scheduler.jobs.get(job)
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

    def _check_profile_canary(self, entitlement: str, intent: CanaryIntent,
                              child: str) -> None:
        """A host-profile canary needs machines of its own from its entitlement's
        unused machine quota (decision 103): refused, by name, where that cannot be."""
        try:
            self.profiles.store.get(intent.host_profile or "")
        except NotFound:
            raise ValidationError("host_profile", f"host profile {intent.host_profile!r} "
                                  "does not exist") from None
        ent = self.state.entitlement(entitlement)
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
            with self.state.lock:
                room = self.state.allocator.quota_of(ent).machines or 0
                held = self.state.allocator.usage(ent.name).machines
                running = child in self.state.allocator.entitlements and (
                    self.state.allocator.usage(child).machines > 0)
            if room - held < 1 and not running:
                why = (f"it holds {held} of the {room} machines its quota leaves it: a "
                       "host-profile canary needs at least one unused machine of its quota")
        if why is not None:
            raise ValidationError("host_profile", f"entitlement {entitlement!r} cannot run "
                                  f"a host-profile canary: {why}")
