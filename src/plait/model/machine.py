"""Machines and their place in the fault-domain tree region/dc/msb/row/rack."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from plait.errors import ValidationError
from plait.model.resources import Resources

#: Fault-domain levels, outermost first (paper Figure 5). An MSB (main switchboard)
#: is the largest fault domain inside a data center.
LEVELS = ("region", "dc", "msb", "row", "rack")


class MachineState(enum.StrEnum):
    HEALTHY = "healthy"
    #: a failure event is open on the machine (health check or operator).
    FAILED = "failed"
    #: planned maintenance is in progress on the machine.
    MAINTENANCE = "maintenance"


@dataclass(frozen=True, slots=True)
class FaultDomain:
    region: str
    dc: str
    msb: str
    row: str
    rack: str

    @classmethod
    def parse(cls, path: str) -> FaultDomain:
        """``"region/dc/msb/row/rack"``; every part non-empty."""
        parts = path.split("/")
        if len(parts) != len(LEVELS) or not all(parts):
            raise ValidationError(
                "fault_domain",
                f"expected region/dc/msb/row/rack with 5 non-empty parts, got {path!r}",
            )
        return cls(*parts)

    def __str__(self) -> str:
        return "/".join((self.region, self.dc, self.msb, self.row, self.rack))


@dataclass(frozen=True, slots=True)
class Machine:
    """One server, as the Resource Broker records it (a read-only view)."""

    id: str
    type: str
    resources: Resources
    fault_domain: FaultDomain
    state: MachineState = MachineState.HEALTHY
    host_profile: str = "default"
    entitlement: str | None = None
    attributes: Mapping[str, str] = field(default_factory=dict)
