"""The throughput benchmark's figures (behaviour, not speed): a real `plait serve`, and
the same behind `plait frontend`, under a small closed-loop load from client
processes."""

import json

import pytest
from typer.testing import CliRunner

from plait.bench import throughput
from plait.cli.main import app

KEYS = {"acks_per_s", "placed_per_s", "p50_ms", "p99_ms", "errors"}


@pytest.mark.parametrize("frontend", [False, True])
def test_every_create_is_acknowledged_and_placed(frontend):
    figures = throughput.run(machines=100, jobs=100, clients=2, frontend=frontend)
    assert set(figures) >= KEYS
    assert figures["errors"] == 0, figures["error_kinds"]
    assert figures["placed"] == figures["jobs"] == 100
    assert figures["acks_per_s"] > 0 and figures["placed_per_s"] > 0
    # placement follows the acknowledgement: never reported before it
    assert figures["placed_s"] >= figures["placed_by_event_s"] > 0
    assert 0 < figures["p50_ms"] <= figures["p99_ms"] <= figures["max_ms"]
    assert figures["params"]["frontend"] is frontend and figures["params"]["clients"] == 2
    assert (figures["frontend_cpu_ms_per_create"] is not None) is frontend
    assert figures["server_cpu_ms_per_create"] > 0
    assert figures["server_stopped_by"] == "sigterm"
    assert figures["server_log"] == []  # no warning, no traceback


def test_cli_prints_one_json_object():
    res = CliRunner().invoke(app, ["bench", "throughput", "--machines", "50", "--jobs", "20",
                                   "--clients", "2"])
    assert res.exit_code == 0, res.output
    figures = json.loads(res.stdout)
    assert set(figures) >= KEYS and figures["errors"] == 0 and figures["placed"] == 20


def test_the_serves_pass_gap_is_a_parameter():
    # (the passes a second apart: what the front door takes with the pass nearly idle)
    res = CliRunner().invoke(app, ["bench", "throughput", "--machines", "50", "--jobs", "20",
                                   "--clients", "2", "--pass-gap", "1"])
    assert res.exit_code == 0, res.output
    figures = json.loads(res.stdout)
    assert figures["params"]["serve_extra"] == ["--min-pass-gap", "1.0"]
    assert figures["errors"] == 0 and figures["placed"] == 20
    assert figures["server_log"] == []
    res = CliRunner().invoke(app, ["serve", "--min-pass-gap", "11", "--data-dir", "/nowhere"])
    assert res.exit_code != 0 and "min-pass-gap" in res.output
