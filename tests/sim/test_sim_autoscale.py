"""``plait sim run examples/scenarios/autoscale-week.yaml``: a week of diurnal load
under the autoscaler, through the real scheduler, frees at least a fifth of the web
tier's machines off-peak (the paper: up to a quarter) and reports its SLO minutes."""

from pathlib import Path

from plait.sim import autoscale, files

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "scenarios" / "autoscale-week.yaml"


def test_the_example_week_frees_machines_off_peak():
    _kind, scenario = files.load(EXAMPLE)
    assert isinstance(scenario, autoscale.AutoscaleWeek)
    f = autoscale.run(scenario).figures
    assert f["machines_freed_offpeak_fraction"] >= 0.2
    assert f["peak_tasks"] > f["offpeak_tasks"] > 0
    assert 0 <= f["slo_violations_minutes"] < 60 * 24  # reported, and not the whole time
    assert 0.4 <= f["mean_utilization"] <= 0.7  # near the policy's target of 0.6
