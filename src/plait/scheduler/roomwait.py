"""Jobs waiting for room (decision 135): a job whose only work is placing tasks no
machine has room for leaves the dirty set and is tried again by its own timer (with
a backoff), by an input of its own, or by a change of its entitlement; a try first
asks the allocator, one task per request, whether anything has room now."""

from __future__ import annotations

from dataclasses import dataclass

import plait.scheduler.acks as acks
import plait.scheduler.controller as controller
import plait.scheduler.execution as execution
import plait.scheduler.placement as placement
from plait.allocator import AllocationRequest
from plait.model.task import TaskState
from plait.scheduler.config import SchedulerConfig
from plait.scheduler.lifecycle import FINISHED
from plait.scheduler.plans import down_tasks
from plait.scheduler.records import SEQUENCE_BLOCK, JobRecord
from plait.scheduler.state import SchedulerState

#: a job waiting for room is tried again after this many seconds, twice as long after
#: each try that found none, up to ``ROOM_RETRY_MAX``
ROOM_RETRY = 1.0
ROOM_RETRY_MAX = 8.0
#: a try of every this many is a reconcile whatever the allocator says (a safety net
#: for room the one-task requests do not see: about every minute at the longest
#: backoff)
ROOM_RECONCILE_EVERY = 8


@dataclass(slots=True)
class RoomWait:
    """A job whose only work is placing tasks no machine has room for (decision 135):
    what its last reconcile left (``seen``), when it is tried again and the backoff
    of that try, the requests of one task each (one per request its placement
    makes) that ask the allocator first whether anything has room now (None: the
    job is reconciled at each try), and the tries since its last reconcile."""

    seen: tuple[object, ...]
    at: float
    backoff: float
    probes: tuple[AllocationRequest, ...] | None
    skipped: int = 0


class RoomWaits:
    """The jobs waiting for room (``waits``), and the wake-up timers they set in the
    pass's ``wake_at``."""

    def __init__(self, state: SchedulerState, config: SchedulerConfig,
                 wake_at: dict[str, float]) -> None:
        self.s = state
        self.config = config
        #: per job waiting for room: what its last reconcile left (unchanged: the
        #: retry changed nothing) and its retry's backoff
        self.waits: dict[str, RoomWait] = {}
        self.wake_at = wake_at

    def wait(self, job: JobRecord, now: float) -> tuple[float, bool] | None:
        """After a reconcile: None unless all the job has left to do is place pending
        tasks for which no machine had room, then (when to try again, whether this
        reconcile changed nothing since the last such one: then nothing is stored or
        shown). Every other task is placed at its goal version with nothing under
        way, or waits with an operation offered that the built-in policy cannot ack
        until a pending task runs, or offered to its TaskController (told all there
        is: its re-check wakes the job too), or acked and held by max_unavailable (a
        rollout whose new tasks found no room, its max_unavailable spent on them).
        The job waits, out of the dirty set, for its timer (1 s, doubled after each
        try that changed nothing, up to 8 s), for an input of its own, or for a change
        of its entitlement (``room_changed``): a job of 100,000 tasks that can never
        be placed cost every pass 0.6 s of reconcile, save and view, and so did one
        whose update could not be placed."""
        name = job.name
        ctl = job.controller is not None
        if (job.unplaced_reason is None or job.lost or job.deleting
                or job.in_flight is not None
                or (ctl and (job.dirty or job.completed))):
            self.waits.pop(name, None)
            return None
        pending_state, goal = TaskState.PENDING, job.target_of
        running, finished = TaskState.RUNNING, FINISHED
        offers = job.offers
        acked = {op.task.index for op in job.acked.values()} if job.acked else offers
        pending = 0
        for r in job.tasks.values():
            state = r.state
            if state is pending_state:
                pending += 1
            # (every other task serves, or finished: one starting, failing its probe or
            # within its grace changes by time alone, its ready timeout, its grace)
            elif not ((state is running and r.serving and r.healthy) or state in finished) or (
                    r.op is not None or r.restart or (
                        r.spec_version != goal(r.index) and r.index not in offers
                        and r.index not in acked)):
                self.waits.pop(name, None)
                return None
        tasks = job.tasks
        if not pending or any(tasks[i].state is not pending_state for i in job.in_progress
                              if i in tasks):
            # (an operation waiting on a running task)
            self.waits.pop(name, None)
            return None
        if offers or job.acked:
            down = down_tasks(job)
            if offers and not ctl and acks.builtin_acks(job, now, down):
                self.waits.pop(name, None)  # (an operation the policy acks now)
                return None
            if job.acked:  # (one acked that would start now, or no longer applies)
                ready = execution.plan_execution(job, 1 << 30, now, down)
                if ready.start or ready.obsolete:
                    self.waits.pop(name, None)
                    return None
        seen = (pending, len(job.tasks), job.unplaced_reason, self.unchanged(job))
        had = self.waits.get(name)
        same = had is not None and had.seen == seen
        backoff = min(ROOM_RETRY_MAX, had.backoff * 2) if same and had else ROOM_RETRY
        # the requests the next reconcile's placement would make (each version and
        # entitlement its pending tasks are placed at), one task of each: room for
        # any of them brings the reconcile back
        plan = placement.plan_placement(job, self.s.allocator.canaries.get(job.entitlement, ()))
        probes = tuple(AllocationRequest.of(name, request.entitlement, request.resources,
                                            allocate=[request.tasks[0][0]],
                                            policy=request.policy)
                       for _, request in plan.requests if request.tasks)
        self.waits[name] = RoomWait(seen, now + backoff, backoff, probes or None)
        return now + backoff, same

    def due(self, name: str, now: float) -> bool:
        """Whether a job woken by its timer is reconciled: yes, unless it waits for
        room and the allocator finds none for one of its tasks (then it is tried
        again after a longer backoff, its reconcile skipped: a job of many pending
        tasks costs a try what one task costs)."""
        wait = self.waits.get(name)
        job = self.s.jobs.get(name)
        if wait is None or wait.probes is None or job is None:
            return True
        asks = self.controller_timer(job)
        if asks <= now:
            return True  # (its controller's re-check is due)
        wait.skipped += 1
        if wait.skipped >= ROOM_RECONCILE_EVERY:  # (whatever the probes say, now and then)
            wait.skipped = 0
            return True
        try:
            if any(self.s.allocator.propose(probe).assign for probe in wait.probes):
                return True
        except Exception:  # (an entitlement gone, say: the reconcile says what it is)
            return True
        wait.backoff = min(ROOM_RETRY_MAX, wait.backoff * 2)
        wait.at = now + wait.backoff
        self.wake_at[name] = min(wait.at, asks)
        return False

    def controller_timer(self, job: JobRecord) -> float:
        """When the job's controller is to be asked again by itself (``inf``: never,
        or no controller)."""
        if job.controller is None:
            return float("inf")
        return controller.timer(job, self.config.recheck_interval,
                                self.config.controller_lost_after)

    def room_changed(self, entitlement: str) -> None:
        """The entitlement's quota or settings changed: its jobs waiting for room are
        tried at the next pass."""
        for name, wait in self.waits.items():
            job = self.s.jobs.get(name)
            if job is not None and job.entitlement == entitlement:
                wait.backoff = ROOM_RETRY / 2
                self.wake_at[name] = self.s.now

    def unchanged(self, job: JobRecord) -> tuple[object, ...]:
        """What a reconcile of a job of ``_only_ops`` changes when it changes anything
        worth storing or showing (compared around it)."""
        return (job.op_counter, job.target, len(job.offers), len(job.acked),
                len(job.completed), job.notices, job.halted, job.error,
                job.sequence_number // SEQUENCE_BLOCK, self.s.counters["ops_started"])
