"""The diurnal scenario (Figure 18's shape): ``plait sim run
examples/scenarios/diurnal.yaml`` holds the issue's targets on the example file
itself, writes its plot, and refuses a malformed scenario with a message that names
the problem."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from plait.cli.main import app
from plait.sim import diurnal, files

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "scenarios" / "diurnal.yaml"


def test_the_example_day_holds_the_targets():
    _kind, scenario = files.load(EXAMPLE)
    assert isinstance(scenario, diurnal.Diurnal)
    result = diurnal.run(scenario)
    f = result.figures
    assert f["mismatched_starts"] == 0
    assert f["revokes_past_deadline"] == 0
    assert f["profile_switches_per_machine_per_day"] <= 1.0
    # the day has the shape: loans at night, revoked as the online load comes back
    assert f["revokes"] > 0 and f["loaned_machine_hours"] > 0
    assert f["peak_loaned"] > 2 * f["min_loaned"]
    night = result.held["batch"][result.hours.index(min(result.hours, key=lambda h: abs(h - 8)))]
    evening = result.held["batch"][result.hours.index(min(result.hours,
                                                          key=lambda h: abs(h - 20)))]
    assert night > evening


def test_sim_run_prints_one_json_object_and_writes_the_plot(tmp_path):
    out = tmp_path / "day.png"
    result = CliRunner().invoke(app, ["sim", "run", str(EXAMPLE), "--hours", "3",
                                      "--machines", "160", "--plot", str(out)])
    assert result.exit_code == 0, result.output
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert set(figures) >= {"profile_switches_per_machine_per_day", "mismatched_starts",
                            "loaned_machine_hours", "revokes", "revokes_past_deadline"}
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_malformed_scenario_is_refused_by_name(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(EXAMPLE.read_text().replace("tick_seconds: 10", "tick_secs: 10"))
    result = CliRunner().invoke(app, ["sim", "run", str(bad)])
    assert result.exit_code != 0 and "tick_secs" in result.output
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text("scenario: tides\n")
    result = CliRunner().invoke(app, ["sim", "run", str(unknown)])
    assert result.exit_code != 0 and "tides" in result.output and "diurnal" in result.output
