"""The API benchmark's figures (behaviour, not speed): a real `plait serve` process under a
small open-loop load from another process."""

import json

from typer.testing import CliRunner

from plait.bench import api
from plait.cli.main import app

KEYS = {"requests", "concurrency", "offered_per_s", "achieved_per_s", "errors", "p50_ms",
        "p99_ms", "max_ms", "max_sustained_per_s", "params", "cpu_count"}


def test_cli_prints_one_json_object_with_consistent_figures():
    res = CliRunner().invoke(app, ["bench", "api", "--rate", "20", "--seconds", "2",
                                   "--connections", "5", "--machines", "200", "--no-search"])
    assert res.exit_code == 0, res.output
    figures = json.loads(res.stdout)
    assert set(figures) >= KEYS
    assert figures["requests"] == 40  # 2 measured seconds at 20 per second
    assert figures["errors"] == 0, figures["run"]["error_kinds"]
    assert figures["concurrency"] == 5 and figures["offered_per_s"] == 20
    assert figures["achieved_per_s"] > 0
    assert 0 < figures["p50_ms"] <= figures["p99_ms"] <= figures["max_ms"]
    assert figures["max_sustained_per_s"] is None and figures["search"] is None
    assert figures["params"]["connections"] == 5 and figures["params"]["machines"] == 200
    assert figures["cpu_count"] >= 1
    assert len(figures["run"]["p99_ms_by_quarter"]) == 4
    assert max(figures["run"]["p99_ms_by_quarter"]) <= figures["max_ms"]
    assert 1 <= figures["run"]["max_outstanding"] <= 40
    # stopped by SIGTERM, without a kill (uvicorn re-raises the signal once shut down)
    assert figures["run"]["server_stopped_by"] == "sigterm"
    assert figures["run"]["server_exit_code"] in (0, -15)
    assert figures["run"]["server_log"] == []  # no warning, no traceback


def test_search_brackets_between_passing_and_failing_rates():
    # the criterion made impossible: every run fails, so the search halves down to
    # min_rate and reports no sustained rate, within its budget of steps
    figures = api.run(rate=8, seconds=1, connections=2, machines=100, step_seconds=1,
                      warmup_seconds=0, p99_limit_ms=0.0, min_rate=4, timeout=5)
    search = figures["search"]
    assert figures["max_sustained_per_s"] == 0.0
    assert search["stopped_by"] == "min_rate"
    assert [s["offered_per_s"] for s in search["steps"]] == [4.0]
    assert not any(s["passed"] for s in search["steps"])
