"""What readers see: jobs, tasks, discovery, entitlements, machines, and the dry run
of a deploy. Job reads never take the lock: each pass publishes a ``JobState`` per
job it changed (decision 45)."""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from plait.allocator import AllocationRequest
from plait.allocator.loans import count
from plait.errors import NotFound
from plait.model import Fleet, JobSpec
from plait.model.redact import shown_spec
from plait.model.task import TaskState
from plait.paging import BadRequest
from plait.scheduler import Scheduler
from plait.scheduler.records import JobRecord, same_runtime
from plait.server.controlplane.listing import JobEntry, JobIndex, render

if TYPE_CHECKING:
    from plait.server.controlplane.core import ControlPlane


@dataclass(frozen=True)
class JobState:
    """What readers see of a job's tasks: made by a pass under the lock, read
    without it."""

    entitlement: str
    target: int
    records: int
    counts: dict[str, int]
    serving: int
    updated: int
    halted: str | None
    rollout_active: bool
    moving_from: str | None
    on_entitlement: int
    unplaced_reason: str | None
    error: str | None
    unavailable: int
    #: per task, by index: (index, state, version, machine, fault domain, serving,
    #: healthy, exit code, operation, parked); ``task_views`` reads them
    tasks: tuple[tuple[Any, ...], ...]
    #: (index, machine, endpoint) of the tasks enabled in service discovery
    serving_on: tuple[tuple[int, str, str | None], ...]
    #: the last operation of the job's log the scheduler has applied
    applied_operation: int
    #: operations wanted, acked or under way (a restart, an update, a move...)
    busy: bool

    @classmethod
    def of(cls, sched: Scheduler, job: JobRecord, fleet: Fleet, applied: int,
           names: dict[int, tuple[str, dict[str, str]]] | None = None) -> JobState:
        """``names``: each machine's name and fault domain, kept by the caller for the
        views of ``fleet`` it makes (filled here)."""
        counts: dict[str, int] = {}
        serving = updated = 0

        # (once per machine: a job's tasks share machines, hundreds to one, and jobs
        # share them too; never changed: a reader copies the domain)
        if names is None:
            names = {}

        def named(m: int) -> tuple[str, dict[str, str]]:
            got = names.get(m)
            if got is None:
                fd = fleet.fault_domain(m)
                got = names[m] = (fleet.name(m), {"dc": fd.dc, "msb": fd.msb,
                                                  "rack": fd.rack})
            return got

        target, running, pending = job.target, TaskState.RUNNING, TaskState.PENDING
        goal = job.target_of
        tasks = []
        serving_on = []
        rows = job.tasks
        for index in sorted(rows):
            r = rows[index]
            state = r.state.value
            counts[state] = counts.get(state, 0) + 1
            serving += r.serving
            updated += (r.spec_version == (target if job.pins is None else goal(index))
                        and r.state is running and r.healthy)
            # (a pending task waits for a machine: the one it was stopped on is not its)
            where = None if r.state is pending else r.machine
            machine, domain = (None, None) if where is None else named(where)
            # (a row, made into the reader's dict when read: a view of 100,000 tasks is
            # made at every pass that changes the job, and read seldom)
            tasks.append((index, state, r.spec_version, machine, domain, r.serving,
                          r.healthy, None if r.apart is None else r.exit_code,
                          None if r.op is None else r.op.kind.value,
                          None if r.apart is None else r.parked))
            if r.serving and machine is not None:
                serving_on.append((index, machine, r.endpoint))
        return cls(job.entitlement, target, len(job.tasks), counts, serving, updated, job.halted,
                   job.rollout_active, job.moving_from, sched.on_entitlement(job),
                   job.unplaced_reason, job.error or (
                       None if job.controller_error is None
                       else f"its TaskController acked nothing: {job.controller_error}"),
                   sched.unavailable(job), tuple(tasks),
                   tuple(serving_on), applied,
                   bool(job.offers or job.acked or job.in_progress
                        or any(r.restart for r in job.tasks.values())))

    def task_views(self) -> list[dict[str, Any]]:
        """The tasks as readers see them, by index."""
        out = []
        for (index, state, version, machine, domain, serving, healthy, exit_code, op,
             parked) in self.tasks:
            task = {"index": index, "state": state, "version": version, "machine": machine,
                    "fault_domain": None if domain is None else dict(domain),
                    "serving": serving, "healthy": healthy, "exit_code": exit_code,
                    "operation": op}
            if parked is not None:  # (stopped at a maintenance's deadline: it waits
                task["parked"] = parked  # for the window to end; only then a key)
            out.append(task)
        return out


class Views:
    def __init__(self, cp: ControlPlane) -> None:
        self.cp = cp
        #: per job: what readers see of its tasks, as the last pass left them
        self._views: dict[str, JobState] = {}
        #: each machine's name and fault domain, as the views show them, for one fleet
        self._names: tuple[Fleet | None, dict[int, tuple[str, dict[str, str]]]] = (None, {})
        #: the stored half of every job's view, for lists (``plait...listing``)
        self.index = JobIndex(cp)


    def publish(self, changed: set[str] | None) -> None:
        """Keep the read views of the jobs this pass changed (``None``: every job),
        so readers never take the lock (decision 45)."""
        sched, views, fleet = self.cp.scheduler, self._views, self.cp.fleet
        if self._names[0] is not fleet:  # (a fleet of its own after a rebuild)
            self._names = (fleet, {})
        names = self._names[1]
        for name in list(sched.jobs) if changed is None else changed:
            job = sched.jobs.get(name)
            if job is None:
                views.pop(name, None)
            else:
                views[name] = JobState.of(sched, job, fleet,
                                          self.cp.persist.applied.get(name, 0), names)
        if changed is None:
            for name in [n for n in views if n not in sched.jobs]:
                del views[name]
            self.index.reset()  # (a rebuild: the records may have changed meanwhile)

    def entitlement_view(self, name: str) -> dict[str, Any]:
        """(No lock: plain reads of the allocator's counters and the jobs' views.)"""
        ent = self.cp.entitlement(name)
        usage = self.cp.allocator.usage(name)
        jobs = sorted(n for n, v in list(self._views.items()) if v.entitlement == name)
        view = {**ent.model_dump(mode="json"), "machines": usage.machines,
                "rru": round(usage.rru, 3), "jobs": jobs}
        if ent.lends or ent.elastic is not None:  # the region's pool of loans
            alloc = self.cp.allocator
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
        doc = self.cp.jobs.get(name)
        return {**render(JobEntry.of(doc), self._views.get(name)),
                "spec": shown_spec(doc.spec.model_dump(mode="json"))}

    def published(self) -> dict[str, JobState]:
        """Every job as the last pass published it (not a copy: read, never change)."""
        return self._views

    def tasks_view(self, name: str) -> list[dict[str, Any]]:
        self.cp.jobs.get(name)  # NotFound for an unknown job
        job = self._views.get(name)
        return job.task_views() if job is not None else []

    def discovery(self, name: str) -> list[dict[str, Any]]:
        self.cp.jobs.get(name)
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
            self.cp.controllers.check_controller_url(spec.task_controller)
        self.cp.check_job(spec)
        try:
            doc = self.cp.jobs.get(spec.name)
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
        with self.cp.lock:
            job = self.cp.scheduler.jobs.get(spec.name)
            have = set(job.tasks) if job is not None else set()
            request = AllocationRequest.of(
                spec.name, spec.entitlement, spec.resources,
                allocate=[i for i in range(spec.task_count)], policy=spec.policy)
            plan = self.cp.allocator.propose(request)
            fleet = self.cp.fleet
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
        fleet = self.cp.fleet
        broker = self.cp.region.broker_of(m)
        fd = fleet.fault_domain(m)
        res = fleet.resources(m)
        name = fleet.name(m)
        return {
            "id": name, "state": broker.state(m).value, "cordoned": broker.cordoned(m),
            "entitlement": broker.entitlement_of(m),
            "fault_domain": {"dc": fd.dc, "msb": fd.msb, "row": fd.row, "rack": fd.rack},
            "type": fleet.type_names[int(fleet.type_code[m])],
            "cpu": res.cpu, "memory_gb": res.memory_gb,
            "tasks": len(self.cp.scheduler.desired.get(m, {})),
            "events": [e.id for e in broker.events_for(m)],
            "host_profile": self.profile_of(m),
            "loan": self.loan_of(m),
        }

    def loan_of(self, m: int) -> dict[str, Any] | None:
        """The machine's loan, if an elastic entitlement holds it: the borrower, since
        when (as far as this control plane saw it claimed), and a revoke under way (its
        deadline, and when the machine is due back)."""
        sched = self.cp.scheduler
        borrower = self.cp.region.broker_of(m).entitlement_of(m)
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
        if not self.cp.membership.owns(m):
            return None
        sched = self.cp.scheduler
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

        fleet = self.cp.fleet
        states = ("up", "failed", "maintenance")
        names = list(self.cp.region.entitlements.names)
        msb_names = fleet.level_names["msb"]
        cells = []
        for broker in list(self.cp.region.brokers.values()):
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
                start = self.cp.machine_index(after)
            except NotFound:
                raise BadRequest("continue", f"machine {after!r} is not in the "
                                             "region; list again from the start") from None
        with self.cp.lock:
            elastic = self.cp.scheduler.elastic
            found: list[dict[str, Any]] = []
            total = position = 0
            more = False
            for m in range(len(self.cp.fleet)):
                broker = self.cp.region.broker_of(m)
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
        m = self.cp.machine_index(machine)
        with self.cp.lock:
            view = self.machine_view(m)
            view["assigned"] = [f"{a.job}/{a.index}"
                                for a in self.cp.scheduler.desired_for(machine)]
            return view
