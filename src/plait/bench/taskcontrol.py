"""``plait bench taskcontrol``: a region whose jobs each have an HTTP TaskController,
some of them tarpits, while other tenants read and update their jobs and agents
heartbeat.

Three processes, as in production: ``plait serve`` (real-agent mode: a machine is up
only while its agent heartbeats), a farm of controllers on one port
(``plait.bench.controllers``: ``lag`` is a replica-lag gate that acks one operation
on one call in twenty and otherwise declines, asking to be asked again after 1 s;
``tarpit`` sends one byte every 2 s and never finishes), and this process, which
plays the agents and the users on asyncio streams:

* ``machines`` agents, each every ``agent_interval`` seconds reading its machine's
  desired set and reporting every task in it running and healthy (the status POST's
  round trip is the heartbeat latency);
* ``jobs`` jobs of ``tasks_per_job`` tasks, ``tarpits`` of them behind a tarpit; once
  every task runs, every job gets a new version at once, so the window (after
  ``warmup`` seconds) finds a thousand rollouts under way, their operations waiting
  for their controllers and for the region's rate limit of destructive operations,
  and each controller asked again every second; during the window jobs are updated
  again round-robin at ``update_rate`` per second;
* a tenant without a controller who reads one of its ``other_jobs`` and updates
  another, ``other_rate`` times a second each (their latency is
  ``other_jobs_api_p99_ms``).

``controller_calls_per_s`` counts the calls the healthy controllers received during
the window; ``false_machine_failures`` the machines declared unreachable during the
whole run (every agent heartbeats throughout, so any is false).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np

from plait.bench.api import Server, _host_busy_seconds
from plait.bench.controllers import farm_process
from plait.bench.http1 import Connection


def _spec(name: str, tasks: int, controller: str | None, rev: int) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": name, "entitlement": "tc", "task_count": tasks,
        "resources": {"cpu": 0.1, "memory_gb": 0.1}, "command": "serve",
        "args": [f"--rev{rev}"], "update": {"max_unavailable": 1}}
    if controller is not None:
        body["task_controller"] = controller
    return body


class Api:
    """Requests on one keep-alive connection."""

    def __init__(self, url: str, token: str) -> None:
        target = httpx.URL(url)
        self.host, self.port = target.host, target.port or 80
        self.token = token
        self.conn = Connection(self.host, self.port)

    async def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        payload = b"" if body is None else json.dumps(body).encode()
        head = (f"{method} {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
                f"Authorization: Bearer {self.token}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(payload)}\r\n\r\n").encode()
        status, answer = await self.conn.request(head + payload)
        return status, json.loads(answer) if answer else None


def _p(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)) * 1000, 2) if values else None


@dataclass
class _Load:
    """What the generator's coroutines share: the region, the stop, the jobs' revisions
    and what the window measured."""

    url: str
    token: str
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    #: the window is open: heartbeats are timed
    measuring: bool = False
    beats: list[float] = field(default_factory=list)
    beat_errors: int = 0
    #: what each error was: a status, or an exception
    error_kinds: dict[str, int] = field(default_factory=dict)
    rev: dict[str, int] = field(default_factory=dict)
    sent: int = 0
    other_latency: list[float] = field(default_factory=list)
    reads: list[float] = field(default_factory=list)
    writes: list[float] = field(default_factory=list)
    other_errors: int = 0
    lags: list[float] = field(default_factory=list)

    def api(self) -> Api:
        return Api(self.url, self.token)

    def kind_of(self, kind: str) -> None:
        self.error_kinds[kind] = self.error_kinds.get(kind, 0) + 1


async def _agent(load: _Load, machine: str, offset: float, interval: float) -> None:
    api = load.api()
    await asyncio.sleep(offset)
    while not load.stop.is_set():
        try:
            _, desired = await api.call("GET", f"/v1/machines/{machine}/desired")
            tasks = [{"job": t["job"], "index": t["index"], "revision": t["revision"],
                      "phase": "running", "healthy": True} for t in desired["tasks"]]
            started = time.perf_counter()
            status, _ = await api.call("POST", f"/v1/machines/{machine}/status",
                                       {"tasks": tasks})
            if load.measuring:
                load.beats.append(time.perf_counter() - started)
            if status != 200:
                load.beat_errors += 1
                load.kind_of(f"heartbeat {status}")
        except (OSError, ValueError, KeyError, TypeError) as e:
            load.beat_errors += 1
            load.kind_of(f"heartbeat {type(e).__name__}: {e}"[:200])
            api.conn.close()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(load.stop.wait(), interval)


async def _create(load: _Load, specs: list[dict[str, Any]]) -> None:
    """Create the jobs of ``specs``, 8 at a time."""
    queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    for spec in specs:
        queue.put_nowait(spec)

    async def creator() -> None:
        api = load.api()
        while not queue.empty():
            spec = queue.get_nowait()
            status, body = await api.call("POST", "/v1/jobs", spec)
            if status not in (200, 201):
                raise RuntimeError(f"creating {spec['name']}: {status} {body}")
    await asyncio.gather(*(creator() for _ in range(8)))


async def _settle(admin: Api, jobs: int, settle_timeout: float) -> None:
    """Until every job's tasks run (before the window opens)."""
    deadline = time.monotonic() + settle_timeout
    while True:
        _, listed = await admin.call("GET", "/v1/jobs")
        running = sum(1 for j in listed["jobs"] if j["settled"])
        if running == jobs:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {running} of {jobs} jobs settled "
                               f"within {settle_timeout:g}s")
        await asyncio.sleep(1.0)


async def _wave(load: _Load, names: list[str], controller: dict[str, str],
                tasks_per_job: int) -> None:
    """Every job of ``names`` gets a new version, 8 at a time."""
    queue: asyncio.Queue[str] = asyncio.Queue()
    for n in names:
        queue.put_nowait(n)

    async def wave() -> None:
        api = load.api()
        while not queue.empty():
            n = queue.get_nowait()
            load.rev[n] += 1
            await api.call("PUT", f"/v1/jobs/{n}", _spec(n, tasks_per_job, controller[n],
                                                         load.rev[n]))
    await asyncio.gather(*(wave() for _ in range(8)))


async def _farm_calls(farm: str) -> dict[str, int]:
    async with httpx.AsyncClient() as c:
        by_mode: dict[str, int] = (await c.get(f"{farm}/stats")).json()["by_mode"]
        return by_mode


async def _updater(load: _Load, healthy: list[str], controller: dict[str, str],
                   tasks_per_job: int, update_rate: float, window_start: float) -> None:
    """Updates the healthy jobs round-robin at ``update_rate`` a second."""
    api = load.api()
    i = 0
    while not load.stop.is_set() and update_rate > 0:
        due = window_start + load.sent / update_rate
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        if load.stop.is_set():
            break
        n = healthy[i % len(healthy)]
        i += 1
        load.rev[n] += 1
        await api.call("PUT", f"/v1/jobs/{n}", _spec(n, tasks_per_job, controller[n],
                                                     load.rev[n]))
        load.sent += 1


async def _tenant(load: _Load, others: list[str], tasks_per_job: int,
                  other_rate: float) -> None:
    """Another tenant: reads one of its jobs and updates another, in turn."""
    api = load.api()
    k = 0
    while not load.stop.is_set():
        n = others[k % len(others)]
        k += 1
        started = time.perf_counter()
        if k % 2:
            status, _ = await api.call("GET", f"/v1/jobs/{n}")
        else:
            load.rev[n] += 1
            status, _ = await api.call("PUT", f"/v1/jobs/{n}",
                                       _spec(n, tasks_per_job, None, load.rev[n]))
        load.other_latency.append(time.perf_counter() - started)
        (load.reads if k % 2 else load.writes).append(load.other_latency[-1])
        if status != 200:
            load.other_errors += 1
            load.kind_of(f"{'GET' if k % 2 else 'PUT'} /v1/jobs {status}")
        await asyncio.sleep(max(0.0, 1 / (2 * other_rate)
                                - (time.perf_counter() - started)))


async def _lag(load: _Load) -> None:
    """How late this generator's own loop runs."""
    while not load.stop.is_set():
        started = time.perf_counter()
        await asyncio.sleep(0.01)
        load.lags.append(time.perf_counter() - started - 0.01)


async def _drive(url: str, token: str, farm: str, *, jobs: int, tarpits: int,
                 tasks_per_job: int, machines: list[str], seconds: float, update_rate: float,
                 other_jobs: int, other_rate: float, agent_interval: float,
                 settle_timeout: float, warmup: float,
                 server_cpu: Callable[[], float | None]) -> dict[str, Any]:
    load = _Load(url, token)
    agents = [asyncio.create_task(_agent(load, m, i * agent_interval / len(machines),
                                         agent_interval))
              for i, m in enumerate(machines)]
    admin = load.api()
    status, body = await admin.call("POST", "/v1/entitlements", {
        "name": "tc", "owner": "bench", "quota": {"machines": len(machines)}})
    if status not in (200, 201):
        raise RuntimeError(f"entitlement: {status} {body}")
    names = [f"tc-{i:04d}" for i in range(jobs)]
    mode = {n: ("tarpit" if i >= jobs - tarpits else "lag") for i, n in enumerate(names)}
    controller = {n: f"{farm}/{mode[n]}/{n}" for n in names}
    others = [f"other-{k}" for k in range(other_jobs)]
    await _create(load, [_spec(n, tasks_per_job, controller.get(n), 1)
                         for n in names + others])
    await _settle(admin, len(names) + len(others), settle_timeout)
    # the wave: every job gets a new version (the window finds them mid-rollout, each
    # controller asked again every second while its operations wait)
    load.rev = {n: 1 for n in names + others}
    await _wave(load, names, controller, tasks_per_job)
    await asyncio.sleep(warmup)
    before = await _farm_calls(farm)
    # the generator's own garbage collection must not pause its clocks
    gc.collect()
    gc.freeze()
    gc.disable()
    load.measuring = True
    cpu0, host0 = server_cpu(), _host_busy_seconds()
    window_start = time.perf_counter()
    healthy = [n for n in names if mode[n] != "tarpit"]
    workers = [asyncio.create_task(_updater(load, healthy, controller, tasks_per_job,
                                            update_rate, window_start)),
               asyncio.create_task(_tenant(load, others, tasks_per_job, other_rate)),
               asyncio.create_task(_lag(load))]
    await asyncio.sleep(seconds)
    window = time.perf_counter() - window_start
    cpu1, host1 = server_cpu(), _host_busy_seconds()
    after = await _farm_calls(farm)
    load.stop.set()
    await asyncio.gather(*workers, *agents, return_exceptions=True)
    gc.enable()
    gc.unfreeze()
    _, failed = await admin.call("GET", "/v1/events?kind=machine_unreachable&limit=1000")
    _, errors = await admin.call("GET", "/v1/events?kind=controller_error&limit=1000")
    healthy_calls = sum(v - before.get(k, 0) for k, v in after.items() if k != "tarpit")
    return {
        "controller_calls_per_s": round(healthy_calls / window, 1),
        "tarpit_calls": after.get("tarpit", 0),
        "updates_per_s": round(load.sent / window, 1),
        "other_jobs_api_p50_ms": _p(load.other_latency, 50),
        "other_jobs_api_p99_ms": _p(load.other_latency, 99),
        "other_jobs_read_p99_ms": _p(load.reads, 99),
        "other_jobs_update_p99_ms": _p(load.writes, 99),
        "other_jobs_api_requests": len(load.other_latency),
        "other_jobs_api_errors": load.other_errors,
        "heartbeat_p50_ms": _p(load.beats, 50),
        "heartbeat_p99_ms": _p(load.beats, 99),
        "heartbeat_max_ms": _p(load.beats, 100),
        "heartbeats": len(load.beats),
        "heartbeat_errors": load.beat_errors,
        "error_kinds": load.error_kinds,
        "false_machine_failures": len(failed["events"]),
        "controller_error_events": len(errors["events"]),
        "generator_lag_p99_ms": _p(load.lags, 99),
        "window_s": round(window, 1),
        # CPU cores busy during the window: the server process, and the whole host
        "server_cpu_cores": None if cpu0 is None or cpu1 is None
        else round((cpu1 - cpu0) / window, 2),
        "host_cpu_cores": None if host0 is None or host1 is None
        else round((host1 - host0) / window, 2),
    }


def run(jobs: int = 1000, tarpits: int = 10, tasks_per_job: int = 2, machines: int = 100,
        seconds: float = 30.0, update_rate: float = 10.0, other_jobs: int = 10,
        other_rate: float = 10.0, agent_interval: float = 1.0,
        heartbeat_timeout: float = 5.0, settle_timeout: float = 180.0,
        warmup: float = 5.0) -> dict[str, Any]:
    with farm_process() as farm:
        server = Server(machines, tick=0.1, sim_agents=False, extra=(
            "--controller-networks", "loopback,any", "--heartbeat-timeout",
            str(heartbeat_timeout), "--startup-grace", "60"))
        with server:
            names = [f"m{i:07d}" for i in range(machines)]
            figures = asyncio.run(_drive(
                server.url, server.token, farm, jobs=jobs, tarpits=tarpits,
                tasks_per_job=tasks_per_job, machines=names, seconds=seconds,
                update_rate=update_rate, other_jobs=other_jobs, other_rate=other_rate,
                agent_interval=agent_interval, settle_timeout=settle_timeout,
                warmup=warmup, server_cpu=server.cpu_seconds))
    return {"jobs": jobs, "tarpits": tarpits, "tasks_per_job": tasks_per_job,
            "machines": machines, "update_rate": update_rate, **figures}
