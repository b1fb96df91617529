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
* a ``PlacedSet`` is one flat tuple ``(job, index, job, index, ...)`` (16 bytes a
  task, not a 48-byte ``TaskRef``), read like a tuple of ``TaskRef`` (``in``,
  iteration, ``len``).

A look-up of a few tasks is a short scan; past a few, a search in C by the task's
index, or by its job when many pairs share the index, whichever leaves fewer pairs
to check (a machine can hold hundreds of one job's small tasks, and thousands of
one-task jobs: searching by job alone made writing a 20,000-task job's state on 48
machines take 2.6 s; by index alone, the state of 5,000 one-task jobs 2.1 s). A
change builds a new tuple (one handed out earlier, to an agent's long-poll, never
changes). A machine left with no task has no entry.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from operator import attrgetter
from typing import TypeVar, cast

from plait.model.task import TaskRef
from plait.scheduler.records import Assigned, Assignment

_ALL = slice(None)
_EVEN = slice(0, None, 2)
_JOB = attrgetter("job")
_ODD = slice(1, None, 2)
#: a machine's set of either kind
S = TypeVar("S", bound=tuple[object, ...])
#: pairs (doubled) up to which ``_find`` scans in Python
_SCAN = 2 * 6
#: tasks up to which the ``*_all`` changes of a set make one change at a time (each
#: a search in C and a copy, cheaper than one pass over the set in Python)
_FEW = 2


def _find(pairs: tuple[object, ...], job: str, index: int,
          jobs: Callable[[tuple[object, ...]], list[str]]) -> int:
    """The position of the task's pair ``(x, index)`` whose ``x`` names ``job``
    (``jobs(xs)``: the job of each ``x``), or -1. A short scan for a few pairs; else a
    search in C by the index, or by the job when many pairs share the index (the one
    task of each of many jobs: index 0), whichever has fewer candidates to check."""
    get = tuple.__getitem__
    n = tuple.__len__(pairs)
    if n <= _SCAN:
        names = jobs(get(pairs, _EVEN))
        for k in range(0, n, 2):
            if get(pairs, k + 1) == index and names[k // 2] == job:
                return k
        return -1
    indices = get(pairs, _ODD)
    if indices.count(index) <= _SCAN:
        p = _first(indices, index, lambda p: jobs((get(pairs, 2 * p),))[0] == job)
    else:
        names = jobs(get(pairs, _EVEN))
        p = _first(names, job, lambda p: indices[p] == index)
    return -1 if p < 0 else 2 * p


def _first(seq: Sequence[object], value: object, ok: Callable[[int], bool]) -> int:
    """The first position ``p`` of ``value`` in ``seq`` (searched in C) with
    ``ok(p)``, or -1."""
    start = 0
    while True:
        try:
            p = seq.index(value, start)
        except ValueError:
            return -1
        if ok(p):
            return p
        start = p + 1


def _assigned_jobs(xs: tuple[object, ...]) -> list[str]:
    return list(map(_JOB, xs))


def _named_jobs(xs: tuple[object, ...]) -> list[str]:
    return cast(list[str], list(xs))


class DesiredSet(tuple[object, ...]):
    """A machine's desired set: ``(assigned, index, ...)``, in the order the tasks
    were assigned, read like a dict of ``TaskRef`` to ``Assignment``."""

    __slots__ = ()

    def _find(self, job: str, index: int) -> int:
        """The position of the task's pair, or -1. (A machine packed with small tasks
        holds dozens, hundreds of one job's: past a few, the indices are searched in
        C, and only a pair with the task's index has its job compared.)"""
        return _find(self, job, index, _assigned_jobs)

    def by_job(self) -> dict[str, set[int]]:
        """The indices of each job's tasks in the set (one pass over it, for a caller
        that asks about the tasks of many jobs on the machine)."""
        out: dict[str, set[int]] = {}
        raw = tuple.__iter__(self)
        for a in raw:
            name = cast(Assigned, a).job
            got = out.get(name)
            if got is None:
                got = out[name] = set()
            got.add(cast(int, next(raw)))
        return out

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


def desire_all(desired: dict[int, DesiredSet], machine: int, job: str,
               items: Mapping[int, Assigned]) -> None:
    """``desire`` for several tasks of one job on one machine (index -> what it is
    assigned): the set is rebuilt once. (An update of a job of small tasks re-assigns
    hundreds of them on each machine: one rebuild each cost its square.)"""
    have = desired.get(machine)
    if have and len(items) <= _FEW:
        for index, assigned in items.items():
            desire(desired, machine, TaskRef(job, index), assigned)
        return
    left = dict(items)
    out: list[object] = []
    if have:
        raw = tuple.__iter__(have)
        for a in raw:
            i = next(raw)
            if i in left and cast(Assigned, a).job == job:
                a = left.pop(i)
            out += (a, i)
    for index, assigned in left.items():
        out += (assigned, index)
    if out:
        desired[machine] = DesiredSet(out)


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


def undesire_all(desired: dict[int, DesiredSet], machine: int, job: str,
                 indices: Collection[int]) -> None:
    """``undesire`` for several tasks of one job on one machine: the set is rebuilt
    once (a wave of an update stops the tasks of a machine together: 16 at a time
    on a machine of 16)."""
    _drop_all(desired, machine, job, indices, undesire, _assigned_jobs, DesiredSet)


def _drop_all(sets: dict[int, S], machine: int, job: str, indices: Collection[int],
              one: Callable[[dict[int, S], int, TaskRef], None],
              jobs: Callable[[tuple[object, ...]], list[str]],
              make: Callable[[list[object]], S]) -> None:
    """Take several tasks of one job out of a machine's set (``one``: a task alone;
    ``jobs``: the job of each of the set's firsts; ``make``: a set of pairs): one or
    two searched for, more in one pass over the set."""
    have = sets.get(machine)
    if not have:
        return
    if len(indices) <= _FEW:
        for index in indices:
            one(sets, machine, TaskRef(job, index))
        return
    raw = tuple.__iter__(have)
    names = jobs(tuple.__getitem__(have, _EVEN))
    keep: list[object] = []
    for k, first in enumerate(raw):
        i = next(raw)
        if i not in indices or names[k] != job:
            keep += (first, i)
    if len(keep) == tuple.__len__(have):
        return  # none of them was there
    if keep:
        sets[machine] = make(keep)
    else:
        del sets[machine]


class PlacedSet(tuple[object, ...]):
    """A machine's placed set: ``(job, index, ...)``, in the order the tasks were
    placed, read like a tuple of ``TaskRef`` (each made as it is read)."""

    __slots__ = ()

    def _find(self, job: str, index: int) -> int:
        """The position of the task's pair, or -1 (as ``DesiredSet._find``)."""
        return _find(self, job, index, _named_jobs)

    def __contains__(self, ref: object) -> bool:
        return isinstance(ref, TaskRef) and self._find(ref.job, ref.index) >= 0

    def __len__(self) -> int:
        return tuple.__len__(self) // 2

    def __iter__(self) -> Iterator[TaskRef]:
        raw = tuple.__iter__(self)
        for job in raw:
            yield TaskRef(cast(str, job), cast(int, next(raw)))

    def refs(self) -> list[TaskRef]:
        """The tasks, as a list (a copy: safe to change the set while going through)."""
        return list(self.__iter__())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, tuple):
            return tuple(iter(self)) == tuple(iter(other))
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(iter(self)))

    def __repr__(self) -> str:
        return f"PlacedSet({list(self)!r})"


#: a machine with nothing placed (the default of ``placed.get``)
NOTHING_PLACED = PlacedSet()


def place(placed: dict[int, PlacedSet], machine: int, ref: TaskRef) -> None:
    have = placed.get(machine)
    if not have:
        placed[machine] = PlacedSet((ref.job, ref.index))
    elif have._find(ref.job, ref.index) < 0:
        placed[machine] = PlacedSet((*tuple.__iter__(have), ref.job, ref.index))


def place_all(placed: dict[int, PlacedSet], machine: int, job: str,
              indices: Collection[int]) -> None:
    """``place`` for several tasks of one job on one machine: the set is read and
    rebuilt once."""
    have = placed.get(machine)
    if have and len(indices) <= _FEW:
        for index in indices:
            place(placed, machine, TaskRef(job, index))
        return
    get = tuple.__getitem__
    there = () if not have else {
        i for j, i in zip(get(have, _EVEN), get(have, _ODD), strict=True) if j == job}
    added = [x for index in dict.fromkeys(indices) if index not in there
             for x in (job, index)]
    if added:
        placed[machine] = PlacedSet((*tuple.__iter__(have or ()), *added))


def unplace_all(placed: dict[int, PlacedSet], machine: int, job: str,
                indices: Collection[int]) -> None:
    """``unplace`` for several tasks of one job on one machine: the set is rebuilt
    once."""
    _drop_all(placed, machine, job, indices, unplace, _named_jobs, PlacedSet)


def unplace(placed: dict[int, PlacedSet], machine: int, ref: TaskRef) -> None:
    have = placed.get(machine)
    if not have:
        return
    k = have._find(ref.job, ref.index)
    if k < 0:
        return
    if tuple.__len__(have) > 2:
        cut = tuple.__getitem__
        placed[machine] = PlacedSet(cut(have, slice(None, k)) + cut(have, slice(k + 2, None)))
    else:
        del placed[machine]
