"""The agent logs through plait.logconfig, with fields: a task's start names the
machine, job, index, revision and the id of the API request that caused it (from its
desired set); a stop names the request that last changed the task's job (an update,
a delete). Every wait is a liveness bound, not a speed check."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_agent_policies import MACHINES, Box, wait_for

from plait import logconfig

SPEC = {"name": "web", "entitlement": "e", "task_count": 2, "command": "sleep",
        "args": ["300"], "resources": {"cpu": 0.1, "memory_gb": 0.1},
        "update": {"max_unavailable": 1}, "kill_timeout_seconds": 5}


@pytest.fixture
def logged(tmp_path: Path) -> Iterator[tuple[Box, io.StringIO]]:
    out = io.StringIO()
    logconfig.configure("test", stream=out, fmt="json", level="info")
    box = Box(tmp_path)
    try:
        yield box, out
    finally:
        box.close()
        logconfig.reset()


def agent_lines(out: io.StringIO, event: str) -> list[dict[str, Any]]:
    return [x for x in map(json.loads, out.getvalue().splitlines())
            if x["logger"] == "plait.agent" and x["event"] == event]


def lines(out: io.StringIO, event: str, rid: str) -> list[dict[str, Any]]:
    return [x for x in agent_lines(out, event) if x.get("request_id") == rid]


def test_start_and_stop_lines_name_the_task_and_the_request_behind_them(logged) -> None:
    box, out = logged
    r = box.api.post("/v1/jobs", json=SPEC, headers={"X-Request-Id": "deploy-1"})
    assert r.status_code == 201, r.text
    wait_for(lambda: len(agent_lines(out, "task started")) == 2, what="both tasks start")
    started = agent_lines(out, "task started")
    assert sorted(x["index"] for x in started) == [0, 1]
    for line in started:
        assert line["job"] == "web" and line["revision"] == 1
        assert line["request_id"] == "deploy-1"
        assert line["machine"] in MACHINES and line["pid"] > 0 and line["level"] == "info"
        assert {"timestamp", "component"} <= set(line)

    # an update that changes how tasks run: each is stopped and started again, both
    # lines naming the update's request
    r = box.api.put("/v1/jobs/web", json={**SPEC, "args": ["301"]},
                    headers={"X-Request-Id": "update-2"})
    assert r.status_code == 200, r.text
    wait_for(lambda: len(lines(out, "task started", "update-2")) == 2, what="both restarted")
    assert {(x["index"], x["revision"]) for x in lines(out, "task started", "update-2")} == {
        (0, 2), (1, 2)}
    stopped = lines(out, "task stopping", "update-2")
    assert {(x["index"], x["revision"]) for x in stopped} == {(0, 1), (1, 1)}
    assert {x["job"] for x in stopped} == {"web"} and all(x["pid"] > 0 for x in stopped)

    # deleted: the agents stop what is no longer assigned to them, naming the delete
    r = box.api.delete("/v1/jobs/web", headers={"X-Request-Id": "delete-3"})
    assert r.status_code == 202
    wait_for(lambda: len(lines(out, "task stopping", "delete-3")) == 2, what="both stop")
    assert {(x["index"], x["revision"], x["reason"]) for x in lines(
        out, "task stopping", "delete-3")} == {(0, 2, "no longer assigned"),
                                               (1, 2, "no longer assigned")}
