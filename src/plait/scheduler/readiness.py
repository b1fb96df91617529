"""Rollout health for versions that run but never pass their probe.

A task of a rollout's new version that exits counts toward ``halt_after_failures``
when its agent reports the exit (``reports.exited``). One that runs without passing
its health probe would otherwise hold its operation open for ever, and the rollout
would neither finish nor halt: after ``update.ready_timeout_seconds`` running at
the target version without passing, it counts as failed too.
"""

from __future__ import annotations

from plait.model.task import TaskState
from plait.scheduler.records import JobRecord


def not_ready(job: JobRecord, now: float) -> list[int]:
    """Tasks of the rollout's new version that have run ``ready_timeout_seconds``
    without passing their probe, not counted as failed yet."""
    if not job.rollout_active or job.halted is not None:
        return []
    timeout = job.spec.update.ready_timeout_seconds
    running, goal = TaskState.RUNNING, job.target_of
    return sorted([r.index for r in job.tasks.values()
                   if not r.healthy and r.state is running and r.spec_version == goal(r.index)
                   and r.unhealthy_since is not None and now - r.unhealthy_since >= timeout
                   and r.index not in job.failed_tasks])
