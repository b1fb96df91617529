"""A desired set as the agent takes it: parsed with the wire's models
(``plait.model.agentwire``), read by the state machine as ``Wanted`` entries."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pydantic

from plait.model.agentmachine import Wanted
from plait.model.agentwire import DesiredSet, DesiredTask


class BadDesired(ValueError):
    """A desired set not in the form the agent takes (the reason says where): taken as
    no answer, so every task keeps running as it is and the heartbeats go on."""


def checked_desired(desired: Any) -> DesiredSet:
    """``desired`` as the wire's model reads it, else ``BadDesired``: one malformed
    task must not stop the agent's loop, nor start or stop anything on a set read
    only in part."""
    try:
        return DesiredSet.model_validate(desired)
    except pydantic.ValidationError as exc:
        errors = exc.errors()
        where = ".".join(str(p) for p in errors[0]["loc"]) if errors else ""
        what = errors[0]["msg"] if errors else str(exc)
        raise BadDesired(f"a malformed desired set ({where or 'the set'}: {what})") from None


@dataclass(frozen=True)
class Pulled:
    """A desired set, and when the agent asked for it (the fence's clock: a set
    asked for after the agent reached the control plane again may start a task its
    fence stopped)."""

    desired: DesiredSet
    at: float


def wanted(task: DesiredTask) -> Wanted[str]:
    """A desired set's entry as the state machine reads it."""
    spec = task.spec
    return Wanted(task.key, task.job, task.index, task.revision, spec.restart.policy,
                  spec.restart.max_retries, None if spec.fence is None else spec.fence.seconds,
                  task.request_id)
