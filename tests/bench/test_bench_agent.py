"""The agent benchmark's figures (behaviour, not speed), small: a real `plait agent`
with two probed tasks against a real `plait serve`, and an idle `plait serve` with
three connected agents."""

import json

import pytest
from typer.testing import CliRunner

from plait.cli.main import app

KEYS = {"agent_cpu_pct", "cp_idle_cpu_pct", "tasks", "agents", "tasks_healthy_after",
        "agents_up_after", "agent_reports_per_s"}


def test_cli_prints_one_json_object_with_consistent_figures():
    res = CliRunner().invoke(app, ["bench", "agent", "--tasks", "2", "--agents", "3",
                                   "--seconds", "2"])
    assert res.exit_code == 0, res.output
    figures = json.loads(res.stdout)
    assert set(figures) >= KEYS
    assert figures["tasks"] == 2 and figures["agents"] == 3
    assert figures["tasks_healthy_after"] == 2  # probed and passing all along
    assert figures["agents_up_after"] == 3  # every agent heartbeats through the window
    assert figures["agent_reports_per_s"] > 0
    # (CPU is counted in clock ticks: a short window may see none)
    assert figures["agent_cpu_pct"] >= 0 and figures["cp_idle_cpu_pct"] >= 0
    assert figures["agent_cpu_pct"] == pytest.approx(
        figures["agent_own_cpu_pct"] + figures["agent_children_cpu_pct"], abs=0.01)
