"""The agent's side of a job's fence (``plait.model.fence``): it stops the tasks
whose lease ran out, starts them again only from a desired set pulled after it
reached the control plane again, and its fence keeper stops them when the agent
cannot. (Liveness bounds only: nothing asserts speed.)"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_agent_hostile_plane import Plane, wire_spec

from plait.agent import fencekeeper
from plait.agent.daemon import Agent
from plait.agent.runtime import proc_start_time
from plait.testing import wait_for

FENCED = {"job": "zk", "index": 0, "revision": 1,
          "spec": wire_spec(name="zk", fence={"seconds": 5}, kill_timeout_seconds=0)}


def desired(*tasks: dict[str, object], generation: int = 1) -> bytes:
    return json.dumps({"generation": generation, "tasks": list(tasks)}).encode()


@pytest.fixture
def plane() -> Iterator[Plane]:
    made = Plane(desired(FENCED))
    yield made
    made.stop.set()
    made.shutdown()
    made.server_close()


@pytest.fixture
def agent(plane: Plane, tmp_path: Path) -> Iterator[tuple[Agent, list[float]]]:
    # (the keeper the agent starts reads the real clock: the fake one starts there)
    clock = [fencekeeper.boottime()]
    made = Agent("m0", [plane.url], "join", tmp_path / "agent", timeout=5.0)
    made.fence_clock = lambda: clock[0]
    yield made, clock
    made.shutdown()
    made.close()
    lease = fencekeeper.read_lease(tmp_path / "agent") or {}
    assert not lease.get("tasks")  # (everything stopped: the keeper guards nothing)


def test_a_fenced_task_starts_only_under_a_lease(agent) -> None:
    a, clock = agent
    a.step()  # no heartbeat taken yet: no lease, nothing starts
    assert "zk.0" not in a.handles
    a.step()  # the last step's report renewed the lease
    assert "zk.0" in a.handles
    lease = fencekeeper.read_lease(a.data_dir)
    assert lease is not None and lease["contact"] == clock[0]
    assert lease["tasks"]["zk.0"]["seconds"] == 5.0


def test_the_agent_stops_a_task_whose_lease_ran_out_and_waits_for_a_fresh_set(
        agent, plane: Plane) -> None:
    a, clock = agent
    a.step()
    a.step()
    handle = a.handles["zk.0"]
    clock[0] += 5.0  # five seconds without a heartbeat taken
    a._fence()
    assert "zk.0" not in a.handles and a.tasks["zk.0"].fenced_at == clock[0]
    wait_for(lambda: a.runtime.poll(handle) is not None, what="the fenced task stops")
    a.step()  # reached again: but the set it pulled was asked for before the report
    assert "zk.0" not in a.handles
    assert a.tasks["zk.0"].rejoined_at == clock[0]
    a.step()  # a set asked for after: still assigned here, so it starts again
    assert "zk.0" in a.handles and a.tasks["zk.0"].fenced_at is None


def test_a_task_moved_away_meanwhile_is_not_started_again(agent, plane: Plane) -> None:
    a, clock = agent
    a.step()
    a.step()
    clock[0] += 60.0
    a._fence()
    plane.desired = desired(generation=2)  # the control plane placed it elsewhere
    a.step()
    a.step()
    assert "zk.0" not in a.handles and "zk.0" not in a.tasks


def test_the_keeper_kills_what_the_lease_no_longer_covers(tmp_path: Path) -> None:
    proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        handle = {"key": "zk.0", "pid": proc.pid, "pgid": proc.pid,
                  "start_time": proc_start_time(proc.pid), "log_path": str(tmp_path / "x"),
                  "cgroup": None, "cgroups": []}
        me = {"pid": os.getpid(), "start_time": proc_start_time(os.getpid())}
        now = fencekeeper.boottime()
        fencekeeper.write_lease(tmp_path, {"agent": me, "contact": now - 4.0,
                                           "tasks": {"zk.0": {"seconds": 5, "handle": handle}}})
        keeper = fencekeeper.Keeper(tmp_path)
        assert keeper.step(now)  # the lease holds
        assert proc.poll() is None
        assert keeper.step(now + 1.5)  # ran out: SIGTERM
        assert proc.wait(timeout=30) == -signal.SIGTERM
        # its agent gone and nothing left running: the keeper is done
        fencekeeper.write_lease(tmp_path, {"agent": {"pid": 1, "start_time": -5},
                                           "contact": now - 4.0,
                                           "tasks": {"zk.0": {"seconds": 5, "handle": handle}}})
        assert not keeper.step(now + 10)
    finally:
        proc.kill()
        proc.wait()


def test_the_keeper_process_outlives_a_frozen_agent(agent) -> None:
    """A real keeper process, started by the agent, kills the task while the agent
    does nothing at all (frozen: no step, no thread of its own looks)."""
    a, _ = agent
    a.fence_clock = fencekeeper.boottime  # (the keeper's clock: it runs for real)
    a.step()
    a.step()
    handle = a.handles["zk.0"]
    keeper = a.fenceguard._keeper_proc
    assert keeper is not None and keeper.poll() is None
    # from now on the agent does nothing: its lease runs out after 5 s
    wait_for(lambda: a.runtime.poll(handle) is not None, what="the keeper stops the task")
    assert (a.data_dir / "logs" / "fencekeeper.log").read_text().count("zk.0 SIGTERM") == 1
