import json

from typer.testing import CliRunner

from plait.cli.main import app


def test_scheduler_bench_prints_the_issue_keys():
    res = CliRunner().invoke(app, ["bench", "scheduler", "--big-tasks", "600", "--machines",
                                   "300", "--jobs", "12", "--sim-seconds", "120",
                                   "--repeat", "1"])
    assert res.exit_code == 0, res.output
    figures = json.loads(res.stdout)
    assert {"plan_15k_ms", "sim_task_ops_per_s"} <= set(figures)
    assert figures["plan_ops_offered"] == 600  # every task gets an update op
    assert figures["plan_first_wave"] == 60  # 10% of the job, the pacing allows
    assert figures["sim_ops_completed"] > 0
