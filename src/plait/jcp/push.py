"""A staged push's progress, a pure function of what the scheduler reports.

A push moves through its stages (percentages of the job): in each, ``rolling`` until
every task the unified spec gives the push runs its version healthy and serving with
no operation under way (tasks waiting for room aside, once one runs: they start at
the push's version when room comes); ``soaking`` while they stay so for ``soak_seconds``;
``gating`` while its gate is asked (no gate: it passes at once); then the next stage,
or at the last one ``completed`` (a last stage of 100 %: the push becomes the job's
spec) or ``holding`` (a last stage below 100 %: it stays there until replaced or
aborted). A failing gate, a stage not healthy within ``stage_timeout_seconds`` or a
rollout the scheduler halted moves it to ``rolled_back``: its tasks go back to the
job's spec. ``aborted`` is asked for by a person.
"""

from __future__ import annotations

from dataclasses import dataclass

from plait.jcp.intents import ACTIVE, PushIntent, PushStatus


@dataclass(frozen=True, slots=True)
class StageHealth:
    """What the scheduler reports of the push's tasks."""

    #: tasks the unified spec gives the push
    want: int
    #: of those, running the push's version, healthy and serving, no operation under way
    ready: int
    #: the job's rollout halted by the scheduler (why), if it is
    halted: str | None = None
    #: of those not ready, the tasks that wait for room (pending, unplaced for want of
    #: a machine, and not taken down by the push: ``plans.waiting_for_room``): they
    #: start at the push's version when room comes, and do not hold the stage
    waiting: int = 0

    @property
    def healthy(self) -> bool:
        """Every task the push holds is ready, but those waiting for room (at least
        one ready: a stage none of whose tasks runs has shown nothing)."""
        if self.ready >= self.want:
            return True
        return self.ready > 0 and self.ready + self.waiting >= self.want


def percent(intent: PushIntent, status: PushStatus) -> int:
    """The share of the job the push holds now (0 once it is over)."""
    if status.phase not in ACTIVE:
        return 0
    return intent.stages[status.stage]


def _to(status: PushStatus, now: float, **changes: object) -> PushStatus:
    return status.model_copy(update={"since": now, "healthy_since": None, **changes})


def advance(intent: PushIntent, status: PushStatus, health: StageHealth,
            now: float) -> PushStatus:
    """The push's status after looking at its tasks at ``now``; a status in
    ``gating`` waits for ``verdict``."""
    status = status.model_copy(update={"want": health.want, "ready": health.ready})
    if status.phase not in ACTIVE or status.version is None:
        return status
    stage = intent.stages[status.stage]
    if health.halted is not None and status.phase != "holding":
        return _to(status, now, phase="rolled_back",
                   message=f"stage {status.stage + 1} ({stage}%): the rollout halted: "
                           f"{health.halted}")
    healthy = health.healthy
    room = (f" ({health.waiting} wait for room)"
            if health.waiting and health.ready < health.want else "")
    if status.phase == "rolling":
        if healthy:
            if intent.soak_seconds == 0:
                return _gate_or_pass(intent, status, now)
            return status.model_copy(update={
                "phase": "soaking", "since": now, "healthy_since": now,
                "message": f"stage {status.stage + 1} ({stage}%): {health.ready} tasks "
                           f"healthy{room}, soaking {intent.soak_seconds:g}s"})
        if now - status.since >= intent.stage_timeout_seconds:
            return _to(status, now, phase="rolled_back",
                       message=f"stage {status.stage + 1} ({stage}%): {health.ready} of "
                               f"{health.want} tasks healthy after "
                               f"{intent.stage_timeout_seconds:g}s")
        return status.model_copy(update={
            "message": f"stage {status.stage + 1} ({stage}%): {health.ready} of "
                       f"{health.want} tasks ready{room}"})
    if status.phase == "soaking":
        if not healthy:
            return status.model_copy(update={
                "phase": "rolling", "healthy_since": None,
                "message": f"stage {status.stage + 1} ({stage}%): a task became unhealthy "
                           "while soaking"})
        assert status.healthy_since is not None
        if now - status.healthy_since >= intent.soak_seconds:
            return _gate_or_pass(intent, status, now)
    return status


def _gate_or_pass(intent: PushIntent, status: PushStatus, now: float) -> PushStatus:
    if intent.gate is None:
        return verdict(intent, status, True, "no gate", now)
    stage = intent.stages[status.stage]
    return _to(status, now, phase="gating",
               message=f"stage {status.stage + 1} ({stage}%): healthy and soaked; asking "
                       "the gate")


def verdict(intent: PushIntent, status: PushStatus, passed: bool, message: str,
            now: float) -> PushStatus:
    """The stage's gate answered: the next stage, the end, or a rollback."""
    stage = intent.stages[status.stage]
    if not passed:
        return _to(status, now, phase="rolled_back",
                   message=f"stage {status.stage + 1} ({stage}%): the gate failed: {message}")
    if status.stage + 1 < len(intent.stages):
        nxt = status.stage + 1
        return _to(status, now, phase="rolling", stage=nxt,
                   message=f"stage {nxt + 1} ({intent.stages[nxt]}%) begins")
    if stage == 100:
        return _to(status, now, phase="completed",
                   message=f"every stage passed ({message}); the push is the job's spec")
    return _to(status, now, phase="holding",
               message=f"holding at {stage}% (the last stage; {message})")
