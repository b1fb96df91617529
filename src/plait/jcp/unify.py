"""The Job Control Plane's reconciliation: intents from many writers into one unified
spec (the 2023 post's Figures 4-6, Table 1).

A job's dimensions are written by different actors and never address task indexes:

* the job intent: the stable spec (the service owner), ``stable`` below;
* a push intent: a spec version pushed to a percentage of the job (continuous
  delivery);
* a sizing intent: a task count within [min, max] (the autoscaler, or a person);
* canary intents: a spec version on N tasks, or on tasks placed on a hardware type,
  until a time (testing).

``unify`` is a pure function of those intents, the job's previous unified spec and
where its tasks are placed: which task index runs which spec version. Its rules,
each tested:

1. the size is the sizing intent's count (clamped into its [min, max]), else the job
   intent's;
2. each live canary keeps the indexes it had (below the size), then takes more from
   tasks that are neither pushed nor in another canary, the lowest index first; a
   canary by hardware prefers tasks placed on that machine type, and a task it takes
   elsewhere is marked to be placed there (``hardware``);
3. a push of P % covers ``round_half_up(P * size / 100)`` tasks of the whole job (so a
   50 % push stays 50 % as the job is resized), never a canary's task (the push signal
   is not diluted); it keeps the indexes it had, adds the lowest stable ones, and
   gives up the highest when it must shrink;
4. the rest run the stable spec;
5. what the rules cannot satisfy (a canary larger than the tasks left, a push that
   the canaries leave too few tasks for) is reported in ``conflicts``, never guessed;
   canaries never take every task of the job (one at least runs its spec).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction

STABLE, PUSH = "stable", "push"


@dataclass(frozen=True, slots=True)
class Push:
    version: int
    #: the share of the job's tasks it covers, 0-100
    percent: Fraction


@dataclass(frozen=True, slots=True)
class Sizing:
    task_count: int
    min: int = 0
    max: int = 1 << 31


@dataclass(frozen=True, slots=True)
class Canary:
    name: str
    version: int
    #: how many tasks it runs on
    tasks: int
    #: a machine type: the canary runs on tasks placed on machines of that type
    hardware: str | None = None
    #: it ends then (a canary past its end takes no task)
    until: float = float("inf")


@dataclass(frozen=True)
class Unified:
    """Which spec version each task index runs, and why."""

    task_count: int
    #: per index: ``stable``, ``push`` or ``canary:NAME``
    roles: tuple[str, ...]
    #: per index: the spec version it runs
    versions: tuple[int, ...]
    #: indexes a hardware canary needs placed on a machine type they are not on now
    hardware: Mapping[int, str] = field(default_factory=dict)
    #: what the intents asked that the rules could not give, one sentence each
    conflicts: tuple[str, ...] = ()

    def count(self, role: str) -> int:
        return sum(1 for r in self.roles if r == role)


def round_half_up(x: Fraction) -> int:
    """The rounding of a push's task count: halves go up (a 50 % push of 5 tasks is
    3), so a push of more than 0 % covers at least one task of any job of 2 or more
    once P * size >= 50."""
    return int(x + Fraction(1, 2)) if x >= 0 else -int(-x + Fraction(1, 2))


def size_of(base: int, sizing: Sizing | None) -> int:
    if sizing is None:
        return base
    return max(sizing.min, min(sizing.max, sizing.task_count))


def unify(stable: int, base_count: int, *, push: Push | None = None,
          sizing: Sizing | None = None, canaries: Sequence[Canary] = (),
          previous: Unified | None = None,
          placed_on: Mapping[int, str | None] | None = None, now: float = 0.0) -> Unified:
    """The unified spec of a job whose stable spec is version ``stable`` with
    ``base_count`` tasks (see the module's rules). ``placed_on``: each task's machine
    type, where it is placed."""
    n = size_of(base_count, sizing)
    placed_on = placed_on or {}
    before = previous.roles if previous is not None else ()
    roles: list[str] = [STABLE] * n
    conflicts: list[str] = []
    hardware: dict[int, str] = {}
    was_pushed = {i for i, r in enumerate(before[:n]) if r == PUSH}
    taken: set[int] = set()
    for canary in sorted((c for c in canaries if c.until > now), key=lambda c: c.name):
        role = f"canary:{canary.name}"
        mine = [i for i, r in enumerate(before[:n]) if r == role and i not in taken]
        if canary.hardware is not None:  # only tasks on that hardware stay
            mine = [i for i in mine if placed_on.get(i) == canary.hardware
                    or (previous is not None and previous.hardware.get(i) == canary.hardware)]
        mine = mine[:canary.tasks]
        free = [i for i in range(n) if i not in taken and i not in mine]
        # not a pushed task unless nothing else is left (then the push shrinks, below)
        free.sort(key=lambda i: (i in was_pushed, i))
        if canary.hardware is not None:
            free.sort(key=lambda i: (placed_on.get(i) != canary.hardware, i in was_pushed, i))
        # canaries never take the whole job: one task at least runs its spec (a job
        # resized below a canary's count would otherwise run the canary everywhere)
        room = max(0, n - 1 - len(taken))
        mine = mine[:room]
        need = min(canary.tasks, room) - len(mine)
        mine += free[:max(0, need)]
        if len(mine) < canary.tasks:
            conflicts.append(f"canary {canary.name} asks for {canary.tasks} tasks; only "
                             f"{len(mine)} of the job's {n} are free of other canaries "
                             "(one at least runs the job's spec)")
        for i in mine:
            roles[i] = role
            taken.add(i)
            if canary.hardware is not None and placed_on.get(i) != canary.hardware:
                hardware[i] = canary.hardware
    if push is not None:
        want = round_half_up(push.percent * n / 100)
        eligible = [i for i in range(n) if i not in taken]
        if want > len(eligible):
            conflicts.append(f"the push of {push.percent}% wants {want} of {n} tasks; the "
                             f"canaries leave {len(eligible)}")
            want = len(eligible)
        keep = [i for i in eligible if i in was_pushed][:want]
        add = [i for i in eligible if i not in was_pushed][:want - len(keep)]
        for i in keep + add:
            roles[i] = PUSH
    versions: list[int] = []
    by_name = {f"canary:{c.name}": c.version for c in canaries}
    for role in roles:
        if role == STABLE:
            versions.append(stable)
        elif role == PUSH:
            assert push is not None
            versions.append(push.version)
        else:
            versions.append(by_name[role])
    return Unified(n, tuple(roles), tuple(versions), hardware, tuple(conflicts))
