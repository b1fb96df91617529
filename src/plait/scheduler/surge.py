"""The shared surge buffer: make before break for single-task high-availability jobs
(the 2023 post's inference case; decision 102).

A job with ``update.surge`` never takes a serving task down for a planned operation
(an update, a restart, a maintenance move) before a *surge task* of its goal version
serves in its place. A surge task is a task of the same job at the next index past
all of its tasks (``JobRecord.surges`` maps it to the task it covers): past the
job's count, so it is not one of the job's tasks (not counted by max_unavailable),
placed like a task, in service discovery while it serves. The entitlement's
``surge_buffer`` caps how many run at once across its jobs, and its quota is the
room they run in: no job holds double capacity of its own. While the buffer is full,
or a surge task is not serving yet, the covered task's operation waits (the
built-in pacing holds its ack: ``acks``); it is never taken down uncovered. Once the
covered task is back (running healthy at its goal version, serving, with no
operation), its surge task is released: a task past the count, stopped like one.

``plan_surge`` is a function of the job's records and the buffer's room; the
scheduler applies it before the job's other stages each pass.
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass, field

from plait.model.task import TaskState
from plait.scheduler.plans import is_down
from plait.scheduler.records import JobRecord, TaskRecord


@dataclass(slots=True)
class SurgePlan:
    #: tasks to cover with a new surge task (their indices, not the surge tasks')
    start: list[int] = field(default_factory=list)
    #: surge tasks to keep, by index: the task each covers
    keep: dict[int, int] = field(default_factory=dict)
    #: tasks whose operation waits for room in the buffer
    waiting: int = 0
    #: of those, tasks to move for maintenance (they go first: ``plan_surge``)
    maintenance: set[int] = field(default_factory=set)


def covered(job: JobRecord) -> set[int]:
    """The tasks a serving surge task covers now (their operations may go on)."""
    surges = job.surges
    if not surges:
        return set()
    running, tasks = TaskState.RUNNING, job.tasks
    return {i for s, i in surges.items() if (r := tasks.get(s)) is not None
            and r.serving and r.healthy and r.state is running}


def for_maintenance(wanted: tuple[tuple[object, str], ...]) -> bool:
    return any(reason.startswith("maintenance ") for _, reason in wanted)


def plan_surge(job: JobRecord, room: int, reserved: int = 0,
               noticed: Container[int] = ()) -> SurgePlan:
    """Which surge tasks to start and keep. ``room``: surge tasks the buffer can take;
    ``reserved``: of those, the ones other jobs' maintenance moves wait for. A
    maintenance move has a deadline (the machine goes down at its start) and an update
    does not, so only a maintenance move may take a reserved place, or an operation
    on a task whose machine is under notice (``noticed``: machine indices)."""
    plan = SurgePlan()
    tasks = job.tasks
    count = 0 if job.deleting else job.spec.task_count
    acked = {op.task.index for op in job.acked.values()} if job.acked else set()
    for s, i in (job.surges or {}).items():
        rec = tasks.get(i)
        if s >= count and s in tasks and rec is not None and i < count and _needs_cover(
                job, rec, acked):
            plan.keep[s] = i
    have = set(plan.keep.values())
    for i in sorted(job.offers):
        if i >= count or i in have:
            continue
        rec = tasks.get(i)
        if rec is None or is_down(rec):
            continue  # down already: nothing left to cover
        urgent = rec.machine in noticed or for_maintenance(job.offers[i])
        if room - (0 if urgent else reserved) <= 0:
            plan.waiting += 1
            if urgent:
                plan.maintenance.add(i)
            continue
        plan.start.append(i)
        room -= 1
    return plan


def _needs_cover(job: JobRecord, rec: TaskRecord, acked: set[int]) -> bool:
    i = rec.index
    if i in job.offers or rec.op is not None or i in acked:
        return True
    return not (rec.state is TaskState.RUNNING and rec.healthy and rec.serving
                and rec.spec_version == job.target_of(i))
