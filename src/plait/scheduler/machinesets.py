"""Per machine: the tasks its agent must run, and the tasks whose records name it.

A region holds one of each per machine with tasks (a million machines: about
500,000 of each), holding two million tasks. As a dict of ``TaskRef`` to
``Assignment`` and a set of ``TaskRef`` they took 240 and 232 bytes per machine
even for one task, plus 96 bytes of ``Assignment`` per task. Here:

* a ``DesiredSet`` is one flat tuple ``(assigned, index, assigned, index, ...)``:
  ``Assigned`` is shared by a job's tasks at one version (``JobRecord.assigned``),
  so a task costs 16 bytes of it; it reads like the dict it replaces (``in``,
  ``get``, ``values``, ``items``, ``len``, iteration), making each ``Assignment``
  as it is read (agents read their sets, the pass only writes them);
* a placed set is a plain tuple of ``TaskRef`` (``in``, iteration).

A machine holds few tasks, so a look-up is a short scan, and a change builds a new
tuple (one handed out earlier, to an agent's long-poll, never changes). A machine
left with no task has no entry.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import cast

from plait.model.task import TaskRef
from plait.scheduler.records import Assigned, Assignment

_ALL = slice(None)


class DesiredSet(tuple[object, ...]):
    """A machine's desired set: ``(assigned, index, ...)``, in the order the tasks
    were assigned, read like a dict of ``TaskRef`` to ``Assignment``."""

    __slots__ = ()

    def _find(self, job: str, index: int) -> int:
        """The position of the task's pair, or -1."""
        get = tuple.__getitem__
        for k in range(0, tuple.__len__(self), 2):
            if get(self, k + 1) == index and cast(Assigned, get(self, k)).job == job:
                return k
        return -1

    def get(self, ref: TaskRef, default: Assignment | None = None) -> Assignment | None:
        k = self._find(ref.job, ref.index)
        if k < 0:
            return default
        return cast(Assigned, tuple.__getitem__(self, k)).at(ref.index)

    def __contains__(self, ref: object) -> bool:
        return isinstance(ref, TaskRef) and self._find(ref.job, ref.index) >= 0

    def __len__(self) -> int:
        return tuple.__len__(self) // 2

    def assignments(self) -> Iterator[Assignment]:
        raw = tuple.__iter__(self)
        for assigned in raw:
            yield cast(Assigned, assigned).at(cast(int, next(raw)))

    def __iter__(self) -> Iterator[Assignment]:
        return self.assignments()

    def values(self) -> list[Assignment]:
        return list(self.assignments())

    def keys(self) -> list[TaskRef]:
        return [TaskRef(a.job, a.index) for a in self.assignments()]

    def items(self) -> list[tuple[TaskRef, Assignment]]:
        return [(TaskRef(a.job, a.index), a) for a in self.assignments()]

    def __repr__(self) -> str:
        return f"DesiredSet({self.values()!r})"


def desire(desired: dict[int, DesiredSet], machine: int, ref: TaskRef,
           assigned: Assigned) -> None:
    """Put (or replace, where it was) the task's assignment in the machine's set."""
    have = desired.get(machine)
    index = ref.index
    if not have:
        desired[machine] = DesiredSet((assigned, index))
        return
    k = have._find(ref.job, index)
    cut = tuple.__getitem__  # (slices of the raw pairs, as plain tuples)
    if k < 0:
        desired[machine] = DesiredSet((*cut(have, _ALL), assigned, index))
    else:
        desired[machine] = DesiredSet((*cut(have, slice(None, k)), assigned, index,
                                       *cut(have, slice(k + 2, None))))


def undesire(desired: dict[int, DesiredSet], machine: int, ref: TaskRef) -> None:
    """Take the task out of the machine's set, if it is there."""
    have = desired.get(machine)
    if not have:
        return
    k = have._find(ref.job, ref.index)
    if k < 0:
        return
    if tuple.__len__(have) > 2:
        cut = tuple.__getitem__
        desired[machine] = DesiredSet(cut(have, slice(None, k))
                                      + cut(have, slice(k + 2, None)))
    else:
        del desired[machine]


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
