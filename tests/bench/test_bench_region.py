"""``plait bench region`` at a tiny size: the keys the README names, and sane values
(never speed). Run as the command, in a process of its own: ``state_bytes`` is the
growth of resident memory, which a process that already freed more than the region
needs (a test session) would not show."""

from __future__ import annotations

import json
import subprocess
import sys


def test_region_bench_reports_memory_and_reconcile_figures():
    out = subprocess.run(
        [sys.executable, "-m", "plait.cli.main", "bench", "region", "--machines", "3000",
         "--shards", "3"], capture_output=True, text=True, timeout=300, check=True).stdout
    r = json.loads(out)
    for key in ("state_bytes", "max_shard_reconcile_ms", "max_shard_idle_tick_ms",
                "state_bytes_per_task", "tasks"):
        assert key in r
    assert r["tasks"] > 3000 and r["state_bytes"] > 0
    assert r["max_shard_reconcile_ms"] > 0 and r["max_shard_idle_tick_ms"] >= 0
    assert r["invariant_problems"] == [] and r["unplaced_tasks"] == 0
    assert r["tasks_reported_running"] == r["tasks"]
