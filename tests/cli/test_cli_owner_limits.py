"""plait owner limits: an admin sets and shows an owner's limits on jobs and tasks;
a create past them fails with the limit named."""

from __future__ import annotations

import json

from typer.testing import CliRunner


def plait(*args: str, ok: bool = True):
    from plait.cli.main import app

    result = CliRunner().invoke(app, list(args))
    if ok:
        assert result.exit_code == 0, (args, result.output, result.exception)
    return result


def test_an_admin_sets_and_shows_an_owners_limits(plane, tmp_path):
    plait("entitlement", "create", "--name", "web", "--owner", "alice", "--machines", "4")
    set_ = json.loads(plait("owner", "limits", "set", "alice", "--jobs", "1", "--tasks", "5",
                            "-o", "json").stdout)
    assert (set_["jobs"], set_["tasks"], set_["set"]) == (1, 5, {"jobs": 1, "tasks": 5})
    job = tmp_path / "job.json"
    job.write_text(json.dumps({"name": "one", "entitlement": "web", "task_count": 5,
                               "command": "serve", "resources": {"cpu": 1, "memory_gb": 1}}))
    plait("job", "deploy", str(job))
    job.write_text(json.dumps({"name": "two", "entitlement": "web", "task_count": 1,
                               "command": "serve", "resources": {"cpu": 1, "memory_gb": 1}}))
    res = plait("job", "deploy", str(job), ok=False)
    assert res.exit_code != 0 and "at most 1 jobs" in " ".join(res.output.split())
    shown = plait("owner", "limits", "show").output
    assert "alice" in shown and "defaults: 1,000 jobs and 50,000 tasks" in " ".join(
        shown.split())
    mine = json.loads(plait("owner", "limits", "show", "alice", "-o", "json").stdout)
    assert mine["used"] == {"jobs": 1, "tasks": 5}
    again = json.loads(plait("owner", "limits", "set", "alice", "-o", "json").stdout)
    assert (again["jobs"], again["set"]) == (1_000, {})
