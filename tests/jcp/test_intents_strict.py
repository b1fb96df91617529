"""A push's stages are whole numbers as JSON writes them: ``"50"`` and ``true`` are
refused (pydantic's lax mode read them as 50 and 1), in the model, the API and the
CLI's ``--stages``."""

from __future__ import annotations

import pytest

from plait.cli.client import CliError
from plait.cli.push import _stages
from plait.errors import ValidationError
from plait.jcp.intents import PushIntent
from plait.model.base import parse

SPEC = {"name": "web", "entitlement": "e", "task_count": 2, "command": "serve",
        "resources": {"cpu": 1, "memory_gb": 1}}


@pytest.mark.parametrize("stages", [["50"], [True], [50, "100"], [10.0], [False, 100]])
def test_stages_that_are_not_integers_are_refused(stages: list[object]) -> None:
    with pytest.raises(ValidationError) as caught:
        parse(PushIntent, {"spec": SPEC, "stages": stages})
    assert caught.value.field.startswith("stages"), caught.value


def test_integer_stages_are_taken() -> None:
    assert parse(PushIntent, {"spec": SPEC, "stages": [10, 50, 100]}).stages == (10, 50, 100)


@pytest.mark.parametrize("text", ["+50", "5_0", "٥٠", "50,x", "1e2", "-5"])
def test_the_cli_takes_only_ascii_digits(text: str) -> None:
    with pytest.raises(CliError) as caught:
        _stages(text)
    assert "--stages" in caught.value.message


def test_the_cli_reads_percentages() -> None:
    assert _stages(" 10, 50 ,100") == [10, 50, 100]
