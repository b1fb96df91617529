"""Per machine: the tasks its agent must run, and the tasks whose records name it.

A region holds one of each per machine with tasks (a million machines: about
700,000 of each), each holding a few tasks. As a dict and a set they took 240 and
232 bytes even for one task; as tuples they take 56 bytes and 8 more per task. A
machine holds few tasks, so a look-up is a short scan, and a change builds a new
tuple (the old one may still be read by an agent's long-poll: it never changes).

``DesiredSet`` reads like the ``dict[TaskRef, Assignment]`` it replaces (``in``,
``get``, ``values``, ``items``, ``len``); ``placed`` sets are plain tuples of
``TaskRef`` (``in``, iteration). A machine left with no task has no entry.
"""

from __future__ import annotations

from collections.abc import Iterator

from plait.model.task import TaskRef
from plait.scheduler.records import Assignment


class DesiredSet(tuple[Assignment, ...]):
    """A machine's desired set: its assignments, in the order they were made, read
    like a dict keyed by ``TaskRef``."""

    __slots__ = ()

    def get(self, ref: TaskRef, default: Assignment | None = None) -> Assignment | None:
        job, index = ref.job, ref.index
        for a in self:
            if a.index == index and a.job == job:
                return a
        return default

    def __contains__(self, ref: object) -> bool:
        if not isinstance(ref, TaskRef):
            return False
        return self.get(ref) is not None

    def values(self) -> tuple[Assignment, ...]:
        return tuple(self)

    def keys(self) -> list[TaskRef]:
        return [TaskRef(a.job, a.index) for a in self]

    def items(self) -> Iterator[tuple[TaskRef, Assignment]]:
        return ((TaskRef(a.job, a.index), a) for a in self)


def desire(desired: dict[int, DesiredSet], machine: int, ref: TaskRef,
           assignment: Assignment) -> None:
    """Put (or replace, where it was) the task's assignment in the machine's set."""
    have = desired.get(machine)
    if not have:
        desired[machine] = DesiredSet((assignment,))
        return
    job, index = ref.job, ref.index
    for k, a in enumerate(have):
        if a.index == index and a.job == job:
            desired[machine] = DesiredSet((*have[:k], assignment, *have[k + 1:]))
            return
    desired[machine] = DesiredSet((*have, assignment))


def undesire(desired: dict[int, DesiredSet], machine: int, ref: TaskRef) -> None:
    """Take the task out of the machine's set, if it is there."""
    have = desired.get(machine)
    if not have:
        return
    job, index = ref.job, ref.index
    for k, a in enumerate(have):
        if a.index == index and a.job == job:
            if len(have) > 1:
                desired[machine] = DesiredSet((*have[:k], *have[k + 1:]))
            else:
                del desired[machine]
            return


def place(placed: dict[int, tuple[TaskRef, ...]], machine: int, ref: TaskRef) -> None:
    have = placed.get(machine, ())
    if ref not in have:
        placed[machine] = (*have, ref)


def unplace(placed: dict[int, tuple[TaskRef, ...]], machine: int, ref: TaskRef) -> None:
    have = placed.get(machine)
    if not have or ref not in have:
        return
    if len(have) > 1:
        k = have.index(ref)
        placed[machine] = (*have[:k], *have[k + 1:])
    else:
        del placed[machine]
