"""Agents' reports: the truth about tasks, recorded into the task lifecycle.

An agent's heartbeat carries the statuses of the tasks on its machine. Each is
checked against the records (a stale copy of a task that moved is ignored; a report
of an older revision means the old process is still winding down) and moves the
task's lifecycle on: starting, running (healthy or not), crashed, finished, stopped.
A task its machine was stopping and no longer reports is stopped. What a crash or
an exit for good means for the task and its rollout is here too (``exited``,
``rollout_failure``, ``finished``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import cast

from plait.allocator import AllocationRequest
from plait.model.task import TaskState
from plait.scheduler.lifecycle import Event
from plait.scheduler.machinesets import NOTHING_PLACED
from plait.scheduler.plans import to_target
from plait.scheduler.records import JobRecord, Phase, TaskRecord, TaskStatus
from plait.scheduler.state import SchedulerState


def _may_end(job: JobRecord, rec: TaskRecord, code: int | None) -> bool:
    """Could the task's restart policy end it at this exit (its retries used up)? An
    agent that says a task is final when its policy would start it again (a service's,
    ``always``) is not believed: the task exited, and is to be started again. (A
    machine's credential would otherwise end any task placed there for good.)"""
    restart = job.versions[rec.spec_version - 1].restart
    return restart.after_exit(0 if code is None else code, restart.max_retries) is None


def endpoints(s: SchedulerState, machine: int,
              reported: Mapping[tuple[str, int], str | None]) -> None:
    """Where the tasks on machine index ``machine`` listen, as its agent reported them
    ((job, index) -> "host:port"): taken only for a task placed there (a stale copy
    elsewhere says nothing); a change marks the job, so it is stored with its
    record."""
    jobs = s.jobs
    for (name, index), endpoint in reported.items():
        job = jobs.get(name)
        rec = job.tasks.get(index) if job is not None else None
        if rec is not None and rec.machine == machine and rec.endpoint != endpoint:
            rec.endpoint = endpoint
            s.mark(name)


def record(s: SchedulerState, machine: int, statuses: Iterable[TaskStatus], now: float) -> None:
    """Record the statuses an agent reported for machine index ``machine``."""
    s.heard[machine] = now  # (a fenced task counts its move from the last one)
    # (the tasks reported, as (job, index): hashed in C, a heartbeat of a machine
    # packed with thousands of small tasks reads each once)
    seen: set[tuple[str, int]] = set()
    jobs = s.jobs
    running, starting = Phase.RUNNING, Phase.STARTING
    is_running, is_starting = TaskState.RUNNING, TaskState.STARTING
    for st in statuses:
        job = jobs.get(st.job)
        rec = job.tasks.get(st.index) if job is not None else None
        if job is None or rec is None or rec.machine != machine:
            continue  # a stale copy; the agent stops it (not in its desired set)
        seen.add((st.job, st.index))
        phase = st.phase
        if (phase is running and rec.state is is_running and st.healthy and rec.healthy
                and rec.serving and rec.op is None and rec.apart is None):
            # the common heartbeat: a task serving as it was, nothing under way (no
            # field below would change; the rollout may be done, if one is active)
            if job.rollout_active and st.revision == job.revision(rec.spec_version):
                s.rollout_done(job, now)
            continue
        if not ((phase is starting and rec.state is is_starting)
                or (phase is running and rec.state is is_running
                    and st.healthy == rec.healthy and rec.serving and rec.op is None)):
            s.mark(st.job)  # a heartbeat that changes nothing leaves the job idle
        if phase is Phase.STOPPING:
            continue  # its agent is stopping it: not stopped until it says so
        if phase is Phase.STOPPED:
            s.stopped(job, rec, now)
        elif st.revision != job.revision(rec.spec_version):
            continue  # the old version still winding down
        elif phase is starting:
            s.transition(rec, Event.STARTING)
        elif phase is running:
            s.transition(rec, Event.RUNNING)
            if st.healthy and not rec.healthy:
                rec.healthy_since = now
            if st.healthy:
                if rec.apart is not None:  # (both are kept apart: unset while it has none)
                    rec.unhealthy_since, rec.served = None, False
            elif rec.unhealthy_since is None and rec.state is TaskState.RUNNING:
                rec.unhealthy_since = now  # failing its probe (or not passed it yet)
                rec.served = rec.serving
            rec.healthy = st.healthy
            s.maybe_serving(job, rec, now)
        elif phase is Phase.EXITED and st.final and _may_end(job, rec, st.exit_code):
            finished(s, job, rec, st.exit_code, now)
        elif phase is Phase.EXITED:
            exited(s, job, rec, now, st.killed, st.exit_code)
    # a task this machine was stopping and no longer has is stopped
    placed = s.placed.get(machine, NOTHING_PLACED)
    raw = tuple.__iter__(placed)  # (the set as it is now: a stop below makes a new one)
    for named in raw:
        name, index = cast(str, named), cast(int, next(raw))
        if (name, index) in seen:
            continue
        job = jobs.get(name)
        rec = job.tasks.get(index) if job is not None else None
        if job is not None and rec is not None and rec.state is TaskState.STOPPING:
            s.mark(job.name)
            s.stopped(job, rec, now)


def exited(s: SchedulerState, job: JobRecord, rec: TaskRecord, now: float,
           killed: bool = False, code: int | None = None) -> None:
    """A task crashed (its agent restarts it); during a rollout, a task of the new
    version that crashes counts toward halting it, unless it was ``killed`` from
    outside (a SIGKILL neither its agent nor the out-of-memory killer sent: not
    the version's doing)."""
    if not s.transition(rec, Event.EXITED):
        return
    rec.healthy = False
    rec.healthy_since = None
    rec.serving = False
    rec.unhealthy_since, rec.served = None, False
    job.dirty = True
    if killed:
        s.event(now, job.name, "task_killed",
                   f"task {rec.index} was killed from outside (SIGKILL, not out of "
                   "memory): restarted, not counted against its version",
                   task=rec.index, machine=rec.machine, op="failure",
                   reason="killed from outside")
    else:
        how = "exited" if code is None else f"exited with code {code}"
        s.task_event(now, job, rec, "task_exited", f"{how}; its agent restarts it",
                        op="failure", reason="exited")
        if job.rollout_active and rec.spec_version == job.target_of(rec.index):
            rollout_failure(s, job, rec.index, how, now)


def rollout_failure(s: SchedulerState, job: JobRecord, index: int, how: str, now: float) -> None:
    """A task of the rollout's new version failed to become healthy (it exited, or
    ran without passing its probe for ``ready_timeout_seconds``): enough of them
    halt the rollout."""
    if index in job.failed_tasks:
        return
    job.add_failed(index)
    job.rollout_failures = len(job.failed_tasks)
    job.dirty = True
    version = job.target_of(index)  # (a pushed or canary task's: its pin's)
    s.event(now, job.name, "task_not_ready", f"task {index} of version {version} {how}")
    # never more than the tasks pacing lets go down at once, or a bad version
    # under a small max_unavailable would stall instead of halting
    update = job.spec.update
    cap = update.resolve(job.spec.task_count)
    limit = min(update.halt_after_failures, cap or update.halt_after_failures)
    if job.halted is None and job.rollout_failures >= limit:
        n = job.rollout_failures
        job.halted = (f"{n} task{'s' if n != 1 else ''} of version {version} failed "
                      f"to become healthy (the last {how})")
        s.event(now, job.name, "rollout_halted", job.halted, cause=job.cause)
        for op in [o for o in job.acked.values() if to_target(o)]:
            del job.acked[op.op_id]  # acked but not started: dropped, reported done
            if job.controller is not None:
                job.completed.append(op)


def finished(s: SchedulerState, job: JobRecord, rec: TaskRecord, code: int | None,
             now: float) -> None:
    """A batch task exited for good: it leaves its machine, whose resources go
    back to the entitlement; the job completes when every task succeeded."""
    ok = code == 0
    if not s.transition(rec, Event.SUCCEEDED if ok else Event.GAVE_UP):
        return
    if rec.op is not None:
        s.complete(job, rec)  # an update or restart ends with the run
    s.task_event(now, job, rec, "task_finished", f"exited with code {code}")
    s.drop_acked(job, rec.index)
    s.cancel_pending(job, rec.index)
    job.lost.discard(rec.index)
    rec.lost_since = None
    rec.parked = None
    if rec.machine is not None:
        s.unassign(job.ref(rec.index), rec.machine)
    rec.machine = None
    rec.serving = rec.healthy = False
    rec.healthy_since = rec.unhealthy_since = None
    rec.served = False
    rec.exit_code = code
    job.dirty = True
    spec = job.spec
    s.allocator.allocate(AllocationRequest.of(
        job.name, job.entitlement, spec.resources, free=[rec.index], policy=spec.policy))
    if not ok:
        s.event(now, job.name, "task_failed",
                   f"task {rec.index} exited with code {code} and will not be started "
                   f"again (restart policy {spec.restart.policy})")
        if sum(1 for r in job.tasks.values() if r.state is TaskState.DEAD) == 1:
            s.event(now, job.name, "job_failed", f"task {rec.index} failed for good")
    elif all(r.state is TaskState.SUCCEEDED for r in job.tasks.values()) and (
            len(job.tasks) == spec.task_count):
        s.event(now, job.name, "job_completed",
                   f"all {spec.task_count} tasks exited 0")
    s.rollout_done(job, now)
