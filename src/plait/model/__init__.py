"""plait's domain model: machines, topology, entitlements, job specs, tasks, events.

Everything here is a value: frozen, validated when built, with errors that name the
field. The columnar ``Fleet`` is the one exception to "an object per thing": a
region has a million machines.
"""

from plait.model.base import Value, build, parse
from plait.model.entitlement import ElasticTerms, Entitlement, Quota
from plait.model.events import EventKind, UnavailabilityEvent
from plait.model.job import Fence, HealthProbe, JobSpec, RestartPolicy, UpdatePolicy
from plait.model.machine import FaultDomain, Machine, MachineState
from plait.model.policy import (
    DEFAULT_POLICY,
    DEFAULT_PREFERENCES,
    SPREAD_DC,
    SPREAD_MSB,
    SPREAD_RACK,
    STACK,
    AllocationPolicy,
    Preference,
    Property,
    Requirements,
    Strategy,
)
from plait.model.resources import Resources
from plait.model.task import Task, TaskRef, TaskState
from plait.model.topology import DEFAULT_TYPES, Fleet, MachineType, RegionSpec, describe, generate

__all__ = [
    "DEFAULT_POLICY",
    "DEFAULT_PREFERENCES",
    "DEFAULT_TYPES",
    "SPREAD_DC",
    "SPREAD_MSB",
    "SPREAD_RACK",
    "STACK",
    "AllocationPolicy",
    "ElasticTerms",
    "Entitlement",
    "EventKind",
    "FaultDomain",
    "Fence",
    "Fleet",
    "HealthProbe",
    "JobSpec",
    "Machine",
    "MachineState",
    "MachineType",
    "Preference",
    "Property",
    "Quota",
    "RegionSpec",
    "Requirements",
    "Resources",
    "RestartPolicy",
    "Strategy",
    "Task",
    "TaskRef",
    "TaskState",
    "UnavailabilityEvent",
    "UpdatePolicy",
    "Value",
    "build",
    "describe",
    "generate",
    "parse",
]
