"""Stage 2 of a job's reconcile: which offered operations may proceed.

Three sources of acks, each a function of a job's records that returns what to ack
and changes nothing (``apply`` acks them):

* without a TaskController, the built-in policy: keep the job's unavailable tasks,
  for any reason but a want of room, below ``max_unavailable`` (tasks waiting for
  room, ``plans.waiting_for_room``, are down already and not counted); stops of tasks
  beyond the count and moves of tasks already down cost nothing;
* a controller's answer: the acks it gave for operations still offered as they were
  sent (``controller`` plans the request);
* the failure deadline: a task down on a failed machine for ``failure_deadline`` is
  moved without an ack.
"""

from __future__ import annotations

import bisect

import plait.scheduler.surge as surge
from plait.model.topology import Fleet
from plait.scheduler.plans import FAILURE, down_tasks, lapsed, offered_ops, waiting_for_room
from plait.scheduler.records import JobRecord
from plait.taskcontrol.protocol import OpKind, TaskControlRequest, TaskControlResponse, TaskOp


def builtin_acks(job: JobRecord, now: float, down: set[int] | None = None) -> list[int]:
    """The tasks whose (first) offered operation the built-in policy acks now, in
    task order. Taking down a task that serves costs one of max_unavailable; so does
    one that was serving and has failed its probe for less than
    ``serving_grace_seconds`` (it is down already, so only while the job is within
    its cap); tasks long unhealthy, exited, lost, waiting for room or beyond the count
    are free, and those waiting for room do not count against the others.
    ``down``: ``plans.down_tasks(job)``, when the caller has it."""
    if not job.offers:
        return []
    count = job.spec.task_count
    cap = job.spec.update.resolve(count)
    grace = job.spec.update.serving_grace_seconds
    tasks = job.tasks
    if down is None:
        down = down_tasks(job)
    budget = (1 if cap is None else cap) - sum(1 for i in down if i < count) - sum(
        1 for op in job.acked.values() if op.task.index not in down)
    if job.unplaced_reason is not None:  # (tasks waiting for room are not counted)
        budget += sum(1 for i in waiting_for_room(job) if i < count)
    free_all = job.deleting
    acked: list[int] = []
    offered = sorted(job.offers)
    # make before break: a serving task's operation waits for its surge task to serve
    cover = surge.covered(job) if job.spec.update.surge and not free_all else None
    for index in offered:
        if not (free_all or index >= count):
            if cover is not None and index not in down and index not in cover:
                continue  # (its surge task is not serving yet, or the buffer is full)
            if index not in down:
                if budget <= 0:
                    break  # spent: the rest below
                budget -= 1
            elif budget < 0 and lapsed(tasks[index], now, grace):
                continue  # the job is past its cap already: not another serving task
        acked.append(index)
    else:
        return acked
    # the budget is spent (and never grows again): of the offers after ``index``,
    # only tasks down already (unless lapsed past the cap) or beyond the count
    offers = job.offers
    for i in sorted(i for i in down if index < i < count and i in offers):
        if not (budget < 0 and lapsed(tasks[i], now, grace)):
            acked.append(i)
    acked.extend(offered[bisect.bisect_left(offered, count):])
    return acked


def failure_deadline_acks(job: JobRecord, now: float, deadline: float) -> list[int]:
    """Lost tasks whose move off their failed machine has waited ``deadline`` seconds
    for an ack: moved without one."""
    due = []
    for index in sorted(job.lost):
        rec = job.tasks.get(index)
        wanted = job.offers.get(index)
        if rec is None or wanted is None or wanted[0] != (OpKind.MOVE, FAILURE):
            continue
        if rec.lost_since is not None and now - rec.lost_since >= deadline:
            due.append(index)
    return due


def answer_error(response: object, error: str | None) -> str | None:
    """Why a controller's answer acks nothing (its call failed, or it is not a
    response), or None for a usable one."""
    if error is not None:
        return error
    if not isinstance(response, TaskControlResponse) or isinstance(
            response.ack, str) or not all(isinstance(a, str) for a in response.ack):
        return f"expected a TaskControlResponse, got {response!r}"
    return None


def acks_from_answer(job: JobRecord, request: TaskControlRequest,
                     response: TaskControlResponse, fleet: Fleet) -> list[TaskOp]:
    """The operations a controller's answer acks: at most one per task, each still
    offered as it was sent (a task whose situation changed since is offered anew);
    of a maintenance pair, the move wins."""
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
            ids = current[index] = {o.op_id for o in offered_ops(job, index, fleet)}
        if op_id not in ids:
            continue  # the task's situation changed since the request was sent
        prior = chosen.get(index)
        if prior is None or (op.kind is OpKind.MOVE and prior.kind is OpKind.STOP):
            chosen[index] = op
    return list(chosen.values())
