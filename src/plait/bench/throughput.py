"""``plait bench throughput``: single-job creates from many clients, acknowledged and
placed, through the front door.

The server is ``plait serve --sim-agents`` in a process of its own over a fresh SQLite
data dir (``plait.bench.api.Server``), a region of ``machines`` machines; with
``frontend`` it runs as scheduler shard 0 (``--shard 0``) behind ``plait frontend`` in
another process, which the clients call (its entitlement is created through the front
end too, so the map places it on the shard).

``clients`` client PROCESSES (spawned, so none shares a GIL with the server or with
this orchestrating process) each drive one keep-alive HTTP/1.1 connection CLOSED LOOP:
a connection sends its next ``POST /v1/jobs`` (a new one-task job of 1 cpu, 0.1 GB) as
soon as the previous answer arrives, until the ``jobs`` creates are shared out. They
start together at a wall-clock instant given to all of them. Latency is the time from
sending a request to its answer; an error is any status but 201, a transport error, or
no byte of the answer for ``timeout`` seconds (a blocking socket per client: one
request out at a time, no event loop between a request and its answer).

Meanwhile this process watches the placements: it polls the serve's event log for
``task_placed`` events (``GET /v1/events?kind=task_placed&after=``, each poll only
what is new) every ``poll_seconds`` once the clients are done (5 times less often
while they send: the polls are requests the server answers too; the wait between two
is cut short when the clients are done), until every job's
task is placed (or ``place_timeout``). ``placed_per_s`` is ``jobs`` over the time
from the first request sent to the poll that saw the last placement (so up to one
poll interval late: a conservative figure); ``acks_per_s`` is 201s over the time
from the first request sent to the last answer. ``server_cpu_ms_per_create`` (and
the front end's) is CPU time of the process over the whole window, divided by the
creates.
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, wait
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from plait.bench.api import Server, _ready, terminate
from plait.bench.http1 import BlockingConnection, HttpError
from plait.errors import ValidationError
from plait.harness.region import cpu_seconds, wait_healthy

#: the job every request creates (the name is filled in per request): one task of 1 cpu
JOB_BODY = ('{{"name": "{name}", "entitlement": "bench", "task_count": 1, '
            '"resources": {{"cpu": 1, "memory_gb": 0.1}}, "command": "serve"}}')


class FrontEnd:
    """``plait frontend`` in a child process over a serve's data dir (its SQLite
    store); stopped with SIGTERM, then killed."""

    def __init__(self, data_dir: Path, log: Path, start_timeout: float = 60.0,
                 grace: float = 10.0) -> None:
        self.data_dir, self.log_path = data_dir, log
        self.start_timeout, self.grace = start_timeout, grace
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""

    def start(self, env: dict[str, str]) -> FrontEnd:
        from plait.testing import free_port

        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        cmd = [sys.executable, "-m", "plait.cli.main", "frontend", "--data-dir",
               str(self.data_dir), "--host", "127.0.0.1", "--port", str(port),
               "--shards", "1", "--no-write-config"]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT)
        wait_healthy(self.proc, self.url, self.start_timeout, "plait frontend",
                     lambda: self.log_path.read_text()[-2000:])
        return self

    def cpu_seconds(self) -> float | None:
        return None if self.proc is None else cpu_seconds(self.proc.pid)

    def stop(self) -> None:
        proc = self.proc
        if proc is not None and proc.poll() is None:
            terminate(proc, self.grace)


# -- a client process ---------------------------------------------------------------------------
def client(url: str, token: str, names: list[str], start_at: float,
           timeout: float) -> dict[str, Any]:
    """Create the jobs ``names`` one after another over one keep-alive connection,
    starting at wall-clock ``start_at``; the raw figures. (A blocking socket: one
    request is out at a time, and an event loop would cost this client, on the same
    cores as the server, several times the CPU per request.)"""
    target = httpx.URL(url)
    host, port = target.host, target.port or 80
    head = ("POST /v1/jobs HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: Bearer {token}"
            "\r\nContent-Type: application/json\r\nContent-Length: {length}\r\n\r\n")
    requests = []
    for name in names:
        body = JOB_BODY.format(name=name).encode()
        requests.append(head.format(host=host, port=port, token=token,
                                    length=len(body)).encode() + body)
    latency = np.full(len(names), np.nan)
    status = np.zeros(len(names), np.int32)
    failures: Counter[str] = Counter()
    conn = BlockingConnection(host, port, timeout)
    conn.open()  # before the start, as a keep-alive client would have it
    delay = start_at - time.time()
    if delay > 0:
        time.sleep(delay)
    first = time.time()
    cpu0 = time.process_time()
    clock = time.perf_counter
    for i, data in enumerate(requests):
        t0 = clock()
        try:
            code, answer = conn.request(data)
            status[i] = code
            if code != 201:
                failures[f"http {code}: {answer[:120].decode(errors='replace')}"] += 1
        except TimeoutError:
            status[i] = -1
            failures["timeout"] += 1
            conn.close()
        except (OSError, EOFError, HttpError, ValueError) as exc:
            status[i] = -1
            failures[type(exc).__name__] += 1
        latency[i] = clock() - t0
    last = time.time()
    conn.close()
    return {"latency": latency, "status": status, "first": first, "last": last,
            "failures": dict(failures), "cpu_s": time.process_time() - cpu0}


# -- the placements -----------------------------------------------------------------------------
def watch_placements(url: str, token: str, jobs: int, deadline: float,
                     poll_seconds: float, sent: Callable[[float], bool] = lambda _: True
                     ) -> tuple[int, float | None, float | None]:
    """Poll the event log for ``task_placed`` events of the bench's entitlement until
    ``jobs`` tasks are placed or ``deadline`` (monotonic); (tasks placed, wall time of
    the poll that saw the last one, the last event's own time). ``sent(t)`` waits at
    most ``t`` seconds for the clients to be done, and says whether they are: while
    they send, it polls 5 times less often (the polls are requests to the server
    measured too), and once they are done, at once and then every ``poll_seconds``."""
    placed, after, seen_at, last_time = 0, 0, None, None
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=url, headers=headers, timeout=10.0) as http:
        while placed < jobs and time.monotonic() < deadline:
            sending = not sent(0)
            r = http.get("/v1/events", params={"kind": "task_placed", "after": after,
                                               "entitlement": "bench", "limit": 1000})
            now = time.time()
            if r.status_code == 200:
                page = r.json()
                placed += len(page["events"])
                if page["events"]:
                    after = page["events"][-1]["seq"]
                    last_time = page["events"][-1]["time"]
                    seen_at = now
                if page["next"] is not None:
                    continue  # more already: read them now
            if sending:
                sent(5 * poll_seconds)  # (cut short when the clients are done)
            else:
                time.sleep(poll_seconds)
    return placed, seen_at, last_time


# -- one run --------------------------------------------------------------------------------------
def _ms(seconds: float) -> float:
    return round(seconds * 1000, 2)


def run(machines: int = 1000, jobs: int = 2000, clients: int = 8, frontend: bool = False,
        timeout: float = 30.0, place_timeout: float = 120.0, poll_seconds: float = 0.02,
        tick: float = 0.5, serve_extra: tuple[str, ...] = ()) -> dict[str, Any]:
    for field, value in (("machines", machines), ("jobs", jobs), ("clients", clients),
                         ("timeout", timeout), ("place_timeout", place_timeout),
                         ("poll_seconds", poll_seconds)):
        if not value > 0:
            raise ValidationError(field, f"must be > 0, not {value}")
    started, loadavg = time.monotonic(), os.getloadavg()[0]
    spawn = multiprocessing.get_context("spawn")
    extra = (*(("--shard", "0") if frontend else ()), *serve_extra)
    front: FrontEnd | None = None
    with ProcessPoolExecutor(max_workers=clients, mp_context=spawn) as pool, \
            Server(machines, tick, extra=extra) as server:
        for f in [pool.submit(_ready) for _ in range(clients)]:
            f.result()
        try:
            url = server.url
            if frontend:
                env = {**os.environ, "PLAIT_CONFIG": str(server.dir / "config.yaml"),
                       "PYTHONUNBUFFERED": "1"}
                front = FrontEnd(server.dir / "data", server.dir / "frontend.log").start(env)
                url = front.url
            made = httpx.post(f"{url}/v1/entitlements", timeout=30.0,
                              headers={"Authorization": f"Bearer {server.token}"},
                              json={"name": "bench", "owner": "bench",
                                    "quota": {"machines": machines}})
            if made.status_code not in (200, 201):
                raise RuntimeError(f"creating the entitlement: {made.status_code} "
                                   f"{made.text}")
            names = [f"t{i:06d}" for i in range(jobs)]
            shares = [names[c::clients] for c in range(clients)]
            cpu0 = server.cpu_seconds()
            fcpu0 = front.cpu_seconds() if front is not None else None
            start_at = time.time() + 0.3
            futures = [pool.submit(client, url, server.token, share, start_at, timeout)
                       for share in shares if share]
            placed, seen_at, last_event = watch_placements(
                server.url, server.token, jobs, time.monotonic() + place_timeout,
                poll_seconds, sent=lambda t: not wait(futures, timeout=t).not_done)
            raws = [f.result() for f in futures]
            cpu1 = server.cpu_seconds()
            fcpu1 = front.cpu_seconds() if front is not None else None
        finally:
            if front is not None:
                front.stop()
    latency = np.concatenate([r["latency"] for r in raws])
    status = np.concatenate([r["status"] for r in raws])
    first = min(r["first"] for r in raws)
    last = max(r["last"] for r in raws)
    ok = int(np.count_nonzero(status == 201))
    failures: Counter[str] = Counter()
    for r in raws:
        failures.update(r["failures"])
    server_cpu = None if cpu0 is None or cpu1 is None else cpu1 - cpu0
    front_cpu = None if fcpu0 is None or fcpu1 is None else fcpu1 - fcpu0
    all_placed = placed >= jobs and seen_at is not None
    return {
        "acks_per_s": round(ok / (last - first), 1) if last > first else 0.0,
        "placed_per_s": round(jobs / (seen_at - first), 1) if all_placed and seen_at else 0.0,
        "p50_ms": _ms(float(np.percentile(latency, 50))),
        "p99_ms": _ms(float(np.percentile(latency, 99))),
        "errors": len(latency) - ok,
        "max_ms": _ms(float(np.max(latency))),
        "jobs": jobs,
        "placed": placed,
        "acked_s": round(last - first, 3),
        "placed_s": round(seen_at - first, 3) if seen_at is not None else None,
        # the last placement by its own event time (the start of the pass that made
        # it): a lower bound of placed_s, where placed_s is at most one poll late
        "placed_by_event_s": (round(last_event - first, 3) if last_event is not None
                              and all_placed else None),
        "server_cpu_ms_per_create": (None if server_cpu is None
                                     else round(server_cpu * 1000 / jobs, 3)),
        "frontend_cpu_ms_per_create": (None if front_cpu is None
                                       else round(front_cpu * 1000 / jobs, 3)),
        "client_cpu_s": round(sum(r["cpu_s"] for r in raws), 3),
        "error_kinds": dict(failures.most_common(5)),
        "server_stopped_by": server.stopped_by,
        "server_log": server.log,
        "params": {"machines": machines, "jobs": jobs, "clients": clients,
                   "frontend": frontend, "task": "1 task of 1 cpu, 0.1 GB",
                   "closed_loop": True, "connections_per_client": 1,
                   "poll_seconds": poll_seconds, "tick": tick,
                   "store": "sqlite (WAL, synchronous=FULL)", "sim_agents": True,
                   "serve_extra": list(serve_extra)},
        "cpu_count": os.cpu_count(),
        "loadavg_1m_at_start": round(loadavg, 2),
        "python": sys.version.split()[0],
        "wall_s": round(time.monotonic() - started, 1),
    }

