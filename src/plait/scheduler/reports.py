"""Agents' reports: the truth about tasks, recorded into the task lifecycle.

An agent's heartbeat carries the statuses of the tasks on its machine. Each is
checked against the records (a stale copy of a task that moved is ignored; a report
of an older revision means the old process is still winding down) and moves the
task's lifecycle on: starting, running (healthy or not), crashed, finished, stopped.
A task its machine was stopping and no longer reports is stopped.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import cast

from plait.model.task import TaskState
from plait.scheduler.lifecycle import Event
from plait.scheduler.machinesets import NOTHING_PLACED
from plait.scheduler.records import JobRecord, Phase, TaskRecord, TaskStatus
from plait.scheduler.state import SchedulerState


def _may_end(job: JobRecord, rec: TaskRecord, code: int | None) -> bool:
    """Could the task's restart policy end it at this exit (its retries used up)? An
    agent that says a task is final when its policy would start it again (a service's,
    ``always``) is not believed: the task exited, and is to be started again. (A
    machine's credential would otherwise end any task placed there for good.)"""
    restart = job.versions[rec.spec_version - 1].restart
    return restart.after_exit(0 if code is None else code, restart.max_retries) is None


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
            s.finished(job, rec, st.exit_code, now)
        elif phase is Phase.EXITED:
            s.exited(job, rec, now, st.killed, st.exit_code)
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
