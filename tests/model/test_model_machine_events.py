"""Fault domains, machine values, unavailability events and tasks."""

from __future__ import annotations

import pytest

from plait.errors import ValidationError
from plait.model import (
    EventKind,
    FaultDomain,
    Machine,
    MachineState,
    Resources,
    Task,
    TaskRef,
    TaskState,
    UnavailabilityEvent,
)

# -- FaultDomain ---------------------------------------------------------------------------


def test_fault_domain_parse_and_str_round_trip() -> None:
    fd = FaultDomain.parse("west/dc1/msb2/row3/rack4")
    assert fd == FaultDomain("west", "dc1", "msb2", "row3", "rack4")
    assert (fd.region, fd.dc, fd.msb, fd.row, fd.rack) == ("west", "dc1", "msb2", "row3", "rack4")
    assert str(fd) == "west/dc1/msb2/row3/rack4"
    assert FaultDomain.parse(str(fd)) == fd


@pytest.mark.parametrize(
    "path",
    ["a/b/c", "", "r/dc/msb/row/rack/extra", "r//msb/row/rack", "/dc/msb/row/rack",
     "r/dc/msb/row/", "r/dc/msb/row"],
)
def test_fault_domain_parse_rejects(path: str) -> None:
    with pytest.raises(ValidationError) as exc:
        FaultDomain.parse(path)
    assert exc.value.field == "fault_domain"
    assert repr(path) in exc.value.message


def test_fault_domain_is_hashable_value() -> None:
    a = FaultDomain.parse("r/d/m/w/k")
    assert len({a, FaultDomain("r", "d", "m", "w", "k"), FaultDomain("r", "d", "m", "w", "j")}) == 2


def test_machine_defaults() -> None:
    m = Machine("m1", "skylake", Resources(cpu=16), FaultDomain.parse("r/d/m/w/k"))
    assert m.state is MachineState.HEALTHY
    assert m.entitlement is None
    assert m.host_profile == "default"
    assert dict(m.attributes) == {}


# -- UnavailabilityEvent ------------------------------------------------------------------


def test_failure_without_end_is_valid() -> None:
    ev = UnavailabilityEvent("f1", EventKind.FAILURE, ("m0000001",), start=5.0)
    assert ev.end is None
    assert ev.reason == ""


def test_maintenance_with_end_is_valid() -> None:
    ev = UnavailabilityEvent("mt", EventKind.MAINTENANCE, ("a", "b"), start=1.0, end=2.0,
                             reason="kernel")
    assert ev.machines == ("a", "b")


def test_event_needs_machines() -> None:
    with pytest.raises(ValidationError) as exc:
        UnavailabilityEvent("e", EventKind.FAILURE, (), start=0.0)
    assert exc.value.field == "machines"


def test_maintenance_needs_end() -> None:
    with pytest.raises(ValidationError) as exc:
        UnavailabilityEvent("e", EventKind.MAINTENANCE, ("m",), start=0.0)
    assert exc.value.field == "end"


@pytest.mark.parametrize("kind", list(EventKind))
@pytest.mark.parametrize("end", [10.0, 9.0, -1.0])
def test_end_must_be_after_start(kind: EventKind, end: float) -> None:
    with pytest.raises(ValidationError) as exc:
        UnavailabilityEvent("e", kind, ("m",), start=10.0, end=end)
    assert exc.value.field == "end"


def test_end_just_after_start_ok() -> None:
    ev = UnavailabilityEvent("e", EventKind.MAINTENANCE, ("m",), start=10.0, end=10.5)
    assert ev.end == 10.5


# -- Task ---------------------------------------------------------------------------------


def test_task_ref() -> None:
    t = Task("web", 3, spec_version=1)
    assert t.state is TaskState.PENDING
    assert t.machine is None
    assert t.ref == TaskRef("web", 3)
    assert str(t.ref) == "web/3"
    assert t.ref != TaskRef("web", 4)
