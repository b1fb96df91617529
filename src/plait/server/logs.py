"""The tail of each task's output, as its agent sends it.

Agents own the full logs (their files, with rotation); the control plane keeps the
last ``max_bytes`` of each task's output in memory so ``plait task logs`` can show
and follow it from anywhere. Offsets count every byte a task has printed since the
control plane started, so a follower asks for what came after the offset it saw; if
that fell out of the tail, it gets the oldest part still kept and is told so.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass


@dataclass
class _Tail:
    data: bytearray
    #: offset of data[0] in the task's whole output
    start: int
    machine: str


class TaskLogs:
    def __init__(self, max_bytes: int = 64 * 1024, max_tasks: int = 10_000) -> None:
        self.max_bytes = max_bytes
        self.max_tasks = max_tasks
        self._tails: OrderedDict[tuple[str, int], _Tail] = OrderedDict()
        self._lock = threading.Lock()

    def append(self, job: str, index: int, machine: str, text: str) -> None:
        raw = text.encode(errors="replace")
        with self._lock:
            key = (job, index)
            tail = self._tails.get(key)
            if tail is None:
                tail = self._tails[key] = _Tail(bytearray(), 0, machine)
                while len(self._tails) > self.max_tasks:
                    self._tails.popitem(last=False)  # the task heard from longest ago
            else:
                self._tails.move_to_end(key)
            tail.machine = machine
            tail.data += raw
            extra = len(tail.data) - self.max_bytes
            if extra > 0:
                del tail.data[:extra]
                tail.start += extra

    def forget(self, job: str) -> None:
        """Drop every tail of ``job`` (its deletion finished: a job made later under
        the name starts with none)."""
        with self._lock:
            for key in [k for k in self._tails if k[0] == job]:
                del self._tails[key]

    def holds(self, job: str, index: int) -> bool:
        """Is any output of the task kept?"""
        with self._lock:
            return (job, index) in self._tails

    def read(self, job: str, index: int, after: int = 0,
             limit: int = 1 << 20) -> tuple[str, int, bool, str | None]:
        """(text after offset ``after``, the next offset, whether output between
        ``after`` and the text was dropped, the machine that sent it last)."""
        with self._lock:
            tail = self._tails.get((job, index))
            if tail is None:
                return "", after, False, None
            end = tail.start + len(tail.data)
            begin = max(after, tail.start)
            skipped = after < tail.start
            chunk = bytes(tail.data[begin - tail.start: begin - tail.start + limit])
            return chunk.decode(errors="replace"), begin + len(chunk), skipped and after < end, \
                tail.machine
