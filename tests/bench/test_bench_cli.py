"""The CLI benchmark's figures (behaviour, not speed), small: `plait job deploy`
processes against a `plait serve` process."""

import json

from typer.testing import CliRunner

from plait.cli.main import app


def test_cli_prints_one_json_object_and_every_deploy_is_stored():
    res = CliRunner().invoke(app, ["bench", "cli", "--sequential", "2", "--parallel", "6",
                                   "--shells", "3"])
    assert res.exit_code == 0, res.output
    figures = json.loads(res.stdout)
    assert figures["cli_deploy_ms"] > 0 and figures["cli_parallel_deploys_per_s"] > 0
    assert figures["cli_parallel_deploys_per_s_json"] > 0
    assert figures["sequential_failures"] == 0 and figures["parallel_failures"] == 0
    assert figures["parallel_jobs_stored"] == 12, figures["first_error"]  # YAML and JSON
