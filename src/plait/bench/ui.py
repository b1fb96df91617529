"""How fast the web UI's pages answer (``ui_p99_ms``): ``plait serve --sim-agents`` in
its own process with a region of ``machines`` machines and ``jobs`` jobs (some of
them updated, so their ops charts have bars), each page fetched ``requests`` times
one after another by a logged-in client over loopback HTTP, as a browser would."""

from __future__ import annotations

import time
from typing import Any

import httpx

from plait.bench.api import Server
from plait.testing import wait_for

PAGES = ("/ui/", "/ui/entitlements", "/ui/jobs", "/ui/jobs/job-0", "/ui/jobs/job-0/gantt",
         "/ui/machines", "/ui/events")


def _pct(samples: list[float], p: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def run(machines: int = 1000, jobs: int = 200, tasks_per_job: int = 5, updated: int = 20,
        requests: int = 50, entitlements: int = 10,
        env: dict[str, str] | None = None) -> dict[str, Any]:
    """``env``: more environment for the server (its log level, say)."""
    with Server(machines, tick=0.2, env=env) as server:
        api = httpx.Client(base_url=server.url, timeout=60.0,
                           headers={"Authorization": f"Bearer {server.token}"})
        per = machines // entitlements
        for e in range(entitlements):
            r = api.post("/v1/entitlements", json={"name": f"ent-{e}", "owner": f"team-{e}",
                                                   "quota": {"machines": per}})
            r.raise_for_status()
        spec = {"task_count": tasks_per_job, "command": "serve",
                "resources": {"cpu": 1, "memory_gb": 1}, "update": {"max_unavailable": 1}}
        for j in range(jobs):
            r = api.post("/v1/jobs", json={**spec, "name": f"job-{j}",
                                           "entitlement": f"ent-{j % entitlements}"})
            r.raise_for_status()

        def settled() -> bool:
            return all(j["settled"] for j in api.get("/v1/jobs").json()["jobs"])
        wait_for(settled, 300, "every job placed and running", poll=0.2)
        for j in range(updated):
            r = api.put(f"/v1/jobs/job-{j}", json={**spec, "name": f"job-{j}",
                                                    "entitlement": f"ent-{j % entitlements}",
                                                    "env": {"RELEASE": "2"}})
            r.raise_for_status()
        wait_for(settled, 300, "the updates done", poll=0.2)

        ui = httpx.Client(base_url=server.url, timeout=60.0)
        r = ui.post("/ui/login", data={"token": server.token})
        if r.status_code != 303:
            raise RuntimeError(f"logging in to the UI: {r.status_code} {r.text[:200]}")
        pages: dict[str, dict[str, float]] = {}
        every: list[float] = []
        for page in PAGES:
            for _ in range(3):  # warm
                ui.get(page).raise_for_status()
            samples = []
            for _ in range(requests):
                t0 = time.perf_counter()
                r = ui.get(page)
                samples.append((time.perf_counter() - t0) * 1000)
                r.raise_for_status()
            every.extend(samples)
            pages[page] = {"p50_ms": round(_pct(samples, 50), 2),
                           "p99_ms": round(_pct(samples, 99), 2),
                           "max_ms": round(max(samples), 2), "bytes": len(r.content)}
        gantt = ui.get("/ui/jobs/job-0/gantt").text
        return {
            "machines": machines, "jobs": jobs, "tasks": jobs * tasks_per_job,
            "requests_per_page": requests,
            # the slowest page's 99th percentile: every page answers within it
            "ui_p99_ms": max(p["p99_ms"] for p in pages.values()),
            "ui_p50_ms": round(_pct(every, 50), 2),
            "gantt_bars": gantt.count("<rect "),
            "pages": pages,
        }
