import json

from typer.testing import CliRunner

from plait import __version__
from plait.cli.main import app

runner = CliRunner()


def test_version():
    res = runner.invoke(app, ["version"])
    assert res.exit_code == 0 and res.stdout.strip() == __version__


def test_region_describe_json():
    res = runner.invoke(app, ["region", "describe", "--machines", "1200", "--dcs", "2",
                              "--msbs-per-dc", "3", "--json"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)
    assert summary["machines"] == 1200 and summary["dcs"] == 2 and summary["msbs"] == 6
    assert sum(summary["types"].values()) == 1200
    assert summary["index_bytes_per_machine"] <= 300


def test_demo_walks_figure7_and_benchmarks():
    res = runner.invoke(app, ["demo", "--machines", "2000", "--jobs", "20"])
    assert res.exit_code == 0, res.output
    assert "claimed ['m" in res.stdout and "released ['m" in res.stdout
    assert '"job_allocations_per_s"' in res.stdout


def test_bad_flag_is_refused_with_a_message():
    res = runner.invoke(app, ["bench", "allocator", "--repeat-ratio", "2"])
    assert res.exit_code != 0
    assert "repeat-ratio" in res.output


def test_sim_rollout_with_a_controller_and_failures():
    res = runner.invoke(app, ["sim", "rollout", "--tasks", "12", "--machines", "30",
                              "--controller", "one-at-a-time", "--fail", "1", "--json"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    assert summary["finished"] and summary["serving"] == 12
    assert summary["tasks_lost"] >= 1


def test_sim_rollout_of_a_crashing_version_halts():
    res = runner.invoke(app, ["sim", "rollout", "--tasks", "8", "--crash", "--json"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    assert summary["halted"] and not summary["finished"]


def test_sim_rollout_refuses_an_unknown_controller():
    res = runner.invoke(app, ["sim", "rollout", "--controller", "magic"])
    assert res.exit_code == 2
    assert "--controller" in res.output


def test_region_flags_out_of_range_are_one_line_errors():
    res = runner.invoke(app, ["bench", "allocator", "--dcs", "100", "--machines", "1000"])
    assert res.exit_code == 2
    assert "dcs" in res.output and "Traceback" not in res.output
