"""Allocation policy values, quotas and entitlements."""

from __future__ import annotations

from typing import Any

import pytest

from plait.errors import ValidationError
from plait.model import (
    DEFAULT_PREFERENCES,
    SPREAD_DC,
    SPREAD_MSB,
    SPREAD_RACK,
    STACK,
    AllocationPolicy,
    Entitlement,
    Preference,
    Property,
    Quota,
    Requirements,
    Resources,
    Strategy,
    parse,
)


def entitlement(**over: Any) -> dict[str, Any]:
    return {"name": "ads.prod", "owner": "ads-team", "quota": {"machines": 10}, **over}


# -- Quota -----------------------------------------------------------------------------


def test_quota_machines_only() -> None:
    q = parse(Quota, {"machines": 5})
    assert (q.machines, q.rru) == (5, None)
    assert str(q) == "5 machines"


def test_quota_rru_only() -> None:
    q = parse(Quota, {"rru": 12.5})
    assert (q.machines, q.rru) == (None, 12.5)
    assert str(q) == "12.5 RRU"


def test_quota_zero_machines_allowed() -> None:
    assert parse(Quota, {"machines": 0}).machines == 0


@pytest.mark.parametrize("quota", [{}, {"machines": 1, "rru": 2.0}, {"machines": None}])
def test_quota_needs_exactly_one_inside_entitlement(quota: dict[str, Any]) -> None:
    with pytest.raises(ValidationError) as exc:
        parse(Entitlement, entitlement(quota=quota))
    assert exc.value.field == "quota"
    assert "exactly one" in exc.value.message


def test_quota_negative_names_nested_field() -> None:
    with pytest.raises(ValidationError) as exc:
        parse(Entitlement, entitlement(quota={"rru": -1}))
    assert exc.value.field == "quota.rru"


# -- Entitlement -------------------------------------------------------------------------


def test_entitlement_defaults() -> None:
    e = parse(Entitlement, entitlement())
    assert e.default_preferences == (
        Preference(strategy=Strategy.SPREAD, property=Property.MSB),
        Preference(strategy=Strategy.STACK, property=Property.MACHINE),
    )
    assert e.default_preferences == DEFAULT_PREFERENCES == (SPREAD_MSB, STACK)
    assert e.pin_dc is None
    assert e.host_profile == "default"
    assert e.quota == Quota(machines=10)


def test_entitlement_missing_quota() -> None:
    data = entitlement()
    del data["quota"]
    with pytest.raises(ValidationError) as exc:
        parse(Entitlement, data)
    assert exc.value.field == "quota"


@pytest.mark.parametrize("field", ["name", "owner"])
def test_entitlement_names_checked(field: str) -> None:
    with pytest.raises(ValidationError) as exc:
        parse(Entitlement, entitlement(**{field: "Not Valid"}))
    assert exc.value.field == field


def test_entitlement_bad_default_preference_path() -> None:
    data = entitlement(default_preferences=[{"strategy": "stack", "property": "rack"}])
    with pytest.raises(ValidationError) as exc:
        parse(Entitlement, data)
    assert exc.value.field == "default_preferences[0]"


# -- Preference --------------------------------------------------------------------------


def test_spread_machine_rejected() -> None:
    with pytest.raises(ValidationError) as exc:
        parse(Preference, {"strategy": "spread", "property": "machine"})
    assert "spread" in exc.value.message


def test_spread_defaults_to_machine_and_is_therefore_rejected() -> None:
    with pytest.raises(ValidationError):
        parse(Preference, {"strategy": "spread"})


@pytest.mark.parametrize("prop", ["dc", "msb", "row", "rack", "type"])
def test_stack_with_a_grouping_property_rejected(prop: str) -> None:
    with pytest.raises(ValidationError) as exc:
        parse(Preference, {"strategy": "stack", "property": prop})
    assert "stack" in exc.value.message


@pytest.mark.parametrize("prop", ["dc", "msb", "row", "rack", "type"])
def test_spread_with_a_grouping_property_accepted(prop: str) -> None:
    p = parse(Preference, {"strategy": "spread", "property": prop})
    assert p.property is Property(prop)
    assert str(p) == f"spread({prop})"


def test_stack_accepted_and_printed() -> None:
    p = parse(Preference, {"strategy": "stack"})
    assert p == STACK
    assert str(p) == "stack"


def test_unknown_strategy_rejected() -> None:
    with pytest.raises(ValidationError) as exc:
        parse(Preference, {"strategy": "pack"})
    assert exc.value.field == "strategy"


def test_constants() -> None:
    assert (SPREAD_DC.strategy, SPREAD_DC.property) == (Strategy.SPREAD, Property.DC)
    assert (SPREAD_RACK.strategy, SPREAD_RACK.property) == (Strategy.SPREAD, Property.RACK)


# -- AllocationPolicy ---------------------------------------------------------------------


def test_duplicate_preferences_rejected() -> None:
    data = {
        "preferences": [
            {"strategy": "spread", "property": "msb"},
            {"strategy": "stack"},
            {"strategy": "spread", "property": "msb"},
        ]
    }
    with pytest.raises(ValidationError) as exc:
        parse(AllocationPolicy, data)
    assert exc.value.field == "preferences"
    assert "twice" in exc.value.message


def test_distinct_preferences_kept_in_order() -> None:
    data = {"preferences": [{"strategy": "spread", "property": "dc"},
                            {"strategy": "spread", "property": "rack"}, {"strategy": "stack"}]}
    assert parse(AllocationPolicy, data).preferences == (SPREAD_DC, SPREAD_RACK, STACK)


def test_empty_preference_list_is_not_none() -> None:
    assert parse(AllocationPolicy, {"preferences": []}).preferences == ()
    assert parse(AllocationPolicy, {}).preferences is None


# -- Requirements -------------------------------------------------------------------------


def test_requirements_hashable_and_equal_hash_equal() -> None:
    a = Requirements(
        machine_types=("skylake",), min_free=Resources(cpu=1),
        attributes={"zone": "a", "tier": "gold"}, dc="dc1", max_tasks_per_machine=2,
    )
    b = parse(Requirements, {
        "machine_types": ["skylake"], "min_free": {"cpu": 1.0},
        "attributes": {"tier": "gold", "zone": "a"}, "dc": "dc1", "max_tasks_per_machine": 2,
    })
    assert a == b
    assert hash(a) == hash(b)
    cache = {a: "placed"}
    assert cache[b] == "placed"


@pytest.mark.parametrize(
    "change",
    [
        {"machine_types": ("cooperlake",)},
        {"min_free": Resources(cpu=2)},
        {"attributes": {"zone": "b"}},
        {"dc": "dc2"},
        {"max_tasks_per_machine": 3},
    ],
)
def test_different_requirements_are_different_keys(change: dict[str, Any]) -> None:
    base: dict[str, Any] = {"machine_types": ("skylake",), "min_free": Resources(cpu=1),
                            "attributes": {"zone": "a"}, "dc": "dc1",
                            "max_tasks_per_machine": 2}
    a = Requirements(**base)
    b = Requirements(**{**base, **change})
    assert a != b
    assert len({a, b}) == 2


def test_policies_with_equal_requirements_share_a_cache_key() -> None:
    p1 = AllocationPolicy(requirements=Requirements(attributes={"x": "1", "y": "2"}),
                          preferences=(SPREAD_MSB, STACK))
    p2 = parse(AllocationPolicy, {"requirements": {"attributes": {"y": "2", "x": "1"}},
                                  "preferences": [{"strategy": "spread", "property": "msb"},
                                                  {"strategy": "stack"}]})
    assert p1 == p2
    assert hash(p1) == hash(p2)
    assert {p1: 1}[p2] == 1


def test_max_tasks_per_machine_at_least_one() -> None:
    with pytest.raises(ValidationError) as exc:
        parse(Requirements, {"max_tasks_per_machine": 0})
    assert exc.value.field == "max_tasks_per_machine"


def test_canary_host_profiles_are_names_listed_once_and_not_a_canary_entitlements():
    import pytest

    from plait.errors import ValidationError
    from plait.model import Entitlement, parse

    base = {"name": "e", "owner": "o", "quota": {"machines": 2}}
    ent = parse(Entitlement, {**base, "canary_host_profiles": ["tuned", "big"]})
    assert ent.may_canary("tuned") and ent.may_canary("default")  # (its own profile)
    assert not ent.may_canary("other")
    assert not parse(Entitlement, base).may_canary("tuned")  # none unless listed
    for bad, said in ((["tuned", "tuned"], "listed twice"), (["Bad Name"], "valid name"),
                      (["x"] * 65, "at most 64")):
        with pytest.raises(ValidationError, match=said):
            parse(Entitlement, {**base, "canary_host_profiles": bad})
    with pytest.raises(ValidationError, match="runs no canary of its own"):
        parse(Entitlement, {**base, "canary_of": "p", "canary_host_profiles": ["tuned"]})
