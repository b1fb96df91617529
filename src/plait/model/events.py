"""Unavailability events: failures and planned maintenance of machines."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

from plait.errors import ValidationError


class EventKind(enum.StrEnum):
    #: a machine failed; open until it is ended (the machine is healthy again).
    FAILURE = "failure"
    #: planned maintenance from ``start`` to ``end``, announced ahead of ``start``.
    MAINTENANCE = "maintenance"


#: the id prefix of the maintenance event that revokes a machine's loan (its start is
#: the revoke's deadline; the scheduler's loans stage carries it out)
LOAN_REVOKE_PREFIX = "loan-revoke-"
#: the same for a host-profile roll's drain of a busy machine
PROFILE_ROLL_PREFIX = "profile-roll-"
#: the same for an operator's drain of a machine (``plait machine drain``), carried
#: out by the scheduler's maintenance stage
MACHINE_DRAIN_PREFIX = "drain-"
#: events that drain a machine out of its entitlement: at their start what still
#: runs there is moved elsewhere, not parked until the window ends
DRAIN_PREFIXES = (LOAN_REVOKE_PREFIX, PROFILE_ROLL_PREFIX, MACHINE_DRAIN_PREFIX)


@dataclass(frozen=True, slots=True)
class UnavailabilityEvent:
    id: str
    kind: EventKind
    machines: tuple[str, ...]
    start: float
    #: when the machines are expected back; ``None`` for a failure with no known end.
    end: float | None = None
    reason: str = ""

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "kind", EventKind(self.kind))
        except ValueError:
            raise ValidationError("kind", f"unknown event kind {self.kind!r}") from None
        if isinstance(self.machines, str) or not all(isinstance(m, str) for m in self.machines):
            raise ValidationError("machines", "a list of machine ids")
        object.__setattr__(self, "machines", tuple(self.machines))
        for name in ("start", "end"):
            value = getattr(self, name)
            if value is not None and not math.isfinite(value):
                raise ValidationError(name, f"must be a finite time, got {value!r}")
        if not self.machines:
            raise ValidationError("machines", "an event must name at least one machine")
        if self.kind is EventKind.MAINTENANCE and self.end is None:
            raise ValidationError("end", "maintenance needs an end time")
        if self.end is not None and self.end <= self.start:
            raise ValidationError("end", f"end ({self.end}) must be after start ({self.start})")
