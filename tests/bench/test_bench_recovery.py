"""The recovery benchmark's figures (behaviour, not speed): a real, small `plait up` on
loopback, a deploy of sleeping tasks, and the web job surviving a dead machine."""

import json
import math

import pytest
from typer.testing import CliRunner

from plait.cli.main import app

KEYS = {"machines", "tasks", "heartbeat_timeout_s", "recovery_s_after_timeout", "up_ready_s",
        "deploy_200_running_s", "machine_unavailable_s_after_kill", "lost_tasks",
        "recovered_tasks", "web_tasks", "killed_machine", "recovery_steps", "cpu_count"}
FIGURES = ("recovery_s_after_timeout", "up_ready_s", "deploy_200_running_s",
           "recovery_s_after_kill", "machine_unavailable_s_after_kill", "api_ready_s",
           "up_ready_observed_s", "deploy_placed_s", "delete_s", "web_serving_s")


@pytest.mark.timeout(240)
def test_cli_prints_one_json_object_and_every_lost_task_comes_back():
    res = CliRunner().invoke(app, ["bench", "recovery", "--machines", "4", "--tasks", "10",
                                   "--heartbeat-timeout", "2", "--timeout", "60"])
    assert res.exit_code == 0, res.output
    figures = json.loads(res.stdout)
    assert set(figures) >= KEYS
    assert figures["machines"] == 4 and figures["tasks"] == 10
    assert figures["heartbeat_timeout_s"] == 2
    for key in FIGURES:
        value = figures[key]
        assert isinstance(value, int | float) and math.isfinite(value) and value > 0, key
    # the region was up before it was ready, and ready before it was seen to be
    assert figures["api_ready_s"] <= figures["up_ready_s"] <= figures["up_ready_observed_s"]
    # the machine died: its tasks were lost and every one answers again elsewhere
    assert 1 <= figures["lost_tasks"] == figures["recovered_tasks"] <= 2  # at most 2 a machine
    assert figures["web_tasks"] == 6
    assert len(figures["recovery_steps"]) == figures["lost_tasks"]
    for step in figures["recovery_steps"].values():
        assert isinstance(step["answered_s"], int | float)
        assert step["answered_s"] <= figures["recovery_s_after_timeout"]
    assert figures["recovery_s_after_kill"] >= figures["recovery_s_after_timeout"]
    # torn down by Ctrl-C, nothing left over
    assert figures["up_stopped_by"] == "sigint" and figures["up_exit_code"] == 0
    assert figures["leftover_processes_killed"] == 0
