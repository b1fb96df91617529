"""The scheduler: jobs and tasks, their lifecycle, pacing, TaskControl calls, rate
limits, failures and planned maintenance (paper sections 2.4, 2.5 and 4).

A pure core object driven by its caller: ``tick(now)`` reconciles, ``report`` takes
agents' statuses, the job operations change desired state. Time is always passed
in; the only outside calls are to the allocator, the brokers' in-memory state and
the jobs' TaskControllers (which the shell may back with HTTP).

One reconcile pass per job, top-down:

1. **operations wanted**: per task, what should happen (update to the target
   version, restart, move off a failed machine, stop for a resize, move or stop for
   announced maintenance); kept as offered operations with stable ids;
2. **acks**: the job's TaskController decides which offered operations may proceed
   (called when something it should hear about happened, or every
   ``recheck_interval``); without one, the built-in policy acks while the job's
   unavailable tasks, for any reason, stay below ``max_unavailable``;
3. **execution**: each acked destructive operation takes a token from the shard's
   bucket; with ``max_unavailable`` set, it is a safety cap even under a
   controller. The task is disabled in service discovery first, then stopped;
4. **placement**: tasks without a machine go to the allocator, then into their
   machine's desired set, which agents pull and converge to.

Exceptions to "never proceed without an ack": a maintenance deadline (what still
runs is stopped, counted apart from the rate limit), and ``failure_deadline`` for
tasks already down on a failed machine.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass

from plait.allocator import AllocationRequest, Allocator
from plait.broker import BrokerChange, ChangeKind
from plait.errors import Conflict, NotFound, ValidationError
from plait.model.events import EventKind
from plait.model.job import JobSpec
from plait.model.machine import MachineState
from plait.model.task import TaskRef, TaskState
from plait.scheduler.lifecycle import DOWN, FINISHED, Event, advance
from plait.scheduler.ratelimit import TokenBucket
from plait.scheduler.records import (
    SEQUENCE_BLOCK,
    Assignment,
    JobRecord,
    Phase,
    SchedulerEvent,
    TaskRecord,
    TaskStatus,
    Wanted,
    same_runtime,
)
from plait.taskcontrol.protocol import (
    AdvanceNotice,
    ControllerAnswer,
    ControllerCall,
    NoticeKind,
    OpKind,
    RemoteController,
    TaskController,
    TaskControlRequest,
    TaskControlResponse,
    TaskOp,
)

_KIND = {kind: kind.value for kind in OpKind}
_RESIZE = "resize"
_DELETE = "job deleted"
_FAILURE = "machine failed"
_RESTART = "restart requested"
#: the reason of the ``move`` that carries a task to a job's new entitlement (followed by
#: its name); unlike other moves, it brings the task to the target version
_RELOCATE = "move to entitlement "


@dataclass(frozen=True)
class SchedulerConfig:
    #: destructive operations per second, and the bucket's size
    rate: float = 20.0
    burst: float = 40.0
    #: most operations offered to a controller in one call
    controller_batch: int = 1000
    #: call a controller again after this long even if nothing changed (unless it
    #: asked to be called again sooner or later: ``ask_again_after``)
    recheck_interval: float = 30.0
    #: a remote controller's request with no answer from the shell after this long
    #: is taken as failed (the shell's own hard deadline is much shorter)
    controller_lost_after: float = 60.0
    #: move a task off a failed machine without an ack after this long
    failure_deadline: float = 300.0
    #: events kept
    event_limit: int = 10_000


class Scheduler:
    def __init__(self, allocator: Allocator, config: SchedulerConfig | None = None,
                 now: float = 0.0) -> None:
        self.allocator = allocator
        self.region = allocator.region
        self.fleet = allocator.index.fleet
        self.config = config or SchedulerConfig()
        self.bucket = TokenBucket(self.config.rate, self.config.burst, now)
        self.now = now
        self.jobs: dict[str, JobRecord] = {}
        #: per machine: the tasks its agent must run
        self.desired: dict[int, dict[TaskRef, Assignment]] = {}
        #: per machine: the tasks whose record names it (desired or stopping)
        self.placed: dict[int, set[TaskRef]] = {}
        self.events: list[SchedulerEvent] = []
        self.counters: dict[str, int] = {
            "ops_started": 0, "ops_completed": 0, "throttled": 0, "deadline_stops": 0,
            "failure_deadline_moves": 0, "controller_errors": 0, "controller_calls": 0,
            "tasks_lost": 0, "reconcile_errors": 0,
        }
        #: machines whose desired set changed since the shell last looked
        self.touched: set[int] = set()
        #: when a set (the shell that persists the scheduler sets it): the jobs whose
        #: records may have changed since the shell last emptied it
        self.changed_jobs: set[str] | None = None
        #: jobs left quiet by their last reconcile and untouched since: ``tick`` skips
        #: them (a region's settled jobs cost nothing per tick)
        self._idle: set[str] = set()
        #: idle jobs with a controller, and when they must be looked at again even
        #: if nothing happens (a re-check due, an answer given up for lost)
        self._wake_at: dict[str, float] = {}
        #: idle jobs whose acked operations wait for the rate limit, oldest first: each
        #: tick wakes as many as there are tokens (not a thousand reconciles a pass
        #: for one or two tokens), in turn
        self._for_tokens: dict[str, None] = {}
        #: the last reconcile's acked operations ran out of tokens
        self._throttled = False
        self._changes: list[BrokerChange] = []
        self._parked: dict[str, set[TaskRef]] = {}
        #: remote controllers' requests for the shell to send (``take_calls``), and
        #: the answers it handed back, applied by the next pass
        self.outbox: list[ControllerCall] = []
        self._answers: dict[str, ControllerAnswer] = {}
        self.region.subscribe(self._changes.append)

    # -- job operations (what users ask for) -------------------------------------------------
    def create_job(self, spec: JobSpec, now: float,
                   controller: TaskController | RemoteController | None = None) -> JobRecord:
        """Persist a job at version 1; its tasks are placed on the next ``tick``.
        Creating the same spec again is a no-op; a different spec is a conflict."""
        existing = self.jobs.get(spec.name)
        if existing is not None:
            if existing.spec == spec and not existing.deleting:
                return existing
            raise Conflict(f"job {spec.name}", "absent or identical", "exists")
        if spec.entitlement not in self.allocator.entitlements:
            raise ValidationError("entitlement", f"entitlement {spec.entitlement!r} does not exist")
        job = JobRecord(spec.name, spec.entitlement, [spec], 1, controller)
        for i in range(spec.task_count):
            job.tasks[i] = TaskRecord(i, 1)
        self.jobs[spec.name] = job
        self._event(now, job.name, "created", f"{spec.task_count} tasks, version 1")
        return job

    def update_job(self, spec: JobSpec, now: float) -> int:
        """A new spec version, rolled out with pacing. Returns the version number."""
        job = self._job(spec.name)
        if spec.entitlement != job.entitlement:
            raise ValidationError("entitlement", f"job {spec.name} runs in entitlement "
                                  f"{job.entitlement!r}; update cannot move it (move it to "
                                  "another entitlement with a move)")
        if spec == job.spec:
            return job.target
        return self.append_version(spec, now, f"version {len(job.versions) + 1}")

    def append_version(self, spec: JobSpec, now: float, what: str) -> int:
        """Add ``spec`` as the job's next version and roll it out, even when it equals
        the current one (a rollback, or an operation replayed from the store). A spec
        of another entitlement moves the job there: ``move_job`` checks a move first,
        a move replayed from the store is applied as it was stored."""
        job = self._job(spec.name)
        if spec.entitlement != job.entitlement:
            if spec.entitlement not in self.allocator.entitlements:
                raise ValidationError("entitlement",
                                      f"entitlement {spec.entitlement!r} does not exist")
            job.moving_from = job.entitlement
            job.entitlement = spec.entitlement
        job.versions.append(spec)
        self._retarget(job, len(job.versions), now, what)
        return job.target

    def move_job(self, name: str, entitlement: str, now: float) -> int:
        """Move a job to another entitlement (paper section 3.1): a new version bound to
        ``entitlement``, rolled out like an update. Each task is stopped and placed again
        on machines of the new entitlement (claimed from the free pool as usual) by a
        ``move`` operation, paced by max_unavailable or the job's TaskController; tasks
        keep their indices. A move while another is under way redirects it. Returns
        the version number."""
        job = self._job(name)
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
        job = self.jobs.get(spec.name)
        if job is not None and job.deleting:
            raise Conflict(f"job {spec.name}", "a live job", "being deleted")
        if entitlement not in self.allocator.entitlements:
            raise ValidationError("entitlement", f"entitlement {entitlement!r} does not exist")
        if entitlement == spec.entitlement:
            raise ValidationError("entitlement", f"job {spec.name} already runs in entitlement "
                                                 f"{entitlement!r}")
        moved = spec.model_copy(update={"entitlement": entitlement})
        done = set() if job is None else {i for i, r in job.tasks.items() if r.state in FINISHED}
        need = [i for i in range(spec.task_count) if i not in done]
        if need:
            plan = self.allocator.propose(AllocationRequest.of(
                spec.name, entitlement, spec.resources, allocate=need, policy=spec.policy))
            if plan.unplaced:
                raise Conflict(f"entitlement {entitlement}",
                               f"room for the {len(need)} tasks of job {spec.name}",
                               f"room for {len(need) - len(plan.unplaced)} "
                               f"({plan.unplaced[0][1]})")
        return moved

    def resize(self, name: str, task_count: int, now: float) -> int:
        job = self._job(name)
        if task_count < 0:
            raise ValidationError("task_count", "must be >= 0")
        return self.update_job(job.spec.model_copy(update={"task_count": task_count}), now)

    def rollback(self, name: str, version: int, now: float) -> int:
        """Return to an earlier version, as a new version rolled out like any update."""
        job = self._job(name)
        if not 1 <= version <= len(job.versions):
            raise ValidationError("version", f"job {name} has versions 1..{len(job.versions)}")
        spec = job.versions[version - 1]
        if spec.entitlement != job.entitlement:  # a rollback stays where the job is
            spec = spec.model_copy(update={"entitlement": job.entitlement})
        return self.append_version(spec, now,
                                   f"version {len(job.versions) + 1}: rollback to version "
                                   f"{version}")

    def resume(self, name: str, now: float) -> None:
        job = self._job(name)
        job.halted = None
        job.rollout_failures = 0
        job.failed_tasks.clear()
        job.dirty = True
        self._event(now, name, "rollout_resumed", f"rollout of version {job.target} resumed")

    def restart(self, name: str, now: float, index: int | None = None) -> None:
        """Restart the whole job or one task, through TaskControl like any operation."""
        job = self._job(name)
        targets = job.tasks.values() if index is None else [self._task(job, index)]
        for rec in targets:
            rec.restart = True
        job.dirty = True
        self._event(now, name, "restart", "whole job" if index is None else f"task {index}")

    def delete_job(self, name: str, now: float) -> None:
        job = self._job(name)
        job.deleting = True
        job.dirty = True
        self._event(now, name, "deleting", f"stopping {len(job.tasks)} tasks")

    def _retarget(self, job: JobRecord, version: int, now: float, what: str) -> None:
        old = job.versions[job.target - 1]
        job.target = version
        spec = job.spec
        for i in range(spec.task_count):
            if i not in job.tasks:
                job.tasks[i] = TaskRecord(i, version)
        # an update that already restarted its task but is not proven healthy yet
        # is over: the task is offered the new target like any other
        for index in list(job.in_progress):
            rec = job.tasks.get(index)
            if rec is None:
                job.in_progress.discard(index)
            elif rec.op is not None and (
                    _to_target(rec.op) or rec.op.kind is OpKind.RESTART) and (
                    rec.state is not TaskState.STOPPING):
                self._complete(job, rec)
        if not same_runtime(old, spec):  # a new runtime: a new rollout
            job.halted = None
            job.rollout_failures = 0
            job.failed_tasks.clear()
            job.rollout_active = True
        job.dirty = True
        self._event(now, job.name, "updated", what)

    def restore(self, job: JobRecord, desired: Iterable[int]) -> None:
        """Take back a job rebuilt from a store: its tasks' machines, operations under
        way, losses and parking come from the records; ``desired`` lists the tasks
        that were in their machine's desired set."""
        if job.name in self.jobs:
            raise Conflict(f"job {job.name}", "absent", "exists")
        self.jobs[job.name] = job
        self._mark(job.name)
        wanted = set(desired)
        for rec in job.tasks.values():
            if rec.op is not None:
                job.in_progress.add(rec.index)
            if rec.state is TaskState.LOST:
                job.lost.add(rec.index)
            if rec.parked is not None:
                self._parked.setdefault(rec.parked, set()).add(job.ref(rec.index))
            if rec.machine is None:
                continue
            ref = job.ref(rec.index)
            self.placed.setdefault(rec.machine, set()).add(ref)
            self.touched.add(rec.machine)
            if rec.index in wanted:
                self.desired.setdefault(rec.machine, {})[ref] = Assignment(
                    job.name, rec.index, rec.spec_version, job.revision(rec.spec_version),
                    job.versions[rec.spec_version - 1])
        job.dirty = True

    # -- reading -----------------------------------------------------------------------------
    def job(self, name: str) -> JobRecord:
        return self._job(name)

    def desired_for(self, machine: str) -> list[Assignment]:
        m = self.fleet.index_of(machine)
        return sorted(self.desired.get(m, {}).values(), key=lambda a: (a.job, a.index))

    def discovery(self, name: str) -> list[tuple[int, str]]:
        """(task index, machine) of the tasks enabled in service discovery."""
        job = self._job(name)
        return [(r.index, self.fleet.name(r.machine)) for r in sorted(
            job.tasks.values(), key=lambda r: r.index) if r.serving and r.machine is not None]

    def on_entitlement(self, job: JobRecord) -> int:
        """Tasks of the job, within its count, running healthy (or finished) at a version
        of its entitlement: the progress of a move (the allocator places a task only
        on machines of the entitlement its request names)."""
        count, versions, ent = job.spec.task_count, job.versions, job.entitlement
        return sum(1 for r in job.tasks.values() if r.index < count and (
            (r.state is TaskState.RUNNING and r.healthy) or r.state in FINISHED)
            and versions[r.spec_version - 1].entitlement == ent)

    def unavailable(self, job: JobRecord) -> int:
        count = job.spec.task_count
        return sum(1 for r in job.tasks.values() if r.index < count and _down(r))

    def _job(self, name: str) -> JobRecord:
        job = self.jobs.get(name)
        if job is None:
            raise NotFound("job", name)
        return job

    def _task(self, job: JobRecord, index: int) -> TaskRecord:
        rec = job.tasks.get(index)
        if rec is None:
            raise NotFound("task", f"{job.name}/{index}")
        return rec

    def _mark(self, job: str) -> None:
        """Something about the job changed: reconcile it on the next tick (and tell a
        shell that persists it)."""
        self._idle.discard(job)
        if self.changed_jobs is not None:
            self.changed_jobs.add(job)

    def _quiet(self, job: JobRecord) -> bool:
        """Nothing under way: every task runs the target, serving, with nothing
        offered or acked; such a job changes only through an outside input."""
        if job.offers or job.acked or job.in_progress or job.lost or job.deleting or (
                len(job.tasks) != job.spec.task_count):
            return False
        running, finished = TaskState.RUNNING, FINISHED
        return all(((r.state is running and r.serving) or r.state in finished)
                   and r.op is None for r in job.tasks.values())

    def _waiting(self, job: JobRecord) -> bool:
        """Nothing for the scheduler to do until an input arrives (an agent's report, a
        machine change, a job operation): every task is placed at the target version
        and runs or is being started by its agent, with nothing offered or under way."""
        if job.offers or job.acked or job.in_progress or job.lost or job.deleting or (
                len(job.tasks) != job.spec.task_count):
            return False
        target, live = job.target, _LIVE
        return all(r.state in live and r.op is None and not r.restart
                   and r.spec_version == target for r in job.tasks.values())

    def _waiting_for_controller(self, job: JobRecord) -> bool:
        """Operations offered to the job's controller, and nothing else under way:
        only its answer (or its re-check) can move the job on."""
        return not job.acked and self._only_ops(job)

    def _only_ops(self, job: JobRecord) -> bool:
        """Every task placed, with no operation under way and none lost: a reconcile
        can only offer, ack (or call about) and start operations."""
        if job.in_progress or job.lost or job.deleting or (
                len(job.tasks) != job.spec.task_count):
            return False
        live = _LIVE
        return all(r.state in live and r.op is None for r in job.tasks.values())

    def _unchanged(self, job: JobRecord) -> tuple[object, ...]:
        """What a reconcile of a job of ``_only_ops`` changes when it changes anything
        worth storing or showing (compared around it)."""
        return (job.op_counter, job.target, len(job.offers), len(job.acked),
                len(job.completed), job.notices, job.halted, job.error,
                job.sequence_number // SEQUENCE_BLOCK, self.counters["ops_started"])

    def _controller_timer(self, job: JobRecord) -> float:
        """When an idle job with a controller must be looked at again by itself: its
        answer given up for lost, or its re-check due (far off when nothing is
        offered: nothing to ask about)."""
        if job.in_flight is not None:
            return job.in_flight_since + self.config.controller_lost_after
        if not job.offers or job.last_call is None:
            return float("inf")
        recheck = self.config.recheck_interval if job.recheck is None else job.recheck
        return job.last_call + recheck

    def _event(self, now: float, job: str, kind: str, message: str) -> None:
        self._mark(job)
        self.events.append(SchedulerEvent(now, job, kind, message))
        if len(self.events) > self.config.event_limit:
            del self.events[: len(self.events) - self.config.event_limit]

    # -- agents ------------------------------------------------------------------------------
    def report(self, machine: str, statuses: Iterable[TaskStatus], now: float) -> None:
        """An agent's heartbeat: the statuses of the tasks on its machine."""
        m = self.fleet.index_of(machine)
        self.now = now
        seen: set[TaskRef] = set()
        for st in statuses:
            ref = TaskRef(st.job, st.index)
            job = self.jobs.get(st.job)
            rec = job.tasks.get(st.index) if job is not None else None
            if job is None or rec is None or rec.machine != m:
                continue  # a stale copy; the agent stops it (not in its desired set)
            seen.add(ref)
            phase = st.phase
            if not ((phase is Phase.STARTING and rec.state is TaskState.STARTING)
                    or (phase is Phase.RUNNING and rec.state is TaskState.RUNNING
                        and st.healthy == rec.healthy and rec.serving and rec.op is None)):
                self._mark(st.job)  # a heartbeat that changes nothing leaves the job idle
            if st.phase is Phase.STOPPED:
                self._stopped(job, rec, now)
            elif st.revision != job.revision(rec.spec_version):
                continue  # the old version still winding down
            elif st.phase is Phase.STARTING:
                self._transition(rec, Event.STARTING)
            elif st.phase is Phase.RUNNING:
                self._transition(rec, Event.RUNNING)
                if st.healthy and not rec.healthy:
                    rec.healthy_since = now
                rec.healthy = st.healthy
                self._maybe_serving(job, rec, now)
            elif st.phase is Phase.EXITED and st.final:
                self._finished(job, rec, st.exit_code, now)
            elif st.phase is Phase.EXITED:
                self._exited(job, rec, now)
        # a task this machine was stopping and no longer has is stopped
        for ref in list(self.placed.get(m, ())):
            if ref in seen:
                continue
            job = self.jobs.get(ref.job)
            rec = job.tasks.get(ref.index) if job is not None else None
            if job is not None and rec is not None and rec.state is TaskState.STOPPING:
                self._mark(job.name)
                self._stopped(job, rec, now)

    def _transition(self, rec: TaskRecord, event: Event) -> bool:
        nxt = advance(rec.state, event)
        if nxt is None:
            return False
        rec.state = nxt
        return True

    def _maybe_serving(self, job: JobRecord, rec: TaskRecord, now: float) -> None:
        if rec.state is not TaskState.RUNNING or not rec.healthy:
            if rec.serving:
                rec.serving = False
            return
        if rec.op is not None and rec.op.kind is not OpKind.STOP:
            ready = job.versions[rec.spec_version - 1].update.min_ready_seconds
            if rec.healthy_since is None or now - rec.healthy_since < ready:
                return  # not proven healthy yet: the operation is still in progress
            self._complete(job, rec)
        if rec.op is None and not rec.serving:
            rec.serving = True
        self._rollout_done(job, now)

    def _rollout_done(self, job: JobRecord, now: float) -> None:
        if job.rollout_active and all(
                r.spec_version == job.target and (
                    (r.state is TaskState.RUNNING and r.healthy)
                    or r.state is TaskState.SUCCEEDED)
                for r in job.tasks.values()):
            job.rollout_active = False
            self._event(now, job.name, "rollout_done", f"all tasks run version {job.target}")
            if job.moving_from is not None:
                job.moving_from = None
                self._event(now, job.name, "move_done",
                            f"every task runs in entitlement {job.entitlement}")

    def _exited(self, job: JobRecord, rec: TaskRecord, now: float) -> None:
        if not self._transition(rec, Event.EXITED):
            return
        rec.healthy = False
        rec.healthy_since = None
        rec.serving = False
        job.dirty = True
        if job.rollout_active and rec.spec_version == job.target:
            job.failed_tasks.add(rec.index)
            job.rollout_failures = len(job.failed_tasks)
            # never more than the tasks pacing lets go down at once, or a bad version
            # under a small max_unavailable would stall instead of halting
            update = job.spec.update
            cap = update.resolve(job.spec.task_count)
            limit = min(update.halt_after_failures, cap or update.halt_after_failures)
            if job.halted is None and job.rollout_failures >= limit:
                job.halted = (f"{job.rollout_failures} tasks of version {job.target} failed "
                              "to become healthy")
                self._event(now, job.name, "rollout_halted", job.halted)
                for op in [o for o in job.acked.values() if _to_target(o)]:
                    del job.acked[op.op_id]  # acked but not started: dropped, reported done
                    if job.controller is not None:
                        job.completed.append(op)

    def _finished(self, job: JobRecord, rec: TaskRecord, code: int | None, now: float) -> None:
        """A batch task exited for good: it leaves its machine, whose resources go
        back to the entitlement; the job completes when every task succeeded."""
        ok = code == 0
        if not self._transition(rec, Event.SUCCEEDED if ok else Event.GAVE_UP):
            return
        if rec.op is not None:
            self._complete(job, rec)  # an update or restart ends with the run
        self._drop_acked(job, rec.index)
        self._cancel_pending(job, rec.index)
        job.lost.discard(rec.index)
        rec.lost_since = None
        rec.parked = None
        if rec.machine is not None:
            self._unassign(job.ref(rec.index), rec.machine)
        rec.machine = None
        rec.serving = rec.healthy = False
        rec.healthy_since = None
        rec.exit_code = code
        job.dirty = True
        spec = job.spec
        self.allocator.allocate(AllocationRequest.of(
            job.name, job.entitlement, spec.resources, free=[rec.index], policy=spec.policy))
        if not ok:
            self._event(now, job.name, "task_failed",
                        f"task {rec.index} exited with code {code} and will not be started "
                        f"again (restart policy {spec.restart.policy})")
            if sum(1 for r in job.tasks.values() if r.state is TaskState.DEAD) == 1:
                self._event(now, job.name, "job_failed", f"task {rec.index} failed for good")
        elif all(r.state is TaskState.SUCCEEDED for r in job.tasks.values()) and (
                len(job.tasks) == spec.task_count):
            self._event(now, job.name, "job_completed",
                        f"all {spec.task_count} tasks exited 0")
        self._rollout_done(job, now)

    def _stopped(self, job: JobRecord, rec: TaskRecord, now: float) -> None:
        if not self._transition(rec, Event.STOPPED):
            return
        op = rec.op
        if op is None:
            return
        if op.kind is OpKind.STOP:
            if op.reason in (_RESIZE, _DELETE):
                self._free(job, [rec])  # completes the operation
            else:  # stopped for maintenance: parked until it ends, allocation kept
                event_id = op.reason.rsplit(" ", 1)[-1]
                rec.parked = event_id
                self._parked.setdefault(event_id, set()).add(job.ref(rec.index))
                self._complete(job, rec)
            return
        if _to_target(op):
            rec.spec_version = job.target
        if op.kind is OpKind.RESTART:
            rec.restart = False
        self._transition(rec, Event.REPLACE)

    def _complete(self, job: JobRecord, rec: TaskRecord) -> None:
        assert rec.op is not None
        if job.controller is not None:
            job.completed.append(rec.op)
        rec.op = None
        job.in_progress.discard(rec.index)
        job.dirty = True
        self.counters["ops_completed"] += 1

    # -- machines ----------------------------------------------------------------------------
    def _assign(self, job: JobRecord, rec: TaskRecord, machine: int) -> None:
        ref = job.ref(rec.index)
        if rec.machine is not None and rec.machine != machine:
            self._unassign(ref, rec.machine)
        rec.machine = machine
        self.touched.add(machine)
        self.placed.setdefault(machine, set()).add(ref)
        self.desired.setdefault(machine, {})[ref] = Assignment(
            job.name, rec.index, rec.spec_version, job.revision(rec.spec_version),
            job.versions[rec.spec_version - 1])

    def _unassign(self, ref: TaskRef, machine: int) -> None:
        self.touched.add(machine)
        self.desired.get(machine, {}).pop(ref, None)
        self.placed.get(machine, set()).discard(ref)

    def _take_out(self, ref: TaskRef, rec: TaskRecord) -> None:
        """Leave the machine's desired set (its agent stops the task); the record
        keeps naming the machine until the stop is seen."""
        rec.serving = False
        rec.healthy = False
        rec.healthy_since = None
        if rec.machine is not None:
            self.touched.add(rec.machine)
            self.desired.get(rec.machine, {}).pop(ref, None)

    def _free(self, job: JobRecord, recs: list[TaskRecord]) -> None:
        spec = job.spec
        indices = [r.index for r in recs]
        if indices:
            self.allocator.allocate(AllocationRequest.of(
                job.name, job.entitlement, spec.resources, free=indices, policy=spec.policy))
        for rec in recs:
            if rec.op is not None:
                self._complete(job, rec)
            self._drop_acked(job, rec.index)
            if rec.machine is not None:
                self._unassign(job.ref(rec.index), rec.machine)
            job.offers.pop(rec.index, None)
            job.serials.pop(rec.index, None)
            job.lost.discard(rec.index)
            del job.tasks[rec.index]
            if rec.index < spec.task_count and not job.deleting:
                job.tasks[rec.index] = TaskRecord(rec.index, job.target)  # resized back up

    def _on_machines(self, now: float) -> None:
        changes, self._changes[:] = list(self._changes), []
        for change in changes:
            if change.kind is not ChangeKind.STATE:
                continue
            m = change.machine
            refs = list(self.placed.get(m, ()))
            if change.state is MachineState.FAILED:
                for ref in refs:
                    self._lose(ref, now)
            elif change.state is MachineState.HEALTHY:
                for ref in refs:
                    job = self.jobs.get(ref.job)
                    rec = job.tasks.get(ref.index) if job else None
                    if job is None or rec is None or rec.state is not TaskState.LOST:
                        continue
                    self._mark(job.name)
                    if rec.op is None and self._transition(rec, Event.RECOVERED):
                        self._assign(job, rec, m)
                        rec.lost_since = None
                        job.lost.discard(rec.index)
                        self._cancel_pending(job, rec.index)
                        self._drop_acked(job, rec.index)

    def _lose(self, ref: TaskRef, now: float) -> None:
        job = self.jobs.get(ref.job)
        rec = job.tasks.get(ref.index) if job else None
        if job is None or rec is None:
            return
        self._mark(job.name)
        if rec.state is TaskState.STOPPING:
            op = rec.op
            if op is not None and op.kind is OpKind.STOP and op.reason in (_RESIZE, _DELETE):
                self._stopped(job, rec, now)  # its machine is gone: nothing left to stop
                return
            # stopping to restart, move or wait out maintenance: its machine is gone,
            # so whatever it was doing is over and it needs a new home
            if op is not None:
                self._complete(job, rec)
            rec.state = TaskState.LOST
            rec.parked = None
            rec.lost_since = now
            job.lost.add(rec.index)
            self._drop_acked(job, rec.index)
            self._cancel_pending(job, rec.index)
            self.counters["tasks_lost"] += 1
            return
        if rec.op is not None and rec.state is not TaskState.PENDING:
            self._complete(job, rec)  # whatever was under way is over: it is down now
        self._drop_acked(job, rec.index)
        if self._transition(rec, Event.LOST):
            job.lost.add(rec.index)
            rec.serving = False
            rec.healthy = False
            rec.lost_since = now
            rec.parked = None
            job.dirty = True
            self.counters["tasks_lost"] += 1
            self._cancel_pending(job, rec.index)
            where = self.fleet.name(rec.machine) if rec.machine is not None else "?"
            self._event(now, job.name, "task_lost", f"task {rec.index}: machine {where} is down")

    def _maintenance(self, now: float) -> dict[int, tuple[str, float]]:
        """Stop what still runs at a maintenance deadline; bring parked tasks back when
        their maintenance is over. Returns machines under notice -> (event, start)."""
        notice: dict[int, tuple[str, float]] = {}
        live: set[str] = set()
        for ev in self.region.events():
            if ev.kind is not EventKind.MAINTENANCE:
                continue
            live.add(ev.id)
            machines = [self.fleet.index_of(name) for name in ev.machines]
            if now < ev.start:
                for m in machines:
                    notice.setdefault(m, (ev.id, ev.start))
                continue
            for m in machines:  # deadline reached: stop what still runs
                for ref in list(self.placed.get(m, ())):
                    self._deadline_stop(ref, ev.id, now)
        for event_id in [e for e in self._parked if e not in live]:
            for ref in self._parked.pop(event_id):
                job = self.jobs.get(ref.job)
                rec = job.tasks.get(ref.index) if job else None
                if job is None or rec is None or rec.parked != event_id:
                    continue
                rec.parked = None
                self._mark(job.name)
                if rec.machine is not None and self._transition(rec, Event.ALLOCATED):
                    self._assign(job, rec, rec.machine)
        return notice

    def _deadline_stop(self, ref: TaskRef, event_id: str, now: float) -> None:
        job = self.jobs.get(ref.job)
        rec = job.tasks.get(ref.index) if job else None
        if job is None or rec is None or rec.parked == event_id:
            return
        if rec.state in (TaskState.STOPPED, TaskState.LOST, TaskState.PENDING):
            return
        if rec.op is not None:
            if rec.op.kind is OpKind.STOP or rec.state is TaskState.STOPPING:
                return  # already being stopped
            self._complete(job, rec)  # an update or move under way ends here
        self._drop_acked(job, rec.index)
        self._take_out(ref, rec)
        rec.state = TaskState.STOPPED
        rec.healthy = False
        rec.parked = event_id
        self._parked.setdefault(event_id, set()).add(ref)
        self._cancel_pending(job, rec.index)
        job.dirty = True
        self.counters["deadline_stops"] += 1
        self._event(now, job.name, "deadline_stop",
                    f"task {rec.index} stopped for maintenance {event_id} at its deadline")

    # -- the reconcile loop ------------------------------------------------------------------
    def tick(self, now: float) -> None:
        self.now = now
        self.bucket.refill(now)
        self._on_machines(now)
        notice = self._maintenance(now)
        idle = self._idle
        if self._wake_at:
            for name in [n for n, at in self._wake_at.items() if at <= now]:
                del self._wake_at[name]
                idle.discard(name)
        if self._for_tokens:
            for name in itertools.islice(self._for_tokens, int(self.bucket.tokens)):
                idle.discard(name)
        for name in sorted(self.jobs):
            job = self.jobs[name]
            if name in idle and not (notice and any(
                    r.machine in notice for r in job.tasks.values())):
                continue  # nothing under way and nothing new: its reconcile is a no-op
            quiet = self._quiet(job)
            # a job waiting for its controller's answer or for the rate limit, whose
            # reconcile changed nothing but a call's own bookkeeping, is not marked
            # changed (nothing to store or show)
            before = self._unchanged(job) if self._only_ops(job) else None
            started = self.counters["ops_started"]
            self._throttled = False
            try:
                self._reconcile(job, notice, now)
            except Exception as exc:  # one job's failure must not stall the region
                self.counters["reconcile_errors"] += 1
                error = f"{type(exc).__name__}: {exc}"
                self._mark(name)
                if error != job.error:
                    job.error = error
                    self._event(now, name, "reconcile_failed", error)
                continue
            job.error = None
            quiet_now = self._quiet(job)
            if not (quiet and quiet_now) and not (
                    before is not None and self._only_ops(job)
                    and before == self._unchanged(job)):
                self._mark(name)
            for_tokens = self._throttled and not job.dirty and self._only_ops(job)
            if not for_tokens:
                self._for_tokens.pop(name, None)
            elif name not in self._for_tokens or self.counters["ops_started"] > started:
                self._for_tokens.pop(name, None)  # its turn is over: to the back
                self._for_tokens[name] = None
            if job.controller is None:
                if quiet_now or self._waiting(job) or for_tokens:
                    idle.add(name)
            elif not job.dirty and (quiet_now or self._waiting(job) or for_tokens
                                    or self._waiting_for_controller(job)):
                # only an answer, an input or its timer can move it on
                idle.add(name)
                at = self._controller_timer(job)
                if at < float("inf"):
                    self._wake_at[name] = at
                else:
                    self._wake_at.pop(name, None)
            if job.deleting and not job.tasks:
                del self.jobs[name]
                self._wake_at.pop(name, None)
                self._for_tokens.pop(name, None)
                self.allocator.cache.drop(name)
                self._event(now, name, "deleted", "all tasks stopped")

    def _reconcile(self, job: JobRecord, notice: dict[int, tuple[str, float]],
                   now: float) -> None:
        for index in list(job.in_progress):  # operations waiting for min_ready_seconds
            rec = job.tasks.get(index)
            if rec is None:
                job.in_progress.discard(index)
            elif rec.state is TaskState.RUNNING and rec.healthy:
                self._maybe_serving(job, rec, now)
        self._want(job, notice, now)
        if job.controller is not None and not job.deleting:
            self._ask_controller(job, notice, now)
        else:
            self._builtin_acks(job)
        self._failure_deadline(job, now)
        self._execute(job, now)
        self._place(job, now)
        if job.rollout_active and not job.tasks:
            self._rollout_done(job, now)  # no task left to report running

    # stage 1: operations wanted ------------------------------------------------------------
    def _want(self, job: JobRecord, notice: dict[int, tuple[str, float]], now: float) -> None:
        spec = job.spec
        count = 0 if job.deleting else spec.task_count
        target = job.target
        runtime_same = job.same_as(target)
        acked_tasks = {op.task.index for op in job.acked.values()}
        # the wanted tuples are shared, so "unchanged" is a cheap comparison
        stop: Wanted = ((OpKind.STOP, _DELETE if job.deleting else _RESIZE),)
        move: Wanted = ((OpKind.MOVE, _FAILURE),)
        restart: Wanted = ((OpKind.RESTART, _RESTART),)
        update: Wanted = ((OpKind.UPDATE, f"update to version {target}"),)
        relocate: Wanted = ((OpKind.MOVE, f"{_RELOCATE}{job.entitlement}"),)
        #: per version: the operation that brings a task of it to the target (an update,
        #: or a move for a version of another entitlement); finished tasks need none
        to_target: dict[int, Wanted] = {}
        maintenance: dict[str, Wanted] = {}
        none: Wanted = ()
        offers, serials = job.offers, job.serials
        dropped: list[TaskRecord] = []
        gone: list[TaskRecord] = []
        # one pass over the tasks, with everything it touches in locals: this loop
        # is most of the cost of planning a 15,000-task update
        pending, lost, finished = TaskState.PENDING, TaskState.LOST, FINISHED
        serial = job.op_counter
        dirty = False
        settled = False  # a finished task reached the target without running again
        halted = job.halted is not None
        for rec in job.tasks.values():
            i = rec.index
            state = rec.state
            if rec.op is not None:
                if i >= count and state is pending:
                    dropped.append(rec)  # stopped for an update, then resized away
                continue
            if i in acked_tasks:
                continue
            wanted = none
            if i >= count:
                if rec.machine is not None or not (state is pending or state in finished):
                    wanted = stop
                else:
                    gone.append(rec)  # never placed, or finished: it just goes away
                    continue
            elif state in finished:
                if rec.spec_version != target and same_runtime(
                        _placed_in(job.versions[rec.spec_version - 1], spec.entitlement), spec):
                    # a resize or a move only: it stays finished (a move relocates
                    # what runs; a finished task has nothing to move)
                    rec.spec_version = target
                    settled = True
                if rec.restart or rec.spec_version != target:
                    # run it again, at the target version: it holds no machine, so
                    # this takes nothing down and needs no operation
                    self._transition(rec, Event.RERUN)
                    rec.spec_version = target
                    rec.restart = False
                    rec.exit_code = None
                    dirty = True
                continue
            elif state is lost:
                wanted = move
            elif rec.parked is not None or state is pending:
                pass
            elif rec.restart:
                wanted = restart
            elif rec.spec_version != target:
                same = runtime_same.get(rec.spec_version)
                if same is None:
                    same = runtime_same[rec.spec_version] = same_runtime(
                        job.versions[rec.spec_version - 1], spec)
                if same:
                    rec.spec_version = target  # a resize only: nothing to restart
                    if rec.machine is not None:
                        self._assign(job, rec, rec.machine)
                elif not halted:
                    wanted = to_target.get(rec.spec_version) or to_target.setdefault(
                        rec.spec_version, relocate if job.versions[
                            rec.spec_version - 1].entitlement != spec.entitlement else update)
            if notice and not wanted and rec.machine is not None and rec.machine in notice:
                event_id = notice[rec.machine][0]
                wanted = maintenance.get(event_id) or maintenance.setdefault(
                    event_id, ((OpKind.MOVE, f"maintenance {event_id}"),
                               (OpKind.STOP, f"maintenance {event_id}")))
            have = offers.get(i)
            if have is None:
                if wanted:
                    serial += 1
                    offers[i] = wanted
                    serials[i] = serial
                    dirty = True
            elif have is not wanted and have != wanted:
                if wanted:
                    serial += 1
                    offers[i] = wanted
                    serials[i] = serial
                else:
                    del offers[i]
                    del serials[i]
                dirty = True
        job.op_counter = serial
        if dirty:
            job.dirty = True
        if settled:
            self._rollout_done(job, now)  # no report would tell: it runs nowhere
        for rec in dropped:
            self._complete(job, rec)
            self._free(job, [rec])
        for rec in gone:
            offers.pop(rec.index, None)
            serials.pop(rec.index, None)
            del job.tasks[rec.index]

    def _ops(self, job: JobRecord, index: int) -> list[TaskOp]:
        """The TaskOps offered for one task (made on demand; ids are stable)."""
        wanted, serial = job.offers[index], job.serials[index]
        rec = job.tasks[index]
        machine = self.fleet.name(rec.machine) if rec.machine is not None else None
        ref = job.ref(index)
        return [TaskOp(f"{job.name}/{index}/{_KIND[kind]}/{serial}", ref, kind, reason, machine)
                for kind, reason in wanted]

    def _drop_acked(self, job: JobRecord, index: int) -> None:
        """Acked operations of a task whose situation changed no longer apply; a
        controller is told they are over (so it does not wait for them)."""
        for op_id in [k for k, op in job.acked.items() if op.task.index == index]:
            op = job.acked.pop(op_id)
            if job.controller is not None:
                job.completed.append(op)
            job.dirty = True

    def _cancel_pending(self, job: JobRecord, index: int) -> None:
        if job.offers.pop(index, None) is not None:
            job.serials.pop(index, None)
            job.dirty = True

    # stage 2: acks -------------------------------------------------------------------------
    def _builtin_acks(self, job: JobRecord) -> None:
        """Without a controller: keep unavailable tasks, whatever the reason, below
        max_unavailable; stops of tasks beyond the count and moves of tasks already
        down cost nothing."""
        if not job.offers:
            return
        count = job.spec.task_count
        cap = job.spec.update.resolve(count)
        tasks = job.tasks
        running, finished = TaskState.RUNNING, FINISHED
        down = {i for i, r in tasks.items() if r.state not in finished and (
            r.state is not running or not r.healthy or not r.serving)}
        budget = (1 if cap is None else cap) - sum(1 for i in down if i < count) - sum(
            1 for op in job.acked.values() if op.task.index not in down)
        free_all = job.deleting
        offers, serials, acked = job.offers, job.serials, job.acked
        name, fleet = job.name, self.fleet
        for index in sorted(offers):
            if not (free_all or index >= count or index in down):
                if budget <= 0:
                    continue
                budget -= 1
            # the first offer: a move before a stop for maintenance (``_ops`` inlined)
            wanted, serial = offers.pop(index), serials.pop(index)
            kind, reason = wanted[0]
            machine = tasks[index].machine
            op = TaskOp(f"{name}/{index}/{_KIND[kind]}/{serial}", TaskRef(name, index), kind,
                        reason, fleet.name(machine) if machine is not None else None)
            acked[op.op_id] = op

    def _ask_controller(self, job: JobRecord, notice: dict[int, tuple[str, float]],
                        now: float) -> None:
        """Plan the job's TaskControl request when the controller should hear of
        something (or its re-check is due). An in-process controller answers at once;
        a remote one's request goes to ``outbox`` for the shell, and its answer is
        applied by a later pass (``answer``): the pass never waits on a tenant."""
        notices = self._notices(job, notice)
        notice_key = tuple(n.notice_id for n in notices)
        if notice_key != job.notices:
            job.notices = notice_key
            job.dirty = True
        remote = isinstance(job.controller, RemoteController)
        if remote and job.in_flight is not None:
            got = self._answers.pop(job.name, None)
            if got is not None:
                self._answered(job, job.in_flight, got.response, got.error, now)
                job.in_flight = None
            elif now - job.in_flight_since >= self.config.controller_lost_after:
                # the shell enforces a hard deadline, so this is a safety net: a
                # request it lost (a restart of the dispatcher) must not hold the job
                lost = job.in_flight
                job.in_flight = None
                self._answered(job, lost, None, "no answer came back from the shell", now)
            else:
                return  # one call at a time per job; the answer is applied when it comes
        recheck = self.config.recheck_interval if job.recheck is None else job.recheck
        due = job.offers and (job.last_call is None or now - job.last_call >= recheck)
        if not (job.dirty or due):
            return
        job.sequence_number += 1
        pending = [op for index in sorted(job.offers)[: self.config.controller_batch]
                   for op in self._ops(job, index)]
        request = TaskControlRequest(
            job_handle=job.name,
            request=tuple(pending),
            completed=tuple(job.completed),
            advance_notices=notices,
            all_unhealthy_tasks=tuple(job.ref(r.index) for r in sorted(
                job.tasks.values(), key=lambda r: r.index) if _down(r)),
            sequence_number=job.sequence_number,
        )
        job.dirty = False
        job.last_call = now
        self.counters["controller_calls"] += 1
        controller = job.controller
        if isinstance(controller, RemoteController):
            job.in_flight = request
            job.in_flight_since = now
            self._answers.pop(job.name, None)  # (a stale answer of a forgotten call)
            self.outbox.append(ControllerCall(job.name, controller.url, request))
            return
        assert controller is not None
        response: TaskControlResponse | None = None
        error: str | None = None
        try:
            response = controller.process(request)
        except Exception as exc:  # a controller's failure acks nothing, never crashes us
            error = str(exc)
        self._answered(job, request, response, error, now)

    def answer(self, answer: ControllerAnswer) -> None:
        """The shell's delivery of a remote controller's answer (or of why there is
        none); applied to the job by the next pass. An answer to a request the job
        no longer waits for (an older sequence number) is dropped there."""
        job = self.jobs.get(answer.job)
        if job is None or job.in_flight is None or (
                job.in_flight.sequence_number != answer.sequence_number):
            return
        self._answers[answer.job] = answer
        self._idle.discard(answer.job)

    def take_calls(self) -> list[ControllerCall]:
        """The remote controllers' requests planned since the last call (the shell
        sends them)."""
        calls, self.outbox = self.outbox, []
        return calls

    def _answered(self, job: JobRecord, request: TaskControlRequest,
                  response: TaskControlResponse | None, error: str | None,
                  now: float) -> None:
        """Apply a controller's answer to ``request``: acks of operations still offered
        as they were sent; nothing at all for an error or garbage."""
        if error is None and (not isinstance(response, TaskControlResponse) or isinstance(
                response.ack, str) or not all(isinstance(a, str) for a in response.ack)):
            error = f"expected a TaskControlResponse, got {response!r}"
        if error is not None or response is None:
            self.counters["controller_errors"] += 1
            self._event(now, job.name, "controller_error", f"acked nothing: {error}")
            return  # the completions are sent again with the next call
        job.completed = job.completed[len(request.completed):]
        job.recheck = response.ask_again_after
        job.last_call = now  # (the re-check counts from the answer)
        offered = {op.op_id: op for op in request.request}
        chosen: dict[int, TaskOp] = {}
        current: dict[int, set[str]] = {}
        for op_id in response.ack:
            op = offered.get(op_id)
            if op is None or op.task.index not in job.offers:
                continue  # unknown or already done
            index = op.task.index
            ids = current.get(index)
            if ids is None:
                ids = current[index] = {o.op_id for o in self._ops(job, index)}
            if op_id not in ids:
                continue  # the task's situation changed since the request was sent
            prior = chosen.get(index)
            if prior is None or (op.kind is OpKind.MOVE and prior.kind is OpKind.STOP):
                chosen[index] = op  # of a maintenance pair, move wins
        for op in chosen.values():
            self._ack(job, op)

    def _notices(self, job: JobRecord,
                 notice: dict[int, tuple[str, float]]) -> tuple[AdvanceNotice, ...]:
        by_event: dict[str, tuple[float, set[int], list[TaskRef]]] = {}
        for rec in job.tasks.values():
            if rec.machine is not None and rec.machine in notice:
                event_id, start = notice[rec.machine]
                entry = by_event.setdefault(event_id, (start, set(), []))
                entry[1].add(rec.machine)
                entry[2].append(job.ref(rec.index))
        return tuple(
            AdvanceNotice(eid, NoticeKind.MAINTENANCE, tuple(self.fleet.names(sorted(ms))),
                          tuple(sorted(refs, key=lambda r: r.index)), start, start)
            for eid, (start, ms, refs) in sorted(by_event.items()))

    def _ack(self, job: JobRecord, op: TaskOp) -> None:
        job.offers.pop(op.task.index, None)
        job.serials.pop(op.task.index, None)
        job.acked[op.op_id] = op

    def _failure_deadline(self, job: JobRecord, now: float) -> None:
        for index in sorted(job.lost):
            rec = job.tasks.get(index)
            wanted = job.offers.get(index)
            if rec is None or wanted is None or wanted[0] != (OpKind.MOVE, _FAILURE):
                continue
            if rec.lost_since is not None and (
                    now - rec.lost_since >= self.config.failure_deadline):
                self._ack(job, self._ops(job, index)[0])
                self.counters["failure_deadline_moves"] += 1
                self._event(now, job.name, "failure_deadline",
                            f"task {index} moved without an ack after "
                            f"{self.config.failure_deadline:g}s down")

    # stage 3: execution --------------------------------------------------------------------
    def _execute(self, job: JobRecord, now: float) -> None:
        """Start acked operations. Each is checked again first: it may no longer
        apply (the task recovered, moved or was updated meanwhile), and whether it
        takes an available task down is decided now, against max_unavailable (a
        safety cap under a controller, the pacing itself without one)."""
        if not job.acked:
            return
        count = job.spec.task_count
        cap = job.spec.update.resolve(count)
        if cap is None and job.controller is None:
            cap = 1
        down = self.unavailable(job) if cap is not None else 0
        throttled = False
        for op in sorted(job.acked.values(), key=lambda o: o.task.index):
            rec = job.tasks.get(op.task.index)
            if rec is None or rec.op is not None or not self._still_applies(job, rec, op):
                del job.acked[op.op_id]
                if job.controller is not None:
                    job.completed.append(op)  # over without being carried out
                    job.dirty = True
                continue
            costs = not _down(rec) and rec.index < count and not job.deleting
            if cap is not None and costs and down >= cap:
                continue  # waits, acked, until the job is back under its cap
            if not self.bucket.take(now):
                throttled = True
                break
            del job.acked[op.op_id]
            rec.op_costly = costs
            self._start(job, rec, op, now)
            if costs:
                down += 1
        self._throttled = throttled
        if throttled:
            self.counters["throttled"] += 1
            if not job.throttled:  # once when it starts waiting, not on every pass
                job.throttled = True
                self._event(now, job.name, "throttled",
                            f"{len(job.acked)} acked operations wait for the rate limit")
        elif job.throttled and not job.acked:
            job.throttled = False

    def _still_applies(self, job: JobRecord, rec: TaskRecord, op: TaskOp) -> bool:
        if op.kind is OpKind.MOVE and op.reason == _FAILURE:
            return rec.state is TaskState.LOST
        if rec.state is TaskState.LOST:
            return op.kind is OpKind.STOP and op.reason in (_RESIZE, _DELETE)
        if _to_target(op):
            return rec.spec_version != job.target and job.halted is None
        if op.kind is OpKind.RESTART:
            return rec.restart
        return True

    def _start(self, job: JobRecord, rec: TaskRecord, op: TaskOp, now: float) -> None:
        self.counters["ops_started"] += 1
        rec.op = op
        job.in_progress.add(rec.index)
        ref = job.ref(rec.index)
        if rec.state is TaskState.LOST:  # its machine is gone: place it elsewhere now
            assert rec.machine is not None
            job.lost.discard(rec.index)
            self._unassign(ref, rec.machine)
            self._transition(rec, Event.REPLACE)
            return
        if rec.state is TaskState.PENDING:
            if op.kind is OpKind.STOP:
                self._free(job, [rec])
            return
        if rec.state is TaskState.STOPPED:  # parked: already stopped
            rec.state = TaskState.STOPPING
            self._stopped(job, rec, now)
            return
        self._take_out(ref, rec)
        self._transition(rec, Event.STOP)

    # stage 4: placement --------------------------------------------------------------------
    def _place(self, job: JobRecord, now: float) -> None:
        pending = [r for r in job.tasks.values()
                   if r.state is TaskState.PENDING and r.index < job.spec.task_count]
        if not pending:
            return
        by_version: dict[int, list[TaskRecord]] = {}
        ent, versions = job.entitlement, job.versions
        for rec in pending:
            if versions[rec.spec_version - 1].entitlement != ent:
                # waiting for a machine at a version of the entitlement the job left
                # (never placed, or moved off a failed machine): it runs nowhere, so
                # it starts on the new entitlement at the target version directly
                rec.spec_version = job.target
            by_version.setdefault(rec.spec_version, []).append(rec)
        for version, recs in sorted(by_version.items()):
            spec = job.versions[version - 1]
            # a task still holding a machine keeps it if the allocator finds it usable
            # (an update in place); one on a failed or cordoned machine is moved
            request = AllocationRequest.of(job.name, job.entitlement, spec.resources,
                                           allocate=sorted(r.index for r in recs),
                                           policy=spec.policy)
            result = self.allocator.allocate(request)
            placed = dict(zip(result.tasks, result.machines, strict=True))
            for rec in recs:
                m = placed.get(rec.index)
                if m is None:
                    continue
                if self._transition(rec, Event.ALLOCATED):
                    self._assign(job, rec, m)
            if result.unplaced:
                reason = result.unplaced[0][1]
                if reason != job.unplaced_reason:
                    job.unplaced_reason = reason
                    self._event(now, job.name, "unplaced",
                                f"{len(result.unplaced)} tasks: {reason}")
            else:
                job.unplaced_reason = None


_LIVE = (TaskState.ALLOCATED, TaskState.STARTING, TaskState.RUNNING, TaskState.SUCCEEDED,
         TaskState.DEAD)


def _to_target(op: TaskOp) -> bool:
    """Does the operation bring its task to the job's target version (an update, or
    the move to the job's new entitlement)?"""
    return op.kind is OpKind.UPDATE or (op.kind is OpKind.MOVE
                                        and op.reason.startswith(_RELOCATE))


def _placed_in(spec: JobSpec, entitlement: str) -> JobSpec:
    """``spec`` as if it were bound to ``entitlement``."""
    if spec.entitlement == entitlement:
        return spec
    return spec.model_copy(update={"entitlement": entitlement})


def _down(rec: TaskRecord) -> bool:
    if rec.state in FINISHED:
        return False
    return rec.state in DOWN or not rec.healthy or not rec.serving

