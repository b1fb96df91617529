"""The create-cost benchmark's figures (behaviour, not speed): every create of every
batch size is stored, every job placed and run, and the figures are CPU per create,
per batch and per job, with the pass's stages named."""

import json

import pytest
from typer.testing import CliRunner

from plait.bench import createcost
from plait.cli.main import app
from plait.errors import ValidationError


def test_figures_per_batch_size_and_per_job():
    figures = createcost.run(machines=50, jobs=40, batches=(1, 8), pass_batch=10)
    per_create = figures["request_cpu_ms_per_create"]
    assert set(per_create) == {"1", "8"} and all(v > 0 for v in per_create.values())
    # the two sizes split a create's cost into the batch's share and its own
    # (cost(b) = per_batch / b + per_item, exactly, at both sizes)
    per_batch, per_item = figures["request_cpu_ms_per_batch"], figures["request_cpu_ms_per_item"]
    for b in (1, 8):
        assert per_batch / b + per_item == pytest.approx(per_create[str(b)], abs=1e-3)
    assert figures["pass_cpu_ms_per_job"] > 0
    stages = figures["pass_stages_ms_per_job"]
    assert {"placement", "save", "flush_events"} <= set(stages)
    assert list(stages.values()) == sorted(stages.values(), reverse=True)
    assert figures["params"]["jobs"] == 40 and figures["params"]["batches"] == [1, 8]


def test_a_single_batch_size_has_no_split():
    figures = createcost.run(machines=20, jobs=12, batches=(4,), pass_batch=12)
    assert figures["request_cpu_ms_per_batch"] is None
    assert figures["request_cpu_ms_per_item"] is None
    assert figures["request_cpu_ms_per_create"]["4"] > 0


@pytest.mark.parametrize("kwargs, field", [({"jobs": 8, "batches": (16,)}, "jobs"),
                                           ({"batches": (0,)}, "batches"),
                                           ({"batches": ()}, "batches"),
                                           ({"pass_batch": 0}, "pass_batch")])
def test_bad_parameters_are_refused_by_name(kwargs, field):
    with pytest.raises(ValidationError) as refused:
        createcost.run(machines=10, **{"jobs": 20, **kwargs})
    assert refused.value.field == field


def test_cli_prints_one_json_object():
    res = CliRunner().invoke(app, ["bench", "createcost", "--machines", "20", "--jobs", "12",
                                   "--batch", "2", "--batch", "4", "--pass-batch", "6"])
    assert res.exit_code == 0, res.output
    figures = json.loads(res.stdout)
    assert set(figures["request_cpu_ms_per_create"]) == {"2", "4"}
    assert figures["pass_cpu_ms_per_job"] > 0
