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
