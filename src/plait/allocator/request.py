"""What the scheduler asks of the allocator, and what it gets back (paper 2.3).

An allocation request names an entitlement, an allocation policy and a per-task map
of which tasks to allocate or free. Requests are declarative and idempotent:
allocating a task that already sits on a good machine keeps it there, so a
scheduler that retries a request gets the same placement back.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from operator import itemgetter, lt

from plait.errors import ValidationError
from plait.model.policy import DEFAULT_POLICY, AllocationPolicy
from plait.model.resources import Resources
from plait.model.topology import Fleet


class TaskOp(enum.StrEnum):
    ALLOCATE = "allocate"
    FREE = "free"


@dataclass(frozen=True, slots=True)
class AllocationRequest:
    job: str
    entitlement: str
    #: per-task resources
    resources: Resources
    #: (task index, operation), sorted by task index, each task at most once
    tasks: tuple[tuple[int, TaskOp], ...]
    policy: AllocationPolicy = DEFAULT_POLICY

    def __post_init__(self) -> None:
        if _well_formed(self.tasks):
            return
        last = -1
        for index, op in self.tasks:
            if index <= last:
                raise ValidationError("tasks", "task indices must be unique and sorted")
            if not isinstance(op, TaskOp):
                raise ValidationError("tasks", f"task {index}: unknown operation {op!r}")
            last = index
        if self.tasks and self.tasks[0][0] < 0:
            raise ValidationError("tasks", "task indices must be >= 0")

    @classmethod
    def of(
        cls, job: str, entitlement: str, resources: Resources, allocate: Iterable[int] = (),
        free: Iterable[int] = (), policy: AllocationPolicy = DEFAULT_POLICY,
    ) -> AllocationRequest:
        ops = dict.fromkeys(allocate, TaskOp.ALLOCATE)
        for index in free:
            if index in ops:
                raise ValidationError("tasks", f"task {index} is both allocated and freed")
            ops[index] = TaskOp.FREE
        return cls(job, entitlement, resources, tuple(sorted(ops.items())), policy)


def _well_formed(tasks: tuple[tuple[int, TaskOp], ...]) -> bool:
    """The checks of ``AllocationRequest.__post_init__`` with loops in C, for the
    usual valid request; False sends it through the loop that names the problem."""
    if not tasks:
        return True
    try:
        indices = list(map(itemgetter(0), tasks))
        return (indices[0] >= 0 and all(map(lt, indices, indices[1:]))
                and set(map(type, map(itemgetter(1), tasks))) == {TaskOp})
    except TypeError:
        return False


@dataclass(frozen=True, slots=True)
class AllocationResult:
    """Placement of a request's tasks. Machines are region-wide indices; use
    ``placements`` for machine ids."""

    job: str
    entitlement: str
    #: allocated tasks of the request and their machines, in task order
    tasks: tuple[int, ...]
    machines: tuple[int, ...]
    #: tasks that could not be placed, with the reason ("does not fit" is a result)
    unplaced: tuple[tuple[int, str], ...] = ()
    freed: tuple[int, ...] = ()
    #: tasks that were on a machine they can no longer use and were placed again
    moved: tuple[int, ...] = ()
    #: machines added to the entitlement from the free pool, and returned to it
    claimed: tuple[int, ...] = ()
    released: tuple[int, ...] = ()
    cached: bool = False
    attempts: int = 1
    fleet: Fleet | None = field(default=None, compare=False, repr=False)

    @property
    def complete(self) -> bool:
        return not self.unplaced

    @property
    def placements(self) -> Mapping[int, str]:
        names = self.fleet.names(self.machines) if self.fleet else [str(m) for m in self.machines]
        return dict(zip(self.tasks, names, strict=True))

    def machine_ids(self, machines: Iterable[int]) -> list[str]:
        return self.fleet.names(machines) if self.fleet else [str(m) for m in machines]
