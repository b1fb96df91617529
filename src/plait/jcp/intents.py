"""The Job Control Plane's intents: each a separate dimension of a job, written by a
different actor through its own API resource (the 2023 post's Table 1).

* the job intent is the job's spec itself (``PUT /v1/jobs/{job}``, the service owner);
* ``PushIntent``: a target spec and its stages, e.g. 10 -> 50 -> 100 % with a health
  gate between stages (continuous delivery; ``plait push``);
* ``SizingIntent``: a task count within [min, max] (the autoscaler, or a person);
* ``CanaryIntent``: a spec on N tasks, or on tasks placed on a machine type, for a
  duration (testing).

No intent addresses task indexes: a body that tries is refused with a message that
points to Shard Manager (Table 1's last row). The records the control plane keeps per
job (``JcpRecord``) hold each intent with who wrote it and when, and the push's
progress (``PushStatus``, advanced by ``plait.jcp.push``).
"""

from __future__ import annotations

import itertools
import re
from typing import Any, Literal

import pydantic

from plait.model.base import Value
from plait.model.job import MAX_TASKS, JobSpec
from plait.model.policy import Name

#: keys of a body that would address task indexes
INDEX_KEYS = ("index", "indexes", "indices", "task_index", "task_indexes", "task_indices")
PER_TASK = ("per-task customization is not supported: no intent addresses task indexes "
            "(the job's tasks are interchangeable); an application whose tasks hold "
            "different data or roles runs under Shard Manager, which assigns shards to "
            "tasks through TaskControl")

Phase = Literal["rolling", "soaking", "gating", "holding", "completed", "rolled_back",
                "aborted"]
#: phases in which a push holds its share of the job
ACTIVE: frozenset[str] = frozenset({"rolling", "soaking", "gating", "holding"})


class _NoIndexes(Value):
    @pydantic.model_validator(mode="before")
    @classmethod
    def _no_indexes(cls, data: Any) -> Any:
        if isinstance(data, dict):
            named = [k for k in INDEX_KEYS if k in data]
            if named:
                raise ValueError(f"{named[0]}: {PER_TASK}")
        return data


class Gate(Value):
    """What decides, after a stage's tasks are healthy and soaked, whether the push goes
    on: a URL the control plane asks (any 2xx answer passes; anything else, or no answer
    within 5 s, fails), or a verdict posted to ``/v1/jobs/{job}/push/gate`` (``plait
    push --gate-command`` runs a command where the push was started and posts its exit
    status)."""

    url: str | None = pydantic.Field(default=None, max_length=2048)
    external: bool = False

    @pydantic.model_validator(mode="after")
    def _one(self) -> Gate:
        if (self.url is None) == (not self.external):
            raise ValueError("a gate is either a url or external, not both or neither")
        if self.url is not None and not re.match(r"^https?://[^\s/]+(/\S*)?\Z", self.url):
            raise ValueError("url: an http:// or https:// URL (without spaces)")
        return self


class PushIntent(_NoIndexes):
    """A target spec pushed to the job in stages (percentages of its tasks)."""

    spec: JobSpec
    #: percentages of the job's tasks, increasing; a last stage below 100 holds there
    #: (whole numbers only: ``"50"`` and ``true`` are refused, not read as 50 and 1)
    stages: tuple[pydantic.StrictInt, ...] = pydantic.Field(default=(100,), min_length=1,
                                                           max_length=10)
    #: how long a stage's tasks stay healthy before its gate is asked
    soak_seconds: float = pydantic.Field(default=60.0, ge=0, le=86_400)
    #: a stage whose tasks are not healthy by then fails (and the push rolls back)
    stage_timeout_seconds: float = pydantic.Field(default=1800.0, ge=1, le=7 * 86_400)
    gate: Gate | None = None

    @pydantic.field_validator("stages")
    @classmethod
    def _stages(cls, stages: tuple[int, ...]) -> tuple[int, ...]:
        for s in stages:
            if not 1 <= s <= 100:
                raise ValueError(f"a stage is a percentage from 1 to 100, not {s}")
        if any(b <= a for a, b in itertools.pairwise(stages)):
            raise ValueError(f"stages must increase: {list(stages)}")
        return stages


class SizingIntent(_NoIndexes):
    """How many tasks the job runs, within bounds (the autoscaler's or a person's)."""

    task_count: int = pydantic.Field(ge=0, le=MAX_TASKS)
    min: int = pydantic.Field(default=0, ge=0, le=MAX_TASKS)
    max: int = pydantic.Field(default=MAX_TASKS, ge=0, le=MAX_TASKS)

    @pydantic.model_validator(mode="after")
    def _bounds(self) -> SizingIntent:
        if self.min > self.max:
            raise ValueError(f"min {self.min} is above max {self.max}")
        return self

    @property
    def size(self) -> int:
        return max(self.min, min(self.max, self.task_count))


class CanaryIntent(_NoIndexes):
    """A spec run on some of the job's tasks for a while: ``tasks`` of them, on machines
    of type ``hardware`` if given (tasks are moved there when needed). With
    ``host_profile``, a code + config + host-profile canary: its tasks run on machines
    of their own that carry that host profile (a canary entitlement, decision 103), so
    the spec change and the host change are tried together on the same machines."""

    spec: JobSpec
    tasks: int = pydantic.Field(default=1, ge=1, le=100_000)
    hardware: Name | None = None
    host_profile: Name | None = None
    duration_seconds: float = pydantic.Field(default=3600.0, ge=1, le=30 * 86_400)


class PushStatus(Value):
    """Where a push stands (advanced by ``plait.jcp.push.advance``)."""

    #: the kept version the push runs (None until it is stored)
    version: int | None = None
    stage: int = 0
    phase: Phase = "rolling"
    #: when the phase began
    since: float = 0.0
    #: when the stage's tasks were all healthy (soaking)
    healthy_since: float | None = None
    #: the stage's tasks: how many the push holds, how many are ready
    want: int = 0
    ready: int = 0
    message: str = ""
    #: a completed push: the job's version it became
    promoted: int | None = None


class StoredPush(Value):
    intent: PushIntent
    status: PushStatus
    actor: str | None = None
    created: float = 0.0


class StoredSizing(Value):
    intent: SizingIntent
    actor: str | None = None
    time: float = 0.0


class StoredCanary(Value):
    intent: CanaryIntent
    version: int | None = None
    #: a host-profile canary's canary entitlement, once made
    entitlement: str | None = None
    actor: str | None = None
    started: float = 0.0
    until: float = 0.0


class JcpRecord(Value):
    """A job's intents but its spec, as the control plane stores them."""

    push: StoredPush | None = None
    sizing: StoredSizing | None = None
    canaries: dict[str, StoredCanary] = pydantic.Field(default_factory=dict)
    #: what the intents asked that the rules could not give (``unify``), last computed
    conflicts: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        return self.push is None and self.sizing is None and not self.canaries

