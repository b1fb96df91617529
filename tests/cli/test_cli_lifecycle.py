"""plait entitlement delete and plait maintenance cancel, through the CLI and the SDK
(plait.client), against a live API."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from test_cli_client import plait, write

from plait.client import ApiError, Client
from plait.testing import wait_for

JOB = """\
name: api
entitlement: e
task_count: 2
command: serve
resources: {cpu: 1, memory_gb: 1}
"""


def test_entitlement_delete(plane, tmp_path: Path) -> None:
    plait("entitlement", "create", "--name", "e", "--owner", "alice", "--machines", "8")
    plait("job", "deploy", str(write(tmp_path, "api.yaml", JOB)), "--wait")
    refused = plait("entitlement", "delete", "e", ok=False)
    assert refused.exit_code != 0 and "used by job api" in refused.output, refused.output
    plait("job", "delete", "api", "--wait")
    done = plait("entitlement", "delete", "e")
    assert "entitlement e deleted" in done.output, done.output
    gone = plait("entitlement", "show", "e", ok=False)
    assert gone.exit_code != 0 and "not found" in gone.output
    # the SDK: the same rules
    with Client(plane.url, token=plane.admin_token) as c:
        c.entitlements.create({"name": "f", "owner": "bob", "quota": {"machines": 2}})
        answer = c.entitlements.delete("f")
        assert answer["deleted"] is True and answer["name"] == "f"
        with pytest.raises(ApiError) as caught:
            c.entitlements.delete("f")
        assert caught.value.status == 404


def test_maintenance_cancel(plane) -> None:
    machine = "m0000003"
    made = json.loads(plait("maintenance", "schedule", machine, "--start", "+1h",
                            "--duration", "30m", "-o", "json").stdout)
    listed = json.loads(plait("maintenance", "list", "-o", "json").stdout)["events"]
    assert [e["id"] for e in listed] == [made["event"]]
    said = plait("maintenance", "cancel", made["event"])
    assert f"maintenance {made['event']} cancelled (1 machine)" in said.output, said.output
    assert json.loads(plait("maintenance", "list", "-o", "json").stdout)["events"] == []
    again = plait("maintenance", "cancel", made["event"], ok=False)
    assert again.exit_code != 0 and "not found" in again.output
    # under way, through the SDK: ended early
    with Client(plane.url, token=plane.admin_token) as c:
        event = c.maintenance.schedule([machine], time.time(), 3600)["event"]
        wait_for(lambda: c.machines.get(machine)["state"] == "maintenance")
        answer = c.maintenance.cancel(event)
        assert answer == {"event": event, "state": "ended", "machines": [machine]}
        wait_for(lambda: c.machines.get(machine)["state"] == "healthy")
