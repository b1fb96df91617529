"""The web UI benchmark's workload and figures (behaviour, not speed)."""

import json

from typer.testing import CliRunner

from plait.bench import ui
from plait.cli.main import app


def test_every_page_is_fetched_and_the_figures_are_one_json_object():
    res = CliRunner().invoke(app, ["bench", "ui", "--machines", "20", "--jobs", "4",
                                   "--tasks-per-job", "2", "--requests", "5"])
    assert res.exit_code == 0, res.output
    figures = json.loads(res.stdout)
    assert set(figures["pages"]) == set(ui.PAGES)
    assert figures["ui_p99_ms"] == max(p["p99_ms"] for p in figures["pages"].values())
    assert all(p["bytes"] > 0 and p["p50_ms"] <= p["p99_ms"] for p in figures["pages"].values())
    # job-0 was updated: its chart has a start and an update bar per task
    assert figures["gantt_bars"] == 4
    assert figures["tasks"] == 8
