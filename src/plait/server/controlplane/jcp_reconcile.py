"""The Job Control Plane's reconciler: after each pass (``Pass.after``),
the jobs whose intents may have moved on are looked at, their pushes advanced from
what the scheduler reports and their gates asked, their canaries started and ended,
their sizes set, and their tasks pinned to the unified spec (the steps are in
``plait.server.controlplane.jcp``'s docstring)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from concurrent.futures import Future
from fractions import Fraction
from typing import TYPE_CHECKING

from plait import logconfig, requestid
from plait.errors import Conflict, NotFound, PlaitError, TooLarge
from plait.jcp import Canary, Push, Unified, unify
from plait.jcp.intents import ACTIVE, CanaryIntent, JcpRecord, PushStatus, StoredCanary, StoredPush
from plait.jcp.push import StageHealth, advance, percent, verdict
from plait.model.entitlement import Entitlement, Quota, canary_entitlement
from plait.model.job import JobSpec
from plait.model.task import TaskState
from plait.persist.scheduler import JobDoc
from plait.server.controlplane.jcp_records import GateAsking, IntentRecords

if TYPE_CHECKING:
    from plait.server.controlplane.commands import JobCommands
    from plait.server.controlplane.inbox import Inbox
    from plait.server.controlplane.regionstate import RegionState

log = logconfig.get("plait.controlplane.jcp")

#: the stored records are read again this often (another replica may have written)
REFRESH = 5.0
#: the reconciler runs this often (and at once after a write); it looks at the jobs
#: whose intents, records or tasks changed since it last did, and at those whose
#: intents wait for a time (a soak, a stage's timeout, a canary's end) that has come
EVERY = 1.0
#: a job whose intents wait for nothing of the above is looked at this often anyway
QUIET_EVERY = 30.0
#: the phases of a push under way (a push holding its last stage is not)
PUSHING = frozenset({"rolling", "soaking", "gating"})


def canary_spec(intent: CanaryIntent, entitlement: str | None = None) -> JobSpec:
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


class IntentReconciler:
    """The reconciler (the leader, after a pass, off the lock): the jobs whose intents
    may have moved on looked at, their records read and written through ``store``
    (the Job Control Plane's ``IntentRecords``)."""

    def __init__(self, records: IntentRecords, state: RegionState, inbox: Inbox,
                 commands: JobCommands, gates: GateAsking) -> None:
        """``gates``: what a push's URL gate is asked through."""
        self.store, self.state, self.inbox, self.commands = records, state, inbox, commands
        self.gates = gates
        self._read_at: float | None = None
        #: gates being asked: job -> ((version, stage), the answer to come)
        self._gates: dict[str, tuple[tuple[int, int], Future[tuple[bool, str]]]] = {}
        self.reconciles = 0
        self._done_at: float | None = None
        #: when each job held must be looked at again by time (``_next``), unless its
        #: intents, record or tasks change first (``IntentRecords.dirty``)
        self._due: dict[str, float] = {}

    def due(self, now: float) -> bool:
        return self._read_at is None or now - self._read_at >= REFRESH

    def touch(self, jobs: Iterable[str] | None) -> None:
        """These jobs' records or tasks changed (None: every job's): the next
        reconcile looks at those that have intents."""
        with self.store.lock:
            if not self.store.records:
                return
            if jobs is None:
                self.store.dirty.update(self.store.records)
            else:
                self.store.dirty.update(j for j in jobs if j in self.store.records)

    def _refresh(self, now: float) -> None:
        if self._read_at is not None and now - self._read_at < REFRESH:
            return
        self._read_at = now
        found: dict[str, JcpRecord] = {}
        raw: dict[str, bytes] = {}
        with self.store.lock:
            held, known = dict(self.store.records), dict(self.store.raw)
        try:
            names = self.store.ns.children("/")
            # (every record in one read; one whose bytes are those held is not parsed
            # again)
            stored = self.store.ns.get_many([f"/{job}" for job in names])
            for job in names:
                got = stored.get(f"/{job}")
                if got is None:
                    continue  # (deleted meanwhile)
                if known.get(job) == got[0] and job in held:
                    found[job] = held[job]
                else:  # (a former job's too: reconciled away)
                    found[job] = self.store.parse_record(job, got[0])[0]
                raw[job] = got[0]
        except NotFound:
            pass
        except (OSError, PlaitError, ValueError) as exc:
            log.warning("intents not read", error=str(exc))
            return
        with self.state.lock:  # (pins no intent explains: a record deleted before a crash)
            pinned = {n for n, j in self.state.scheduler.jobs.items() if j.pins}
        with self.store.lock:
            # (a record written elsewhere, or new here: looked at in this reconcile)
            self.store.dirty.update(j for j, rec in found.items() if held.get(j) != rec)
            self.store.records, self.store.raw = found, raw
            self.store.unpin |= pinned - found.keys()
            for job in [j for j in self._due if j not in found]:
                del self._due[job]

    def reconcile(self, now: float) -> None:
        """The jobs with intents that may have moved on (``touch``, ``_next``), at most
        once a second (at once after a write)."""
        if not self.store.poked and self._done_at is not None and now - self._done_at < EVERY:
            return
        self.store.poked = False
        self._done_at = now
        self._refresh(now)
        with self.store.lock:
            due = self._due
            jobs = sorted(j for j in self.store.records
                          if j in self.store.dirty or due.get(j, 0.0) <= now)
            self.store.dirty.clear()
            unpin, self.store.unpin = self.store.unpin - self.store.records.keys(), set()
        for job in sorted(unpin):
            try:
                doc = self.state.jobs.get(job)
                if doc.pins and not doc.deleting:
                    self.state.jobs.set_pins(job, {}, now, "no intent left: every task "
                                                           "runs the job's spec")
                    self.inbox.notify(job)
            except NotFound:
                pass
            except (PlaitError, OSError, ValueError) as exc:
                log.warning("unpinning failed", job=job, error=str(exc))
                with self.store.lock:
                    self.store.unpin.add(job)
        for job in jobs:
            after: JcpRecord | None = None
            try:
                after = self._reconcile(job, now)
            except NotFound:
                self._forget(job)
            except (PlaitError, OSError, ValueError) as exc:
                log.warning("reconciling intents failed", job=job, error=str(exc))
            with self.store.lock:  # (a failed look is tried again in a second)
                self._due[job] = now + EVERY if after is None else self._next(job, after, now)
        with self.store.lock:
            pushing = {job for job, rec in self.store.records.items() if rec.push is not None
                       and rec.push.status.phase in PUSHING}
        with self.state.lock:  # (a profile roll waits for these: decision 104)
            self.state.scheduler.pushing = pushing
        self.reconciles += 1

    def _forget(self, job: str) -> None:
        """The job its record was written for is gone (deleted, or another job now
        under the name): so are its intents, and its canaries' entitlements claim no
        machine more. A record written meanwhile for the job now under the name is
        left alone."""
        with self.store.lock:
            kept = self.store.records.get(job)
        try:
            rec, uid, version = self.store.stored(job)
        except (PlaitError, OSError, ValueError):
            rec, uid, version = JcpRecord(), "", None
        if version is not None and uid == self.store.uid(job, deleting=False):
            return  # (the job now under the name's own, and not being deleted)
        for old in (kept, rec if version is not None else None):
            if old is not None:
                self.store.retire_canaries(old)
        if version is not None:
            with contextlib.suppress(NotFound, Conflict):
                self.store.ns.delete(f"/{job}", version)
        with self.store.lock:
            self.store.records.pop(job, None)
        self._gates.pop(job, None)

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
        doc = self.state.jobs.get(job)
        if doc.deleting:
            raise NotFound("job", job)
        rec, uid, version = self.store.stored(job)
        if version is not None and uid != doc.uid:
            raise NotFound("job", job)  # (its record is a former job's: forgotten)
        if rec.empty:
            with self.store.lock:
                self.store.records.pop(job, None)
            return rec
        # 1. the specs of the push and the canaries, kept as versions
        push = rec.push
        if push is not None and push.status.phase in ACTIVE and push.status.version is None:
            try:
                doc, version = self.state.jobs.keep(push.intent.spec, now)
            except TooLarge as exc:
                # (it never will fit: the push ends, said why, not tried every second)
                push = push.model_copy(update={"status": push.status.model_copy(update={
                    "phase": "aborted", "since": now, "healthy_since": None,
                    "message": f"its spec could not be kept: {exc}"})})
                self.store.event(job, "push_aborted", push.status.message, push.actor)
            else:
                push = push.model_copy(update={"status": push.status.model_copy(
                    update={"version": version})})
        canaries = dict(rec.canaries)
        for name, canary in sorted(canaries.items()):
            if canary.until <= now:
                del canaries[name]
                if canary.entitlement is not None:
                    self.store.retire(canary.entitlement)
                self.store.event(job, "canary_ended", f"canary {name}: its {canary.intent.tasks} "
                            "tasks go back to the job's spec (its time is up)", canary.actor)
                continue
            if canary.intent.host_profile is not None:
                ent = self._canary_entitlement(doc, name, canary)
                if ent != canary.entitlement:
                    canary = canaries[name] = canary.model_copy(update={"entitlement": ent})
            if canary.version is None:
                doc, version = self.state.jobs.keep(
                    canary_spec(canary.intent, canary.entitlement), now,
                    canary_of=doc.entitlement)
                canaries[name] = canary.model_copy(update={"version": version})
        # 2. the size
        if rec.sizing is not None and rec.sizing.intent.size != doc.spec.task_count:
            token = requestid.actor.set(rec.sizing.actor or "jcp")
            try:
                before = doc.spec.task_count
                doc = self.commands.resize_job(job, rec.sizing.intent.size)
            finally:
                requestid.actor.reset(token)
            self.store.event(job, "resized", f"{before} -> {doc.spec.task_count} tasks (sizing "
                        "intent)", rec.sizing.actor)
        # 3. the push's progress, from what the scheduler reports
        first = self._unify(doc, push, canaries, now)
        if push is not None and push.status.phase in ACTIVE:
            status = advance(push.intent, push.status, self._health(job, push, first), now)
            status = self._gate(job, push, status, now)
            if status.phase != push.status.phase or status.stage != push.status.stage:
                self.store.announce(job, push, status)
                if status.phase == "rolled_back":
                    self.store.resume_if_halted(job)
            push = push.model_copy(update={"status": status})
        unified = self._unify(doc, push, canaries, now)
        # 4. the pins, or the push made the job's spec
        pins = {i: v for i, v in enumerate(unified.versions) if v != doc.target}
        if push is not None and push.status.phase == "completed" and (
                push.status.promoted is None):
            # (idempotent: the same spec and pins again change nothing)
            spec = push.intent.spec.model_copy(update={"task_count": doc.spec.task_count})
            keep = {i: v for i, v in pins.items() if unified.roles[i].startswith("canary:")}
            doc = self.state.jobs.update(spec, now, pins=keep)
            push = push.model_copy(update={"status": push.status.model_copy(
                update={"promoted": doc.target})})
            self.inbox.notify(job)
        elif pins != doc.pins:
            doc = self.state.jobs.set_pins(job, pins, now, self._describe(unified))
            self.inbox.notify(job)
        new = rec.model_copy(update={"push": push, "canaries": canaries,
                                     "conflicts": unified.conflicts})
        if new != rec:
            if unified.conflicts != rec.conflicts and unified.conflicts:
                self.store.event(job, "intents_conflict", "; ".join(unified.conflicts))

            def edit(current: JcpRecord) -> JcpRecord:
                # (written by the API since it was read: its change wins, and the next
                # pass goes on from it)
                return new if current == rec else current
            return self.store.change(job, edit)
        return new

    def _canary_entitlement(self, doc: JobDoc, name: str, canary: StoredCanary) -> str:
        """A host-profile canary's canary entitlement, defined (or brought back) as it
        must be: the job's entitlement's owner, data center and preferences, the
        canary's host profile, and a quota of one machine per canary task (shared with
        the job's entitlement's: ``Allocator.quota_of``)."""
        parent = self.state.entitlement(doc.entitlement)
        ent = Entitlement(
            name=canary_entitlement(parent.name, doc.name, name), owner=parent.owner,
            quota=Quota(machines=canary.intent.tasks),
            host_profile=canary.intent.host_profile or parent.host_profile,
            default_preferences=parent.default_preferences, pin_dc=parent.pin_dc,
            canary_of=parent.name)
        with self.state.lock:
            have = self.state.allocator.entitlements.get(ent.name)
        if have is not None and have.canary_of != parent.name:
            raise Conflict(f"entitlement {ent.name}", f"a canary entitlement of {parent.name}",
                           "an entitlement of its own")
        if have != ent:
            self.commands.define_entitlement(ent)
        return ent.name

    def _unify(self, doc: JobDoc, push: StoredPush | None,
               canaries: dict[str, StoredCanary], now: float) -> Unified:
        n = doc.spec.task_count
        fleet = self.state.fleet
        with self.state.lock:
            sched = self.state.scheduler.jobs.get(doc.name)
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
        with self.state.lock:
            sched = self.state.scheduler.jobs.get(job)
            if sched is None:
                return StageHealth(len(mine), 0)
            running = TaskState.RUNNING
            ready = 0
            for i in mine:
                r = sched.tasks.get(i)
                if r is not None and r.spec_version == version and r.state is running and (
                        r.healthy and r.serving and r.op is None):
                    ready += 1
            room = self.state.scheduler.waiting_for_room(sched)
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
            asking = self.gates.ask(self.state.owner_of_job(job), gate.url, job, status.stage + 1)
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
        with self.store.lock:
            self.store.dirty.add(job)
            self.store.poked = True
        self.inbox.wake.set()

    @staticmethod
    def _describe(unified: Unified) -> str:
        counts: dict[str, int] = {}
        for role in unified.roles:
            counts[role] = counts.get(role, 0) + 1
        return "unified spec: " + ", ".join(f"{n} {r}" for r, n in sorted(counts.items()))
