"""What readers see: jobs, tasks, discovery, entitlements, machines, and the dry run
of a deploy. Job reads never take the lock: each pass publishes a ``JobState`` per
job it changed (decision 45)."""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Any

from plait.allocator import AllocationRequest
from plait.allocator.loans import count
from plait.errors import NotFound
from plait.model import Fleet, JobSpec
from plait.model.redact import shown_spec
from plait.paging import BadRequest
from plait.scheduler.records import same_runtime
from plait.server.controlplane.jobstate import JobState as JobState  # (re-exported)
from plait.server.controlplane.listing import JobEntry, JobIndex, render

if TYPE_CHECKING:
    from plait.server.controlplane.controllers import Controllers
    from plait.server.controlplane.membership import Membership
    from plait.server.controlplane.regionstate import RegionState


class Views:
    def __init__(self, state: RegionState, membership: Membership,
                 controllers: Controllers) -> None:
        self.state, self.membership, self.controllers = state, membership, controllers
        #: per job: what readers see of its tasks, as the last pass left them
        self._views: dict[str, JobState] = {}
        #: each machine's name and fault domain, as the views show them, for one fleet
        self._names: tuple[Fleet | None, dict[int, tuple[str, dict[str, str]]]] = (None, {})
        #: the stored half of every job's view, for lists (``plait...listing``)
        self.index = JobIndex(state, self.published)


    def publish(self, changed: set[str] | None) -> None:
        """Keep the read views of the jobs this pass changed (``None``: every job),
        so readers never take the lock (decision 45)."""
        sched, views, fleet = self.state.scheduler, self._views, self.state.fleet
        if self._names[0] is not fleet:  # (a fleet of its own after a rebuild)
            self._names = (fleet, {})
        names = self._names[1]
        for name in list(sched.jobs) if changed is None else changed:
            job = sched.jobs.get(name)
            if job is None:
                views.pop(name, None)
            else:
                views[name] = JobState.of(sched, job, fleet,
                                          self.state.persist.applied.get(name, 0), names)
        if changed is None:
            for name in [n for n in views if n not in sched.jobs]:
                del views[name]
            self.index.reset()  # (a rebuild: the records may have changed meanwhile)

    def entitlement_view(self, name: str) -> dict[str, Any]:
        """(No lock: plain reads of the allocator's counters and the jobs' views.)"""
        ent = self.state.entitlement(name)
        usage = self.state.allocator.usage(name)
        jobs = sorted(n for n, v in list(self._views.items()) if v.entitlement == name)
        view = {**ent.model_dump(mode="json"), "machines": usage.machines,
                "rru": round(usage.rru, 3), "jobs": jobs}
        if ent.lends or ent.elastic is not None:  # the region's pool of loans
            alloc = self.state.allocator
            n = count(alloc.index, alloc.entitlements, alloc.loans)
            view["loans"] = {"lendable": n.lendable, "on_loan": n.on_loan,
                             "revoking": n.revoking}
        return view

    def snapshot(self) -> dict[str, JobState]:
        """Every job as the last pass published it (a copy: read without the lock)."""
        return dict(self._views)

    def job_view(self, name: str) -> dict[str, Any]:
        """The job as stored (spec, versions) and as the last pass left its tasks (no
        lock: a read never waits for a pass)."""
        doc = self.state.jobs.get(name)
        return {**render(JobEntry.of(doc), self._views.get(name)),
                "spec": shown_spec(doc.spec.model_dump(mode="json"))}

    def published(self) -> dict[str, JobState]:
        """Every job as the last pass published it (not a copy: read, never change)."""
        return self._views

    def tasks_view(self, name: str) -> list[dict[str, Any]]:
        self.state.jobs.get(name)  # NotFound for an unknown job
        job = self._views.get(name)
        return job.task_views() if job is not None else []

    def discovery(self, name: str) -> list[dict[str, Any]]:
        self.state.jobs.get(name)
        job = self._views.get(name)
        if job is None:
            return []
        return [{"index": i, "machine": m, "endpoint": endpoint}
                for i, m, endpoint in job.serving_on]

    def plan(self, spec: JobSpec,
             may_see: Callable[[str], None] = lambda entitlement: None) -> dict[str, Any]:
        """What deploying ``spec`` would do, changing nothing: the spec fields that
        differ from the current version, and where new tasks would go. ``may_see``
        (given the entitlement of the job the name holds now, read once with the spec
        it is diffed against) raises for a caller who may not see that job."""
        if spec.task_controller is not None:  # (as a deploy checks it; not under the lock)
            self.controllers.check_controller_url(spec.task_controller)
        self.state.check_job(spec)
        try:
            doc = self.state.jobs.get(spec.name)
        except NotFound:
            doc = None
        if doc is not None:
            may_see(doc.entitlement)
        current: JobSpec | None = None if doc is None else doc.spec
        changes = {}
        if current is not None:
            old, new = current.model_dump(mode="json"), spec.model_dump(mode="json")
            shown_old, shown_new = shown_spec(old), shown_spec(new)  # (no credential)
            changes = {k: {"from": shown_old.get(k), "to": shown_new.get(k)}
                       for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)}
        with self.state.lock:
            job = self.state.scheduler.jobs.get(spec.name)
            have = set(job.tasks) if job is not None else set()
            request = AllocationRequest.of(
                spec.name, spec.entitlement, spec.resources,
                allocate=[i for i in range(spec.task_count)], policy=spec.policy)
            plan = self.state.allocator.propose(request)
            fleet = self.state.fleet
            by_dc: dict[str, int] = {}
            for _, m in plan.assign + plan.keep:
                dc = fleet.fault_domain(m).dc
                by_dc[dc] = by_dc.get(dc, 0) + 1
            # (the same test the scheduler applies: pacing, a TaskController or the
            # count change no task)
            runtime_changed = current is not None and not same_runtime(current, spec)
            return {
                "job": spec.name, "action": "create" if current is None else (
                    "none" if not changes else "update"),
                "changes": changes,
                "tasks_added": max(0, spec.task_count - len(have)),
                "tasks_removed": max(0, len(have) - spec.task_count),
                "tasks_updated": min(len(have), spec.task_count) if runtime_changed else 0,
                "max_unavailable": spec.update.resolve(spec.task_count),
                "task_controller": spec.task_controller is not None,
                "placement": {"placeable": len(plan.assign) + len(plan.keep),
                              "machines_to_claim": len(plan.claims), "by_dc": by_dc,
                              "unplaced": len(plan.unplaced),
                              "unplaced_reason": plan.unplaced[0][1] if plan.unplaced else None},
            }

    def machine_view(self, m: int) -> dict[str, Any]:
        fleet = self.state.fleet
        broker = self.state.region.broker_of(m)
        fd = fleet.fault_domain(m)
        res = fleet.resources(m)
        name = fleet.name(m)
        return {
            "id": name, "state": broker.state(m).value, "cordoned": broker.cordoned(m),
            "entitlement": broker.entitlement_of(m),
            "fault_domain": {"dc": fd.dc, "msb": fd.msb, "row": fd.row, "rack": fd.rack},
            "type": fleet.type_names[int(fleet.type_code[m])],
            "cpu": res.cpu, "memory_gb": res.memory_gb,
            "tasks": len(self.state.scheduler.desired.get(m, {})),
            "events": [e.id for e in broker.events_for(m)],
            "host_profile": self.profile_of(m),
            "loan": self.loan_of(m),
        }

    def loan_of(self, m: int) -> dict[str, Any] | None:
        """The machine's loan, if an elastic entitlement holds it: the borrower, since
        when (as far as this control plane saw it claimed), and a revoke under way (its
        deadline, and when the machine is due back)."""
        sched = self.state.scheduler
        borrower = self.state.region.broker_of(m).entitlement_of(m)
        if borrower is None or borrower not in sched.elastic:
            return None
        seen = sched.loaned.get(m)
        revoke = sched.revokes.get(m)
        return {"borrower": borrower, "since": None if seen is None else seen[1],
                "revoking": revoke is not None,
                "deadline": None if revoke is None else revoke.deadline,
                "due_back": None if revoke is None else revoke.return_by}

    def profile_of(self, m: int) -> dict[str, Any] | None:
        """The host profile the machine must carry, the one its agent reported applied
        (as far as this control plane has heard: a machine not heard from off
        ``default`` shows ``default``), whether its tasks wait for a switch, and why
        its last switch failed. None for a machine another scheduler shard manages
        (its agent reports there: ``GET /v1/machines/{id}`` is answered by it)."""
        if not self.membership.owns(m):
            return None
        sched = self.state.scheduler
        target = sched.profile_target(m)
        seen = sched.profiles.applied.get(m)
        failing = sched.profiles.failing.get(m)
        return {"target": None if target is None else f"{target.name}@{target.version}",
                "applied": "default@1" if seen is None else
                (None if seen.name is None else f"{seen.name}@{seen.version}"),
                "switching": m in sched.profiles.pending,
                "error": None if seen is None else seen.error,
                "failures": 0 if failing is None else failing[2],
                "rolling": m in sched.rolling}

    def machine_summary(self) -> dict[str, Any]:
        """Machines counted by data center, MSB, state and entitlement (None: the free
        pool), from the brokers' arrays (a copy each, no lock): what the web UI's
        region page shows, at any region size."""
        import numpy as np

        fleet = self.state.fleet
        states = ("up", "failed", "maintenance")
        names = list(self.state.region.entitlements.names)
        msb_names = fleet.level_names["msb"]
        cells = []
        for broker in list(self.state.region.brokers.values()):
            codes, ents = broker.state_codes(), broker.entitlement_codes()
            machines = broker.machines
            if not (len(codes) == len(ents) == len(machines)):
                continue  # (changed between the copies: rare, and the next read counts it)
            msbs = fleet.codes["msb"][machines].astype(np.int64)
            keys, counts = np.unique(
                np.stack([msbs, codes.astype(np.int64), ents.astype(np.int64)]), axis=1,
                return_counts=True)
            for (msb, state, ent), n in zip(keys.T.tolist(), counts.tolist(), strict=True):
                dc, _, short = msb_names[msb].rpartition("/")
                cells.append({"dc": dc.rsplit("/", 1)[-1], "msb": short, "state": states[state],
                              "entitlement": None if ent < 0 else (
                                  names[ent] if ent < len(names) else "?"),
                              "machines": int(n)})
        return {"cells": cells, "total": len(fleet)}

    def machines(self, states: Collection[str] | None = None, entitlement: str | None = None,
                 offset: int = 0, limit: int = 100, after: str | None = None,
                 loaned: bool = False) -> tuple[list[dict[str, Any]], int, str | None]:
        """The machines that pass the filters (in one of ``states``, of
        ``entitlement``, on loan to an elastic entitlement), in the fleet's order (which only ever
        grows at its end): ``limit`` of them from ``offset``, or after machine
        ``after``; how many pass in all; the last one listed when more follow."""
        start = -1
        if after is not None:
            try:
                start = self.state.machine_index(after)
            except NotFound:
                raise BadRequest("continue", f"machine {after!r} is not in the "
                                             "region; list again from the start") from None
        with self.state.lock:
            elastic = self.state.scheduler.elastic
            found: list[dict[str, Any]] = []
            total = position = 0
            more = False
            for m in range(len(self.state.fleet)):
                broker = self.state.region.broker_of(m)
                if states is not None and broker.state(m).value not in states:
                    continue
                if entitlement is not None and broker.entitlement_of(m) != entitlement:
                    continue
                if loaned and broker.entitlement_of(m) not in elastic:
                    continue
                total += 1
                if m <= start:
                    continue
                if position >= offset:
                    if len(found) < limit:
                        found.append(self.machine_view(m))
                    else:
                        more = True
                position += 1
            return found, total, (found[-1]["id"] if found and more else None)

    def machine(self, machine: str) -> dict[str, Any]:
        m = self.state.machine_index(machine)
        with self.state.lock:
            view = self.machine_view(m)
            view["assigned"] = [f"{a.job}/{a.index}"
                                for a in self.state.scheduler.desired_for(machine)]
            return view
