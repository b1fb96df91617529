"""plait job autoscale / plait job load against a live API: the job follows its load,
and --off leaves its size."""

from __future__ import annotations

import json
from pathlib import Path

from test_cli_client import plait, write

from plait.testing import wait_for

JOB = """\
name: api
entitlement: e
task_count: 1
command: serve
resources: {cpu: 1, memory_gb: 1}
"""


def test_a_job_follows_the_load_pushed_to_it(plane, tmp_path: Path):
    plait("entitlement", "create", "--name", "e", "--owner", "alice", "--machines", "24")
    plait("job", "deploy", str(write(tmp_path, "api.yaml", JOB)))
    shown = json.loads(plait("job", "autoscale", "api", "--metric", "external",
                             "--target", "0.5", "--max", "12",
                             "--interval", "1", "-o", "json").stdout)
    assert shown["policy"]["max_tasks"] == 12 and shown["interval_seconds"] == 1
    # no setting given: the policy, as it is (it was reset to the defaults)
    looked = json.loads(plait("job", "autoscale", "api", "-o", "json").stdout)
    assert looked["policy"] == shown["policy"] and looked["interval_seconds"] == 1
    # one setting given: that one changes, the others keep their values
    changed = json.loads(plait("job", "autoscale", "api", "--max", "10", "-o",
                               "json").stdout)
    assert changed["policy"] == {**shown["policy"], "max_tasks": 10}
    assert changed["interval_seconds"] == 1
    plait("job", "autoscale", "api", "--max", "12")
    plait("job", "load", "api", "3")  # 3 tasks' worth at 50 %: 6 tasks
    wait_for(lambda: json.loads(plait("job", "show", "api", "-o", "json").stdout)["spec"][
        "task_count"] == 6, what="the job resized to 6 tasks", poll=0.2)
    assert "autoscaling off" in plait("job", "autoscale", "api", "--off").stderr
    refused = plait("job", "load", "api", "3", ok=False)
    assert refused.exit_code != 0 and "autoscale" in refused.output
