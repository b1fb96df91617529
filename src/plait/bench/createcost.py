"""``plait bench createcost``: what one create costs the shard that takes it, in CPU,
measured in-process where nothing else shares the process's cores.

``plait bench throughput`` runs a real serve, front end and clients on the same cores,
and its figures move with whatever else the box runs (a third from one day to the
next on a shared 2-core box). This benchmark measures the shard's two costs per
create with CPU time instead, in one process over a fresh SQLite store:

* the request path (``request_cpu_ms_per_create``): batches of ``batch`` creates as
  the front end sends them (``POST /v1/shard/creates``, through the control plane's
  whole ASGI app and middleware, the group commit and its fsync), per batch size;
  the process's CPU time over ``jobs`` creates (the committer's thread included), no
  pass running. From two sizes, ``request_cpu_ms_per_batch`` (what a batch costs
  whatever its size) and ``request_cpu_ms_per_item`` (what each create in it adds);
* the pass (``pass_cpu_ms_per_job``): ``jobs`` one-task jobs (1 cpu) created in
  batches of ``pass_batch`` with a pass after each batch, as a loaded serve runs them,
  then passes until every task runs (``--sim-agents``: the simulated agents start
  them); the CPU time of the passes' thread over the jobs' whole lives (placed, then
  running), per job, with the garbage collector set as a running loop sets it
  (``Loop.prepare``) and its collections after passes counted.
  ``pass_stages_ms_per_job``: the pass's stages (the loop's own
  timer, ``plait_pass_stage_duration_seconds``: wall time of a single thread doing
  CPU work) per job, the largest first.

HTTP parsing (uvicorn) and the hop from the front end are not in these figures: the
app is called as an ASGI application. Log lines are written as a serve writes them
(JSON, to a file).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import tempfile
import time
from collections.abc import Iterator, MutableMapping
from pathlib import Path
from typing import Any

from plait.errors import ValidationError

BODY = ('{{"name": "{name}", "entitlement": "bench", "task_count": 1, '
        '"resources": {{"cpu": 1, "memory_gb": 0.1}}, "command": "serve"}}')


def _control_plane(work: Path, machines: int) -> tuple[Any, str]:
    from plait.model import Entitlement, RegionSpec
    from plait.server.controlplane import ControlPlane, ControlPlaneConfig
    from plait.server.serve import store_for

    cp = ControlPlane(store_for(work / "data"), ControlPlaneConfig(
        region=RegionSpec.sized(machines, dcs=1, msbs_per_dc=4, rows_per_msb=1,
                                racks_per_row=2),
        tick_seconds=0.5, sim_agents=True, owner_max_jobs=10**7, owner_max_tasks=10**9))
    token = cp.bootstrap_admin()
    assert token is not None
    cp.commands.define_entitlement(Entitlement.model_validate(
        {"name": "bench", "owner": "bench", "quota": {"machines": machines}}))
    cp.tokens.verify(token)
    return cp, token


def request_path(machines: int, jobs: int, batch: int) -> float:
    """CPU ms per create of ``jobs`` creates sent in batches of ``batch``."""
    from plait.api.app import create_app
    from plait.frontend import batch as wire

    with tempfile.TemporaryDirectory(prefix="plait-bench-createcost-") as tmp:
        cp, token = _control_plane(Path(tmp), machines)
        cp.loop.prepare()  # (the collector as in a serve, whose loop sets it)
        app = create_app(cp, run_loop=False)
        auth = f"Bearer {token}"
        bodies = [wire.encode([wire.Item(auth, f"r{i + k}",
                                         BODY.format(name=f"t{i + k:06d}").encode())
                               for k in range(min(batch, jobs - i))])
                  for i in range(0, jobs, batch)]

        async def send_all() -> float:
            async def call(data: bytes) -> int:
                sent: list[dict[str, Any]] = []

                async def receive() -> dict[str, Any]:
                    return {"type": "http.request", "body": data, "more_body": False}

                async def send(message: MutableMapping[str, Any]) -> None:
                    sent.append(dict(message))

                scope = {"type": "http", "method": "POST", "path": wire.PATH,
                         "raw_path": wire.PATH.encode(), "query_string": b"",
                         "headers": [(b"authorization", auth.encode()),
                                     (b"content-type", wire.CONTENT_TYPE.encode()),
                                     (b"content-length", str(len(data)).encode())],
                         "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2),
                         "scheme": "http", "http_version": "1.1", "root_path": "",
                         "state": {}}
                await app(scope, receive, send)
                return int(sent[0]["status"])

            await call(bodies[0])  # (first calls: imports, caches)
            started = time.process_time()
            for data in bodies[1:]:
                status = await call(data)
                if status != 200:
                    raise RuntimeError(f"a batch of creates was answered {status}")
            return time.process_time() - started

        try:
            spent = asyncio.run(send_all())
            made = cp.creates.written
        finally:
            cp.store.close()
    counted = jobs - min(batch, jobs)
    if made != jobs:
        raise RuntimeError(f"{made} of {jobs} creates were stored")
    return spent * 1000 / max(counted, 1)


def pass_cost(machines: int, jobs: int, pass_batch: int,
              timeout: float = 120.0) -> tuple[float, dict[str, float]]:
    """(CPU ms of the passes per job over its life, the stages' ms per job)."""
    from plait.model import JobSpec

    with tempfile.TemporaryDirectory(prefix="plait-bench-createcost-") as tmp:
        cp, _ = _control_plane(Path(tmp), machines)
        try:
            for _ in range(3):
                cp.loop.step()
            cp.loop.prepare()  # (the collector as a running loop has it)
            before = _stage_sums(cp)
            specs = [JobSpec.model_validate(json.loads(BODY.format(name=f"t{i:06d}")))
                     for i in range(jobs)]
            spent = 0.0

            def step() -> None:
                nonlocal spent
                started = time.thread_time()
                cp.loop.step()
                cp.loop.collect(time.monotonic())  # (as the loop does after each pass)
                spent += time.thread_time() - started

            for i in range(0, jobs, pass_batch):
                for f in [cp.commands.submit_create(s) for s in specs[i:i + pass_batch]]:
                    f.result()
                step()
            deadline = time.monotonic() + timeout
            while _running(cp) < jobs:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"only {_running(cp)} of {jobs} tasks ran within "
                                       f"{timeout:g}s")
                time.sleep(0.02)  # (the simulated agents start tasks as time passes)
                step()
            after = _stage_sums(cp)
        finally:
            cp.store.close()
    stages = {k: round((v - before.get(k, 0.0)) * 1000 / jobs, 4) for k, v in after.items()}
    stages = dict(sorted(((k, v) for k, v in stages.items() if v > 0),
                         key=lambda kv: -kv[1]))
    return spent * 1000 / jobs, stages


@contextlib.contextmanager
def _logging_as_a_serve(path: Path) -> Iterator[None]:
    """Log lines written as a serve writes them (JSON, to a file), unless this process
    has set its logging up already (then as it did); what was set up here is taken
    out after."""
    from plait import logconfig

    if logconfig.configured():
        yield
        return
    logconfig.configure("bench", file=path, fmt="json")
    try:
        yield
    finally:
        logconfig.reset()


def _running(cp: Any) -> int:
    return sum(1 for job in cp.scheduler.jobs.values() for rec in job.tasks.values()
               if rec.state.value == "running" and rec.healthy)


def _stage_sums(cp: Any) -> dict[str, float]:
    sums: dict[str, float] = {}
    for metric in cp.metrics.registry.collect():
        if metric.name != "plait_pass_stage_duration_seconds":
            continue
        for sample in metric.samples:
            if sample.name.endswith("_sum"):
                sums[sample.labels["stage"]] = sample.value
    return sums


def run(machines: int = 1000, jobs: int = 2000, batches: tuple[int, ...] = (1, 4, 16),
        pass_batch: int = 24) -> dict[str, Any]:
    for field, value in (("machines", machines), ("jobs", jobs), ("pass_batch", pass_batch)):
        if not value > 0:
            raise ValidationError(field, f"must be > 0, not {value}")
    if not batches or min(batches) < 1 or max(batches) > 256:
        raise ValidationError("batches", f"each from 1 to 256, not {list(batches)}")
    if jobs <= max(batches):
        raise ValidationError("jobs", f"must be more than the largest batch ({max(batches)})")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="plait-bench-createcost-") as tmp, \
            _logging_as_a_serve(Path(tmp) / "serve.log"):
        per_create = {b: round(request_path(machines, jobs, b), 4) for b in batches}
        pass_ms, stages = pass_cost(machines, jobs, pass_batch)
    lo, hi = min(batches), max(batches)
    per_batch = per_item = None
    if hi > lo:  # cost(b) = per_batch / b + per_item
        per_batch = (per_create[lo] - per_create[hi]) / (1 / lo - 1 / hi)
        per_item = per_create[hi] - per_batch / hi
    return {
        "request_cpu_ms_per_create": {str(b): v for b, v in per_create.items()},
        "request_cpu_ms_per_batch": None if per_batch is None else round(per_batch, 4),
        "request_cpu_ms_per_item": None if per_item is None else round(per_item, 4),
        "pass_cpu_ms_per_job": round(pass_ms, 4),
        "pass_stages_ms_per_job": stages,
        "params": {"machines": machines, "jobs": jobs, "batches": list(batches),
                   "pass_batch": pass_batch, "store": "sqlite (WAL, synchronous=FULL)",
                   "sim_agents": True, "task": "1 task of 1 cpu, 0.1 GB"},
        "python": sys.version.split()[0],
        "wall_s": round(time.monotonic() - started, 1),
    }
