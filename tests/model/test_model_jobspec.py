"""JobSpec parsing (errors name the dotted field path) and UpdatePolicy."""

from __future__ import annotations

from typing import Any

import pytest

from plait.errors import ValidationError
from plait.model import (
    DEFAULT_POLICY,
    AllocationPolicy,
    JobSpec,
    Resources,
    UpdatePolicy,
    parse,
)


def valid() -> dict[str, Any]:
    return {
        "name": "web-frontend",
        "entitlement": "ads.prod",
        "task_count": 12,
        "resources": {"cpu": 2, "memory_gb": 4},
        "command": "/usr/bin/web",
        "args": ["--port", "8080"],
        "env": {"LOG_LEVEL": "info", "_X1": "y"},
        "update": {"max_unavailable": "10%"},
    }


def error_of(data: Any) -> ValidationError:
    with pytest.raises(ValidationError) as exc:
        parse(JobSpec, data)
    return exc.value


def test_valid_spec() -> None:
    spec = parse(JobSpec, valid())
    assert spec.name == "web-frontend"
    assert spec.entitlement == "ads.prod"
    assert spec.task_count == 12
    assert spec.resources == Resources(cpu=2, memory_gb=4)
    assert spec.args == ("--port", "8080")
    assert dict(spec.env) == {"LOG_LEVEL": "info", "_X1": "y"}
    assert spec.update.max_unavailable == "10%"
    assert spec.update.resolve(spec.task_count) == 1
    assert spec.policy == DEFAULT_POLICY
    assert spec.policy.preferences is None


def test_defaults_for_optional_fields() -> None:
    data = valid()
    for key in ("args", "env", "update"):
        del data[key]
    spec = parse(JobSpec, data)
    assert spec.args == ()
    assert dict(spec.env) == {}
    assert spec.update == UpdatePolicy(max_unavailable=1)
    assert spec.policy == AllocationPolicy()


def test_zero_tasks_allowed() -> None:
    assert parse(JobSpec, {**valid(), "task_count": 0}).task_count == 0


def test_equal_specs_hash_equal_whatever_the_env_order() -> None:
    a = parse(JobSpec, {**valid(), "env": {"A": "1", "B": "2"}})
    b = parse(JobSpec, {**valid(), "env": {"B": "2", "A": "1"}})
    c = parse(JobSpec, {**valid(), "env": {"A": "1", "B": "3"}})
    assert a == b
    assert hash(a) == hash(b)
    assert a != c
    assert len({a, b, c}) == 2


def test_missing_command() -> None:
    data = valid()
    del data["command"]
    assert error_of(data).field == "command"


def test_empty_command() -> None:
    assert error_of({**valid(), "command": ""}).field == "command"


@pytest.mark.parametrize("count", [-1, -100, 100_001])
def test_task_count_out_of_range(count: int) -> None:
    assert error_of({**valid(), "task_count": count}).field == "task_count"


def test_zero_cpu_rejected_and_message_mentions_cpu() -> None:
    err = error_of({**valid(), "resources": {"cpu": 0, "memory_gb": 4}})
    assert err.field in ("resources", "resources.cpu")
    assert "cpu" in err.message


def test_negative_cpu_names_nested_field() -> None:
    err = error_of({**valid(), "resources": {"cpu": -1}})
    assert err.field == "resources.cpu"


def test_negative_memory_names_nested_field() -> None:
    err = error_of({**valid(), "resources": {"cpu": 1, "memory_gb": -1}})
    assert err.field == "resources.memory_gb"


def test_unknown_extra_field_rejected() -> None:
    err = error_of({**valid(), "priority": 5})
    assert err.field == "priority"


def test_unknown_nested_field_rejected() -> None:
    err = error_of({**valid(), "resources": {"cpu": 1, "gpu": 1}})
    assert err.field == "resources.gpu"


@pytest.mark.parametrize("key", ["1ABC", "A-B", "A B", "", "É", "PATH\n"])
def test_bad_env_var_name(key: str) -> None:
    err = error_of({**valid(), "env": {"GOOD": "1", key: "x"}})
    assert err.field == "env"
    assert repr(key) in err.message


@pytest.mark.parametrize(
    "name", ["Web", "web!", "-web", "web-", "", "a" * 65, "web frontend", "web/1", "web\n",
             "web\r\n"]
)
def test_bad_name(name: str) -> None:
    err = error_of({**valid(), "name": name})
    assert err.field == "name"


@pytest.mark.parametrize("name", ["a", "a" * 64, "web.v2_x-1", "0"])
def test_good_names(name: str) -> None:
    assert parse(JobSpec, {**valid(), "name": name}).name == name


def test_bad_entitlement_name() -> None:
    assert error_of({**valid(), "entitlement": "Ads"}).field == "entitlement"


@pytest.mark.parametrize("value", ["abc", 0, -3, "0%", "101%", "10", "%", "ten%", "-5%"])
def test_bad_max_unavailable(value: object) -> None:
    err = error_of({**valid(), "update": {"max_unavailable": value}})
    assert err.field == "update.max_unavailable"


def test_bad_preference_names_index_in_path() -> None:
    data = {
        **valid(),
        "policy": {
            "preferences": [
                {"strategy": "spread", "property": "msb"},
                {"strategy": "spread", "property": "machine"},
            ]
        },
    }
    err = error_of(data)
    assert err.field == "policy.preferences[1]"


def test_bad_requirement_names_nested_path() -> None:
    data = {**valid(), "policy": {"requirements": {"max_tasks_per_machine": 0}}}
    assert error_of(data).field == "policy.requirements.max_tasks_per_machine"


@pytest.mark.parametrize("data", [[], "job", None, 3, [("name", "x")]])
def test_non_dict_input_rejected(data: object) -> None:
    err = error_of(data)
    assert err.field == ""
    assert "JobSpec" in err.message
    assert "object" in err.message


# -- UpdatePolicy.resolve -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "task_count", "expected"),
    [
        (3, 100, 3),
        (3, 1, 3),
        (1, 0, 1),
        ("10%", 36, 3),
        ("10%", 5, 1),
        ("10%", 0, 1),
        ("100%", 7, 7),
        ("2.5%", 100, 2),
        ("50%", 9, 4),
        ("33.3%", 1000, 333),
        ("29%", 100, 29),
    ],
)
def test_resolve(value: int | str, task_count: int, expected: int) -> None:
    policy = parse(UpdatePolicy, {"max_unavailable": value})
    assert policy.resolve(task_count) == expected


def test_resolve_is_exact_for_every_whole_percentage_of_100() -> None:
    # p% of 100 tasks is exactly p tasks; float rounding must not lose one
    for pct in range(1, 101):
        policy = UpdatePolicy(max_unavailable=f"{pct}%")
        assert policy.resolve(100) == pct, pct


def test_percentage_whitespace_is_stripped() -> None:
    policy = parse(UpdatePolicy, {"max_unavailable": " 20% "})
    assert policy.max_unavailable == "20%"
    assert policy.resolve(10) == 2


def test_update_policy_default_is_one() -> None:
    assert UpdatePolicy().max_unavailable == 1
    assert UpdatePolicy().resolve(1000) == 1


def test_health_probes_and_restart_policies_are_checked():
    import pytest as _pytest

    from plait.errors import ValidationError as _Invalid
    from plait.model import JobSpec as _Spec
    from plait.model import parse as _parse

    base = {"name": "j", "entitlement": "e", "task_count": 1,
            "resources": {"cpu": 1, "memory_gb": 1}, "command": "x"}
    ok = _parse(_Spec, {**base, "health": {"http": "/healthz"},
                        "restart": {"policy": "on-failure", "max_retries": 2}})
    assert ok.restart.batch and ok.health is not None and ok.health.http == "/healthz"
    for bad, field in (({"http": "/a\nb"}, "health"), ({"http": "x"}, "health"),
                       ({"command": ["sh", "a\x00b"]}, "health"),
                       ({"http": "/", "command": ["true"]}, "health"), ({}, "health")):
        with _pytest.raises(_Invalid) as exc:
            _parse(_Spec, {**base, "health": bad})
        assert field in str(exc.value)
    with _pytest.raises(_Invalid):
        _parse(_Spec, {**base, "restart": {"policy": "sometimes"}})


def test_restart_after_is_the_one_restart_policy_of_both_agents():
    from plait.model.job import MAX_RESTART_BACKOFF, RestartPolicy, restart_after

    assert [restart_after("always", 3, 1, n) for n in range(7)] == [
        1, 2, 4, 8, 16, MAX_RESTART_BACKOFF, MAX_RESTART_BACKOFF]
    assert restart_after("always", 0, 0, 99) == MAX_RESTART_BACKOFF  # a service always
    assert restart_after("never", 3, 1, 0) is None
    assert restart_after("on-failure", 3, 0, 0) is None  # exited 0: done
    assert restart_after("on-failure", 2, 1, 1) == 2 and restart_after("on-failure", 2, 1, 2) \
        is None  # out of retries
    assert RestartPolicy(policy="on-failure", max_retries=1).after_exit(1, 0) == 1


def test_converge_stops_what_left_restarts_new_revisions_and_starts_the_rest():
    from plait.model.converge import converge

    plan = converge({"a": 1, "b": 1, "c": 2}, {"b": 2, "c": 2, "d": 1})
    assert plan.remove == ("a",) and plan.replace == ("b",) and plan.add == ("d",)
    assert converge({}, {}) == converge({"x": 1}, {"x": 1}).__class__((), (), ())
