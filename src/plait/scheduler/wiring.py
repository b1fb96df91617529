"""The one place a region's core is wired together: machines, their brokers, the
index over both, the allocator, and the scheduler (or one scheduler per shard over
one shared index).

``plait serve`` (the control plane, with brokers and allocator loaded from the
store), the simulator, the sharded simulator and the test harness all build their
core here, so they run the same parts connected the same way; what differs (a store
behind the brokers and the allocator) is passed in.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from plait.allocator import Allocator, MachineIndex
from plait.broker import Region
from plait.model.topology import Fleet
from plait.scheduler.scheduler import Scheduler, SchedulerConfig

#: makes a region's allocator over its index (``Allocator``, or one loaded from a store)
AllocatorFactory = Callable[[MachineIndex], Allocator]


@dataclass(frozen=True, slots=True)
class Core:
    """A region's core, wired: each part reads the ones before it."""

    fleet: Fleet
    region: Region
    index: MachineIndex
    allocator: Allocator
    scheduler: Scheduler


def wire(fleet: Fleet, config: SchedulerConfig | None = None, now: float = 0.0, *,
         region: Region | None = None, allocator: AllocatorFactory = Allocator) -> Core:
    """The core of a region of ``fleet``: in memory, or over the ``region`` and the
    ``allocator`` a caller loads from its store."""
    brokers = Region(fleet) if region is None else region
    index = MachineIndex(fleet, brokers)
    alloc = allocator(index)
    return Core(fleet, brokers, index, alloc, Scheduler(alloc, config, now))


def wire_shards(fleet: Fleet, shards: int, config: SchedulerConfig | None = None,
                now: float = 0.0) -> tuple[Region, MachineIndex, list[Scheduler]]:
    """A region run by ``shards`` schedulers, each with an allocator of its own over
    the one region-wide index (they claim machines from the same free pool)."""
    region = Region(fleet)
    index = MachineIndex(fleet, region)
    return region, index, [Scheduler(Allocator(index), config, now) for _ in range(shards)]
