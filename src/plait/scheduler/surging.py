"""The scheduler's part that keeps each entitlement's surge buffer: which surge tasks
run on it and which jobs wait for room in it (the plan is ``surge.plan_surge``; this
applies it to the job's records)."""

from __future__ import annotations

import plait.scheduler.surge as surge
from plait.scheduler.records import JobRecord, TaskRecord
from plait.scheduler.state import SchedulerState
from plait.scheduler.wanted import Notice


class SurgeBuffers:
    def __init__(self, state: SchedulerState) -> None:
        self.s = state
        #: per entitlement: its surge tasks, (job, index), and the jobs waiting for
        #: room in its surge buffer
        self.surges: dict[str, set[tuple[str, int]]] = {}
        self.surge_waiters: dict[str, set[str]] = {}
        #: per entitlement: jobs whose maintenance moves wait for the buffer, and how
        #: many (room that frees up goes to them before any update)
        self.surge_urgent: dict[str, dict[str, int]] = {}
        state.counters.update(surge_started=0, surge_waits=0)

    def keep(self, job: JobRecord, notice: Notice, now: float) -> int:
        """Start and keep the job's surge tasks (``plait.scheduler.surge``); returns
        how many tasks it had past its count."""
        s = self.s
        ent, count = job.entitlement, job.spec.task_count
        have = sum(1 for i in job.tasks if i >= count)
        used = self.surges.setdefault(ent, set())
        jobs = s.jobs
        for key in [k for k in used if k[0] not in jobs or k[1] not in jobs[k[0]].tasks
                    or k[1] < jobs[k[0]].spec.task_count]:
            used.discard(key)  # (stopped and gone, resized into the job, or its job is)
        used.update((job.name, i) for i in job.tasks if i >= count)  # (after a restore)
        found = s.allocator.entitlements.get(ent)
        urgent = self.surge_urgent.setdefault(ent, {})
        urgent.pop(job.name, None)
        plan = surge.plan_surge(job, (found.surge_buffer if found else 0) - len(used),
                                sum(urgent.values()), notice)
        if plan.maintenance:
            urgent[job.name] = len(plan.maintenance)  # (updates leave them the room)
        for i in plan.start:
            index = max(max(job.tasks, default=-1) + 1, count)
            job.tasks[index] = TaskRecord(index, job.target_of(i))
            plan.keep[index] = i
            used.add((job.name, index))
            s.counters["surge_started"] += 1
            s.event(now, job.name, "surge_started",
                    f"task {i}: surge task {index} starts on the shared buffer; task {i}'s "
                    "operation waits until it serves")
        for index, i in sorted((job.surges or {}).items()):
            if index not in plan.keep:
                s.event(now, job.name, "surge_released",
                        f"task {i} is back: surge task {index} stops")
        if (job.surges or {}) != plan.keep:
            job.surges = plan.keep or None
            s.mark(job.name)
        waiters = self.surge_waiters.setdefault(ent, set())
        if plan.waiting:
            if job.name not in waiters:
                s.counters["surge_waits"] += 1
                s.event(now, job.name, "surge_waiting",
                        f"{plan.waiting} operations wait for room in the surge buffer of "
                        f"{ent} ({found.surge_buffer if found else 0} surge tasks)")
            waiters.add(job.name)
        else:
            waiters.discard(job.name)
        return have

    def after(self, job: JobRecord, had: int) -> None:
        """After the job's stages: room that its surge tasks left in the buffer brings
        back the jobs waiting for it."""
        if sum(1 for i in job.tasks if i >= job.spec.task_count) < had:
            for name in self.surge_waiters.get(job.entitlement, ()):
                self.s.mark(name)
