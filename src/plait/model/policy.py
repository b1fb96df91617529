"""Allocation policy: hard requirements that rule machines out, and an ordered list
of soft preferences that rank what is left (paper section 2.3).

A soft preference is (machine property that partitions machines into bins) +
(strategy). ``spread`` assigns a job's tasks evenly to the bins; ``stack`` prefers
machines already in the entitlement, best fit, so that whole machines stay free.
The first preference decides; later ones only break its ties.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Annotated

import pydantic

from plait.model.base import Value
from plait.model.resources import Resources

#: a machine type or attribute name: 1 to 64 characters
Name = Annotated[str, pydantic.StringConstraints(min_length=1, max_length=64)]
#: an attribute's value: at most 256 characters
AttributeValue = Annotated[str, pydantic.StringConstraints(max_length=256)]


class Strategy(enum.StrEnum):
    SPREAD = "spread"
    STACK = "stack"


class Property(enum.StrEnum):
    """Machine properties that partition machines into bins."""

    DC = "dc"
    MSB = "msb"
    ROW = "row"
    RACK = "rack"
    TYPE = "type"
    #: each machine is its own bin; only meaningful for ``stack``.
    MACHINE = "machine"


class Preference(Value):
    """A soft preference: spread a job's tasks over the bins of a property, or stack
    them onto the fewest machines."""

    #: spread over the bins of ``property``, or stack onto the fewest machines
    strategy: Strategy
    #: the property whose values are the bins (``machine`` for stack)
    property: Property = Property.MACHINE

    @pydantic.model_validator(mode="after")
    def _check(self) -> Preference:
        if self.strategy is Strategy.SPREAD and self.property is Property.MACHINE:
            raise ValueError(
                "spread needs a property that groups machines (dc, msb, row, rack, type); "
                "to cap tasks per machine use requirements.max_tasks_per_machine"
            )
        if self.strategy is Strategy.STACK and self.property is not Property.MACHINE:
            raise ValueError("stack ranks individual machines; its property must be 'machine'")
        return self

    def __str__(self) -> str:
        if self.strategy is Strategy.STACK:
            return "stack"
        return f"spread({self.property.value})"


SPREAD_DC = Preference(strategy=Strategy.SPREAD, property=Property.DC)
SPREAD_MSB = Preference(strategy=Strategy.SPREAD, property=Property.MSB)
SPREAD_RACK = Preference(strategy=Strategy.SPREAD, property=Property.RACK)
STACK = Preference(strategy=Strategy.STACK)

#: The default policy (paper section 2.2): spread over MSBs (which spreads over the
#: DCs too, as every DC contributes its MSBs as bins), then stack.
DEFAULT_PREFERENCES: tuple[Preference, ...] = (SPREAD_MSB, STACK)


class Requirements(Value):
    """Hard requirements: a machine that fails any one is never chosen."""

    #: allowed machine types (SKUs); empty = any type.
    machine_types: tuple[Name, ...] = pydantic.Field(default=(), max_length=64)
    #: free resources the machine must have besides what the task itself asks for.
    min_free: Resources | None = None
    #: attribute equality: built-in (dc, msb, row, rack, type) or a machine attribute.
    attributes: Mapping[Name, AttributeValue] = pydantic.Field(default_factory=dict,
                                                               max_length=64)
    #: pin to one data center.
    dc: str | None = pydantic.Field(default=None, max_length=64)
    #: at most this many of the job's tasks on one machine (anti-affinity); at most a
    #: job's largest task count.
    max_tasks_per_machine: int | None = pydantic.Field(default=None, ge=1, le=100_000)

    @pydantic.field_validator("attributes")
    @classmethod
    def _no_domains_below_dc(cls, value: Mapping[str, str]) -> Mapping[str, str]:
        for key in ("msb", "row", "rack"):
            if key in value:
                raise ValueError(f"{key}: only dc and type can be required among the "
                                 "fault-domain properties; use spread preferences below a DC")
        return value

    @pydantic.field_validator("dc")
    @classmethod
    def _dc(cls, value: str | None) -> str | None:
        if value is not None and not value:
            raise ValueError("must not be empty")
        return value

    def __hash__(self) -> int:
        return hash(
            (self.machine_types, self.min_free, tuple(sorted(self.attributes.items())), self.dc,
             self.max_tasks_per_machine)
        )


class AllocationPolicy(Value):
    """Where a job's tasks may go (hard requirements) and where they should go (soft
    preferences, in order of importance)."""

    #: what a machine must offer to take one of the job's tasks
    requirements: Requirements = Requirements()
    #: in order of importance; ``None``: the entitlement's default preferences.
    preferences: tuple[Preference, ...] | None = pydantic.Field(default=None, max_length=16)

    @pydantic.field_validator("preferences")
    @classmethod
    def _no_duplicates(cls, prefs: tuple[Preference, ...] | None) -> tuple[Preference, ...] | None:
        if prefs is not None:
            seen = set()
            for p in prefs:
                if p in seen:
                    raise ValueError(f"preference {p} is listed twice")
                seen.add(p)
        return prefs


DEFAULT_POLICY = AllocationPolicy()
