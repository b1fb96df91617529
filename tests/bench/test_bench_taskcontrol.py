"""The TaskControl benchmark's figures (behaviour, not speed), small: a `plait serve`
process, a farm of controllers in another, a few tarpits."""

import json

from typer.testing import CliRunner

from plait.cli.main import app

KEYS = {"jobs", "tarpits", "controller_calls_per_s", "other_jobs_api_p99_ms",
        "heartbeat_p99_ms", "false_machine_failures"}


def test_cli_prints_one_json_object_with_consistent_figures():
    res = CliRunner().invoke(app, ["bench", "taskcontrol", "--jobs", "40", "--tarpits", "3",
                                   "--machines", "12", "--seconds", "6",
                                   "--update-rate", "2"])
    assert res.exit_code == 0, res.output
    figures = json.loads(res.stdout)
    assert set(figures) >= KEYS
    assert figures["jobs"] == 40 and figures["tarpits"] == 3
    assert figures["controller_calls_per_s"] > 0  # the healthy controllers were asked
    assert figures["tarpit_calls"] >= 3  # each tarpit asked (and cut off at its deadline)
    assert figures["false_machine_failures"] == 0
    assert figures["heartbeat_errors"] == 0 and figures["other_jobs_api_errors"] == 0, \
        figures["error_kinds"]
    assert 0 < figures["heartbeat_p50_ms"] <= figures["heartbeat_p99_ms"]
    assert 0 < figures["other_jobs_api_p50_ms"] <= figures["other_jobs_api_p99_ms"]
