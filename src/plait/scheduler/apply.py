"""Where the stages' plans become changes: the only writer of what a pass decides.

Each function commits one stage's result for one job into the scheduler's state,
through the state's primitives (``state.SchedulerState``). A stage reads the records
as the previous stage's commit left them, so a job's reconcile is: plan wanted,
apply; plan acks, apply; plan execution, apply; plan placement, apply (submitted to
the allocator, which commits with optimistic concurrency).
"""

from __future__ import annotations

import heapq

import plait.scheduler.acks as acking
from plait.allocator.placement import NO_MACHINE
from plait.model.task import TaskState
from plait.scheduler.lifecycle import Event
from plait.scheduler.plans import (
    KIND,
    ExecutionPlan,
    PlacementPlan,
    WantedPlan,
    first_offered_op,
)
from plait.scheduler.records import JobRecord
from plait.scheduler.state import SchedulerState
from plait.taskcontrol.protocol import (
    AdvanceNotice,
    TaskController,
    TaskControlRequest,
    TaskControlResponse,
    new_op,
)


def wanted(s: SchedulerState, job: JobRecord, plan: WantedPlan, now: float) -> None:
    """Offer what the tasks want (each new offer gets the job's next serial, so its
    operation's id is stable while it waits), and make the changes that need none."""
    if not plan:
        return
    tasks, offers, serials = job.tasks, job.offers, job.serials
    serial = job.op_counter
    offered, wants = plan.offered, plan.wants
    dirty = bool(offered)
    if all(wants):  # (new offers only: in bulk)
        offers.update(zip(offered, wants, strict=True))
        serials.update(zip(offered, range(serial + 1, serial + 1 + len(offered)),
                           strict=True))
        serial += len(offered)
    else:
        for index, want in zip(offered, wants, strict=True):
            if want:
                serial += 1
                offers[index] = want
                serials[index] = serial
            else:
                del offers[index]
                del serials[index]
    job.op_counter = serial
    goal = job.target_of
    for index in plan.settle:
        tasks[index].spec_version = goal(index)
    for index in plan.rerun:
        rec = tasks[index]
        s.transition(rec, Event.RERUN)
        rec.spec_version = goal(index)
        rec.restart = False
        rec.exit_code = None
        dirty = True
    retagged = []
    for index in plan.retag:
        rec = tasks[index]
        rec.spec_version = goal(index)
        if rec.machine is not None:
            retagged.append((rec, rec.machine))
    s.assign_all(job, retagged)  # their desired sets name the new version
    if dirty:
        job.dirty = True
    if plan.settle:
        s.rollout_done(job, now)  # no report would tell: it runs nowhere
    for index in plan.dropped:
        rec = tasks[index]
        s.complete(job, rec)
        s.free(job, [rec])
    for index in plan.gone:
        offers.pop(index, None)
        serials.pop(index, None)
        del tasks[index]
    for index in plan.liveness:
        rec = tasks[index]
        rec.restart = True
        job.dirty = True
        since = rec.unhealthy_since if rec.unhealthy_since is not None else now
        s.event(now, job.name, "liveness_restart",
                f"task {index} has failed its health probe for {now - since:.0f}s: "
                "restarting it")


def acks(s: SchedulerState, job: JobRecord, indices: list[int]) -> None:
    """Ack the first offered operation of each task (a move before a stop, of a
    maintenance pair)."""
    # (``first_offered_op`` and ``s.ack``, inlined: a 15,000-task update acks 1,500,
    # 16 on each machine, whose name is made once)
    name, machine_name = job.name, s.fleet.name
    offers, serials, acked, tasks = job.offers, job.serials, job.acked, job.tasks
    names: dict[int, str] = {}
    for index in indices:
        kind, reason = offers.pop(index)[0]
        machine = tasks[index].machine
        on = None
        if machine is not None:
            on = names.get(machine)
            if on is None:
                on = names[machine] = machine_name(machine)
        op_id = f"{name}/{index}/{KIND[kind]}/{serials.pop(index)}"
        acked[op_id] = new_op(op_id, name, index, kind, reason, on)


def failure_deadline(s: SchedulerState, job: JobRecord, indices: list[int], deadline: float,
                     now: float) -> None:
    for index in indices:
        s.ack(job, first_offered_op(job, index, s.fleet))
        s.counters["failure_deadline_moves"] += 1
        s.event(now, job.name, "failure_deadline",
                f"task {index} moved without an ack after {deadline:g}s down")


def notices(job: JobRecord, current: tuple[AdvanceNotice, ...]) -> None:
    """The advance notices the job is under; a change is news for its controller."""
    key = tuple(n.notice_id for n in current)
    if key != job.notices:
        job.notices = key
        job.dirty = True


def sent(s: SchedulerState, job: JobRecord, request: TaskControlRequest, now: float) -> None:
    """A request planned for the job's controller is on its way."""
    job.sequence_number = request.sequence_number
    job.dirty = False
    job.last_call = now
    s.counters["controller_calls"] += 1


def call_in_process(s: SchedulerState, job: JobRecord, controller: TaskController,
                    request: TaskControlRequest, now: float) -> None:
    """An in-process controller (tests, the simulator, built-in policies) answers at
    once; its failure acks nothing and never stops the pass."""
    response: TaskControlResponse | None = None
    error: str | None = None
    try:
        response = controller.process(request)
    except Exception as exc:
        error = str(exc)
    answered(s, job, request, response, error, now)


def answered(s: SchedulerState, job: JobRecord, request: TaskControlRequest,
             response: TaskControlResponse | None, error: str | None, now: float) -> None:
    """Apply a controller's answer to ``request``: acks of operations still offered
    as they were sent; nothing at all for an error or garbage."""
    error = acking.answer_error(response, error)
    if error is not None or response is None:
        s.counters["controller_errors"] += 1
        s.event(now, job.name, "controller_error", f"acked nothing: {error}")
        if job.controller_error != error:  # (what the job's view says it waits on)
            job.controller_error = error
            s.mark(job.name)
        return  # the completions are sent again with the next call
    if job.controller_error is not None:
        job.controller_error = None
        s.mark(job.name)
    job.completed = job.completed[len(request.completed):]
    job.recheck = response.ask_again_after
    job.last_call = now  # (the re-check counts from the answer)
    for op in acking.acks_from_answer(job, request, response, s.fleet):
        s.ack(job, op)


def execution(s: SchedulerState, job: JobRecord, plan: ExecutionPlan, now: float) -> None:
    """Start the planned operations (each takes a token) and drop the obsolete ones,
    in task order; report a wait for the rate limit once, when it begins."""
    taken = s.bucket.take_many(len(plan.start), now)  # (each start takes one)
    assert taken, "the execution plan started more operations than there were tokens"
    if not plan.obsolete:
        s.start_ops(job, plan.start, now)
    else:
        controller, acked = job.controller is not None, job.acked
        for op, costs in heapq.merge(((op, None) for op in plan.obsolete), plan.start,
                                     key=lambda step: step[0].task.index):
            if costs is None:
                del acked[op.op_id]
                if controller:
                    job.completed.append(op)  # over without being carried out
                    job.dirty = True
            else:
                s.start_ops(job, [(op, costs)], now)
    if plan.throttled:
        s.counters["throttled"] += 1
        if not job.throttled:  # once when it starts waiting, not on every pass
            job.throttled = True
            s.event(now, job.name, "throttled",
                    f"{len(job.acked)} acked operations wait for the rate limit")
    elif job.throttled and not job.acked:
        job.throttled = False


def placement(s: SchedulerState, job: JobRecord, plan: PlacementPlan, now: float) -> None:
    """Submit the allocation requests; what was placed enters its machine's desired
    set (its agent starts it). The first reason a task could not be placed is
    reported once."""
    tasks = job.tasks
    for index in plan.retarget:
        tasks[index].spec_version = job.target_of(index)
    unplaced = took = 0
    reason: str | None = None
    short = 0  # (milli-cores its tasks waiting for a machine ask for, over its versions)
    for _version, request in plan.requests:
        result = s.allocator.allocate(request)
        if result.unplaced and result.unplaced[0][1].startswith(NO_MACHINE):
            # waiting for a machine: a lender's such tasks take loans back (``loans``)
            short = min(1 << 62, short + len(result.unplaced) * max(1, round(
                min(request.resources.cpu, 1e15) * 1000)))
        placed = []
        for index, machine in zip(result.tasks, result.machines, strict=True):
            rec = tasks[index]
            if s.transition(rec, Event.ALLOCATED):
                placed.append((rec, machine))
        s.assign_all(job, placed)
        for rec, _machine in placed:
            if rec.op is None:  # (placed for an operation: part of its bar)
                s.task_event(now, job, rec, "task_placed",
                             f"placed, version {rec.spec_version}", op="start",
                             reason="new task")
            if rec.op is None or not rec.op_costly:
                took += 1  # (a task that waited for room, placed)
        if result.unplaced:
            unplaced += len(result.unplaced)
            if reason is None:
                reason = result.unplaced[0][1]
    if took and reason is not None:
        _waiting_now(job, took)
    # (a version whose tasks were all placed does not clear another's reason)
    if reason is not None:
        if reason != job.unplaced_reason:
            job.unplaced_reason = reason
            s.event(now, job.name, "unplaced", f"{unplaced} tasks: {reason}")
    elif plan.requests:
        job.unplaced_reason = None
    if short:
        s.short[job.name] = (job.entitlement, short)
    elif s.short and plan.requests:
        s.short.pop(job.name, None)


def _waiting_now(job: JobRecord, took: int) -> None:
    """Tasks that waited for room took the room of tasks a planned operation took down,
    which wait for room now (the job serves as many tasks as before that operation):
    as many of those as were placed count as waiting for room from now on
    (``plans.waiting_for_room``), so max_unavailable still bounds the serving tasks
    planned operations keep down, not which of the job's tasks got the room."""
    pending = TaskState.PENDING
    for rec in job.tasks.values():
        if took <= 0:
            return
        if rec.state is pending and rec.op is not None and rec.op_costly:
            rec.op_costly = False
            took -= 1
