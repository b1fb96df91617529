"""The job operations users ask for (create, update, pin, move, resize, rollback,
resume, restart, delete) and the restore of a job from a store: each changes the
job's records and marks it, and the next pass carries it out."""

from __future__ import annotations

from collections.abc import Iterable

import plait.scheduler.machinesets as machinesets
from plait.allocator import AllocationRequest
from plait.errors import Conflict, NotFound, ValidationError
from plait.model.job import JobSpec
from plait.model.task import TaskState
from plait.scheduler.lifecycle import FINISHED
from plait.scheduler.plans import to_target
from plait.scheduler.records import Assigned, JobRecord, TaskRecord, same_runtime
from plait.scheduler.state import SchedulerState
from plait.taskcontrol.protocol import OpKind, RemoteController, TaskController


class JobOperations:
    def __init__(self, state: SchedulerState) -> None:
        self.s = state

    def create_job(self, spec: JobSpec, now: float,
                   controller: TaskController | RemoteController | None = None,
                   cause: str | None = None) -> JobRecord:
        """Persist a job at version 1; its tasks are placed on the next ``tick``.
        Creating the same spec again is a no-op; a different spec is a conflict.
        ``cause``: the id of the request that created it (``JobRecord.cause``)."""
        existing = self.s.jobs.get(spec.name)
        if existing is not None:
            if existing.spec == spec and not existing.deleting:
                return existing
            raise Conflict(f"job {spec.name}", "absent or identical", "exists")
        if spec.entitlement not in self.s.allocator.entitlements:
            raise ValidationError("entitlement", f"entitlement {spec.entitlement!r} does not exist")
        job = JobRecord(spec.name, spec.entitlement, [spec], 1, controller, cause=cause)
        for i in range(spec.task_count):
            job.tasks[i] = TaskRecord(i, 1)
        self.s.jobs[spec.name] = job
        self.s.event(now, job.name, "created", f"{spec.task_count} tasks, version 1")
        return job

    def update_job(self, spec: JobSpec, now: float) -> int:
        """A new spec version, rolled out with pacing. Returns the version number."""
        job = self.job(spec.name)
        if spec.entitlement != job.entitlement:
            raise ValidationError("entitlement", f"job {spec.name} runs in entitlement "
                                  f"{job.entitlement!r}; update cannot move it (move it to "
                                  "another entitlement with a move)")
        if spec == job.spec:
            return job.target
        return self.append_version(spec, now, f"version {len(job.versions) + 1}")

    def add_version(self, spec: JobSpec, now: float, revision: int | None = None) -> int:
        """Keep ``spec`` as the job's next version without rolling it out: tasks run it
        only once pinned to it (``pin``). Returns the version number. ``revision``:
        the version's revision as a store kept it (``JobRecord.pin_revision``), else
        computed."""
        job = self.job(spec.name)
        if not self._bound_here(job, spec.entitlement):
            raise ValidationError("entitlement", f"job {spec.name} runs in entitlement "
                                  f"{job.entitlement!r}; a pinned version stays there "
                                  "(or in one of its canary entitlements)")
        if revision is not None:
            job.pin_revision(len(job.versions) + 1, revision)
        job.versions.append(spec)
        self.s.event(now, job.name, "version_added",
                   f"version {len(job.versions)} kept for pinned tasks")
        return len(job.versions)

    def _bound_here(self, job: JobRecord, entitlement: str) -> bool:
        """A version of the job may run in ``entitlement``: the job's own, or one of
        its canary entitlements (decision 103)."""
        return entitlement == job.entitlement or entitlement in self.s.allocator.canaries.get(
            job.entitlement, ())

    def retarget(self, name: str, version: int, now: float, what: str) -> None:
        """Make version ``version``, kept already, the job's target (its record's
        target moved back past versions kept for pinned tasks)."""
        job = self.job(name)
        if not 1 <= version <= len(job.versions):
            raise ValidationError("version", f"job {name} has no version {version}")
        if version != job.target:
            self._retarget(job, version, now, what)

    def pin(self, name: str, pins: dict[int, int], now: float) -> None:
        """Set which tasks run a version other than the job's target (the Job Control
        Plane's unified spec: ``plait.jcp.unify``); every other task's goal is the
        target. A pinned task moves to its version by the same paced, TaskControl-acked
        operations as an update."""
        job = self.job(name)
        for version in pins.values():
            if not 1 <= version <= len(job.versions):
                raise ValidationError("version", f"job {name} has no version {version}")
            if not self._bound_here(job, job.versions[version - 1].entitlement):
                raise ValidationError("version", f"version {version} of job {name} runs "
                                      "in another entitlement")
        clean = {i: v for i, v in pins.items() if v != job.target}
        if clean == (job.pins or {}):
            return
        before = {i: job.target_of(i) for i in job.in_progress}
        job.pins = clean or None
        # an update to a goal the task no longer has is over (a push rolled back while
        # its task ran the pushed version, unhealthy: the update would wait for a health
        # that never comes, and the task never went back): it is offered its new goal
        for index, goal in before.items():
            rec = job.tasks.get(index)
            if rec is not None and rec.op is not None and to_target(rec.op) and (
                    rec.state is not TaskState.STOPPING) and job.target_of(index) != goal:
                self.s.complete(job, rec)
                if rec.state is TaskState.PENDING:  # stopped, waiting for a machine: it
                    rec.spec_version = job.target_of(index)  # starts at its new goal
        job.rollout_active = True
        job.dirty = True
        self.s.mark(name)
        self.s.event(now, name, "pinned", f"{len(clean)} tasks pinned to other versions "
                   f"than {job.target}")

    def append_version(self, spec: JobSpec, now: float, what: str,
                       revision: int | None = None) -> int:
        """Add ``spec`` as the job's next version and roll it out, even when it equals
        the current one (a rollback, or an operation replayed from the store). A spec
        of another entitlement moves the job there: ``move_job`` checks a move first,
        a move replayed from the store is applied as it was stored. ``revision``: as
        for ``add_version``."""
        job = self.job(spec.name)
        if revision is not None:
            job.pin_revision(len(job.versions) + 1, revision)
        if spec.entitlement != job.entitlement:
            if spec.entitlement not in self.s.allocator.entitlements:
                raise ValidationError("entitlement",
                                      f"entitlement {spec.entitlement!r} does not exist")
            job.moving_from = job.entitlement
            job.entitlement = spec.entitlement
        job.versions.append(spec)
        self._retarget(job, len(job.versions), now, what)
        return job.target

    def set_cause(self, name: str, cause: str | None) -> None:
        """The id of the request whose operation is being applied to the job
        (``JobRecord.cause``: the desired sets it makes name it); a change marks the
        job, so it is stored with its state."""
        job = self.s.jobs.get(name)
        if job is not None and job.cause != cause:
            job.cause = cause
            self.s.mark(name)

    def set_controller(self, name: str,
                       controller: TaskController | RemoteController | None) -> None:
        """Pace the job with ``controller`` from now on (its latest version names
        another one): a request in flight to the one before is forgotten, its answer
        dropped when it comes, and its re-check with it; the new one is called on the
        job's next reconcile."""
        job = self.job(name)
        job.controller = controller
        job.in_flight = None
        job.recheck = None
        self.s.drop_answer(name)
        job.dirty = True
        self.s.mark(name)

    def move_job(self, name: str, entitlement: str, now: float) -> int:
        """Move a job to another entitlement (paper section 3.1): a new version bound to
        ``entitlement``, rolled out like an update. Each task is stopped and placed again
        on machines of the new entitlement (claimed from the free pool as usual) by a
        ``move`` operation, paced by max_unavailable or the job's TaskController; tasks
        keep their indices. A move while another is under way redirects it. Returns
        the version number."""
        job = self.job(name)
        spec = self.check_move(job.spec, entitlement)
        return self.append_version(spec, now, f"version {len(job.versions) + 1}: move from "
                                              f"{job.entitlement} to {entitlement}")

    def check_move(self, spec: JobSpec, entitlement: str) -> JobSpec:
        """``spec`` (a job's latest version) bound to ``entitlement``, once that move is
        possible; otherwise an error that names the problem. Changes nothing: room is
        checked with a placement the allocator proposes and does not commit.

        Refused: an unknown entitlement or the job's own (``ValidationError``), a job
        being deleted, or an entitlement whose machines and quota cannot hold the job's
        tasks right now (``Conflict``). Finished batch tasks need no room."""
        job = self.s.jobs.get(spec.name)
        if job is not None and job.deleting:
            raise Conflict(f"job {spec.name}", "a live job", "being deleted")
        if entitlement not in self.s.allocator.entitlements:
            raise ValidationError("entitlement", f"entitlement {entitlement!r} does not exist")
        if entitlement == spec.entitlement:
            raise ValidationError("entitlement", f"job {spec.name} already runs in entitlement "
                                                 f"{entitlement!r}")
        moved = spec.model_copy(update={"entitlement": entitlement})
        done = set() if job is None else {i for i, r in job.tasks.items() if r.state in FINISHED}
        need = [i for i in range(spec.task_count) if i not in done]
        if need:
            plan = self.s.allocator.propose(AllocationRequest.of(
                spec.name, entitlement, spec.resources, allocate=need, policy=spec.policy))
            if plan.unplaced:
                raise Conflict(f"entitlement {entitlement}",
                               f"room for the {len(need)} tasks of job {spec.name}",
                               f"room for {len(need) - len(plan.unplaced)} "
                               f"({plan.unplaced[0][1]})")
        return moved

    def placeable(self, name: str, task_count: int) -> tuple[int, str | None]:
        """How many of ``task_count`` tasks of the job could be placed now, and why
        not all (the allocator's first reason): its tasks that hold a machine (or
        finished), and as many more as the allocator finds room for in the job's
        entitlement (its quota, its machines and the free pool) in a placement it
        proposes and does not commit. Changes nothing (the autoscaler's cap)."""
        job = self.job(name)
        spec = job.spec
        tasks = job.tasks
        need = [i for i in range(task_count) if (rec := tasks.get(i)) is None or (
            rec.machine is None and rec.state not in FINISHED)]
        if not need:
            return task_count, None
        plan = self.s.allocator.propose(AllocationRequest.of(
            name, job.entitlement, spec.resources, allocate=need, policy=spec.policy))
        if not plan.unplaced:
            return task_count, None
        return task_count - len(plan.unplaced), plan.unplaced[0][1]

    def resize(self, name: str, task_count: int, now: float) -> int:
        job = self.job(name)
        if task_count < 0:
            raise ValidationError("task_count", "must be >= 0")
        return self.update_job(job.spec.model_copy(update={"task_count": task_count}), now)

    def rollback(self, name: str, version: int, now: float) -> int:
        """Return to an earlier version, as a new version rolled out like any update."""
        job = self.job(name)
        if not 1 <= version <= len(job.versions):
            raise ValidationError("version", f"job {name} has versions 1..{len(job.versions)}")
        spec = job.versions[version - 1]
        if spec.entitlement != job.entitlement:  # a rollback stays where the job is
            spec = spec.model_copy(update={"entitlement": job.entitlement})
        return self.append_version(spec, now,
                                   f"version {len(job.versions) + 1}: rollback to version "
                                   f"{version}")

    def resume(self, name: str, now: float) -> None:
        job = self.job(name)
        job.halted = None
        job.rollout_failures = 0
        job.failed_tasks.clear()
        job.dirty = True
        self.s.event(now, name, "rollout_resumed", f"rollout of version {job.target} resumed")

    def restart(self, name: str, now: float, index: int | None = None) -> None:
        """Restart the whole job or one task, through TaskControl like any operation."""
        job = self.job(name)
        targets = job.tasks.values() if index is None else [self.task(job, index)]
        for rec in targets:
            rec.restart = True
        job.dirty = True
        self.s.event(now, name, "restart", "whole job" if index is None else f"task {index}")

    def delete_job(self, name: str, now: float) -> None:
        job = self.job(name)
        job.deleting = True
        # what was under way for the job's tasks is over (an update a halted rollout
        # left on a task that never started would keep the delete's stop from ever
        # being offered): each task is offered its stop, stops under way go on
        for index in list(job.in_progress):
            rec = job.tasks.get(index)
            if rec is None:
                job.in_progress.discard(index)
            elif rec.op is not None and rec.op.kind is not OpKind.STOP and (
                    rec.state is not TaskState.STOPPING):
                self.s.complete(job, rec)
        for index in {op.task.index for op in job.acked.values()}:
            self.s.drop_acked(job, index)
        for index in list(job.offers):
            self.s.cancel_pending(job, index)
        job.dirty = True
        self.s.event(now, name, "deleting", f"stopping {len(job.tasks)} tasks")

    def _retarget(self, job: JobRecord, version: int, now: float, what: str) -> None:
        old = job.versions[job.target - 1]
        job.target = version
        spec = job.spec
        for i in range(spec.task_count):
            if i not in job.tasks:
                job.tasks[i] = TaskRecord(i, job.target_of(i))
        # an update that already restarted its task but is not proven healthy yet
        # is over: the task is offered the new target like any other
        for index in list(job.in_progress):
            rec = job.tasks.get(index)
            if rec is None:
                job.in_progress.discard(index)
            elif rec.op is not None and (
                    to_target(rec.op) or rec.op.kind is OpKind.RESTART) and (
                    rec.state is not TaskState.STOPPING):
                self.s.complete(job, rec)
        if not same_runtime(old, spec):  # a new runtime: a new rollout
            job.halted = None
            job.rollout_failures = 0
            job.failed_tasks.clear()
            job.rollout_active = True
        job.dirty = True
        self.s.event(now, job.name, "updated", what)

    def restore(self, job: JobRecord, desired: Iterable[int]) -> None:
        """Take back a job rebuilt from a store: its tasks' machines, operations under
        way, losses and parking come from the records; ``desired`` lists the tasks
        that were in their machine's desired set."""
        if job.name in self.s.jobs:
            raise Conflict(f"job {job.name}", "absent", "exists")
        self.s.jobs[job.name] = job
        self.s.mark(job.name)
        wanted = set(desired)
        by_machine: dict[int, dict[int, Assigned | None]] = {}
        for rec in job.tasks.values():
            if rec.op is not None:
                job.add_in_progress(rec.index)
            if rec.state is TaskState.LOST:
                job.add_lost(rec.index)
            if rec.parked is not None:
                self.s.parked.setdefault(rec.parked, set()).add(job.ref(rec.index))
            if rec.machine is None:
                continue
            on = by_machine.get(rec.machine)
            if on is None:
                on = by_machine[rec.machine] = {}
            on[rec.index] = job.assigned(rec.spec_version) if rec.index in wanted else None
        # (each machine's sets made once: a job of small tasks has thousands on one)
        for machine, on in by_machine.items():
            self.s.touched.add(machine)
            machinesets.place_all(self.s.placed, machine, job.name, on.keys())
            machinesets.desire_all(self.s.desired, machine, job.name,
                                   {i: a for i, a in on.items() if a is not None})
        job.dirty = True

    def job(self, name: str) -> JobRecord:
        job = self.s.jobs.get(name)
        if job is None:
            raise NotFound("job", name)
        return job

    def task(self, job: JobRecord, index: int) -> TaskRecord:
        rec = job.tasks.get(index)
        if rec is None:
            raise NotFound("task", f"{job.name}/{index}")
        return rec
