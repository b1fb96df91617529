"""Per-task maps of a job, one array slot per task index.

The allocator keeps, per job, each task's machine, the units it holds and the
entitlement its machine was taken in. As three dicts keyed by task index they cost
about 120 bytes per task (a region holds two million tasks); a job's task indices
are dense (0 to its count), so here each map is an array with one slot per index:

* ``MachineMap``: the machine's index itself (4 bytes a task);
* ``CodedMap``: a code into the map's own small table of distinct values (2 bytes a
  task: a job's tasks hold one or two distinct unit triples and entitlements).

Both read and write like the dicts they replace, except that they iterate in task
order (not in order of insertion).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator, Mapping, MutableMapping
from typing import Generic, TypeVar

V = TypeVar("V")

_ABSENT = -1


class _Slots(MutableMapping[int, V], Generic[V]):
    """One array slot per task index (``_ABSENT`` where a task has no entry)."""

    __slots__ = ("_len", "_slots")

    def __init__(self, typecode: str) -> None:
        self._slots = array(typecode)
        self._len = 0

    def _decode(self, code: int) -> V:
        raise NotImplementedError

    def _encode(self, value: V) -> int:
        raise NotImplementedError

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, task: int) -> V:
        slots = self._slots
        if 0 <= task < len(slots):
            code = slots[task]
            if code != _ABSENT:
                return self._decode(code)
        raise KeyError(task)

    def __contains__(self, task: object) -> bool:
        slots = self._slots
        return isinstance(task, int) and 0 <= task < len(slots) and slots[task] != _ABSENT

    def _grow(self, top: int) -> None:
        """Room for task indices up to ``top``."""
        slots = self._slots
        if top >= len(slots):
            slots.extend(array(slots.typecode, (_ABSENT,)) * (top + 1 - len(slots)))

    def __setitem__(self, task: int, value: V) -> None:
        if task < 0:
            raise KeyError(task)
        self._grow(task)
        slots = self._slots
        if slots[task] == _ABSENT:
            self._len += 1
        slots[task] = self._encode(value)

    def __delitem__(self, task: int) -> None:
        slots = self._slots
        if not (0 <= task < len(slots)) or slots[task] == _ABSENT:
            raise KeyError(task)
        slots[task] = _ABSENT
        self._len -= 1
        if task == len(slots) - 1:  # (trailing free slots are given back)
            end = task
            while end and slots[end - 1] == _ABSENT:
                end -= 1
            del slots[end:]

    def __iter__(self) -> Iterator[int]:
        return iter([t for t, code in enumerate(self._slots) if code != _ABSENT])

    def update(self, other: Iterable[tuple[int, V]] | Mapping[int, V] = (),  # type: ignore[override]
               **kwargs: V) -> None:
        pairs = list(other.items() if isinstance(other, Mapping) else other)
        if not pairs:
            return
        tasks = [t for t, _ in pairs]
        if min(tasks) < 0:
            raise KeyError(min(tasks))
        self._grow(max(tasks))
        slots, encode, added = self._slots, self._encode, 0
        for task, value in pairs:
            if slots[task] == _ABSENT:
                added += 1
            slots[task] = encode(value)
        self._len += added

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Mapping):
            return dict(self.items()) == dict(other.items())
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({dict(self.items())!r})"


class MachineMap(_Slots[int]):
    """Task index -> machine index (non-negative ints), 4 bytes a task."""

    __slots__ = ()

    def __init__(self, items: Iterable[tuple[int, int]] = ()) -> None:
        super().__init__("i")
        if items:
            self.update(items)

    def _decode(self, code: int) -> int:
        return code

    def _encode(self, value: int) -> int:
        if value < 0:
            raise ValueError(f"a machine index is >= 0, not {value}")
        return value

    def get(self, task: int, default: int | None = None) -> int | None:  # type: ignore[override]
        slots = self._slots
        if 0 <= task < len(slots):
            m = slots[task]
            if m != _ABSENT:
                return m
        return default

    def values(self) -> list[int]:  # type: ignore[override]
        return [m for m in self._slots if m != _ABSENT]

    def items(self) -> list[tuple[int, int]]:  # type: ignore[override]
        return [(t, m) for t, m in enumerate(self._slots) if m != _ABSENT]


class CodedMap(_Slots[V]):
    """Task index -> one of a few distinct values (hashable), 2 bytes a task."""

    __slots__ = ("_table",)

    def __init__(self, items: Iterable[tuple[int, V]] = ()) -> None:
        super().__init__("h")
        #: the distinct values, a code's at its position (a job's few: looked up by
        #: a scan, not a dict per job)
        self._table: list[V] = []
        if items:
            self.update(items)

    def _decode(self, code: int) -> V:
        return self._table[code]

    def _encode(self, value: V) -> int:
        table = self._table
        for code, have in enumerate(table):
            if have == value:
                return code
        table.append(value)
        return len(table) - 1

    def values(self) -> list[V]:  # type: ignore[override]
        table = self._table
        return [table[c] for c in self._slots if c != _ABSENT]

    def items(self) -> list[tuple[int, V]]:  # type: ignore[override]
        table = self._table
        return [(t, table[c]) for t, c in enumerate(self._slots) if c != _ABSENT]

    def fill(self, tasks: Iterable[int], value: V) -> None:
        """Set every task of ``tasks`` to ``value`` (one look-up of its code)."""
        tasks = list(tasks)
        if not tasks:
            return
        if min(tasks) < 0:
            raise KeyError(min(tasks))
        self._grow(max(tasks))
        code, slots, added = self._encode(value), self._slots, 0
        for task in tasks:
            if slots[task] == _ABSENT:
                added += 1
            slots[task] = code
        self._len += added
