"""The allocator benchmark's workload and figures (behaviour, not speed)."""

import json

import pytest
from typer.testing import CliRunner

from plait.bench import allocator
from plait.cli.main import app

KEYS = {"machines", "jobs", "tasks_per_job", "seconds", "job_allocations_per_s",
        "task_placements_per_s", "cache_hit_ratio", "index_bytes_per_machine",
        "max_msb_loss_ratio", "index_build_s"}


def test_cli_prints_one_json_object_with_the_issue_keys():
    res = CliRunner().invoke(app, ["bench", "allocator", "--machines", "3000", "--jobs", "50",
                                   "--tasks-per-job", "12", "--dcs", "2", "--msbs-per-dc", "3"])
    assert res.exit_code == 0, res.output
    figures = json.loads(res.stdout)
    assert set(figures) >= KEYS
    assert figures["machines"] == 3000 and figures["jobs"] == 50
    assert figures["unplaced_tasks"] == 0
    # 12 tasks over 6 MSBs: the best possible is 2 per MSB
    assert figures["max_msb_loss_ratio"] == pytest.approx(2 / 12, abs=1e-4)


def test_repeats_hit_the_cache_and_get_the_same_placement():
    figures = allocator.run(machines=2000, jobs=400, tasks_per_job=8, dcs=2, msbs_per_dc=2,
                            repeat_ratio=0.9)
    assert figures["repeats"] == 360 and figures["distinct_jobs"] == 40
    assert figures["repeat_placement_mismatches"] == 0
    assert figures["cache_hit_ratio"] == pytest.approx(0.9)


def test_region_fills_up_and_quotas_hold():
    # 20 entitlements of 5 machines cover 100 machines: room for 1,600 one-RRU tasks
    figures = allocator.run(machines=100, jobs=60, tasks_per_job=36, dcs=1, msbs_per_dc=2)
    assert 0 < figures["claimed_machines"] <= 100
    assert figures["placed_tasks"] + figures["unplaced_tasks"] == 60 * 36
    assert figures["placed_tasks"] <= 1600
    assert figures["unplaced_tasks"] >= 60 * 36 - 1600


def test_big_entitlement_scenario_stacks_into_the_bound_machines():
    figures = allocator.run(machines=2000, jobs=50, tasks_per_job=12, dcs=2, msbs_per_dc=3,
                            scenario="big-entitlement")
    assert figures["scenario"] == "big-entitlement"
    assert set(figures) >= KEYS
    # every job fits in the 1,000 machines bound before the run: nothing claimed
    assert figures["claimed_machines"] == 0 and figures["unplaced_tasks"] == 0
    assert figures["max_msb_loss_ratio"] == pytest.approx(2 / 12, abs=1e-4)
    # 600 one-RRU tasks stacked 16 to a machine, 6 MSBs: at most a few machines each
    assert figures["machines_used"] <= 600 // 16 + 6


def test_rack_spread_scenario_puts_each_task_of_a_job_in_its_own_rack():
    figures = allocator.run(machines=3000, jobs=40, tasks_per_job=12, dcs=2, msbs_per_dc=3,
                            scenario="rack-spread")
    assert figures["scenario"] == "rack-spread" and figures["unplaced_tasks"] == 0
    assert figures["max_rack_loss_ratio"] == pytest.approx(1 / 12, abs=1e-4)
    # racks are chosen by stacking and best fit first; ties between them alternate over
    # the MSBs, so no MSB holds half of a job (as when the ties took one MSB's racks per
    # DC first: 6 of 12 here)
    assert figures["max_msb_loss_ratio"] <= 3 / 12 + 1e-4


def test_an_unknown_scenario_is_refused():
    res = CliRunner().invoke(app, ["bench", "allocator", "--machines", "100", "--jobs", "1",
                                   "--scenario", "nope"])
    assert res.exit_code != 0
    assert "scenario" in res.output
