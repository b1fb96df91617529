"""``plait bench recovery``: how fast a whole region on one box comes up, deploys, and
recovers from a dead machine.

The region is ``plait up`` in a process of its own, exactly as an operator runs it:
a fresh data dir in a temporary directory, a free loopback port, ``machines`` agent
processes, ``heartbeat_timeout``. Its client configuration goes to the temporary
directory too (``PLAIT_CONFIG``, ``HOME`` and ``XDG_CONFIG_HOME`` point there), so
the user's CLI configuration is left alone. Everything is observed through the REST
API with the admin token ``plait up`` leaves in its data dir; the only other things
read are the files ``plait up`` and its agents keep there (``agents/<machine>/agent.pid``
and ``agent.json``), to find the processes of the machine that is killed.

Three figures, in order:

``up_ready_s``
    from launching ``plait up`` until every machine's agent has joined (the
    ``machine_joined`` event: an agent heartbeats, with its first status report, in
    the same step as it joins) and the API lists ``machines`` machines, all healthy.
    It is taken from the events' own times (the control plane's clock); the figure as
    this process saw it, up to one event flush later, is ``up_ready_observed_s``.
``deploy_200_running_s``
    from the ``POST /v1/jobs`` of a job of ``tasks`` tasks whose command is
    ``sleep infinity`` (so it measures plait, not an interpreter starting) until the
    API shows every task running. ``deploy_all_placed_s`` is when every task had a
    machine, and ``deploy_running_p50_s`` when half of them ran. The job is then
    deleted; ``delete_s`` is until the API no longer knows it.
``recovery_s_after_timeout``
    the web job of ``examples/web.yaml`` is deployed and waited for until every task
    answers HTTP 200 at its endpoint in service discovery. Then the machine with the
    most of its tasks dies: its agent and all its tasks get SIGKILL at the same moment
    (their process groups; every task runs in its own session). The heartbeat timeout
    is taken as the time of the control plane's ``machine_unreachable`` event for that
    machine (when it noticed the missing heartbeats; the machine's last heartbeat
    was at most one agent step before the kill). The figure is from there until every
    lost task index answers HTTP 200 at a new endpoint, on another machine, in
    service discovery. ``recovery_s_after_kill`` counts from the kill instead, and
    ``machine_unavailable_s_after_kill`` is the detection alone (about the heartbeat
    timeout). ``recovery_steps`` splits the recovery per lost index: when the task
    was placed on its new machine, when it ran, when it answered.

``plait up`` is stopped with SIGINT (it stops its agents and their tasks) and waited
for a bounded time; whatever is left (agents, tasks: found by their pid files, their
state files and, in /proc, by the data dir in their command line or environment) is
killed, whatever happened before, and the temporary directory removed.

CPU: ``control_plane_cpu_util`` and ``agents_cpu_util`` are the CPU seconds of the
``plait up`` process and of all agent processes per second of the run (an agent
steps every 0.5 s), and ``agent_start_cpu_s`` the mean CPU an agent spent until it
was ready (mostly its interpreter and imports): on a box with few cores the agents'
start-up competes for CPU, which ``up_ready_s`` shows.
"""

from __future__ import annotations

import contextlib
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from plait.errors import ValidationError
from plait.harness.region import LocalRegion as Region
from plait.harness.region import started_at

#: the job of the deploy figure (the tasks' command: ``sleep infinity``)
SLEEP_JOB = "bench-sleep"
#: the entitlement of the deploy figure
SLEEP_ENTITLEMENT = "bench"


def _round(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 3)


def _examples() -> Path:
    return Path(__file__).resolve().parents[3] / "examples"


def _answers(endpoint: str, timeout: float = 0.5) -> bool:
    try:
        return httpx.get(f"http://{endpoint}/", timeout=timeout).status_code == 200
    except httpx.HTTPError:
        return False


# -- the phases -----------------------------------------------------------------------------
def _wait_ready(region: Region, timeout: float) -> dict[str, Any]:
    """Until every machine's agent has joined and the API lists every machine healthy."""
    joined = region.wait_ready(timeout)
    observed = time.time()
    t0 = region.launched_at
    # where the time went: each agent process's start (from /proc), the end of its
    # start-up (its pid file is written once it has imported and set up, before its
    # first step), its join
    spawned, initialised = [], []
    for machine, pid in region.agent_pids().items():
        at = started_at(pid)
        with contextlib.suppress(OSError):
            done = (region.data / "agents" / machine / "agent.pid").stat().st_mtime
            if at is not None:
                spawned.append(at - t0)
                initialised.append(done - at)
    return {"up_ready_s": max(joined.values()) - t0,
            "up_ready_observed_s": observed - t0,
            "api_ready_s": region.api_at - t0,
            "first_agent_joined_s": min(joined.values()) - t0,
            "agents_spawned_s": max(spawned, default=None),
            "agent_startup_s_mean": statistics.mean(initialised) if initialised else None,
            "agent_startup_s_max": max(initialised, default=None)}


def _running_times(region: Region, job: str, started: float, timeout: float,
                   count: int) -> dict[str, Any]:
    """Poll the job's tasks until ``count`` run; when each was first placed and first
    seen running (seconds after ``started``, a monotonic time)."""
    placed: dict[int, float] = {}
    running: dict[int, float] = {}

    def all_running() -> bool:
        tasks = region.get(f"/v1/jobs/{job}/tasks")["tasks"]
        now = time.monotonic() - started
        for t in tasks:
            if t["machine"] is not None:
                placed.setdefault(t["index"], now)
            if t["state"] == "running":
                running.setdefault(t["index"], now)
        return len(running) >= count and sum(t["state"] == "running" for t in tasks) >= count

    region.wait(all_running, timeout, f"{count} tasks of {job} running")
    return {"running_s": max(running.values()), "placed_s": max(placed.values()),
            "running_p50_s": statistics.median(running.values())}


def _deploy_sleepers(region: Region, tasks: int, timeout: float) -> dict[str, Any]:
    region.send("POST", "/v1/entitlements", {
        "name": SLEEP_ENTITLEMENT, "owner": "bench", "quota": {"machines": region.machines}})
    spec = {"name": SLEEP_JOB, "entitlement": SLEEP_ENTITLEMENT, "task_count": tasks,
            "resources": {"cpu": 0.1, "memory_gb": 0.1}, "command": "sleep",
            "args": ["infinity"]}
    started = time.monotonic()
    region.send("POST", "/v1/jobs", spec, ok=(201,))
    figures = _running_times(region, SLEEP_JOB, started, timeout, tasks)
    machines = {t["machine"] for t in region.get(f"/v1/jobs/{SLEEP_JOB}/tasks")["tasks"]}
    deleting = time.monotonic()
    region.send("DELETE", f"/v1/jobs/{SLEEP_JOB}", ok=(202,))

    def gone() -> bool:
        assert region.api is not None
        return region.api.get(f"/v1/jobs/{SLEEP_JOB}").status_code == 404

    region.wait(gone, timeout, f"{SLEEP_JOB} deleted")
    return {"deploy_running_s": figures["running_s"], "deploy_placed_s": figures["placed_s"],
            "deploy_running_p50_s": figures["running_p50_s"],
            "deploy_machines_used": len(machines), "delete_s": time.monotonic() - deleting}


def _serving(region: Region, job: str, count: int) -> dict[int, dict[str, Any]] | None:
    """The discovery entries of the job's tasks, if all ``count`` answer HTTP 200."""
    found = {e["index"]: e for e in region.get(f"/v1/discovery/{job}")["endpoints"]
             if e["endpoint"]}
    if len(found) < count or not all(_answers(e["endpoint"]) for e in found.values()):
        return None
    return found


def _recover(region: Region, web: dict[str, Any], timeout: float) -> dict[str, Any]:
    entitlements = yaml.safe_load((_examples() / "entitlements.yaml").read_text())
    for ent in entitlements["entitlements"]:
        if ent["name"] == web["entitlement"]:
            region.send("POST", "/v1/entitlements", ent)
    job, count = web["name"], int(web["task_count"])
    started = time.monotonic()
    region.send("POST", "/v1/jobs", web, ok=(201,))
    before = region.wait(lambda: _serving(region, job, count), timeout, f"{job} serving")
    web_serving_s = time.monotonic() - started

    per_machine: dict[str, list[int]] = {}
    for index, e in sorted(before.items()):
        per_machine.setdefault(e["machine"], []).append(index)
    victim = max(sorted(per_machine), key=lambda m: len(per_machine[m]))
    lost = per_machine[victim]
    region.sample_agent_cpu()
    killed_at, kill_mono, groups = region.kill_machine(victim)

    # the control plane notices the missing heartbeats; the new copies come up
    placed: dict[int, float] = {}
    running: dict[int, float] = {}
    answered: dict[int, float] = {}
    old = {i: before[i]["endpoint"] for i in lost}
    seen_unavailable: float | None = None

    def recovered() -> bool:
        # (each time is taken once the answer that shows it is in)
        nonlocal seen_unavailable
        state = region.get(f"/v1/machines/{victim}")["state"]
        if seen_unavailable is None and state != "healthy":
            seen_unavailable = time.monotonic()
        tasks = region.get(f"/v1/jobs/{job}/tasks")["tasks"]
        now = time.monotonic()
        for t in tasks:
            if t["index"] in old and t["machine"] not in (None, victim):
                placed.setdefault(t["index"], now)
                if t["state"] == "running":
                    running.setdefault(t["index"], now)
        for e in region.get(f"/v1/discovery/{job}")["endpoints"]:
            i = e["index"]
            if i in old and i not in answered and e["machine"] != victim and e["endpoint"] \
                    and e["endpoint"] != old[i] and _answers(e["endpoint"]):
                answered[i] = time.monotonic()
        return len(answered) == len(lost) and seen_unavailable is not None

    region.wait(recovered, timeout + region.heartbeat_timeout, "the lost tasks answer again")
    done = max(answered.values())
    # when the control plane declared the machine unavailable (its clock, the wall clock)
    unreachable = [e["time"] for e in region.events("machine_unreachable", victim)
                   if e["time"] >= killed_at]
    timeout_at = min(unreachable) if unreachable else \
        killed_at + (seen_unavailable - kill_mono)  # type: ignore[operator]
    timeout_mono = kill_mono + (timeout_at - killed_at)
    after_kill = done - kill_mono
    steps = {str(i): {"placed_s": _round(placed.get(i, done) - timeout_mono),
                      "running_s": _round(running.get(i, done) - timeout_mono),
                      "answered_s": _round(answered[i] - timeout_mono)} for i in lost}
    return {
        "recovery_s_after_timeout": done - timeout_mono,
        "recovery_s_after_kill": after_kill,
        "recovery_s_after_kill_plus_timeout": after_kill - region.heartbeat_timeout,
        "machine_unavailable_s_after_kill": timeout_at - killed_at,
        "machine_unavailable_seen_s_after_kill": None if seen_unavailable is None
        else seen_unavailable - kill_mono,
        "recovery_steps": steps,
        "killed_machine": victim, "killed_process_groups": groups,
        "lost_tasks": len(lost), "recovered_tasks": len(answered),
        "web_tasks": count, "web_machines": len(per_machine), "web_serving_s": web_serving_s,
    }


def run(machines: int = 20, tasks: int = 200, heartbeat_timeout: float = 5.0,
        timeout: float = 120.0, web_spec: Path | None = None) -> dict[str, Any]:
    """One run: ``plait up`` of ``machines`` agents, a deploy of ``tasks`` sleeping
    tasks, then the web job and a machine failure. ``timeout`` bounds each wait."""
    for name, value in (("machines", machines), ("tasks", tasks),
                        ("heartbeat_timeout", heartbeat_timeout), ("timeout", timeout)):
        if not value > 0:
            raise ValidationError(name, f"must be > 0, not {value}")
    if machines < 2:
        raise ValidationError("machines", "at least 2: the lost tasks need another machine")
    path = web_spec or _examples() / "web.yaml"
    try:
        web = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ValidationError("web_spec", f"cannot read {path}: {exc}") from None
    started, loadavg = time.monotonic(), os.getloadavg()[0]
    with Region(machines, heartbeat_timeout) as region:
        ready = _wait_ready(region, timeout)
        agents_ready = region.sample_agent_cpu()
        cp_ready, at_ready = region.control_plane_cpu(), time.monotonic()
        deploy = _deploy_sleepers(region, tasks, timeout)
        recovery = _recover(region, web, timeout)
        agents_end = region.sample_agent_cpu()
        cp_end, at_end = region.control_plane_cpu(), time.monotonic()
    span = at_end - at_ready
    agent_cpu = sum(agents_end.values()) - sum(agents_ready.values())
    result: dict[str, Any] = {
        "machines": machines,
        "tasks": tasks,
        "heartbeat_timeout_s": heartbeat_timeout,
        "recovery_s_after_timeout": _round(recovery.pop("recovery_s_after_timeout")),
        "up_ready_s": _round(ready["up_ready_s"]),
        "deploy_200_running_s": _round(deploy["deploy_running_s"]),
        **{k: _round(v) for k, v in ready.items() if k != "up_ready_s"},
        "deploy_placed_s": _round(deploy["deploy_placed_s"]),
        "deploy_running_p50_s": _round(deploy["deploy_running_p50_s"]),
        "deploy_machines_used": deploy["deploy_machines_used"],
        "delete_s": _round(deploy["delete_s"]),
        **{k: _round(v) if isinstance(v, float) else v for k, v in recovery.items()},
        "agent_start_cpu_s": _round(statistics.mean(agents_ready.values()))
        if agents_ready else None,
        "agents_cpu_util": round(agent_cpu / span, 3) if span > 0 else None,
        "control_plane_cpu_util": None if cp_ready is None or cp_end is None or span <= 0
        else round((cp_end - cp_ready) / span, 3),
        "up_stopped_by": region.stopped_by,
        "up_exit_code": region.exit_code,
        "up_stop_s": _round(region.stop_s),
        "leftover_processes_killed": region.leftovers_killed,
        "leftover_processes": region.leftovers,
        "params": {"timeout": timeout, "web_spec": str(path),
                   "sleep_task": "sleep infinity, 0.1 cpu, 0.1 GB"},
        "cpu_count": os.cpu_count(),
        "loadavg_1m_at_start": round(loadavg, 2),
        "python": sys.version.split()[0],
        "wall_s": round(time.monotonic() - started, 1),
    }
    if not all(isinstance(result[k], int | float) and math.isfinite(result[k])
               for k in ("recovery_s_after_timeout", "up_ready_s", "deploy_200_running_s")):
        raise RuntimeError(f"a figure is missing: {result}")
    return result
