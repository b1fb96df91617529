"""End-to-end flows on loopback with real processes: a machine dies, a rolling update,
planned maintenance with a short notice. The job is examples/web.yaml (6 HTTP servers,
max_unavailable 1, enabled in discovery once they answer HTTP) with a leaner server in
place of ``python3 -m http.server``, which takes a second or more to start on a busy
2-core box: the flows measure plait's moves, not interpreter start-up (the example as
it is runs in tests/cli). Every wait is bounded
by a generous liveness timeout; nothing asserts speed (the maintenance notice is a
deadline the flow itself promises to meet)."""

from __future__ import annotations

import copy
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e_region import Region, Sample, Sampler, alive, answers, content, wait_for

EXAMPLE = Path(__file__).parents[2] / "examples" / "web.yaml"
MACHINES = 6  # one DC, three MSBs of two machines; an agent on each


#: an HTTP server answering every request with "$WEB_VERSION\n", on the standard
#: library's socket module alone (python3 -S: not even site), one connection at a time
SERVER = """
import os, socket
body = (os.environ["WEB_VERSION"] + "\\n").encode()
head = b"HTTP/1.0 200 OK\\r\\nContent-Length: %d\\r\\n\\r\\n" % len(body)
server = socket.create_server(("127.0.0.1", int(os.environ["PLAIT_PORT"])), backlog=64)
while True:
    conn, _ = server.accept()
    try:
        conn.settimeout(2)
        request = b""
        while b"\\r\\n\\r\\n" not in request:
            data = conn.recv(4096)
            if not data:
                break
            request += data
        conn.sendall(head + body)
    except OSError:
        pass
    finally:
        conn.close()
"""


def web(version: str, probe_interval: float | None = None) -> dict[str, Any]:
    """The web example, whose servers answer GET / with their version."""
    spec = copy.deepcopy(yaml.safe_load(EXAMPLE.read_text()))
    spec["env"] = {**spec.get("env", {}), "WEB_VERSION": version}
    spec["command"] = "python3"
    spec["args"] = ["-S", "-c", SERVER]
    if probe_interval is not None:
        spec["health"]["interval_seconds"] = probe_interval
    return spec


def running_region(tmp_path: Path, heartbeat_timeout: float) -> Iterator[Region]:
    # agents start slower than the heartbeat timeout on a busy box: a grace for their
    # first heartbeat, so no task is moved before the flows begin
    r = Region(tmp_path, machines=MACHINES, dcs=1, msbs_per_dc=3,
               heartbeat_timeout=heartbeat_timeout, startup_grace=30)
    try:
        machines = r.machine_names()
        for machine in machines:
            r.start_agent(machine)
        r.admin.post("/v1/entitlements", json={"name": "web", "owner": "o",
                                               "quota": {"machines": MACHINES}})
        wait_for(lambda: all((tmp_path / "agents" / m / "agent.json").exists()
                             for m in machines), what="every agent joins")
        yield r
    finally:
        r.close()
        left = r.ours()
    assert not left, f"processes left behind: {left}"


@pytest.fixture
def region(tmp_path):
    """A region whose machines fail 3 s after their agent's last heartbeat."""
    yield from running_region(tmp_path, 3.0)


@pytest.fixture
def steady_region(tmp_path):
    """A region where no machine fails by accident: an agent starved of CPU on a busy
    box for a few seconds is not taken for a dead machine."""
    yield from running_region(tmp_path, 15.0)


def serving(region: Region, version: str, count: int = 6) -> bool:
    """Every task index is listed in discovery and answers with ``version``."""
    endpoints = region.endpoints()
    return len(endpoints) == count and all(
        content(e) == f"{version}\n" for e in endpoints.values())


def deploy(region: Region, version: str = "v1",
           probe_interval: float | None = None) -> list[dict[str, Any]]:
    assert region.admin.post("/v1/jobs", json=web(version, probe_interval)).status_code == 201
    wait_for(lambda: serving(region, version), timeout=120, what="every task serves")
    return region.tasks()


def placement(tasks: list[dict[str, Any]]) -> dict[str, list[int]]:
    by_machine: dict[str, list[int]] = {}
    for t in tasks:
        by_machine.setdefault(t["machine"], []).append(t["index"])
    return by_machine


def diagnose(region: Region, samples: list[Sample], bad: list[Sample]) -> str:
    """What to read when a flow went wrong: the bad samples, every change the sampler
    saw, and the job's events."""
    def brief(s: Sample) -> str:
        return (f"down {sorted(s.down(6))}, " + ", ".join(
            f"{t['index']}:{t['state']}/v{t['version']}@{t['machine']}"
            + ("" if t["serving"] else "/out") + (f"/{t['operation']}" if t["operation"] else "")
            for t in s.tasks))
    lines = [f"{len(bad)} bad samples of {len(samples)}; the first ones:"]
    lines += [f"  {s.at:.3f}-{s.end:.3f} {brief(s)}" for s in bad[:5]]
    lines.append("every change seen:")
    last = None
    for s in samples:
        if brief(s) != last:
            last = brief(s)
            lines.append(f"  {s.at:.3f}-{s.end:.3f} {last}")
    lines.append("events:")
    lines += [f"  {e['time']:.3f} {e['source']} {e['kind']} {e['machine'] or ''}: "
              f"{e['message']}" for e in region.events()]
    lines.append("task logs with errors:")
    lines += [f"  {name}: {' | '.join(tail)}" for name, tail in region.task_errors().items()]
    return "\n".join(lines)


def test_a_dead_machine_makes_its_machine_unavailable_and_its_tasks_serve_elsewhere(region):
    tasks = deploy(region)
    victim, indices = max(placement(tasks).items(), key=lambda kv: len(kv[1]))
    before = region.endpoints()

    # the machine dies: its agent and every task on it are SIGKILLed at once
    pids = region.kill_machine(victim)
    assert len(pids) == len(indices)
    wait_for(lambda: not any(alive(pid) for pid in pids.values()), what="the tasks die")
    wait_for(lambda: region.admin.get(f"/v1/machines/{victim}").json()["state"] == "failed",
             what="the dead machine becomes unavailable")
    # from then on, discovery never sends anyone to the dead machine...
    seen: list[dict[str, Any]] = []

    def moved() -> bool:
        found = region.admin.get("/v1/discovery/web").json()["endpoints"]
        seen.append({e["index"]: e["machine"] for e in found})
        placed = {t["index"]: t["machine"] for t in region.tasks()}
        now = region.endpoints()
        return victim not in placed.values() and len(now) == 6 and all(
            answers(e) for e in now.values())
    wait_for(moved, timeout=90, what="the dead machine's tasks run and answer elsewhere")
    assert not [s for s in seen if victim in s.values()]
    assert all(len(s) == len(set(s)) for s in seen)
    # ...and its tasks answer on their new discovery endpoints, on live machines
    now = region.endpoints()
    placed = {t["index"]: t["machine"] for t in region.tasks()}
    for index in indices:
        assert placed[index] != victim
        assert region.admin.get(f"/v1/machines/{placed[index]}").json()["state"] == "healthy"
        assert content(now[index]) == "v1\n"
    assert region.admin.get(f"/v1/machines/{victim}").json()["state"] == "failed"
    # the old servers are gone with their machine (their endpoints no longer answer)
    for index in indices:
        if before[index] not in now.values():
            assert content(before[index], timeout=2) is None


def test_a_rolling_update_never_takes_more_than_one_task_down(steady_region):
    region = steady_region
    deploy(region, "v1")  # fully healthy: the sampler starts now
    with Sampler(region) as sampler:
        r = region.admin.put("/v1/jobs/web", json=web("v2"))
        assert r.status_code == 200, r.text

        def done() -> bool:
            tasks = region.tasks()
            return all(t["version"] == 2 and t["state"] == "running" and t["serving"]
                       for t in tasks) and len(tasks) == 6 and serving(region, "v2")
        wait_for(done, timeout=120, what="every task runs version 2")
    samples = sampler.samples
    assert samples, sampler.errors
    bad = [s for s in samples if len(s.down(6)) > 1]
    assert not bad, diagnose(region, samples, bad)
    assert any(s.down(6) for s in samples), sampler.errors  # the sampler saw the rollout
    # each index answered v1 until it went down once, then v2
    for index in range(6):
        versions = [s.up[index] for s in samples if index in s.up]
        assert versions == sorted(versions), f"task {index} answered {set(versions)} back and forth"
    # nothing else happened to the job (no task lost, no rollout halted)
    events = region.events("web")
    assert {e["kind"] for e in events if e.get("task") is None} == {
        "created", "updated", "rollout_done"}
    # each task's operations: an update each, paced by the scheduler
    updates = [e for e in events if e["kind"] == "op_started"]
    assert {e["op"] for e in updates} == {"update"}
    assert len({e["task"] for e in updates}) == len({e["task"] for e in events
                                                      if e["kind"] == "task_placed"})
    job = region.admin.get("/v1/jobs/web").json()
    assert job["applied_version"] == 2 and not job["rollout_active"] and job["updated"] == 6
    assert all(t["version"] == 2 for t in region.tasks())
    assert serving(region, "v2")


#: seconds between scheduling the maintenance and its start. The machine under notice
#: holds 2 tasks, moved one at a time (max_unavailable 1); a move is the stop, the start
#: elsewhere and the first passing probe reported (the agent long-polls at the probe
#: interval while a task awaits its first pass). Measured on a 2-core box: both moves
#: done 1.2-1.3 s after the notice, 1.2-2.3 s with four busy loops beside the suite
#: (with python3 -m http.server and heartbeat-paced reports: 3.0-4.2 s under load).
NOTICE = 3.0
PROBE_INTERVAL = 0.2


def test_planned_maintenance_moves_the_tasks_before_the_deadline_one_at_a_time(steady_region):
    region = steady_region
    tasks = deploy(region, probe_interval=PROBE_INTERVAL)
    victim, indices = max(placement(tasks).items(), key=lambda kv: len(kv[1]))
    assert len(indices) == 2  # spread over the 3 MSBs, stacked: 2 tasks a machine

    def moved(s: Sample) -> bool:
        """Every task serves (answers on its discovery endpoint), none on the machine
        under notice, no operation under way."""
        placed = {t["index"]: t["machine"] for t in s.tasks}
        return not s.down(6) and victim not in placed.values() and all(
            t["serving"] and t["operation"] is None for t in s.tasks)

    with Sampler(region) as sampler:
        wait_for(lambda: len(sampler.samples) >= 5,  # the job serving before the notice
                 what="a few samples")
        start = time.time() + NOTICE
        r = region.admin.post("/v1/maintenance", json={
            "machines": [victim], "start": start, "duration_seconds": 120,
            "reason": "e2e notice"})
        assert r.status_code == 201, r.text
        # the liveness bound: the moves finish (before the deadline or not: asserted below)
        wait_for(lambda: any(moved(s) for s in sampler.samples[-5:]), timeout=90,
                 what="the tasks under notice run elsewhere")
        time.sleep(max(0.0, start + 1.0 - time.time()))  # past the deadline (the subject)
    samples = sampler.samples
    assert samples, sampler.errors
    notice = [s for s in samples if s.at >= start - NOTICE]
    report = diagnose(region, samples, [s for s in notice if s.down(6)])
    # every task serves until the notice
    assert all(not s.down(6) for s in samples if s.end < start - NOTICE), report
    # moved before the maintenance starts: seen done by a sample that ended before it
    done = next(s for s in samples if moved(s))
    assert done.end < start, (f"moved {done.end - (start - NOTICE):.2f}s after the "
                              f"{NOTICE:g}s notice\n{report}")
    # and nothing was stopped at the deadline, and nothing else happened to the job
    events = region.events("web")
    assert {e["kind"] for e in events if e.get("task") is None} == {"created"}, report
    assert not [e for e in events if e["kind"] == "deadline_stop"], report
    # the tasks of the machine under notice moved, as operations of their own
    moves = [e for e in events if e["kind"] == "op_started"]
    assert moves and {e["op"] for e in moves} == {"move"}, report
    assert {e["task"] for e in moves} <= set(indices), report
    # never more than max_unavailable (1) down at once
    bad = [s for s in samples if len(s.down(6)) > 1]
    assert not bad, diagnose(region, samples, bad)
    # nothing stopped early: a task of the machine under notice serves there until the
    # scheduler starts its move
    early = [s for s in samples for i in s.down(6) & set(indices)
             if {t["index"]: (t["machine"], t["operation"]) for t in s.tasks}[i]
             == (victim, None)]
    assert not early, diagnose(region, samples, early)
    # only tasks of the machine under notice went down, and the sampler saw it (so the
    # checks above had something to check)...
    seen_down = {i for s in notice for i in s.down(6)}
    assert seen_down and seen_down <= set(indices), report
    # ...and at the deadline and after, every task runs on other machines and serves
    after = [s for s in samples if s.at >= start]
    assert after and all(moved(s) for s in after), report
    assert serving(region, "v1")
    assert victim not in {t["machine"] for t in region.tasks()}
