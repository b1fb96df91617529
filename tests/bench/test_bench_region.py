"""``plait bench region`` at a tiny size: the keys the README names, and sane values
(never speed)."""

from __future__ import annotations

from plait.bench import region


def test_region_bench_reports_memory_and_reconcile_figures():
    r = region.run(machines=3000, shards=3)
    for key in ("state_bytes", "max_shard_reconcile_ms", "max_shard_idle_tick_ms",
                "state_bytes_per_task", "tasks"):
        assert key in r
    assert r["tasks"] > 3000 and r["state_bytes"] > 0
    assert r["max_shard_reconcile_ms"] > 0 and r["max_shard_idle_tick_ms"] >= 0
    assert r["invariant_problems"] == [] and r["unplaced_tasks"] == 0
    assert r["tasks_reported_running"] == r["tasks"]
