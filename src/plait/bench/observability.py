"""``plait bench observability``: what observability costs on the hot paths.

Each figure runs one workload on two **sides**: ``on``, the control plane with every
observability feature on (``SWITCHES``), and ``off``, the same control plane with
all of them off, as an operator turns them off (``ControlPlaneConfig`` fields,
``plait serve`` options; metrics off is ``NullMetrics``). The sides are interleaved
request by request: each request is made on one side and at once on the other, the
order turning each time, so whatever else the box is doing (other processes, CPU
frequency, a pass under way) weighs on both alike. ``*_p25``/``*_p75`` give the
spread of the rounds' figures; an overhead below zero is noise that beat the cost.

* ``alloc_overhead_pct``: allocation requests through a control plane's allocator
  (the object the scheduler's placement stage calls, with all it records: the
  allocation's own metrics, and the store writes of machines claimed and released),
  in CPU time of the thread that makes them (on a small shared box wall time mostly
  measures who else was running; it is reported beside): each round places ``jobs``
  jobs of ``tasks_per_job`` tasks on a region of ``machines`` machines and frees
  them again, every request a cache miss (a placement computed and committed; a hit
  costs microseconds, and a pass asks again only for tasks still pending). The
  figure is the median over rounds of the on side's CPU time over the off side's,
  less one, in percent; also microseconds per request on each side.
* ``api_overhead_pct``: the REST API of a ``plait serve --sim-agents`` process per
  side (its own process, as an operator runs it: the request's metrics, the store
  writes it makes and the passes it wakes all count), one keep-alive connection to
  each from this process: each round creates ``api_requests`` one-task jobs, each
  acknowledged once durably stored, then gets each of them. The figure is the median
  over every pair of requests of the on side's latency over the off side's, less
  one, in percent (creates and gets; each kind apart too). The rounds are spread
  over ``api_starts`` pairs of fresh servers started in either order in turn (the
  process started first came out slower on a busy box). Also reported: each
  server's CPU per request over the rounds (/proc's clock ticks: coarse).
* ``ui_p99_ms``: the web UI's slowest page's 99th percentile (``plait.bench.ui``,
  which ``plait bench ui`` runs alone) on a region of ``ui_machines`` machines and
  ``ui_jobs`` jobs, served with everything on (the region an operator looks at).

A new observability feature (structured logs, traces) joins the comparison by adding
its ``Switch``: the off side then turns it off with the others, and both figures
include its cost. The figures are medians of short rounds on a small box: a
difference of a percent or two is within their noise.
"""

from __future__ import annotations

import gc
import os
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx

from plait.allocator import AllocationRequest
from plait.model import Entitlement, Quota, RegionSpec, Resources
from plait.server.controlplane import ControlPlane, ControlPlaneConfig


@dataclass(frozen=True)
class Switch:
    """An observability feature the off side turns off: the ``ControlPlaneConfig``
    field that says whether it is on (in-process control planes; None: a feature of
    the process, not of a control plane), and the ``plait serve`` options and
    environment that turn it on and off (served ones)."""

    name: str
    field: str | None
    serve_on: tuple[str, ...]
    serve_off: tuple[str, ...]
    env_on: tuple[tuple[str, str], ...] = ()
    env_off: tuple[tuple[str, str], ...] = ()


#: what the off side turns off (a feature added later adds its switch here). Logs:
#: on, every request's access line and every command's line written (info, JSON to
#: the server's log file); off, only warnings. Traces are off on both sides (off
#: unless configured: their cost when off is nil, decision 72)
SWITCHES: tuple[Switch, ...] = (
    Switch("metrics", "metrics", ("--metrics",), ("--no-metrics",)),
    Switch("logs", None, (), (), (("PLAIT_LOG_LEVEL", "info"),),
           (("PLAIT_LOG_LEVEL", "warning"),)),
)


def side_config(base: ControlPlaneConfig, on: bool) -> ControlPlaneConfig:
    """``base`` with every switch on, or every switch off."""
    switched: dict[str, Any] = {s.field: on for s in SWITCHES if s.field is not None}
    return replace(base, **switched)


def side_env(on: bool) -> dict[str, str]:
    """The environment of a side's ``plait serve``."""
    return {k: v for s in SWITCHES for k, v in (s.env_on if on else s.env_off)}


def side_serve_options(on: bool) -> tuple[str, ...]:
    """The ``plait serve`` options of a side."""
    return tuple(o for s in SWITCHES for o in (s.serve_on if on else s.serve_off))


def overhead(on: list[float], off: list[float]) -> dict[str, float]:
    """The rounds' on/off ratios as percentages over 1: their median and quartiles
    (the spread the noise gave). A round whose off side measured nothing (CPU time is
    counted in ticks: a tiny round can read 0) is left out; with none left, 0."""
    pcts = [(a / b - 1) * 100 for a, b in zip(on, off, strict=True) if b > 0]
    return quartiles(pcts or [0.0])


def quartiles(pcts: list[float]) -> dict[str, float]:
    """The median (``pct``) and quartiles (``p25``, ``p75``) of ``pcts``."""
    if len(pcts) == 1:
        return {"pct": round(pcts[0], 2), "p25": round(pcts[0], 2), "p75": round(pcts[0], 2)}
    q1, q2, q3 = statistics.quantiles(pcts, n=4, method="inclusive")
    return {"pct": round(q2, 2), "p25": round(q1, 2), "p75": round(q3, 2)}


# -- the allocation path --------------------------------------------------------------------
TASK = Resources(cpu=1, memory_gb=2)


@contextmanager
def _control_planes(machines: int) -> Iterator[dict[bool, ControlPlane]]:
    """A control plane per side over a fresh SQLite store each (loops not running)."""
    region = RegionSpec.sized(machines, dcs=2, msbs_per_dc=4, rows_per_msb=2,
                              racks_per_row=4)
    from plait.server.serve import store_for

    with tempfile.TemporaryDirectory(prefix="plait-bench-observability-") as work:
        cps: dict[bool, ControlPlane] = {}
        try:
            for on in (True, False):
                cps[on] = ControlPlane(store_for(Path(work) / ("on" if on else "off")),
                                       side_config(ControlPlaneConfig(region=region), on))
            yield cps
        finally:
            for cp in cps.values():
                cp.store.close()


def allocation(machines: int = 2000, jobs: int = 50, tasks_per_job: int = 10,
               rounds: int = 40) -> dict[str, Any]:
    """``alloc_*``: CPU microseconds per allocation request on each side (and wall)."""
    place = [AllocationRequest.of(f"job{k:05d}", "bench", TASK, allocate=range(tasks_per_job))
             for k in range(jobs)]
    free = [AllocationRequest.of(f"job{k:05d}", "bench", TASK, free=range(tasks_per_job))
            for k in range(jobs)]
    with _control_planes(machines) as cps:
        for cp in cps.values():
            cp.allocator.define(Entitlement(name="bench", owner="bench",
                                            quota=Quota(machines=machines)))
        placed = {True: 0, False: 0}
        wall: dict[bool, list[float]] = {True: [], False: []}
        allocators = {on: cps[on].allocator.allocate for on in cps}
        cpu_of, wall_of = time.thread_time, time.perf_counter

        def one_round(r: int) -> tuple[float, float, float, float]:
            """Every request of the round on both sides, each request on one side
            then at once on the other (the order turning each time): the CPU and
            wall microseconds per request of each side."""
            cpu = {True: 0.0, False: 0.0}
            took = {True: 0.0, False: 0.0}
            gc.collect()
            gc.disable()
            try:
                for i, request in enumerate(place + free):
                    for on in ((True, False) if (i + r) % 2 == 0 else (False, True)):
                        allocate = allocators[on]
                        w, c = wall_of(), cpu_of()
                        result = allocate(request)
                        c, w = cpu_of() - c, wall_of() - w
                        cpu[on] += c
                        took[on] += w
                        placed[on] += len(result.tasks) if i < jobs else 0
            finally:
                gc.enable()
            n = 2 * jobs / 1e6
            return cpu[True] / n, cpu[False] / n, took[True] / n, took[False] / n

        one_round(-1)  # warm both: code paths, compiled policies
        on: list[float] = []
        off: list[float] = []
        for r in range(rounds):
            cpu_on, cpu_off, wall_on, wall_off = one_round(r)
            on.append(cpu_on)
            off.append(cpu_off)
            wall[True].append(wall_on)
            wall[False].append(wall_off)
        hits = {s: cps[s].allocator.cache.hits for s in cps}
    if placed[True] != placed[False] or placed[True] != (rounds + 1) * jobs * tasks_per_job:
        raise RuntimeError(f"the sides placed different work: {placed}")
    o, w = overhead(on, off), overhead(wall[True], wall[False])
    return {
        "alloc_overhead_pct": o["pct"],
        "alloc_overhead_pct_p25": o["p25"], "alloc_overhead_pct_p75": o["p75"],
        "alloc_us_on": round(statistics.median(on), 2),
        "alloc_us_off": round(statistics.median(off), 2),
        "alloc_per_s_on": round(1e6 / statistics.median(on), 1),
        "alloc_per_s_off": round(1e6 / statistics.median(off), 1),
        "alloc_wall_overhead_pct": w["pct"],
        "alloc_wall_us_on": round(statistics.median(wall[True]), 2),
        "alloc_wall_us_off": round(statistics.median(wall[False]), 2),
        "alloc_machines": machines, "alloc_jobs": jobs, "alloc_tasks_per_job": tasks_per_job,
        "alloc_requests_per_round": 2 * jobs, "alloc_rounds": rounds,
        "alloc_cache_hits": hits[True] + hits[False],
    }


# -- the API request path ---------------------------------------------------------------------
JOB = {"entitlement": "bench", "task_count": 1, "command": "serve",
       "resources": {"cpu": 0.1, "memory_gb": 0.1}}


def api(machines: int = 200, requests: int = 200, rounds: int = 12, starts: int = 4,
        tick: float = 0.5) -> dict[str, Any]:
    """``api_*``: the client's milliseconds per request (a job create, a get) on each
    side, their overhead over the pairs, and the serving processes' CPU. The rounds
    are spread over ``starts`` pairs of fresh servers, started in turn in either order
    (where a process lands on a shared box weighs on both sides alike)."""
    took: dict[str, dict[bool, list[float]]] = {
        kind: {True: [], False: []} for kind in ("create", "get")}
    cpu: dict[bool, list[float]] = {True: [], False: []}
    by_round: list[float] = []
    series: dict[bool, int] = {True: 0, False: 0}
    per_start = -(-rounds // starts)
    for start in range(starts):
        first = start % 2 == 0
        n = min(per_start, rounds - start * per_start)
        if n > 0:
            _api_rounds(machines, requests, n, tick, (first, not first), took, cpu,
                        by_round, series)
    if not series[True] or series[False]:
        raise RuntimeError(f"the sides did not differ as switched: {series[True]} series "
                           f"with metrics on, {series[False]} off")  # (samples)

    def pct(kinds: tuple[str, ...]) -> float:
        """The median over the pairs of on/off, less one, in percent."""
        ratios = [a / b for k in kinds for a, b in zip(took[k][True], took[k][False],
                                                       strict=True)]
        return round((statistics.median(ratios) - 1) * 100, 2)

    spread = quartiles(by_round)
    c = overhead(cpu[True], cpu[False])
    return {
        "api_overhead_pct": pct(("create", "get")),
        "api_overhead_pct_p25": spread["p25"], "api_overhead_pct_p75": spread["p75"],
        "api_create_overhead_pct": pct(("create",)),
        "api_get_overhead_pct": pct(("get",)),
        "api_create_ms_on": round(statistics.median(took["create"][True]), 3),
        "api_create_ms_off": round(statistics.median(took["create"][False]), 3),
        "api_get_ms_on": round(statistics.median(took["get"][True]), 3),
        "api_get_ms_off": round(statistics.median(took["get"][False]), 3),
        "api_cpu_overhead_pct": c["pct"],
        "api_cpu_ms_on": round(statistics.median(cpu[True]), 3),
        "api_cpu_ms_off": round(statistics.median(cpu[False]), 3),
        "api_machines": machines, "api_requests_per_round": 2 * requests,
        "api_rounds": rounds, "api_server_starts": starts,
        "api_metrics_samples_on": series[True],
    }


def _api_rounds(machines: int, requests: int, rounds: int, tick: float,
                order: tuple[bool, bool], took: dict[str, dict[bool, list[float]]],
                cpu: dict[bool, list[float]], by_round: list[float],
                series: dict[bool, int]) -> None:
    """``rounds`` rounds on a pair of fresh servers started in ``order``: each
    request's milliseconds into ``took``, each side's CPU per request into ``cpu``,
    each round's median pair overhead into ``by_round``, the most samples each
    side's /metrics showed at the end into ``series``."""
    from plait.bench.api import Server

    servers = {on: Server(machines, tick=tick, extra=side_serve_options(on), env=side_env(on))
               for on in order}
    try:
        clients = {}
        for side, server in servers.items():
            server.start()
            server.entitlement()
            clients[side] = httpx.Client(base_url=server.url, timeout=60, headers={
                "Authorization": f"Bearer {server.token}"})

        def call(on: bool, kind: str, name: str) -> float:
            started = time.perf_counter()
            if kind == "create":
                reply, status = clients[on].post("/v1/jobs", json={"name": name, **JOB}), 201
            else:
                reply, status = clients[on].get(f"/v1/jobs/{name}"), 200
            ms = (time.perf_counter() - started) * 1000
            if reply.status_code != status:
                raise RuntimeError(f"{kind} {name}: {reply.status_code} {reply.text[:300]}")
            return ms

        def one_round(r: int) -> None:
            """Each create, then each get, on one side and at once on the other (the
            order turning each time)."""
            names = [f"obs-{r + 1}-{i:04d}" for i in range(requests)]
            used = {s: _cpu(servers[s]) for s in servers}
            pairs: list[float] = []
            for kind in ("create", "get"):
                for i, name in enumerate(names):
                    ms = {on: call(on, kind, name)
                          for on in ((True, False) if (i + r) % 2 == 0 else (False, True))}
                    if r >= 0:
                        took[kind][True].append(ms[True])
                        took[kind][False].append(ms[False])
                        pairs.append(ms[True] / ms[False])
            if r >= 0:
                for on in (True, False):
                    cpu[on].append((_cpu(servers[on]) - used[on]) / (2 * requests) * 1000)
                by_round.append((statistics.median(pairs) - 1) * 100)

        one_round(-1)  # warm both: connections, code paths
        for r in range(rounds):
            one_round(r)
        for side, client in clients.items():
            series[side] = max(series[side], _series(client))
            client.close()
    finally:
        for server in servers.values():
            server.stop()


def _cpu(server: Any) -> float:
    """CPU seconds a server's process has used (all its threads, living or not)."""
    from plait.harness.region import cpu_seconds

    used = cpu_seconds(server.proc.pid)
    if used is None:
        raise RuntimeError("no /proc: the API figure needs the server's CPU time (Linux)")
    return used


def _series(client: httpx.Client) -> int:
    """Samples a side's /metrics shows (none with metrics off)."""
    reply = client.get("/metrics")
    reply.raise_for_status()
    return sum(1 for line in reply.text.splitlines() if line and not line.startswith("#"))


def run(machines: int = 2000, jobs: int = 50, tasks_per_job: int = 10, alloc_rounds: int = 40,
        api_machines: int = 200, api_requests: int = 200, api_rounds: int = 12,
        api_starts: int = 4, ui_machines: int = 1000, ui_jobs: int = 200,
        ui_requests: int = 50) -> dict[str, Any]:
    """Every figure, in one JSON-ready object."""
    figures: dict[str, Any] = {"switches": [s.name for s in SWITCHES],
                               "cpus": os.cpu_count(), "load_average_1m": _load()}
    figures.update(allocation(machines=machines, jobs=jobs, tasks_per_job=tasks_per_job,
                              rounds=alloc_rounds))
    figures.update(api(machines=api_machines, requests=api_requests, rounds=api_rounds,
                       starts=api_starts))
    from plait.bench import ui

    pages = ui.run(machines=ui_machines, jobs=ui_jobs, requests=ui_requests,
                   env=side_env(True))
    figures.update({"ui_p99_ms": pages["ui_p99_ms"], "ui_p50_ms": pages["ui_p50_ms"],
                    "ui_machines": ui_machines, "ui_jobs": ui_jobs,
                    "ui_pages": {p: f["p99_ms"] for p, f in pages["pages"].items()}})
    return figures


def _load() -> float | None:
    """The host's 1-minute load average as the run starts (a busy box widens the
    spread), or None where there is none."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None
