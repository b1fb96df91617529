"""The job-level allocation cache (paper section 2.3).

Machine selection is the costly part of an allocation, and most requests repeat
one already served (a scheduler retrying, a reconcile pass re-asserting the same
placement). The cache keeps, per job, the last complete request and its result.
An entry is used only if the request is identical and no machine hosting the
job's tasks changed since (each machine's generation in the index), so a hit is
always a placement the allocator would keep anyway.

The cache holds a request per job: in a full region that is every task of every
job, two million (task, operation) pairs. The copy it keeps shares its pairs with
the other entries' (one tuple per distinct pair), so a kept task costs a reference
rather than a tuple of its own. The result is kept as one array of 32-bit rows
(tasks, machines, and each machine's generation when stored: 12 bytes a task, one
object per entry) and made into an ``AllocationResult`` again on a hit; keeping the
result object, its two tuples and two arrays cost about 16 bytes a task more and a
few hundred bytes a job (a region holds seventy thousand entries).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from plait.allocator.request import AllocationRequest, AllocationResult, TaskOp
from plait.model.topology import Fleet

#: distinct (task, operation) pairs shared at most (task indices are below a job's
#: task count, so a region's jobs seldom need more than a few tens of thousands)
SHARED_PAIRS = 1 << 18


@dataclass(slots=True)
class _Entry:
    request: AllocationRequest
    #: rows: the result's tasks, their machines, the machines' generations when stored
    rows: npt.NDArray[np.uint32]
    fleet: Fleet | None


class AllocationCache:
    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}
        self._pairs: dict[tuple[int, TaskOp], tuple[int, TaskOp]] = {}
        self.hits = 0
        self.misses = 0

    def lookup(self, request: AllocationRequest,
               gen: npt.NDArray[np.uint32]) -> AllocationResult | None:
        entry = self._entries.get(request.job)
        if entry is not None and entry.request == request:
            tasks, machines, gens = entry.rows
            if np.array_equal(gen[machines], gens):
                self.hits += 1
                # a repeat does nothing new: it reports the placement, not the claims
                return AllocationResult(request.job, request.entitlement,
                                        tuple(tasks.tolist()), tuple(machines.tolist()),
                                        cached=True, attempts=0, fleet=entry.fleet)
        self.misses += 1
        return None

    def store(self, request: AllocationRequest, result: AllocationResult,
              gen: npt.NDArray[np.uint32]) -> None:
        n = len(result.machines)
        rows = np.empty((3, n), np.uint32)
        rows[0] = np.fromiter(result.tasks, np.uint32, n)
        rows[1] = np.fromiter(result.machines, np.uint32, n)
        rows[2] = gen[rows[1]]
        pairs = self._pairs
        if len(pairs) + len(request.tasks) <= SHARED_PAIRS:
            tasks = tuple(map(pairs.setdefault, request.tasks, request.tasks))
            request = AllocationRequest(request.job, request.entitlement, request.resources,
                                        tasks, request.policy)
        self._entries[request.job] = _Entry(request, rows, result.fleet)

    def drop(self, job: str) -> None:
        self._entries.pop(job, None)

    def clear(self) -> None:
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def hit_ratio(self) -> float:
        total = self.hits + self.misses
        return self.hits / total if total else 0.0
