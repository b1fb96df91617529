"""Agents' long-polls of their desired sets, woken when a set changes.

A long-poll (``GET /v1/machines/{m}/desired?since=G&wait=S``) waits on an
``asyncio.Event`` of its own, registered under its machine before it reads the
generation; whatever bumps a machine's generation (the pass, on the pass thread; a
machine leaving the shard; a reload or a takeover, which renumber every machine)
bumps it first and then calls ``notify`` (or ``notify_all``), which sets the events
of that machine's waiting polls on their own event loops
(``loop.call_soon_threadsafe``). A poll therefore either reads the new generation
or is woken after it was bumped: no wake-up is lost, and nothing runs while no set
changes (a waiting poll costs no timer).

::

    long-poll (event loop)            pass (its thread)
    ----------------------            -----------------
    add(machine) -> event             keep the set, bump the generation
    generation == since?  --yes-->    notify(machines)
    await event (at most wait)   <--  loop.call_soon_threadsafe(event.set)
    read the generation again
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterable, Iterator


class Waiters:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: per machine, the events of the polls waiting for it (with their loops)
        self._waiting: dict[str, dict[asyncio.Event, asyncio.AbstractEventLoop]] = {}
        #: the API is stopping: polls answer at once (a stop waits for none of them)
        self.closed = False

    @contextlib.contextmanager
    def waiting(self, machine: str) -> Iterator[asyncio.Event]:
        """An event set when ``machine``'s desired set may have changed, for as long
        as the block runs (call it on the event loop that awaits the event, before
        reading the generation)."""
        event = asyncio.Event()
        loop = asyncio.get_running_loop()
        with self._lock:
            self._waiting.setdefault(machine, {})[event] = loop
        try:
            yield event
        finally:
            with self._lock:
                polls = self._waiting.get(machine)
                if polls is not None:
                    polls.pop(event, None)
                    if not polls:
                        del self._waiting[machine]

    def notify(self, machines: Iterable[str]) -> int:
        """Wake the polls waiting for these machines (after their generations were
        bumped); from any thread. Returns how many were woken."""
        if not self._waiting:  # (a plain read: nobody waits, nothing to do)
            return 0
        with self._lock:
            woken = [(event, loop) for m in machines
                     for event, loop in self._waiting.get(m, {}).items()]
        return self._wake(woken)

    def notify_all(self) -> int:
        """Wake every waiting poll (every generation was renumbered)."""
        with self._lock:
            woken = [(event, loop) for polls in self._waiting.values()
                     for event, loop in polls.items()]
        return self._wake(woken)

    def close(self) -> None:
        """The API is stopping: every waiting poll is answered now, and later ones at
        once (from any thread, but not from a signal handler: it takes a lock)."""
        self.closed = True
        self.notify_all()

    def count(self) -> int:
        """The polls waiting now."""
        with self._lock:
            return sum(len(polls) for polls in self._waiting.values())

    @staticmethod
    def _wake(woken: list[tuple[asyncio.Event, asyncio.AbstractEventLoop]]) -> int:
        for event, loop in woken:
            with contextlib.suppress(RuntimeError):  # (its loop has closed: gone anyway)
                loop.call_soon_threadsafe(event.set)
        return len(woken)
