"""What one task does to its machine does not stop the agent: a task holding every
free port, or filling the disk, makes the next start fail as a start fails, while the
heartbeats go on and no process runs that the agent could not find again."""

from __future__ import annotations

import errno
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_agent_hostile_plane import GOOD_TASK, Plane

import plait.agent.daemon as daemon
from plait.agent.daemon import Agent
from plait.agent.probe import Prober
from plait.localprocs import alive
from plait.testing import wait_for


def desired(*tasks: dict) -> bytes:
    return json.dumps({"generation": len(tasks), "tasks": list(tasks)}).encode()


@pytest.fixture
def plane() -> Iterator[Plane]:
    p = Plane(desired(GOOD_TASK))
    yield p
    p.stop.set()
    p.shutdown()
    p.server_close()


@pytest.fixture
def agent(plane: Plane, tmp_path: Path) -> Iterator[Agent]:
    a = Agent("m0", [plane.url], "join", tmp_path / "agent", timeout=5.0)
    yield a
    a.shutdown()
    a.close()


def test_no_free_port_is_a_failed_start_and_the_heartbeats_go_on(
        plane: Plane, agent: Agent, monkeypatch: pytest.MonkeyPatch) -> None:
    def held(host: str) -> int:
        raise OSError(errno.EADDRINUSE, "Address already in use")
    monkeypatch.setattr(daemon, "_free_port", held)
    monkeypatch.setattr(daemon, "_port_free", lambda host, port: False)
    for _ in range(3):
        agent.step()
    assert plane.reports >= 3  # every turn reported
    task = agent.tasks["a.0"]
    assert task.exit_code == 127 and task.restarts == 1 and agent.handles == {}
    # once a port is free again, it starts (when its restart's backoff is over)
    monkeypatch.undo()
    task.next_start = 0.0
    agent.step()  # (the exit is over)
    agent.step()  # (and it starts)
    assert "a.0" in agent.handles and agent.tasks["a.0"].port > 0


def test_a_start_the_agent_cannot_save_is_undone(
        plane: Plane, agent: Agent, monkeypatch: pytest.MonkeyPatch) -> None:
    agent.step()
    first = agent.handles["a.0"]
    saved = json.loads(agent.state_path.read_text())
    assert list(saved["tasks"]) == ["a.0"]

    def full(*args: object, **kwargs: object) -> tuple[int, str]:
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(tempfile, "mkstemp", full)
    plane.desired = desired(GOOD_TASK, {**GOOD_TASK, "job": "b"})
    agent.step()
    # b's process was started, could not be written down, and was killed: an agent
    # restarted now would not know it, and would start a second copy
    assert "b.0" not in agent.handles and agent.tasks["b.0"].exit_code == 127
    assert list(json.loads(agent.state_path.read_text())["tasks"]) == ["a.0"]
    assert agent.handles["a.0"] is first and alive(first.pid)
    assert plane.reports >= 2
    # the disk has room again: the next turn writes what changed, and b starts
    monkeypatch.undo()
    agent.tasks["b.0"].next_start = 0.0  # (its restart's backoff over)
    agent.step()
    agent.step()
    assert "b.0" in agent.handles
    state = json.loads(agent.state_path.read_text())
    assert sorted(state["tasks"]) == ["a.0", "b.0"]
    assert state["tasks"]["b.0"]["handle"]["pid"] == agent.handles["b.0"].pid


def test_probes_that_hang_hold_up_no_other_tasks_probe_and_die_with_their_task(
        tmp_path: Path) -> None:
    prober = Prober()
    hang = {"command": ["sleep", "600"], "timeout_seconds": 600, "interval_seconds": 1}
    quick = {"command": ["true"], "timeout_seconds": 5, "interval_seconds": 1}
    try:
        for k in range(8):  # one tenant's tasks, every probe hanging for 10 minutes
            prober.check(f"slow.{k}", hang, "127.0.0.1", 1, {"PATH": os.defpath},
                         tmp_path, 0.0)
        wait_for(lambda: all(prober.states[f"slow.{k}"].proc is not None for k in range(8)),
                 what="the hanging probes run")
        pids = [prober.states[f"slow.{k}"].proc.pid for k in range(8)]
        # another task's probe runs beside them, and passes
        wait_for(lambda: prober.check("web.0", quick, "127.0.0.1", 1,
                                      {"PATH": os.defpath}, tmp_path, 0.0),
                 what="the other task's probe passes")
        # a task that leaves takes its probe with it, now, not in 10 minutes
        prober.forget("slow.0")
        wait_for(lambda: not alive(pids[0]), what="the left task's probe is killed")
        assert all(alive(pid) for pid in pids[1:])
    finally:
        prober.close()  # (the agent stops: every probe still running goes)
    wait_for(lambda: not any(alive(pid) for pid in pids), what="every probe is killed")
