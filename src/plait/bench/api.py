"""``plait bench api``: acknowledged, durable job creates per second through the REST API.

The server is ``plait serve`` in a process of its own (a fresh SQLite data dir in a
temporary directory, a free loopback port, ``--sim-agents``, a region of ``machines``
machines), exactly as an operator would run it. The load generator runs in another
process (so it does not share a GIL with the server or with this orchestrating
process): an asyncio loop driving ``connections`` keep-alive HTTP/1.1 connections, each
sending one request at a time (a lean client on asyncio streams; see
``plait.bench.http1.Connection``).
Each run reports the generator's CPU use and how late it sent (``send_lag_*``), to show
it is not the bottleneck, and the CPU the rest of the host used meanwhile
(``other_cpu_util``: a noisy neighbour on a small box).

The load is OPEN-LOOP: request ``i`` is due at ``start + i / rate`` and is launched then
whether or not earlier ones have completed; a request that waits for a free connection
waits inside its own latency. Latency is measured from the due time to the response,
so a stalled server (or a late generator) shows in the figures instead of slowing the
offered load down (no coordinated omission). Each request is ``POST /v1/jobs`` of a new
one-task job of 0.1 cpu / 0.1 GB; the figure is the 201, which the API returns once the
job record is durably stored (placement follows asynchronously). An error is any other
status, a transport error, or no answer within ``timeout`` seconds (counted at that
latency).

The first ``warmup_seconds`` of every run are sent at the same rate but not measured
(connections open, code paths warm). ``requests`` counts the measured requests only.

``achieved_per_s`` is 201s per second over the span of the answers: the offered rate
while latency holds steady, less when a backlog builds. ``p99_ms_by_quarter`` shows the
drift over a run.

``max_sustained_per_s`` is the highest offered rate at which a run of
``step_seconds`` (the base run counts too) had ``p99 <= p99_limit_ms``, no errors, and
kept up: ``achieved_per_s >= min_achieved_ratio * offered`` (0.9 by default; 0 drops
the condition). A short step can otherwise pass a rate the server does not sustain,
its backlog still under a second when the step ends. The search starts from the base
run's verdict: upward it doubles the rate until a run fails (or ``max_rate``),
downward it halves it (down to ``min_rate``); then it bisects (geometric midpoints)
until the bracket is within ``precision`` of its low end, all within
``search_budget_seconds``. Every run, the base run and each search step, gets a
fresh server, so jobs left over (and any backlog) from one rate do not weigh on the
next.
"""

from __future__ import annotations

import asyncio
import functools
import json
import math
import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Executor, ProcessPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from plait.bench.http1 import Connection, HttpError
from plait.errors import ValidationError
from plait.harness.region import cpu_seconds, wait_healthy

#: the job every request creates (the name is filled in per request)
JOB_BODY = ('{{"name": "{name}", "entitlement": "bench", "task_count": 1, '
            '"resources": {{"cpu": 0.1, "memory_gb": 0.1}}, "command": "serve"}}')
#: a server run (start, entitlement, load, stop) beyond its load, for the time budget
RUN_OVERHEAD_S = 4.0


# -- the server ---------------------------------------------------------------------------------
def _host_busy_seconds() -> float | None:
    """CPU seconds all processes of the host have spent busy so far, or None off Linux."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    except OSError:
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(f) for f in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def terminate(proc: subprocess.Popen[bytes], grace: float) -> str:
    """Stop a running process: SIGTERM, then SIGKILL after ``grace`` seconds; which
    one stopped it ("sigterm" or "kill")."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(grace)
        return "sigterm"
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return "kill"


def _worth(line: str) -> bool:
    """A line of the server's log that is more than information: a warning or an
    error, or text that is not a log line (a traceback)."""
    if not line.strip():
        return False
    try:
        record = json.loads(line)
    except ValueError:
        return True
    return not isinstance(record, dict) or record.get("level") not in ("debug", "info")


class Server:
    """``plait serve`` in a child process over a fresh data dir; stopped with SIGTERM,
    then killed if it has not exited within ``grace`` seconds."""

    def __init__(self, machines: int, tick: float = 0.5, start_timeout: float = 60.0,
                 grace: float = 10.0, sim_agents: bool = True,
                 extra: tuple[str, ...] = (), env: dict[str, str] | None = None) -> None:
        """``sim_agents``: simulated agents on every machine (else machines are up only
        while something heartbeats for them); ``extra``: more ``plait serve`` options."""
        self.machines, self.tick = machines, tick
        self.sim_agents, self.extra = sim_agents, extra
        #: more environment for the server (PLAIT_LOG_LEVEL, say)
        self.env = dict(env or {})
        self.start_timeout, self.grace = start_timeout, grace
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""
        self.token = ""
        #: the exit status (uvicorn exits by re-raising SIGTERM after a graceful
        #: shutdown, so -15 is a clean stop) and how it was stopped (sigterm, kill)
        self.exit_code: int | None = None
        self.stopped_by: str | None = None
        self.log: list[str] = []
        self._tmp = tempfile.TemporaryDirectory(prefix="plait-bench-api-")
        self.dir = Path(self._tmp.name)

    def _log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join((self.dir / "server.log").read_text().splitlines()[-lines:])
        except OSError:
            return ""

    def start(self) -> Server:
        from plait.testing import free_port

        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        data = self.dir / "data"
        env = {**os.environ, "PLAIT_CONFIG": str(self.dir / "config.yaml"),
               "PYTHONUNBUFFERED": "1", **self.env}
        cmd = [sys.executable, "-m", "plait.cli.main", "serve", "--data-dir", str(data),
               "--host", "127.0.0.1", "--port", str(port), "--machines", str(self.machines),
               *(["--sim-agents"] if self.sim_agents else []), "--tick", str(self.tick),
               "--no-write-config",
               # (a benchmark's jobs are one owner's: no limit of a tenant's)
               "--owner-max-jobs", "10000000", "--owner-max-tasks", "1000000000", *self.extra]
        with open(self.dir / "server.log", "wb") as log:
            self.proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT)
        wait_healthy(self.proc, self.url, self.start_timeout, "plait serve", self._log_tail)
        self.token = (data / "admin-token").read_text().strip()
        return self

    def entitlement(self) -> None:
        r = httpx.post(f"{self.url}/v1/entitlements", timeout=30.0,
                       headers={"Authorization": f"Bearer {self.token}"},
                       json={"name": "bench", "owner": "bench",
                             "quota": {"machines": self.machines}})
        if r.status_code not in (200, 201):
            raise RuntimeError(f"creating the entitlement: {r.status_code} {r.text}")

    def cpu_seconds(self) -> float | None:
        return None if self.proc is None else cpu_seconds(self.proc.pid)

    def stop(self) -> None:
        proc = self.proc
        if proc is not None and proc.poll() is None:
            self.stopped_by = terminate(proc, self.grace)
        if proc is not None:
            self.exit_code = proc.returncode
        # what the server said beyond its info lines (warnings, tracebacks)
        self.log = [line for line in self._log_tail(200).splitlines() if _worth(line)][-5:]
        self._tmp.cleanup()

    def __enter__(self) -> Server:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()


# -- the load generator (runs in its own process) -----------------------------------------------
def _ready() -> int:
    """A no-op, to have the generator process started before any timing."""
    return os.getpid()


def load(url: str, token: str, rate: float, seconds: float, warmup: float, connections: int,
         timeout: float, prefix: str) -> dict[str, Any]:
    """Send ``POST /v1/jobs`` open-loop at ``rate`` per second for ``warmup + seconds``;
    return the raw figures of the requests due after the warm-up."""
    return asyncio.run(_drive(url, token, rate, seconds, warmup, connections, timeout, prefix))


async def _drive(url: str, token: str, rate: float, seconds: float, warmup: float,
                 connections: int, timeout: float, prefix: str) -> dict[str, Any]:
    """A scheduler puts request ``i`` on a queue at its due time; ``connections``
    workers, one per connection, take requests off it in order and send them. A
    request that finds every connection busy waits in the queue, inside its latency;
    one that waited ``timeout`` seconds is counted as timed out without being sent (so
    an overloaded run ends within ``timeout`` of its last due time)."""
    target = httpx.URL(url)
    host, port = target.host, target.port or 80
    head = ("POST /v1/jobs HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: Bearer {token}"
            "\r\nContent-Type: application/json\r\nContent-Length: {length}\r\n\r\n")
    n_warm = round(warmup * rate)
    n = n_warm + max(1, round(seconds * rate))
    due_at = np.zeros(n)
    latency = np.full(n, np.nan)
    lag = np.full(n, np.nan)  # how late the scheduler queued the request
    wait = np.full(n, np.nan)  # how long it then waited for a connection
    status = np.zeros(n, np.int32)
    failures: Counter[str] = Counter()
    completed = max_outstanding = 0
    clock = time.perf_counter
    queue: asyncio.Queue[int | None] = asyncio.Queue()

    async def send(conn: Connection, i: int) -> None:
        waited = clock() - due_at[i]
        wait[i] = waited - lag[i]
        if waited >= timeout:
            status[i] = -1
            failures["timeout"] += 1
            return
        body = JOB_BODY.format(name=f"{prefix}{i:07d}").encode()
        data = head.format(host=host, port=port, token=token, length=len(body)).encode() + body
        try:
            async with asyncio.timeout(timeout - waited):
                code, answer = await conn.request(data)
            status[i] = code
            if code != 201:
                failures[f"http {code}: {answer[:120].decode(errors='replace')}"] += 1
        except TimeoutError:
            status[i] = -1
            failures["timeout"] += 1
        except (OSError, EOFError, HttpError, ValueError) as exc:
            status[i] = -1
            failures[type(exc).__name__] += 1

    async def worker() -> None:
        nonlocal completed
        conn = Connection(host, port)
        try:
            while (i := await queue.get()) is not None:
                await send(conn, i)
                latency[i] = clock() - due_at[i]
                completed += 1
        finally:
            conn.close()

    workers = [asyncio.create_task(worker()) for _ in range(connections)]
    cpu0 = time.process_time()
    start = clock() + 0.05
    for i in range(n):
        due = due_at[i] = start + i / rate
        delay = due - clock()
        if delay > 0:
            await asyncio.sleep(delay)
        elif i % 16 == 0:
            await asyncio.sleep(0)  # behind schedule: let the workers run too
        lag[i] = clock() - due
        queue.put_nowait(i)
        max_outstanding = max(max_outstanding, i + 1 - completed)
    last_queued = clock()
    for _ in workers:
        queue.put_nowait(None)
    await asyncio.gather(*workers)
    end = clock()
    cpu = time.process_time() - cpu0

    measured = slice(n_warm, n)
    done = due_at[measured] + latency[measured]
    return {
        "latency": latency[measured], "status": status[measured], "lag": lag[measured],
        "wait": wait[measured], "first_due": float(due_at[n_warm]),
        "last_due": float(due_at[-1]), "first_done": float(np.min(done)),
        "last_done": float(np.max(done)),
        "failures": dict(failures.most_common(5)), "max_outstanding": max_outstanding,
        "schedule_overrun_s": max(0.0, last_queued - due_at[-1]),
        "generator_cpu_s": cpu, "generator_wall_s": end - start,
    }


# -- one run and its figures --------------------------------------------------------------------
def _ms(seconds: float) -> float:
    return round(seconds * 1000, 2)


def _run_once(gen: Executor, rate: float, seconds: float, warmup: float, connections: int,
              machines: int, timeout: float, tick: float, prefix: str) -> dict[str, Any]:
    with Server(machines, tick) as server:
        server.entitlement()
        cpu0, host0, t0 = server.cpu_seconds(), _host_busy_seconds(), time.monotonic()
        raw = gen.submit(load, server.url, server.token, rate, seconds, warmup, connections,
                         timeout, prefix).result()
        cpu1, host1 = server.cpu_seconds(), _host_busy_seconds()
        wall = time.monotonic() - t0
    server_cpu = None if cpu0 is None or cpu1 is None else cpu1 - cpu0
    # CPU the rest of the host used meanwhile (other processes: a noisy neighbour)
    other = None if host0 is None or host1 is None or server_cpu is None \
        else max(0.0, (host1 - host0 - server_cpu - raw["generator_cpu_s"]) / wall)
    latency = raw["latency"]
    status = raw["status"]
    requests = len(latency)
    ok = int(np.count_nonzero(status == 201))
    # answers per second over the span of the answers (plus one interval: n requests are
    # due over (n - 1) / rate seconds): the offered rate while latency holds steady, less
    # when a backlog grows
    span = raw["last_done"] - raw["first_done"] + 1 / rate
    quarters = np.array_split(latency, 4)
    return {
        "offered_per_s": round(rate, 2),
        "seconds": seconds,
        "requests": requests,
        "ok": ok,
        "errors": requests - ok,
        "achieved_per_s": round(ok / span, 2) if span > 0 else 0.0,
        "p50_ms": _ms(float(np.percentile(latency, 50))),
        "p90_ms": _ms(float(np.percentile(latency, 90))),
        "p99_ms": _ms(float(np.percentile(latency, 99))),
        "max_ms": _ms(float(np.max(latency))),
        "mean_ms": _ms(float(np.mean(latency))),
        # p99 of each quarter of the measured requests, in order: drift shows a backlog
        # building, or a server slowing down as jobs pile up
        "p99_ms_by_quarter": [_ms(float(np.percentile(q, 99))) if len(q) else None
                              for q in quarters],
        # requests due but not answered yet (sent, or waiting for a connection), at most
        "max_outstanding": raw["max_outstanding"],
        "error_kinds": raw["failures"],
        # how late the generator queued requests, and how long they then waited for a
        # free connection (both already inside the latencies)
        "send_lag_p99_ms": _ms(float(np.percentile(raw["lag"], 99))),
        "send_lag_max_ms": _ms(float(np.max(raw["lag"]))),
        "connection_wait_p99_ms": _ms(float(np.percentile(raw["wait"], 99))),
        "generator_cpu_util": round(raw["generator_cpu_s"] / raw["generator_wall_s"], 3),
        "server_cpu_util": None if server_cpu is None else round(server_cpu / wall, 3),
        "other_cpu_util": None if other is None else round(other, 3),
        "server_exit_code": server.exit_code,
        "server_stopped_by": server.stopped_by,
        "server_log": server.log,
    }


def _passes(step: dict[str, Any], p99_limit_ms: float, min_achieved_ratio: float) -> bool:
    return bool(step["errors"] == 0 and step["p99_ms"] <= p99_limit_ms
                and step["achieved_per_s"] >= min_achieved_ratio * step["offered_per_s"])


def run(rate: float = 200.0, seconds: float = 20.0, connections: int = 50, machines: int = 2000,
        sustained_search: bool = True, max_rate: float = 6400.0, step_seconds: float = 5.0,
        warmup_seconds: float = 1.0, search_budget_seconds: float = 240.0,
        p99_limit_ms: float = 1000.0, min_achieved_ratio: float = 0.9, min_rate: float = 5.0,
        precision: float = 0.1, timeout: float = 10.0, tick: float = 0.5) -> dict[str, Any]:
    for field, value in (("rate", rate), ("seconds", seconds), ("connections", connections),
                         ("machines", machines), ("max_rate", max_rate),
                         ("step_seconds", step_seconds), ("timeout", timeout),
                         ("min_rate", min_rate), ("precision", precision)):
        if not value > 0:
            raise ValidationError(field, f"must be > 0, not {value}")
    if not 0 <= min_achieved_ratio <= 1:
        raise ValidationError("min_achieved_ratio", f"must be in [0, 1], not {min_achieved_ratio}")
    if warmup_seconds < 0:
        raise ValidationError("warmup_seconds", f"must be >= 0, not {warmup_seconds}")
    started, loadavg = time.monotonic(), os.getloadavg()[0]
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=spawn) as gen:
        gen.submit(_ready).result()
        counter = iter(range(1_000_000))

        def once(r: float, s: float) -> dict[str, Any]:
            return _run_once(gen, r, s, warmup_seconds, connections, machines, timeout, tick,
                             prefix=f"b{next(counter):02d}-")

        passes = functools.partial(_passes, p99_limit_ms=p99_limit_ms,
                                   min_achieved_ratio=min_achieved_ratio)
        base = once(rate, seconds)
        base["passed"] = passes(base)
        search: dict[str, Any] | None = None
        if sustained_search:
            search = _search(lambda r: once(r, step_seconds), rate, base["passed"], passes,
                             max_rate, min_rate, precision,
                             deadline=time.monotonic() + search_budget_seconds,
                             step_cost=step_seconds + warmup_seconds + timeout + RUN_OVERHEAD_S)
    result: dict[str, Any] = {
        "requests": base["requests"],
        "concurrency": connections,
        "offered_per_s": base["offered_per_s"],
        "achieved_per_s": base["achieved_per_s"],
        "errors": base["errors"],
        "p50_ms": base["p50_ms"],
        "p99_ms": base["p99_ms"],
        "max_ms": base["max_ms"],
        "max_sustained_per_s": None if search is None else search["max_sustained_per_s"],
        "run": base,
        "search": search,
        "params": {"rate": rate, "seconds": seconds, "connections": connections,
                   "machines": machines, "sustained_search": sustained_search,
                   "max_rate": max_rate, "step_seconds": step_seconds,
                   "warmup_seconds": warmup_seconds,
                   "search_budget_seconds": search_budget_seconds,
                   "p99_limit_ms": p99_limit_ms, "min_achieved_ratio": min_achieved_ratio,
                   "min_rate": min_rate, "precision": precision,
                   "timeout": timeout, "tick": tick, "task": "1 task of 0.1 cpu, 0.1 GB",
                   "store": "sqlite (WAL, synchronous=FULL)", "sim_agents": True},
        "cpu_count": os.cpu_count(),
        "loadavg_1m_at_start": round(loadavg, 2),
        "python": sys.version.split()[0],
        "wall_s": round(time.monotonic() - started, 1),
    }
    return result


def _search(probe: Callable[[float], dict[str, Any]], rate: float, base_ok: bool,
            passes: Callable[[dict[str, Any]], bool], max_rate: float, min_rate: float,
            precision: float, deadline: float, step_cost: float) -> dict[str, Any]:
    """The highest passing offered rate, bracketed from the base run's verdict."""
    steps: list[dict[str, Any]] = []
    lo: float | None = rate if base_ok else None
    hi: float | None = None if base_ok else rate
    stopped = "precision"

    def time_left() -> bool:
        return time.monotonic() + step_cost <= deadline

    def test(r: float) -> bool:
        step = probe(r)
        step["passed"] = passes(step)
        steps.append({k: step[k] for k in (
            "offered_per_s", "passed", "requests", "errors", "achieved_per_s", "p50_ms",
            "p99_ms", "max_ms", "p99_ms_by_quarter", "max_outstanding", "send_lag_p99_ms",
            "connection_wait_p99_ms", "generator_cpu_util", "server_cpu_util",
            "other_cpu_util",
            "error_kinds")})
        return bool(step["passed"])

    if lo is not None:  # upward: double until a run fails
        while hi is None:
            if lo >= max_rate:
                stopped = "max_rate"
                break
            if not time_left():
                stopped = "budget"
                break
            r = min(lo * 2, max_rate)
            if test(r):
                lo = r
            else:
                hi = r
    else:  # downward: halve until a run passes
        r = rate
        while lo is None:
            if r / 2 < min_rate:
                stopped = "min_rate"
                break
            if not time_left():
                stopped = "budget"
                break
            r /= 2
            if test(r):
                lo = r
            else:
                hi = r
    while lo is not None and hi is not None and hi - lo > max(precision * lo, 1.0):
        if not time_left():
            stopped = "budget"
            break
        r = float(round(math.sqrt(lo * hi)))
        if r <= lo or r >= hi:
            break
        if test(r):
            lo = r
        else:
            hi = r
    return {"max_sustained_per_s": lo if lo is not None else 0.0,
            "lowest_failing_per_s": hi, "stopped_by": stopped, "steps": steps}
