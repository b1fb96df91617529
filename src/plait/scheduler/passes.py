"""The pass: machine changes and maintenance, then each job of the dirty set
reconciled in stages (each planned, then applied), and whether it waits for an
input or must be looked at again. The jobs waiting for room are ``roomwait``'s; the
tests of a job's idleness are ``settled``'s."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable

import plait.scheduler.acks as acks
import plait.scheduler.apply as apply
import plait.scheduler.controller as controller
import plait.scheduler.execution as execution
import plait.scheduler.machines as machines
import plait.scheduler.placement as placement
import plait.scheduler.readiness as readiness
import plait.scheduler.reports as reports
import plait.scheduler.settled as settled
from plait.model.task import TaskState
from plait.scheduler.config import SchedulerConfig
from plait.scheduler.loans import Loans
from plait.scheduler.plans import down_tasks
from plait.scheduler.profileroll import ProfileRolls
from plait.scheduler.records import JobRecord
from plait.scheduler.roomwait import RoomWaits
from plait.scheduler.state import SchedulerState
from plait.scheduler.surging import SurgeBuffers
from plait.scheduler.wanted import Notice, plan_wanted
from plait.taskcontrol.protocol import ControllerCall, RemoteController, TaskController


def _untold(stage: str) -> None:
    """The default ``stage``: nobody is told."""


class PassDriver:
    def __init__(self, state: SchedulerState, config: SchedulerConfig, loans: Loans,
                 rolls: ProfileRolls, surges: SurgeBuffers, now: float) -> None:
        self.s = state
        self.config = config
        self.loans = loans
        self.rolls = rolls
        self.surges = surges
        #: idle jobs with a controller, and when they must be looked at again even
        #: if nothing happens (a re-check due, an answer given up for lost)
        self.wake_at: dict[str, float] = {}
        #: idle jobs whose acked operations wait for the rate limit, oldest first: each
        #: pass wakes as many as there are tokens (not a thousand reconciles a pass
        #: for one or two tokens), in turn
        self.for_tokens: dict[str, None] = {}
        self.rooms = RoomWaits(state, config, self.wake_at)
        #: called with a stage's name (``STAGES``) as a pass enters it
        self.stage: Callable[[str], None] = _untold
        #: passes run, full passes among them, and when the last full pass ran
        self.passes = 0
        self.full_passes = 0
        self.full_pass_at = now

    def tick(self, now: float) -> None:
        """One pass: machine changes and maintenance, then the jobs that changed since
        the last pass (the dirty set), in name order; every job now and then (the
        periodic full pass, ``full_pass_every`` / ``full_pass_interval``)."""
        self.s.now = now
        self.stage("machines")
        self.s.bucket.refill(now)
        self.rolls.roll(now)
        self.loans.step(now)
        machines.on_changes(self.s, now)
        notice = machines.maintenance(self.s, now)
        self.stage("jobs")
        dirty = self.s.dirty_jobs
        if self.wake_at:
            for name in [n for n, at in self.wake_at.items() if at <= now]:
                del self.wake_at[name]
                if not self.rooms.due(name, now):
                    continue  # (waiting for room, and none yet: tried again later)
                dirty.add(name)
        if self.for_tokens:
            dirty.update(itertools.islice(self.for_tokens, int(self.s.bucket.tokens)))
        if notice:  # jobs with a task on a machine under notice: looked at every pass
            placed = self.s.placed
            for m in notice:
                dirty.update(ref.job for ref in placed.get(m, ()))
        self.passes += 1
        config = self.config
        if (config.full_pass_every and self.passes % config.full_pass_every == 0) or (
                config.full_pass_interval and now - self.full_pass_at
                >= config.full_pass_interval):
            self.full_pass_at = now
            self.full_passes += 1
            # (jobs waiting for room have their own timer: a full pass would reconcile
            # every one of their pending tasks to find no room again)
            room = self.rooms.waits
            dirty.update(n for n in self.s.jobs if n not in room) if room else dirty.update(
                self.s.jobs)
        queue = self.s.queue = sorted(dirty)  # (a sorted list is a heap)
        jobs = self.s.jobs
        try:
            while queue:
                name = heapq.heappop(queue)
                self.s.current = name
                job = jobs.get(name)
                if job is None:
                    dirty.discard(name)
                    continue
                self._pass_job(job, notice, now)
        finally:
            self.s.queue = None
            self.s.current = ""

    def _pass_job(self, job: JobRecord, notice: Notice, now: float) -> None:
        """Reconcile one job, then decide whether it waits for an input (it leaves
        the dirty set) or the next pass must look at it again."""
        name, dirty = job.name, self.s.dirty_jobs
        if settled.no_op(job, notice):
            # its reconcile would change nothing; it leaves the dirty set, as below
            self.for_tokens.pop(name, None)
            dirty.discard(name)
            return
        # whether the reconcile changed the job matters only to a shell that persists
        # it (``changed_jobs``): the pass keeps or drops the job from the dirty set
        # below whatever the answer. A job waiting for its controller's answer or for
        # the rate limit, whose reconcile changed nothing but a call's own
        # bookkeeping, is not marked changed (nothing to store or show)
        persisted = self.s.changed_jobs is not None
        quiet, only_ops = settled.quiet_only_ops(job) if persisted else (False, False)
        before = self.rooms.unchanged(job) if only_ops else None
        started = self.s.counters["ops_started"]
        try:
            throttled = self.reconcile(job, notice, now)
        except Exception as exc:  # one job's failure must not stall the region
            self.s.counters["reconcile_errors"] += 1
            error = f"{type(exc).__name__}: {exc}"
            self.s.mark(name)
            if error != job.error:
                job.error = error
                self.s.event(now, name, "reconcile_failed", error)
            return
        finally:
            self.stage("jobs")
        job.error = None
        quiet_now = settled.quiet(job)
        room = self.rooms.wait(job, now)
        if persisted and not (quiet and quiet_now) and not (
                before is not None and settled.only_ops(job)
                and before == self.rooms.unchanged(job)) and not (room is not None and room[1]):
            self.s.mark(name)
        for_tokens = throttled and not job.dirty and settled.only_ops(job)
        if not for_tokens:
            self.for_tokens.pop(name, None)
        elif name not in self.for_tokens or self.s.counters["ops_started"] > started:
            self.for_tokens.pop(name, None)  # its turn is over: to the back
            self.for_tokens[name] = None
        waits = False
        if job.controller is None:
            waits = quiet_now or settled.waiting(job) or for_tokens
        elif not job.dirty and (quiet_now or settled.waiting(job) or for_tokens
                                or settled.waiting_for_controller(job)):
            # only an answer, an input or its timer can move it on
            waits = True
            at = controller.timer(job, self.config.recheck_interval,
                                  self.config.controller_lost_after)
            if at < float("inf"):
                self.wake_at[name] = at
            else:
                self.wake_at.pop(name, None)
        if room is not None:  # (tried again by its timer, or by an input)
            waits = True
            at = min(room[0], self.rooms.controller_timer(job))  # (its controller's re-check)
            self.wake_at[name] = min(self.wake_at.get(name, at), at)
        if waits:
            dirty.discard(name)
        else:
            dirty.add(name)  # (still something to do: the next pass looks again)
        if job.deleting and not job.tasks:
            del self.s.jobs[name]
            dirty.discard(name)
            self.wake_at.pop(name, None)
            self.for_tokens.pop(name, None)
            self.rooms.waits.pop(name, None)
            self.s.allocator.cache.drop(name)
            self.s.event(now, name, "deleted", "all tasks stopped")

    def reconcile(self, job: JobRecord, notice: Notice, now: float) -> bool:
        """One job's stages, each planned then applied; whether its acked operations
        ran out of tokens."""
        self.stage("wanted")
        for index in list(job.in_progress):  # operations waiting for min_ready_seconds
            rec = job.tasks.get(index)
            if rec is None:
                job.in_progress.discard(index)
            elif rec.state is TaskState.RUNNING and rec.healthy:
                self.s.maybe_serving(job, rec, now)
        for index in readiness.not_ready(job, now):
            reports.rollout_failure(self.s, job, index, "ran without passing its health probe for "
                                 f"{job.spec.update.ready_timeout_seconds:g}s", now)
        surging = self.surges.keep(job, notice, now) if job.spec.update.surge else None
        apply.wanted(self.s, job, plan_wanted(job, notice, now), now)
        self.stage("acks")
        # the tasks down: acks and the failure deadline change no task's state, so
        # the built-in policy's count holds for execution too (one loop, not two)
        down: set[int] | None = None
        if job.controller is not None and not job.deleting:
            self._ask_controller(job, job.controller, notice, now)
        elif job.offers:
            down = down_tasks(job)
            apply.acks(self.s, job, acks.builtin_acks(job, now, down))
        deadline = self.config.failure_deadline
        apply.failure_deadline(self.s, job, acks.failure_deadline_acks(job, now, deadline),
                               deadline, now)
        self.stage("execution")
        plan = execution.plan_execution(job, int(self.s.bucket.tokens), now, down, self.s.heard,
                                        self.s.started)
        apply.execution(self.s, job, plan, now)
        self.stage("placement")
        apply.placement(self.s, job, placement.plan_placement(
            job, self.s.allocator.canaries.get(job.entitlement, ())), now)
        if job.rollout_active and not job.tasks:
            self.s.rollout_done(job, now)  # no task left to report running
        if surging is not None:
            self.surges.after(job, surging)
        return plan.throttled

    def _ask_controller(self, job: JobRecord, ctl: TaskController | RemoteController,
                        notice: Notice, now: float) -> None:
        """Apply the answer the job waits for, if it came; then plan its next request
        when the controller should hear of something (or its re-check is due). A
        remote controller's request goes to ``outbox`` for the shell: the pass never
        waits on a tenant."""
        notices = controller.advance_notices(job, notice, self.s.fleet)
        apply.notices(job, notices)
        remote = isinstance(ctl, RemoteController)
        if remote and job.in_flight is not None:
            got = self.s._answers.pop(job.name, None)
            if got is not None:
                apply.answered(self.s, job, job.in_flight, got.response, got.error, now)
                job.in_flight = None
            elif now - job.in_flight_since >= self.config.controller_lost_after:
                # the shell enforces a hard deadline, so this is a safety net: a
                # request it lost (a restart of the dispatcher) must not hold the job
                lost = job.in_flight
                job.in_flight = None
                apply.answered(self.s, job, lost, None, "no answer came back from the shell",
                               now)
            else:
                return  # one call at a time per job; the answer is applied when it comes
        request = controller.plan_request(job, notices, now, self.config.recheck_interval,
                                          self.config.controller_batch, self.s.fleet)
        if request is None:
            return
        apply.sent(self.s, job, request, now)
        if isinstance(ctl, RemoteController):
            job.in_flight = request
            job.in_flight_since = now
            self.s._answers.pop(job.name, None)  # (a stale answer of a forgotten call)
            self.s.outbox.append(ControllerCall(job.name, ctl.url, request, ctl.key_name))
        else:
            apply.call_in_process(self.s, job, ctl, request, now)
