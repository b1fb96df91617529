"""Resources: integer unit conversion, validation and fit checks."""

from __future__ import annotations

import pytest

from plait.errors import ValidationError
from plait.model import Resources, build, parse
from plait.model.resources import CPU_UNITS_PER_RRU, MB_PER_GB


def test_unit_constants() -> None:
    assert CPU_UNITS_PER_RRU == 1000
    assert MB_PER_GB == 1024


@pytest.mark.parametrize(
    ("cpu", "memory_gb", "disk_gb", "units"),
    [
        (1, 1, 1, (1000, 1024, 1024)),
        (0.5, 1.5, 2, (500, 1536, 2048)),
        (16, 64, 1024, (16000, 65536, 1048576)),
        (0.001, 0.0, 0.0, (1, 0, 0)),
        (2.25, 0.25, 0.125, (2250, 256, 128)),
    ],
)
def test_to_units_converts_rru_to_milli_and_gb_to_mb(
    cpu: float, memory_gb: float, disk_gb: float, units: tuple[int, int, int]
) -> None:
    got = Resources(cpu=cpu, memory_gb=memory_gb, disk_gb=disk_gb).to_units()
    assert got == units
    assert all(type(u) is int for u in got)


def test_to_units_rounds_float_noise_instead_of_truncating() -> None:
    # 0.1 + 0.2 == 0.30000000000000004 and 0.7 * 1000 == 699.999...; truncating would drift
    assert Resources(cpu=0.1 + 0.2).to_units()[0] == 300
    assert Resources(cpu=0.7).to_units()[0] == 700
    assert Resources(cpu=1, memory_gb=0.7).to_units()[1] == round(0.7 * 1024)


def test_memory_and_disk_default_to_zero() -> None:
    r = parse(Resources, {"cpu": 2})
    assert (r.memory_gb, r.disk_gb) == (0.0, 0.0)
    assert r.to_units() == (2000, 0, 0)


@pytest.mark.parametrize("field", ["cpu", "memory_gb", "disk_gb"])
def test_negative_values_rejected_naming_the_field(field: str) -> None:
    data: dict[str, float] = {"cpu": 1.0, "memory_gb": 1.0, "disk_gb": 1.0}
    data[field] = -0.5
    with pytest.raises(ValidationError) as exc:
        parse(Resources, data)
    assert exc.value.field == field
    assert str(exc.value).startswith(f"{field}: ")


def test_cpu_is_required() -> None:
    with pytest.raises(ValidationError) as exc:
        parse(Resources, {"memory_gb": 4})
    assert exc.value.field == "cpu"


def test_unknown_field_rejected() -> None:
    with pytest.raises(ValidationError) as exc:
        parse(Resources, {"cpu": 1, "gpus": 1})
    assert exc.value.field == "gpus"


def test_build_is_parse_for_keywords() -> None:
    assert build(Resources, cpu=1, memory_gb=2) == Resources(cpu=1, memory_gb=2)
    with pytest.raises(ValidationError) as exc:
        build(Resources, cpu=-1)
    assert exc.value.field == "cpu"


def test_resources_are_frozen_and_hashable() -> None:
    r = Resources(cpu=1, memory_gb=2)
    with pytest.raises(Exception):  # noqa: B017 - pydantic raises its own frozen error
        r.cpu = 5  # type: ignore[misc]
    assert hash(r) == hash(Resources(cpu=1.0, memory_gb=2.0))
    assert len({r, Resources(cpu=1, memory_gb=2), Resources(cpu=1, memory_gb=3)}) == 2


def test_fits_in_compares_every_dimension() -> None:
    machine = Resources(cpu=16, memory_gb=64, disk_gb=100)
    assert Resources(cpu=16, memory_gb=64, disk_gb=100).fits_in(machine)
    assert Resources(cpu=1, memory_gb=1).fits_in(machine)
    assert not Resources(cpu=16.001).fits_in(machine)
    assert not Resources(cpu=1, memory_gb=64.5).fits_in(machine)
    assert not Resources(cpu=1, disk_gb=101).fits_in(machine)
