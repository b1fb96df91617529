"""The autoscaler's decision (SRM, paper sections 2.7 and 5.2): how many tasks a job
needs, from its measured load and its history. Pure: the caller passes time in.

The load is measured in *tasks' worth of work*: a job of ``n`` tasks at mean CPU
utilization ``u`` carries ``n * u``. A decision

1. predicts the load from history: the mean of what was measured at the same time of
   day yesterday and a week ago (``lookahead`` seconds ahead, so a morning ramp is
   met before it arrives), as far as history reaches;
2. blends the prediction with the live measurement (``history_weight``), never below
   the live load (the prediction may lead, never lag);
3. sizes for ``target_utilization``: ``ceil(load / target)``, within [min, max];
4. grows at once, but shrinks at most ``scale_down_fraction`` of the tasks per
   decision (at least one), so a dip does not drop capacity it needs back soon;
5. never sizes past the room there is (``within_room``): the tasks the job's
   entitlement (its quota, its machines) and the region's free pool can place now,
   which the caller asks the allocator for without committing. Tasks no machine
   could take would wait for room and serve nothing.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field

import pydantic

from plait.model.base import Value

DAY, WEEK = 86_400.0, 7 * 86_400.0


class AutoscalePolicy(Value):
    """A job's autoscaling policy."""

    #: what the load is read from: CPU utilization reported for its tasks, or an
    #: external series pushed through the API (in tasks' worth of work)
    metric: str = pydantic.Field(default="cpu", pattern="^(cpu|external)$")
    target_utilization: float = pydantic.Field(default=0.6, gt=0, le=1)
    min_tasks: int = pydantic.Field(default=1, ge=0, le=100_000)
    max_tasks: int = pydantic.Field(default=100_000, ge=0, le=100_000)
    #: the most of its tasks a job loses in one decision
    scale_down_fraction: float = pydantic.Field(default=0.1, gt=0, le=1)
    #: the prediction's weight against the live measurement (0: live only)
    history_weight: float = pydantic.Field(default=0.5, ge=0, le=1)
    #: how far ahead the prediction looks
    lookahead_seconds: float = pydantic.Field(default=900.0, ge=0, le=DAY)

    @pydantic.model_validator(mode="after")
    def _bounds(self) -> AutoscalePolicy:
        if self.min_tasks > self.max_tasks:
            raise ValueError("min_tasks is above max_tasks")
        return self


@dataclass
class History:
    """Measured load over time (kept two weeks)."""

    times: list[float] = field(default_factory=list)
    loads: list[float] = field(default_factory=list)

    def add(self, t: float, load: float) -> None:
        """A measurement at ``t`` (kept in time order, whatever order they come in)."""
        k = bisect.bisect_right(self.times, t)
        self.times.insert(k, t)
        self.loads.insert(k, load)
        cut = bisect.bisect_left(self.times, t - 2 * WEEK - DAY)
        if cut > 1024:
            del self.times[:cut], self.loads[:cut]

    def at(self, t: float, within: float = 600.0) -> float | None:
        """The load measured nearest ``t`` (within ``within`` seconds), if any."""
        k = bisect.bisect_left(self.times, t)
        best: tuple[float, float] | None = None
        for j in (k - 1, k):
            if 0 <= j < len(self.times):
                gap = abs(self.times[j] - t)
                if gap <= within and (best is None or gap < best[0]):
                    best = (gap, self.loads[j])
        return None if best is None else best[1]

    def predict(self, t: float) -> float | None:
        """The mean of the load a day and a week before ``t``, where known."""
        seen = [x for x in (self.at(t - DAY), self.at(t - WEEK)) if x is not None]
        return sum(seen) / len(seen) if seen else None


def recommend(policy: AutoscalePolicy, history: History, now: float, tasks: int,
              live_load: float) -> int:
    """The task count for a job of ``tasks`` tasks carrying ``live_load`` now."""
    load = live_load
    predicted = history.predict(now + policy.lookahead_seconds)
    if predicted is not None:
        blend = policy.history_weight * predicted + (1 - policy.history_weight) * live_load
        load = max(live_load, blend)
    want = math.ceil(load / policy.target_utilization - 1e-9)
    want = max(policy.min_tasks, min(policy.max_tasks, want))
    if want < tasks:
        floor = tasks - max(1, math.floor(tasks * policy.scale_down_fraction))
        want = max(want, floor)
    return want


@dataclass(frozen=True, slots=True)
class Room:
    """How many of a job's tasks could be placed now (those holding a machine, and as
    many more as the allocator finds room for without committing), and why no more
    (the allocator's reason) when that is fewer than asked."""

    tasks: int
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class Capped:
    """A decision within the room: the task count, and what was wanted and why it
    was cut (None: not cut)."""

    tasks: int
    wanted: int
    why: str | None = None


def within_room(policy: AutoscalePolicy, want: int, room: Room) -> Capped:
    """``want`` no larger than ``room.tasks``, never below the policy's ``min_tasks``
    (a floor its owner set); ``why`` names what capped it: the entitlement's quota, or
    the region's capacity (no machine with room, in the entitlement or the free
    pool)."""
    if want <= room.tasks:
        return Capped(want, want)
    tasks = max(policy.min_tasks, room.tasks)
    if tasks >= want:
        return Capped(want, want)
    reason = room.reason or "no room"
    what = "entitlement quota" if reason.startswith("entitlement quota") else (
        "region capacity")
    return Capped(tasks, want, f"{what} ({reason})")
