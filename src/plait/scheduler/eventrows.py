"""The scheduler's events, kept as plain rows until someone reads them.

A pass can raise thousands of events (a 15,000-task update starts 1,500 operations,
each with its ``op_started`` event); a frozen ``SchedulerEvent`` of eleven fields
costs more to make than the rest of starting its operation. The pass appends a
tuple of the event's fields instead (the machine as its index, an operation's
message left to be made), and each row becomes
a ``SchedulerEvent`` the first time it is read: by a test, the simulator's summary;
the shell that drains them after a pass takes their fields without making one
(``take``). Reading is the list's (iteration,
indexing, slicing, ``len``); so is emptying it (``events[:] = []``, ``del
events[:n]``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, MutableSequence
from typing import overload

from plait.scheduler.records import SchedulerEvent


class TaskMessage(str):
    """A task event's message without its "task {task}: " prefix, added when its row
    is read: a region's shards hold hundreds of thousands of task events between
    drains, a few distinct messages among them, so a row shares its message (one per
    distinct text, ``SchedulerState.task_event``) rather than holding a string of its
    own."""

    __slots__ = ()


#: a ``SchedulerEvent``'s fields in order, the machine as its region-wide index:
#: (time, job, kind, message, task, machine, op, reason, decision, actor, request);
#: a task's event may leave its message to be made when read: None for "task {task}:
#: {op} ({reason})", as an operation's start reads, or a ``TaskMessage`` for "task
#: {task}: {message}"
Row = tuple[float, str, str, str | None, int | None, int | None, str | None, str | None,
            str | None, str | None, str | None]
#: a ``SchedulerEvent``'s fields as ``EventRows.take`` gives them: the machine by its
#: name, the message made
Fields = tuple[float, str, str, str, int | None, str | None, str | None, str | None,
               str | None, str | None, str | None]


class EventRows(MutableSequence[SchedulerEvent]):
    """A list of ``SchedulerEvent`` whose entries may still be rows (``add``)."""

    __slots__ = ("_name", "rows")

    def __init__(self, name: Callable[[int], str]) -> None:
        #: the entries: events, or rows not read yet (the pass appends to it directly)
        self.rows: list[SchedulerEvent | Row] = []
        #: a machine's name, from its index
        self._name = name

    def add(self, row: Row) -> None:
        self.rows.append(row)

    def take(self) -> list[Fields]:
        """Every entry's fields, in order (a ``SchedulerEvent``'s, the machine by its
        name, the message made), and the list emptied: what the shell drains after a
        pass, without the events made (``_event``)."""
        out = [self._fields(entry) for entry in self.rows]
        self.rows.clear()
        return out

    def _fields(self, entry: SchedulerEvent | Row) -> Fields:
        if type(entry) is not tuple:
            e: SchedulerEvent = entry  # type: ignore[assignment]
            return (e.time, e.job, e.kind, e.message, e.task, e.machine, e.op, e.reason,
                    e.decision, e.actor, e.request)
        (at, job, kind, message, task, machine, op, reason, decision, actor,
         request) = entry
        if message is None:
            message = f"task {task}: {op} ({reason})"
        elif type(message) is TaskMessage:
            message = f"task {task}: {message}"
        return (at, job, kind, message, task, None if machine is None else self._name(machine),
                op, reason, decision, actor, request)

    def _event(self, k: int) -> SchedulerEvent:
        """Entry ``k`` as an event, made from its row (once) if it still is one."""
        entry = self.rows[k]
        if type(entry) is not tuple:
            return entry  # type: ignore[return-value]
        event = SchedulerEvent(*self._fields(entry))
        self.rows[k] = event
        return event

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self) -> Iterator[SchedulerEvent]:
        k = 0
        while k < len(self.rows):
            yield self._event(k)
            k += 1

    @overload
    def __getitem__(self, index: int) -> SchedulerEvent: ...

    @overload
    def __getitem__(self, index: slice) -> list[SchedulerEvent]: ...

    def __getitem__(self, index: int | slice) -> SchedulerEvent | list[SchedulerEvent]:
        if isinstance(index, slice):
            return [self._event(k) for k in range(len(self.rows))[index]]
        return self._event(range(len(self.rows))[index])

    @overload
    def __setitem__(self, index: int, value: SchedulerEvent) -> None: ...

    @overload
    def __setitem__(self, index: slice, value: Iterable[SchedulerEvent]) -> None: ...

    def __setitem__(self, index: int | slice,
                    value: SchedulerEvent | Iterable[SchedulerEvent]) -> None:
        if isinstance(index, slice):
            assert not isinstance(value, SchedulerEvent)
            self.rows[index] = list(value)
        else:
            assert isinstance(value, SchedulerEvent)
            self.rows[index] = value

    def __delitem__(self, index: int | slice) -> None:
        del self.rows[index]

    def insert(self, index: int, value: SchedulerEvent) -> None:
        self.rows.insert(index, value)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, EventRows | list):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"EventRows({list(self)!r})"
