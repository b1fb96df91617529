"""What the last pass published for readers that take no lock: each machine's desired
set as the pass left it, its generation, and the agents' long-polls waiting for one to
change.

``Published`` is their owner. The pass (and a read that found no kept set, under the
region's lock) keeps sets; ``bump`` and ``renumber`` change generations and wake the
long-polls after the change, so no wake-up is lost (``waiters``).
"""

from __future__ import annotations

import time
from typing import Any

from plait.scheduler.records import Assignment, Stops
from plait.server.controlplane.waiters import Waiters

#: (generation, desired set, tasks being stopped there with the request behind it,
#: the host profile it must carry)
Kept = tuple[int, list[Assignment], Stops, dict[str, Any] | None]


class Published:
    def __init__(self) -> None:
        #: per machine: bumped whenever its desired set changes (agents long-poll it),
        #: counted from a base set when this replica starts leading (a generation an
        #: agent got from the previous leader is never taken for the current one)
        self.generation: dict[str, int] = {}
        self.gen_base = 0
        #: per machine: its desired set as the last pass left it; an agent's
        #: long-poll reads it without the lock
        self.desired_view: dict[str, Kept] = {}
        #: the long-polls of desired sets, woken when their machine's set changes
        self.waiters = Waiters()

    def generation_of(self, machine: str) -> int:
        """Changes whenever the machine's desired set may have changed (a plain read)."""
        return self.gen_base + self.generation.get(machine, 0)

    def keep(self, machine: str, kept: Kept) -> None:
        self.desired_view[machine] = kept

    def kept(self, machine: str) -> Kept | None:
        return self.desired_view.get(machine)

    def forget_sets(self) -> None:
        """A rebuild: no set kept (each is read again under the lock)."""
        self.desired_view = {}

    def bump(self, machine: str) -> None:
        """The machine's set changed (or it left this shard): its long-polls answer."""
        self.generation[machine] = self.generation.get(machine, 0) + 1
        self.waiters.notify([machine])

    def renumber(self) -> None:
        """Every machine's generation anew, from a base no earlier leader gave out
        (wall-clock milliseconds); call ``waiters.notify_all`` once the state is ready."""
        self.gen_base = int(time.time() * 1000)
        self.generation.clear()
