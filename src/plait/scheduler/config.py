"""The scheduler's settings (``SchedulerConfig``) and the names of a pass's stages."""

from __future__ import annotations

from dataclasses import dataclass

#: the stages of a pass, as ``Scheduler.stage`` is told of them: machine changes and
#: maintenance, then for each job reconciled its four stages (1-4 above), with
#: ``jobs`` for choosing the jobs and settling each one's idleness after its stages
STAGES = ("machines", "jobs", "wanted", "acks", "execution", "placement")


def _untold(stage: str) -> None:
    """The default ``Scheduler.stage``: nobody is told."""


@dataclass(frozen=True)
class SchedulerConfig:
    #: destructive operations per second, and the bucket's size
    rate: float = 20.0
    burst: float = 40.0
    #: most operations offered to a controller in one call
    controller_batch: int = 1000
    #: call a controller again after this long even if nothing changed (unless it
    #: asked to be called again sooner or later: ``ask_again_after``)
    recheck_interval: float = 30.0
    #: a remote controller's request with no answer from the shell after this long
    #: is taken as failed (the shell's own hard deadline is much shorter)
    controller_lost_after: float = 60.0
    #: move a task off a failed machine without an ack after this long
    failure_deadline: float = 300.0
    #: events kept
    event_limit: int = 10_000
    #: the periodic full pass: every job is reconciled, changed or not, every this
    #: many passes (0: never) and at least every this many seconds (0: never); a
    #: safety net for an input that failed to mark its job (a settled job's
    #: reconcile costs one look at each of its tasks: ``settled.no_op``)
    full_pass_every: int = 0
    full_pass_interval: float = 60.0
    #: record each task's operations (started, placed, ready, removed): the events a
    #: job's ops chart is drawn from; off, only job-level events are recorded
    task_events: bool = True
    #: a changed host profile rolls over an entitlement's busy machines this many at a
    #: time, each drained within this many seconds at the latest (``profileroll``)
    profile_roll_at_once: int = 1
    profile_roll_deadline: float = 3600.0
    #: a revoked loan's machine is due back in the free pool this long after the
    #: revoke's deadline (its agent's stop of what still ran there; ``loans``)
    loan_return_grace: float = 30.0
