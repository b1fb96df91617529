"""Resources of a machine or of one task.

CPU is counted in RRU (Relative Resource Units, the paper's machine-independent
compute unit), memory and disk in GB. The allocator's index stores them as integers
(milli-RRU and MB) so that repeated place/free never drifts; ``to_units`` is that
conversion, in one place.
"""

from __future__ import annotations

import pydantic

from plait.model.base import Value

CPU_UNITS_PER_RRU = 1000
MB_PER_GB = 1024
#: the largest amount of one resource (RRU or GB): far beyond any machine (whose units
#: the index holds in 32 bits), yet small enough that a task's units, and the sum over
#: a job's tasks, stay well inside 64-bit integers
MAX_AMOUNT = 1e9


class Resources(Value):
    """An amount of machine resources: CPU in RRU (the paper's normalised resource
    unit), memory and disk in GB."""

    cpu: float = pydantic.Field(ge=0, le=MAX_AMOUNT, description="CPU in RRU")
    #: memory in GB (the task's memory limit where cgroups are available)
    memory_gb: float = pydantic.Field(default=0.0, ge=0, le=MAX_AMOUNT)
    #: disk in GB
    disk_gb: float = pydantic.Field(default=0.0, ge=0, le=MAX_AMOUNT)

    def to_units(self) -> tuple[int, int, int]:
        """(milli-RRU, memory MB, disk MB), the allocator index's integer units."""
        return (
            round(self.cpu * CPU_UNITS_PER_RRU),
            round(self.memory_gb * MB_PER_GB),
            round(self.disk_gb * MB_PER_GB),
        )

    def fits_in(self, other: Resources) -> bool:
        mine, theirs = self.to_units(), other.to_units()
        return all(a <= b for a, b in zip(mine, theirs, strict=True))

    def __str__(self) -> str:
        return f"{self.cpu:g} RRU, {self.memory_gb:g} GB mem, {self.disk_gb:g} GB disk"
