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
from typing import Any

import httpx
import numpy as np

from plait.bench.api import Connection, Server, _host_busy_seconds
from plait.bench.controllers import farm_process


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


async def _drive(url: str, token: str, farm: str, *, jobs: int, tarpits: int,
                 tasks_per_job: int, machines: list[str], seconds: float, update_rate: float,
                 other_jobs: int, other_rate: float, agent_interval: float,
                 settle_timeout: float, warmup: float,
                 server_cpu: Callable[[], float | None]) -> dict[str, Any]:
    stop = asyncio.Event()
    beats: list[float] = []
    beat_errors = 0
    error_kinds: dict[str, int] = {}  # what each error was: a status, or an exception

    def kind_of(kind: str) -> None:
        error_kinds[kind] = error_kinds.get(kind, 0) + 1

    measuring = False

    async def agent(machine: str, offset: float) -> None:
        nonlocal beat_errors
        api = Api(url, token)
        await asyncio.sleep(offset)
        while not stop.is_set():
            try:
                _, desired = await api.call("GET", f"/v1/machines/{machine}/desired")
                tasks = [{"job": t["job"], "index": t["index"], "revision": t["revision"],
                          "phase": "running", "healthy": True} for t in desired["tasks"]]
                started = time.perf_counter()
                status, _ = await api.call("POST", f"/v1/machines/{machine}/status",
                                           {"tasks": tasks})
                if measuring:
                    beats.append(time.perf_counter() - started)
                if status != 200:
                    beat_errors += 1
                    kind_of(f"heartbeat {status}")
            except (OSError, ValueError, KeyError, TypeError) as e:
                beat_errors += 1
                kind_of(f"heartbeat {type(e).__name__}: {e}"[:200])
                api.conn.close()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), agent_interval)

    agents = [asyncio.create_task(agent(m, i * agent_interval / len(machines)))
              for i, m in enumerate(machines)]
    admin = Api(url, token)
    status, body = await admin.call("POST", "/v1/entitlements", {
        "name": "tc", "owner": "bench", "quota": {"machines": len(machines)}})
    if status not in (200, 201):
        raise RuntimeError(f"entitlement: {status} {body}")
    names = [f"tc-{i:04d}" for i in range(jobs)]
    mode = {n: ("tarpit" if i >= jobs - tarpits else "lag") for i, n in enumerate(names)}
    controller = {n: f"{farm}/{mode[n]}/{n}" for n in names}
    others = [f"other-{k}" for k in range(other_jobs)]
    queue: asyncio.Queue[str] = asyncio.Queue()
    for n in names + others:
        queue.put_nowait(n)

    async def creator() -> None:
        api = Api(url, token)
        while not queue.empty():
            n = queue.get_nowait()
            status, body = await api.call("POST", "/v1/jobs", _spec(
                n, tasks_per_job, controller.get(n), 1))
            if status not in (200, 201):
                raise RuntimeError(f"creating {n}: {status} {body}")
    await asyncio.gather(*(creator() for _ in range(8)))
    # every job's tasks run before the window opens
    deadline = time.monotonic() + settle_timeout
    while True:
        _, listed = await admin.call("GET", "/v1/jobs")
        running = sum(1 for j in listed["jobs"] if j["settled"])
        if running == len(names) + len(others):
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {running} of {len(names) + len(others)} jobs settled "
                               f"within {settle_timeout:g}s")
        await asyncio.sleep(1.0)

    # the wave: every job gets a new version (the window finds them mid-rollout, each
    # controller asked again every second while its operations wait)
    for n in names:
        queue.put_nowait(n)

    async def wave() -> None:
        api = Api(url, token)
        while not queue.empty():
            n = queue.get_nowait()
            rev[n] += 1
            await api.call("PUT", f"/v1/jobs/{n}", _spec(n, tasks_per_job, controller[n],
                                                         rev[n]))
    rev = {n: 1 for n in names + others}
    await asyncio.gather(*(wave() for _ in range(8)))
    await asyncio.sleep(warmup)

    async def farm_calls() -> dict[str, int]:
        async with httpx.AsyncClient() as c:
            by_mode: dict[str, int] = (await c.get(f"{farm}/stats")).json()["by_mode"]
            return by_mode

    before = await farm_calls()
    # the generator's own garbage collection must not pause its clocks
    gc.collect()
    gc.freeze()
    gc.disable()
    measuring = True
    cpu0, host0 = server_cpu(), _host_busy_seconds()
    window_start = time.perf_counter()
    sent = 0
    healthy = [n for n in names if mode[n] != "tarpit"]
    other_latency: list[float] = []
    reads: list[float] = []
    writes: list[float] = []
    other_errors = 0

    async def updater() -> None:
        nonlocal sent
        api = Api(url, token)
        i = 0
        while not stop.is_set() and update_rate > 0:
            due = window_start + sent / update_rate
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if stop.is_set():
                break
            n = healthy[i % len(healthy)]
            i += 1
            rev[n] += 1
            await api.call("PUT", f"/v1/jobs/{n}", _spec(n, tasks_per_job, controller[n],
                                                         rev[n]))
            sent += 1

    async def tenant() -> None:
        nonlocal other_errors
        api = Api(url, token)
        k = 0
        while not stop.is_set():
            n = others[k % len(others)]
            k += 1
            started = time.perf_counter()
            if k % 2:
                status, _ = await api.call("GET", f"/v1/jobs/{n}")
            else:
                rev[n] += 1
                status, _ = await api.call("PUT", f"/v1/jobs/{n}",
                                           _spec(n, tasks_per_job, None, rev[n]))
            other_latency.append(time.perf_counter() - started)
            (reads if k % 2 else writes).append(other_latency[-1])
            if status != 200:
                other_errors += 1
                kind_of(f"{'GET' if k % 2 else 'PUT'} /v1/jobs {status}")
            await asyncio.sleep(max(0.0, 1 / (2 * other_rate)
                                    - (time.perf_counter() - started)))

    lags: list[float] = []

    async def lag() -> None:  # how late this generator's own loop runs
        while not stop.is_set():
            started = time.perf_counter()
            await asyncio.sleep(0.01)
            lags.append(time.perf_counter() - started - 0.01)

    workers = [asyncio.create_task(updater()), asyncio.create_task(tenant()),
               asyncio.create_task(lag())]
    await asyncio.sleep(seconds)
    window = time.perf_counter() - window_start
    cpu1, host1 = server_cpu(), _host_busy_seconds()
    after = await farm_calls()
    stop.set()
    await asyncio.gather(*workers, *agents, return_exceptions=True)
    gc.enable()
    gc.unfreeze()
    _, failed = await admin.call("GET", "/v1/events?kind=machine_unreachable&limit=1000")
    _, errors = await admin.call("GET", "/v1/events?kind=controller_error&limit=1000")
    healthy_calls = sum(v - before.get(k, 0) for k, v in after.items() if k != "tarpit")
    return {
        "controller_calls_per_s": round(healthy_calls / window, 1),
        "tarpit_calls": after.get("tarpit", 0),
        "updates_per_s": round(sent / window, 1),
        "other_jobs_api_p50_ms": _p(other_latency, 50),
        "other_jobs_api_p99_ms": _p(other_latency, 99),
        "other_jobs_read_p99_ms": _p(reads, 99),
        "other_jobs_update_p99_ms": _p(writes, 99),
        "other_jobs_api_requests": len(other_latency),
        "other_jobs_api_errors": other_errors,
        "heartbeat_p50_ms": _p(beats, 50),
        "heartbeat_p99_ms": _p(beats, 99),
        "heartbeat_max_ms": _p(beats, 100),
        "heartbeats": len(beats),
        "heartbeat_errors": beat_errors,
        "error_kinds": error_kinds,
        "false_machine_failures": len(failed["events"]),
        "controller_error_events": len(errors["events"]),
        "generator_lag_p99_ms": _p(lags, 99),
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
