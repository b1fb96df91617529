"""`plait bench observability` runs both sides and prints one JSON object with its
figures (numbers; how large is not asserted), and its off side is metrics off."""

import json
import math

from typer.testing import CliRunner

from plait.bench import observability
from plait.cli.main import app
from plait.server.controlplane import ControlPlaneConfig


def test_the_bench_prints_every_figure_as_a_number():
    res = CliRunner().invoke(app, [
        "bench", "observability", "--machines", "48", "--jobs", "3", "--tasks-per-job", "2",
        "--alloc-rounds", "2", "--api-machines", "8", "--api-requests", "3",
        "--api-rounds", "2", "--api-starts", "2", "--ui-machines", "20", "--ui-jobs", "4",
        "--ui-requests", "5"])
    assert res.exit_code == 0, res.output
    figures = json.loads(res.stdout)
    for key in ("alloc_overhead_pct", "alloc_us_on", "alloc_us_off", "api_overhead_pct",
                "api_create_ms_on", "api_create_ms_off", "api_get_ms_on", "api_get_ms_off",
                "api_cpu_ms_on", "api_cpu_ms_off", "ui_p99_ms", "ui_p50_ms"):
        assert isinstance(figures[key], float) and math.isfinite(figures[key]), key
    assert figures["alloc_us_on"] > 0 and figures["api_get_ms_off"] > 0
    assert figures["switches"] == ["metrics", "logs"]
    assert figures["ui_p99_ms"] == max(figures["ui_pages"].values())
    assert figures["alloc_rounds"] == 2 and figures["api_rounds"] == 2
    assert figures["api_metrics_samples_on"] > 0  # (and none off: the bench checks it)


def test_the_off_side_turns_every_switch_off():
    on = observability.side_config(ControlPlaneConfig(), True)
    off = observability.side_config(ControlPlaneConfig(metrics=True), False)
    assert on.metrics and not off.metrics
    assert observability.side_serve_options(False) == ("--no-metrics",)
    assert observability.side_serve_options(True) == ("--metrics",)
    assert observability.side_env(False) == {"PLAIT_LOG_LEVEL": "warning"}
    assert observability.side_env(True) == {"PLAIT_LOG_LEVEL": "info"}


def test_overhead_is_the_median_ratio_of_the_paired_rounds():
    figures = observability.overhead([1.10, 1.0, 2.0], [1.0, 1.0, 1.0])
    assert figures["pct"] == 10.0 and figures["p25"] == 5.0 and figures["p75"] == 55.0
