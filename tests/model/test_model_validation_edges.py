"""Edge cases of validation: every refusal names its field."""

import math

import pytest

from plait.errors import ValidationError
from plait.model import Entitlement, EventKind, JobSpec, UnavailabilityEvent, parse

BASE = {"name": "web", "entitlement": "e", "task_count": 1, "command": "x",
        "resources": {"cpu": 1}}


@pytest.mark.parametrize("patch, field", [
    ({"resources": {"cpu": "inf"}}, "resources.cpu"),
    ({"resources": {"cpu": math.nan}}, "resources.cpu"),
    ({"resources": {"cpu": 1e-9}}, "resources"),
    ({"update": {"max_unavailable": 1.5}}, "update.max_unavailable"),
    ({"update": {"max_unavailable": True}}, "update.max_unavailable"),
    ({"policy": {"requirements": {"dc": ""}}}, "policy.requirements.dc"),
    # a number field takes a number: not true (YAML's yes), nor a string of one
    ({"task_count": True}, "task_count"),
    ({"task_count": "3"}, "task_count"),
    ({"resources": {"cpu": 1, "memory_gb": "1"}}, "resources.memory_gb"),
    ({"resources": {"cpu": False}}, "resources.cpu"),
])
def test_job_spec_refusals_name_the_field(patch, field):
    with pytest.raises(ValidationError) as err:
        parse(JobSpec, {**BASE, **patch})
    assert err.value.field == field


def test_entitlement_refuses_empty_pins_and_duplicate_preferences():
    base = {"name": "e", "owner": "o", "quota": {"machines": 1}}
    for patch, field in (({"pin_dc": ""}, "pin_dc"), ({"host_profile": ""}, "host_profile"),
                         ({"quota": {"machines": True}}, "quota.machines"),
                         ({"default_preferences": [{"strategy": "stack"},
                                                   {"strategy": "stack"}]},
                          "default_preferences")):
        with pytest.raises(ValidationError) as err:
            parse(Entitlement, {**base, **patch})
        assert err.value.field == field


def test_event_kind_given_as_a_string_is_coerced_or_refused():
    ev = UnavailabilityEvent("x", "failure", ("a",), 0)  # type: ignore[arg-type]
    assert ev.kind is EventKind.FAILURE
    with pytest.raises(ValidationError) as err:
        UnavailabilityEvent("x", "reboot", ("a",), 0)  # type: ignore[arg-type]
    assert err.value.field == "kind"
    with pytest.raises(ValidationError) as err:
        UnavailabilityEvent("x", EventKind.FAILURE, "ab", 0)  # type: ignore[arg-type]
    assert err.value.field == "machines"
    with pytest.raises(ValidationError) as err:
        UnavailabilityEvent("x", EventKind.FAILURE, ("a",), math.nan)
    assert err.value.field == "start"


def test_a_spec_files_exponent_numbers_are_numbers():
    # YAML 1.1 (PyYAML) reads 1e3 as a string, which a number field refuses
    from plait.cli.specfile import parse_yaml

    (doc,) = parse_yaml("name: web\nentitlement: e\ntask_count: 1\ncommand: x\n"
                        "resources: {cpu: 1, memory_gb: 5e-1, disk_gb: 1e3}\n", "web.yaml")
    spec = parse(JobSpec, doc)
    assert (spec.resources.memory_gb, spec.resources.disk_gb) == (0.5, 1000.0)
    (quoted,) = parse_yaml('name: x\nsize: "1e3"\n', "x.yaml")
    assert quoted["size"] == "1e3"  # (a quoted one stays a string)
