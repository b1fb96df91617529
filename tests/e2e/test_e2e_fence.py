"""At most one copy, with real processes on loopback: a job with a fence whose
machine's agent is frozen (SIGSTOP) is stopped there by the agent's fence keeper
before the control plane starts it elsewhere; the two copies never run at once.
Every wait is bounded by a generous liveness timeout; nothing asserts speed."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time

import pytest
from e2e_region import Region, alive, answers, wait_for

FENCE = 4.0
ZK = {"name": "zk", "entitlement": "zk", "task_count": 1,
      "resources": {"cpu": 0.1, "memory_gb": 0.1}, "command": "sh",
      "args": ["-c", "exec python3 -m http.server $PLAIT_PORT --bind 127.0.0.1"],
      "fence": {"seconds": FENCE}}
AGENTS = ["m0000000", "m0000001"]


@pytest.fixture
def region(tmp_path):
    r = Region(tmp_path, machines=4, heartbeat_timeout=3.0)
    yield r
    r.close()


def copies(region: Region, machine: str) -> list[int]:
    """The live processes of task zk.0 on the machine, as its agent recorded them."""
    try:
        pids = region.task_pids(machine)
    except (OSError, ValueError):  # (being rewritten: read again at the next sample)
        return []
    pid = pids.get("zk.0")
    return [pid] if pid is not None and alive(pid) else []


def test_a_frozen_agents_task_stops_before_its_replacement_starts(region):
    for machine in AGENTS:
        region.start_agent(machine)
    wait_for(lambda: region.admin.get("/v1/machines", params={"state": "failed"}).json()[
        "total"] == 2, what="agentless machines fail", logs=region.tmp)
    region.admin.post("/v1/entitlements", json={"name": "zk", "owner": "o",
                                                "quota": {"machines": 4}})
    assert region.admin.post("/v1/jobs", json=ZK).status_code == 201
    wait_for(lambda: len(region.endpoints("zk")) == 1 and answers(
        region.endpoints("zk")[0]), what="the task answers HTTP", logs=region.tmp)
    frozen = region.tasks("zk")[0]["machine"]
    other = next(m for m in AGENTS if m != frozen)
    first = copies(region, frozen)
    assert first
    # the agent's fence keeper runs beside it, in a session of its own
    wait_for(lambda: (region.tmp / "agents" / frozen / "fence.json").exists(),
             what="the fence lease is written", logs=region.tmp)

    # sample both machines until the replacement runs: the machine the replacement
    # goes to first, then the frozen one (whose copy only goes away), so a sample
    # with both is two copies at the first look's instant
    samples: list[tuple[float, bool, bool]] = []
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            at = time.monotonic()
            there = bool(copies(region, other))
            here = bool(first) and alive(first[0])
            samples.append((at, here, there))
            time.sleep(0.02)  # (sampling: what runs where, over time)

    sampler = threading.Thread(target=sample, daemon=True)
    agent = region.agents[frozen]
    stopped = time.monotonic()
    agent.send_signal(signal.SIGSTOP)
    sampler.start()
    try:
        wait_for(lambda: copies(region, other) and answers(region.endpoints("zk")[0]),
                 timeout=60, what="the replacement runs elsewhere", logs=region.tmp)
        replaced = time.monotonic()
        taken = len(samples)  # a few more samples of the replacement alone
        wait_for(lambda: len(samples) >= taken + 20, what="more samples")
    finally:
        resumed = time.monotonic()
        with contextlib.suppress(OSError):
            agent.send_signal(signal.SIGCONT)
    done.set()
    sampler.join(timeout=30)
    assert samples
    both = [(round(at - stopped, 2)) for at, here, there in samples if here and there]
    assert not both, f"two live copies at {both} s after the agent froze"
    gone = min(at for at, here, _ in samples if not here)
    started = min(at for at, _, there in samples if there)
    # the frozen agent's copy was stopped while the agent was frozen (by its keeper,
    # its lease run out: its log says so below); the replacement came after the fence
    assert stopped < gone < resumed
    assert gone < started <= replaced
    assert started - stopped >= FENCE
    with open(region.tmp / "agents" / frozen / "logs" / "fencekeeper.log") as f:
        assert "zk.0 SIGTERM" in f.read()

    # the agent wakes: it does not start its copy again (the task is not assigned there
    # any more), and the one copy keeps answering
    wait_for(lambda: region.admin.get(f"/v1/machines/{frozen}").json()["state"] == "healthy",
             what="the woken agent heartbeats again", logs=region.tmp)
    until = time.monotonic() + 3
    while time.monotonic() < until:
        assert not copies(region, frozen)
        assert copies(region, other)
        time.sleep(0.1)  # (sampling for 3 s: the subject is what does not start again)
    assert [t["machine"] for t in region.tasks("zk")] == [other]
    assert os.path.exists(region.tmp / "agents" / frozen / "agent.json")
