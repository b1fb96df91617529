"""The allocator: hard requirements, soft preferences, optimistic concurrency and a
job-level cache over a columnar index of the region's machines."""

from plait.allocator.allocator import Allocator, EntitlementUsage
from plait.allocator.cache import AllocationCache
from plait.allocator.index import MachineIndex
from plait.allocator.placement import NO_MACHINE, JobState, Plan, propose
from plait.allocator.request import AllocationRequest, AllocationResult, TaskOp

__all__ = [
    "NO_MACHINE",
    "AllocationCache",
    "AllocationRequest",
    "AllocationResult",
    "Allocator",
    "EntitlementUsage",
    "JobState",
    "MachineIndex",
    "Plan",
    "TaskOp",
    "propose",
]
