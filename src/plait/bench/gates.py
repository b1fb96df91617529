"""``plait bench gates``: staged pushes of many owners, each gated by an HTTP gate,
while one owner's gates are tarpits.

Three processes: ``plait serve --sim-agents``, a farm of gates on one port
(``plait.bench.controllers``: ``ack`` answers 200 at once, ``tarpit`` sends its
headers and then one byte every 2 s, forever) and this one, which plays the owners.

``owners`` owners have an entitlement each and ``jobs`` one-task jobs between them.
The run has two phases of the same workload, one after the other on the same
control plane:

* **with tarpits**: ``tarpits`` jobs of the first owner push again and again behind a
  tarpit gate (each push fails at the gate's deadline, rolls back, and is pushed
  again), while every other job pushes once (one stage of 100 %, no soak) behind an
  ``ack`` gate, ``rate`` pushes a second in a shuffled order;
* **without tarpits**: the same jobs push their next version the same way, and the
  tarpit jobs stay still.

A push's stage time is from its ``PUT`` being acknowledged to its ``push_completed``
event (the stage rolled, its gate asked and passed): the rollout (a simulated task
stops and starts), the wait for the gate and the reconcile between.
``other_owners_push_stage_p99_s`` is its 99th percentile over the owners without
tarpits in the first phase, ``..._without_tarpits`` the same in the second; the
tarpit owner's other jobs are reported apart (their gates share their owner's
slots with its tarpits: ``tarpit_owner_push_stage_p99_s``). ``gates_per_s`` is the
gates the farm answered per second in the first phase.
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

import httpx
import numpy as np

from plait.bench.api import Server
from plait.bench.controllers import farm_process


def _spec(job: str, entitlement: str, version: int) -> dict[str, Any]:
    return {"name": job, "entitlement": entitlement, "task_count": 1, "command": "serve",
            "args": [f"--v{version}"], "resources": {"cpu": 0.1, "memory_gb": 0.1}}


def _p(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)), 3) if values else None


async def _events(admin: httpx.AsyncClient, after: int, limit: int = 1000) -> dict[str, Any]:
    """A page of ``push_completed`` events after the cursor ``after``."""
    r = await admin.get("/v1/events", params={"kind": "push_completed", "limit": limit,
                                              "after": after})
    if r.status_code != 200:
        raise RuntimeError(f"reading the events: {r.status_code} {r.text}")
    page: dict[str, Any] = r.json()
    return page


async def _phase(url: str, admin: httpx.AsyncClient, clients: dict[str, httpx.AsyncClient],
                 jobs: dict[str, str], tarpit_jobs: list[str], farm: str, version: int,
                 rate: float, timeout: float, progress: Any) -> dict[str, Any]:
    """One phase: every job not in ``tarpit_jobs`` pushes ``version`` once; each of
    ``tarpit_jobs`` pushes behind a tarpit until the others are done."""
    owner_of = {job: owner for owner, names in _by_owner(jobs).items() for job in names}
    plain = [j for j in jobs if j not in tarpit_jobs]
    random.Random(version).shuffle(plain)
    # (from the end of the log: only this phase's completions count)
    after = int((await _events(admin, 0, limit=1))["last_seq"])
    started: dict[str, float] = {}
    finished: dict[str, float] = {}
    done = asyncio.Event()
    farm_before = (await admin.get(f"{farm}/stats")).json()["by_mode"]
    t0 = time.time()

    async def push(job: str, gate: str) -> None:
        body = {"spec": _spec(job, jobs[job], version), "stages": [100], "soak_seconds": 0,
                "gate": {"url": f"{farm}/{gate}/{job}"}}
        r = await clients[owner_of[job]].put(f"/v1/jobs/{job}/push", json=body)
        if r.status_code != 200:
            raise RuntimeError(f"push of {job}: {r.status_code} {r.text}")

    async def pusher() -> None:
        gap = 1.0 / rate
        next_at = time.monotonic()
        for job in plain:
            next_at += gap
            await push(job, "ack")
            started[job] = time.time()
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))

    async def tarpit(job: str, turn: int) -> None:
        client = clients[owner_of[job]]
        while not done.is_set():
            await push(job, "tarpit")
            while not done.is_set():
                await asyncio.sleep(1.0)
                status = (await client.get(f"/v1/jobs/{job}/push")).json()["status"]
                if status["phase"] in ("rolled_back", "completed", "aborted"):
                    break
            turn += 1

    async def watcher() -> None:
        nonlocal after
        deadline = time.monotonic() + timeout
        while len(finished) < len(plain) and time.monotonic() < deadline:
            await asyncio.sleep(0.5)
            while True:
                page = await _events(admin, after)
                for event in page["events"]:
                    job = event["job"]
                    if job in started and job not in finished:
                        finished[job] = event["time"]
                if page["next"] is None:
                    if page["events"]:
                        after = max(event["seq"] for event in page["events"])
                    break
                after = page["next"]
            progress(len(finished), len(plain))
        done.set()

    tarpitting = [asyncio.create_task(tarpit(job, 0)) for job in tarpit_jobs]
    await asyncio.gather(pusher(), watcher())
    done.set()
    await asyncio.gather(*tarpitting)
    window = time.time() - t0
    farm_after = (await admin.get(f"{farm}/stats")).json()["by_mode"]
    answered = sum(farm_after.get(m, 0) - farm_before.get(m, 0) for m in farm_after)
    first = next(iter(_by_owner(jobs)))
    stage = {job: finished[job] - started[job] for job in finished}
    others = [s for job, s in stage.items() if owner_of[job] != first]
    mine = [s for job, s in stage.items() if owner_of[job] == first]
    return {"pushes": len(plain), "completed": len(finished), "seconds": round(window, 1),
            "gates_per_s": round(answered / window, 2) if window > 0 else None,
            "other_p50": _p(others, 50), "other_p99": _p(others, 99),
            "other_max": round(max(others), 3) if others else None,
            "tarpit_owner_p99": _p(mine, 99)}


def _by_owner(jobs: dict[str, str]) -> dict[str, list[str]]:
    """Jobs by their entitlement, which is their owner's one (``o{k}``)."""
    out: dict[str, list[str]] = {}
    for job, entitlement in jobs.items():
        out.setdefault(entitlement, []).append(job)
    return out


async def _drive(url: str, token: str, farm: str, *, jobs: int, owners: int, tarpits: int,
                 rate: float, timeout: float, progress: Any) -> dict[str, Any]:
    limits = httpx.Limits(max_connections=20)
    async with httpx.AsyncClient(base_url=url, timeout=60.0, limits=limits, headers={
            "Authorization": f"Bearer {token}"}) as admin:
        clients: dict[str, httpx.AsyncClient] = {}
        names: dict[str, str] = {}
        per_owner = -(-jobs // owners)
        for k in range(owners):
            owner = f"o{k}"
            r = await admin.post("/v1/entitlements", json={
                "name": owner, "owner": owner, "quota": {"machines": per_owner}})
            if r.status_code != 201:
                raise RuntimeError(f"entitlement {owner}: {r.status_code} {r.text}")
            r = await admin.post("/v1/tokens", json={"role": "owner", "name": owner})
            clients[owner] = httpx.AsyncClient(base_url=url, timeout=60.0, limits=limits,
                                               headers={"Authorization":
                                                        f"Bearer {r.json()['token']}"})
        for i in range(jobs):
            owner = f"o{i % owners}"
            names[f"{owner}-j{i // owners:04d}"] = owner
        try:
            sem = asyncio.Semaphore(16)

            async def create(job: str) -> None:
                async with sem:
                    r = await clients[names[job]].post("/v1/jobs", json=_spec(
                        job, names[job], 1))
                    if r.status_code != 201:
                        raise RuntimeError(f"job {job}: {r.status_code} {r.text}")
            await asyncio.gather(*(create(job) for job in names))
            deadline = time.monotonic() + timeout
            while True:  # every task running before the pushes
                listed = (await admin.get("/v1/jobs")).json()
                rows = listed["jobs"] if isinstance(listed, dict) else listed
                if all(row.get("settled") for row in rows) and len(rows) >= jobs:
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError("the jobs did not settle")
                await asyncio.sleep(1.0)
            tarpit_jobs = [j for j in names if names[j] == "o0"][:tarpits]
            with_tarpits = await _phase(url, admin, clients, names, tarpit_jobs, farm, 2,
                                        rate, timeout, progress)
            # the tarpit jobs' last pushes end before the second phase starts
            await asyncio.sleep(6.0)
            without = await _phase(url, admin, clients, names, [], farm, 3, rate, timeout,
                                   progress)
        finally:
            for client in clients.values():
                await client.aclose()
    return {
        "gates_per_s": with_tarpits["gates_per_s"],
        "other_owners_push_stage_p50_s": with_tarpits["other_p50"],
        "other_owners_push_stage_p99_s": with_tarpits["other_p99"],
        "other_owners_push_stage_max_s": with_tarpits["other_max"],
        "other_owners_push_stage_p50_s_without_tarpits": without["other_p50"],
        "other_owners_push_stage_p99_s_without_tarpits": without["other_p99"],
        "other_owners_push_stage_max_s_without_tarpits": without["other_max"],
        "tarpit_owner_push_stage_p99_s": with_tarpits["tarpit_owner_p99"],
        "pushes_completed": with_tarpits["completed"] + without["completed"],
        "pushes": with_tarpits["pushes"] + without["pushes"],
        "phase_seconds": [with_tarpits["seconds"], without["seconds"]],
    }


def run(jobs: int = 1000, owners: int = 5, tarpits: int = 10, rate: float = 12.0,
        machines: int = 250, timeout: float = 600.0,
        progress: Any = lambda done, total: None) -> dict[str, Any]:
    with farm_process() as farm:
        server = Server(machines, tick=0.1, extra=("--controller-networks", "loopback"))
        with server:
            figures = asyncio.run(_drive(server.url, server.token, farm, jobs=jobs,
                                         owners=owners, tarpits=tarpits, rate=rate,
                                         timeout=timeout, progress=progress))
    return {"jobs": jobs, "owners": owners, "tarpits": tarpits, "push_rate": rate,
            "machines": machines, **figures}
