"""The job-level allocation cache (paper section 2.3).

Machine selection is the costly part of an allocation, and most requests repeat
one already served (a scheduler retrying, a reconcile pass re-asserting the same
placement). The cache keeps, per job, the last complete request and its result.
An entry is used only if the request is identical and no machine hosting the
job's tasks changed since (each machine's generation in the index), so a hit is
always a placement the allocator would keep anyway.

The cache holds a request per job: in a full region that is every task of every
job, two million (task, operation) pairs, and a result per job. An entry keeps
both in one array of 32-bit numbers: the result's tasks, their machines and the
machines' generations when it was stored, then the request's tasks, each as ``2 *
index`` (allocate) or ``2 * index + 1`` (free); 16 bytes a task and one object
per entry (with the request's other fields, shared with the job's other requests).
A request is compared with it in that form, and a hit's ``AllocationResult`` made
from it. Keeping the request and result objects themselves, their tuples and two
arrays cost about 20 bytes a task and 500 a job more (a region holds seventy
thousand entries).
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import itemgetter

import numpy as np
import numpy.typing as npt

from plait.allocator.request import AllocationRequest, AllocationResult, TaskOp
from plait.model.policy import AllocationPolicy
from plait.model.resources import Resources
from plait.model.topology import Fleet

_is_free = TaskOp.FREE.__eq__
#: an entry of at most this many tasks placed and asked is made from one list
_FEW = 16


def _asked(tasks: tuple[tuple[int, TaskOp], ...]) -> npt.NDArray[np.uint32]:
    """A request's (index, operation) pairs as an entry keeps them."""
    n = len(tasks)
    index = np.fromiter(map(itemgetter(0), tasks), np.uint32, n)
    free = np.fromiter(map(_is_free, map(itemgetter(1), tasks)), np.uint32, n)
    return index * np.uint32(2) + free


@dataclass(slots=True)
class _Entry:
    entitlement: str
    resources: Resources
    policy: AllocationPolicy
    fleet: Fleet | None
    #: how many tasks the result placed (the first three runs of ``data``)
    placed: int
    #: the result's tasks, their machines, the machines' generations when stored,
    #: then the request's tasks (``_asked``)
    data: npt.NDArray[np.uint32]


class AllocationCache:
    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}
        self.hits = 0
        self.misses = 0

    def lookup(self, request: AllocationRequest,
               gen: npt.NDArray[np.uint32]) -> AllocationResult | None:
        entry = self._entries.get(request.job)
        if (entry is not None and entry.entitlement == request.entitlement
                and entry.resources == request.resources and entry.policy == request.policy
                and entry.data.size - 3 * entry.placed == len(request.tasks)):
            n, data = entry.placed, entry.data
            machines = data[n:2 * n]
            if (np.array_equal(gen[machines], data[2 * n:3 * n])
                    and np.array_equal(data[3 * n:], _asked(request.tasks))):
                self.hits += 1
                # a repeat does nothing new: it reports the placement, not the claims
                return AllocationResult(request.job, request.entitlement,
                                        tuple(data[:n].tolist()), tuple(machines.tolist()),
                                        cached=True, attempts=0, fleet=entry.fleet)
        self.misses += 1
        return None

    def store(self, request: AllocationRequest, result: AllocationResult,
              gen: npt.NDArray[np.uint32]) -> None:
        n = len(result.machines)
        if n + len(request.tasks) <= _FEW:  # (most jobs: one task; one list, one array)
            data = np.array([*result.tasks, *result.machines,
                             *[gen[m] for m in result.machines],
                             *[2 * t + (op is TaskOp.FREE) for t, op in request.tasks]],
                            np.uint32)
        else:
            data = np.empty(3 * n + len(request.tasks), np.uint32)
            data[:n] = np.fromiter(result.tasks, np.uint32, n)
            data[n:2 * n] = np.fromiter(result.machines, np.uint32, n)
            data[2 * n:3 * n] = gen[data[n:2 * n]]
            data[3 * n:] = _asked(request.tasks)
        self._entries[request.job] = _Entry(request.entitlement, request.resources,
                                            request.policy, result.fleet, n, data)

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
