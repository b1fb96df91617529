"""What readers see of one job's tasks (``JobState``): made by a pass under the lock,
published for readers that take none (``Views``, the listing, the metrics)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from plait.model import Fleet
from plait.model.task import TaskState
from plait.scheduler import Scheduler
from plait.scheduler.records import JobRecord


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
