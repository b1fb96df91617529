"""Fleet topology: the generator, the columnar table, views and explicit fleets."""

from __future__ import annotations

import numpy as np
import pytest

from plait.errors import NotFound, ValidationError
from plait.model import (
    DEFAULT_TYPES,
    FaultDomain,
    Fleet,
    Machine,
    MachineState,
    MachineType,
    RegionSpec,
    Resources,
    describe,
    generate,
    parse,
)
from plait.model.topology import DOMAIN_LEVELS

SMALL = RegionSpec(dcs=2, msbs_per_dc=2, rows_per_msb=1, racks_per_row=2, machines_per_rack=3)


def small() -> Fleet:
    return generate(SMALL)


def check_parents(fleet: Fleet) -> None:
    """Every machine's rack -> row -> msb -> dc chain ends at the machine's own dc."""
    rack = fleet.codes["rack"]
    row = fleet.parent["rack"][rack]
    msb = fleet.parent["row"][row]
    dc = fleet.parent["msb"][msb]
    np.testing.assert_array_equal(row, fleet.codes["row"])
    np.testing.assert_array_equal(msb, fleet.codes["msb"])
    np.testing.assert_array_equal(dc, fleet.codes["dc"])
    for lvl in DOMAIN_LEVELS:
        assert fleet.parent[lvl].shape == (len(fleet.level_names[lvl]),)
    np.testing.assert_array_equal(fleet.parent["dc"], 0)
    # names are paths: a child's name starts with its parent's name
    for child, parent in (("msb", "dc"), ("row", "msb"), ("rack", "row")):
        for code, name in enumerate(fleet.level_names[child]):
            parent_name = fleet.level_names[parent][int(fleet.parent[child][code])]
            assert name.startswith(parent_name + "/")


# -- generate ------------------------------------------------------------------------------


def test_small_fleet_counts() -> None:
    fleet = small()
    assert SMALL.racks == 8
    assert SMALL.machine_count == 24
    assert len(fleet) == 24
    assert fleet.region == "region1"
    for arr in (fleet.cpu, fleet.memory, fleet.disk, fleet.type_code, fleet.profile_code,
                *fleet.codes.values()):
        assert arr.shape == (24,)
    assert [len(fleet.level_names[lvl]) for lvl in DOMAIN_LEVELS] == [2, 4, 4, 8]
    assert fleet.level_names["dc"] == ["dc1", "dc2"]
    assert fleet.level_names["msb"] == ["dc1/msb1", "dc1/msb2", "dc2/msb1", "dc2/msb2"]
    assert fleet.level_names["rack"][0] == "dc1/msb1/row1/rack1"
    assert fleet.level_names["rack"][-1] == "dc2/msb2/row1/rack2"
    # machines_per_rack machines in every rack, in order
    np.testing.assert_array_equal(np.bincount(fleet.codes["rack"]), [3] * 8)
    np.testing.assert_array_equal(np.bincount(fleet.codes["dc"]), [12, 12])
    check_parents(fleet)


@pytest.mark.parametrize(
    "spec",
    [
        RegionSpec(dcs=3, msbs_per_dc=4, rows_per_msb=2, racks_per_row=3, machines_per_rack=5),
        RegionSpec(dcs=1, msbs_per_dc=1, rows_per_msb=1, racks_per_row=1, machines_per_rack=1),
        RegionSpec(dcs=2, msbs_per_dc=12, rows_per_msb=3, racks_per_row=11, machines_per_rack=2),
    ],
)
def test_per_level_code_counts(spec: RegionSpec) -> None:
    fleet = generate(spec)
    n_msb = spec.dcs * spec.msbs_per_dc
    n_row = n_msb * spec.rows_per_msb
    n_rack = n_row * spec.racks_per_row
    assert len(fleet) == spec.machine_count == n_rack * spec.machines_per_rack
    expected = {"dc": spec.dcs, "msb": n_msb, "row": n_row, "rack": n_rack}
    for lvl, count in expected.items():
        assert len(fleet.level_names[lvl]) == count
        assert len(set(fleet.level_names[lvl])) == count
        # every domain has machines when no explicit count is given
        assert np.unique(fleet.codes[lvl]).size == count
    check_parents(fleet)


def test_exact_machine_count_dealt_evenly() -> None:
    spec = RegionSpec(dcs=2, msbs_per_dc=3, rows_per_msb=2, racks_per_row=4, machines=1003)
    assert spec.machine_count == 1003
    fleet = generate(spec)
    assert len(fleet) == 1003
    per_msb = np.bincount(fleet.codes["msb"], minlength=6)
    assert per_msb.sum() == 1003
    assert per_msb.max() - per_msb.min() <= 1
    per_rack = np.bincount(fleet.codes["rack"], minlength=spec.racks)
    assert per_rack.max() - per_rack.min() <= 1
    assert len(fleet.level_names["msb"]) == 6
    check_parents(fleet)


@pytest.mark.parametrize("machines", [1, 5, 7, 13, 47, 48, 49, 997])
def test_any_machine_count_is_exact_and_even_over_msbs(machines: int) -> None:
    spec = RegionSpec(dcs=2, msbs_per_dc=4, rows_per_msb=2, racks_per_row=3, machines=machines)
    fleet = generate(spec)
    assert len(fleet) == machines
    per_msb = np.bincount(fleet.codes["msb"], minlength=8)
    assert per_msb.max() - per_msb.min() <= 1
    # level tables stay complete even if some racks are empty
    assert len(fleet.level_names["rack"]) == spec.racks
    check_parents(fleet)


def test_machines_ordered_by_rack() -> None:
    fleet = generate(RegionSpec(dcs=2, msbs_per_dc=2, machines=101))
    assert np.all(np.diff(fleet.codes["rack"]) >= 0)
    assert np.all(np.diff(fleet.codes["dc"]) >= 0)


def test_types_follow_weights_and_racks_are_homogeneous() -> None:
    big = MachineType(name="big", resources=Resources(cpu=64, memory_gb=256), weight=3)
    little = MachineType(name="little", resources=Resources(cpu=8, memory_gb=32), weight=1)
    spec = RegionSpec(dcs=2, msbs_per_dc=10, rows_per_msb=4, racks_per_row=5,
                      machines_per_rack=2, types=(big, little))
    fleet = generate(spec, seed=7)
    assert fleet.type_names == ["big", "little"]
    rack = fleet.codes["rack"]
    # one type per rack
    for r in range(spec.racks):
        assert np.unique(fleet.type_code[rack == r]).size == 1
    # 400 racks drawn 3:1
    rack_types = np.array([fleet.type_code[rack == r][0] for r in range(spec.racks)])
    share_big = float(np.mean(rack_types == 0))
    assert 0.65 < share_big < 0.85
    # resources follow the type
    is_big = fleet.type_code == 0
    assert np.all(fleet.cpu[is_big] == 64000)
    assert np.all(fleet.memory[is_big] == 256 * 1024)
    assert np.all(fleet.cpu[~is_big] == 8000)
    assert np.all(fleet.memory[~is_big] == 32 * 1024)
    assert fleet.cpu.dtype == np.int32


def test_negligible_weight_type_never_drawn() -> None:
    only = MachineType(name="only", resources=Resources(cpu=4))
    rare = MachineType(name="rare", resources=Resources(cpu=2), weight=1e-12)
    fleet = generate(RegionSpec(types=(only, rare)), seed=3)
    assert np.all(fleet.type_code == 0)


def test_deterministic_for_a_seed() -> None:
    spec = RegionSpec(dcs=2, msbs_per_dc=6, rows_per_msb=2, racks_per_row=4, machines=500)
    a, b = generate(spec, seed=11), generate(spec, seed=11)
    c = generate(spec, seed=12)
    np.testing.assert_array_equal(a.type_code, b.type_code)
    np.testing.assert_array_equal(a.cpu, b.cpu)
    for lvl in DOMAIN_LEVELS:
        np.testing.assert_array_equal(a.codes[lvl], b.codes[lvl])
    assert a.level_names == b.level_names
    # 96 racks: another seed draws another type mix
    assert not np.array_equal(a.type_code, c.type_code)
    # topology does not depend on the seed
    np.testing.assert_array_equal(a.codes["rack"], c.codes["rack"])


def test_sized_region() -> None:
    spec = RegionSpec.sized(machines=10000, dcs=5, msbs_per_dc=12)
    assert spec.machine_count == 10000
    fleet = generate(spec)
    assert len(fleet) == 10000
    assert len(fleet.level_names["dc"]) == 5
    assert len(fleet.level_names["msb"]) == 60
    per_msb = np.bincount(fleet.codes["msb"], minlength=60)
    assert per_msb.max() - per_msb.min() <= 1
    check_parents(fleet)


def test_sized_passes_other_fields_through() -> None:
    spec = RegionSpec.sized(machines=500, dcs=2, msbs_per_dc=2, name="east",
                            rows_per_msb=1, racks_per_row=3)
    assert (spec.name, spec.rows_per_msb, spec.racks_per_row) == ("east", 1, 3)
    assert len(generate(spec)) == 500


def test_region_spec_validation() -> None:
    with pytest.raises(ValidationError) as exc:
        parse(RegionSpec, {"dcs": 0})
    assert exc.value.field == "dcs"
    with pytest.raises(ValidationError) as exc:
        parse(RegionSpec, {"types": []})
    assert exc.value.field == "types"
    dup = {"name": "x", "resources": {"cpu": 1}}
    with pytest.raises(ValidationError) as exc:
        parse(RegionSpec, {"types": [dup, dup]})
    assert exc.value.field == "types"
    with pytest.raises(ValidationError) as exc:
        parse(RegionSpec, {"machines": 0})
    assert exc.value.field == "machines"


# -- ids and views -------------------------------------------------------------------------


def test_generated_ids_round_trip() -> None:
    fleet = small()
    assert fleet.name(0) == "m0000000"
    assert fleet.name(23) == "m0000023"
    assert fleet.names([3, 1]) == ["m0000003", "m0000001"]
    for i in range(len(fleet)):
        assert fleet.index_of(fleet.name(i)) == i


@pytest.mark.parametrize("bad", ["m0000024", "m9999999", "m123", "x0000001", "", "m000001a",
                                 "M0000001", " m0000001"])
def test_unknown_generated_ids_not_found(bad: str) -> None:
    fleet = small()
    with pytest.raises(NotFound) as exc:
        fleet.index_of(bad)
    assert exc.value.kind == "machine"
    assert exc.value.name == bad


def test_non_canonical_generated_id_is_not_an_alias() -> None:
    # "m00000001" is not the id of any machine (machine 1 is "m0000001")
    fleet = small()
    with pytest.raises(NotFound):
        fleet.index_of("m00000001")


def test_machine_view() -> None:
    fleet = small()
    # machine 13 is in rack 4 (= dc2/msb1/row1/rack1), the 2nd machine of that rack
    m = fleet.machine(13)
    assert m.id == "m0000013"
    assert m.type == fleet.type_names[int(fleet.type_code[13])]
    assert m.type in {t.name for t in DEFAULT_TYPES}
    assert m.resources == Resources(cpu=16, memory_gb=64, disk_gb=1024)
    assert m.fault_domain == FaultDomain("region1", "dc2", "msb1", "row1", "rack1")
    assert m.state is MachineState.HEALTHY
    assert m.entitlement is None
    assert m.host_profile == "default"
    assert dict(m.attributes) == {}
    m2 = fleet.machine(0, state=MachineState.FAILED, entitlement="ads", host_profile="web")
    assert (m2.state, m2.entitlement, m2.host_profile) == (MachineState.FAILED, "ads", "web")
    assert m2.fault_domain == FaultDomain.parse("region1/dc1/msb1/row1/rack1")


def test_level_code_lookup() -> None:
    fleet = small()
    assert fleet.dc_code("dc2") == 1
    assert fleet.level_code("msb", "dc2/msb2") == 3
    with pytest.raises(NotFound):
        fleet.dc_code("dc3")
    with pytest.raises(NotFound):
        fleet.level_code("msb", "msb1")


def test_describe() -> None:
    fleet = small()
    d = describe(fleet)
    assert d["region"] == "region1"
    assert d["machines"] == 24
    assert (d["dcs"], d["msbs"], d["rows"], d["racks"]) == (2, 4, 4, 8)
    types = d["types"]
    assert isinstance(types, dict)
    assert set(types) == {"skylake", "cooperlake"}
    assert sum(types.values()) == 24
    assert all(v % 3 == 0 for v in types.values())  # whole racks of 3
    assert types["skylake"] == int(np.sum(fleet.type_code == 0))
    assert d["rru"] == 24 * 16.0


# -- from_machines -------------------------------------------------------------------------


def explicit() -> list[Machine]:
    return [
        Machine("alpha", "big", Resources(cpu=32, memory_gb=128, disk_gb=10),
                FaultDomain.parse("west/dcA/msb1/row1/rack1"), host_profile="web",
                attributes={"zone": "z1", "gpu": "a100"}),
        Machine("beta", "small", Resources(cpu=1.5, memory_gb=2.5),
                FaultDomain.parse("west/dcA/msb1/row1/rack2")),
        Machine("gamma", "big", Resources(cpu=32, memory_gb=128, disk_gb=10),
                FaultDomain.parse("west/dcB/msb1/row1/rack1"), attributes={"zone": "z2"}),
        Machine("delta", "small", Resources(cpu=2),
                FaultDomain.parse("west/dcA/msb2/row1/rack1"), attributes={"zone": "z1"}),
    ]


def test_from_machines_keeps_ids_and_views() -> None:
    machines = explicit()
    fleet = Fleet.from_machines(machines)
    assert len(fleet) == 4
    assert fleet.region == "west"
    assert [fleet.name(i) for i in range(4)] == ["alpha", "beta", "gamma", "delta"]
    assert fleet.names([2, 0]) == ["gamma", "alpha"]
    for i, m in enumerate(machines):
        assert fleet.index_of(m.id) == i
        view = fleet.machine(i)
        assert view.id == m.id
        assert view.type == m.type
        assert view.resources == m.resources
        assert view.fault_domain == m.fault_domain
        assert view.host_profile == m.host_profile
        assert dict(view.attributes) == dict(m.attributes)
    with pytest.raises(NotFound):
        fleet.index_of("m0000000")
    with pytest.raises(NotFound):
        fleet.index_of("epsilon")


def test_from_machines_fault_domain_codes() -> None:
    fleet = Fleet.from_machines(explicit())
    assert fleet.level_names["dc"] == ["dcA", "dcB"]
    # msb1 of dcA and msb1 of dcB are different MSBs
    assert fleet.level_names["msb"] == ["dcA/msb1", "dcB/msb1", "dcA/msb2"]
    np.testing.assert_array_equal(fleet.codes["dc"], [0, 0, 1, 0])
    np.testing.assert_array_equal(fleet.codes["msb"], [0, 0, 1, 2])
    np.testing.assert_array_equal(fleet.codes["rack"], [0, 1, 2, 3])
    assert len(fleet.level_names["row"]) == 3
    check_parents(fleet)
    assert fleet.type_names == ["big", "small"]
    np.testing.assert_array_equal(fleet.type_code, [0, 1, 0, 1])
    np.testing.assert_array_equal(fleet.cpu, [32000, 1500, 32000, 2000])
    np.testing.assert_array_equal(fleet.memory, [131072, 2560, 131072, 0])
    d = describe(fleet)
    assert d["types"] == {"big": 2, "small": 2}
    assert d["rru"] == 67.5
    assert (d["dcs"], d["msbs"], d["rows"], d["racks"]) == (2, 3, 3, 4)


def test_from_machines_attributes() -> None:
    fleet = Fleet.from_machines(explicit())
    assert set(fleet.attributes) == {"zone", "gpu"}
    zone_codes, zone_names = fleet.attributes["zone"]
    assert [None if c < 0 else zone_names[c] for c in zone_codes.tolist()] == [
        "z1", None, "z2", "z1"]
    gpu_codes, gpu_names = fleet.attributes["gpu"]
    assert [None if c < 0 else gpu_names[c] for c in gpu_codes.tolist()] == [
        "a100", None, None, None]
    assert dict(fleet.machine(1).attributes) == {}
    assert dict(fleet.machine(2).attributes) == {"zone": "z2"}


def test_from_machines_rejects_duplicate_ids() -> None:
    machines = explicit()
    machines.append(Machine("beta", "big", Resources(cpu=1),
                            FaultDomain.parse("west/dcA/msb1/row1/rack1")))
    with pytest.raises(ValidationError) as exc:
        Fleet.from_machines(machines)
    assert exc.value.field == "machines"
    assert "unique" in exc.value.message


def test_from_machines_rejects_two_regions() -> None:
    machines = explicit()
    machines.append(Machine("omega", "big", Resources(cpu=1),
                            FaultDomain.parse("east/dcA/msb1/row1/rack1")))
    with pytest.raises(ValidationError) as exc:
        Fleet.from_machines(machines)
    assert exc.value.field == "machines"
    assert "east" in exc.value.message and "west" in exc.value.message


def test_from_machines_rejects_empty() -> None:
    with pytest.raises(ValidationError) as exc:
        Fleet.from_machines([])
    assert exc.value.field == "machines"


def test_from_machines_rejects_resources_beyond_index_range() -> None:
    huge = Machine("h", "huge", Resources(cpu=3_000_000),
                   FaultDomain.parse("r/d/m/w/k"))
    with pytest.raises(ValidationError) as exc:
        Fleet.from_machines([huge])
    assert exc.value.field == "resources"
