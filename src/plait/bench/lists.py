"""``plait bench lists``: what reading a long list costs.

A ``plait serve --sim-agents`` in its own process (``plait.bench.api.Server``) with
``jobs`` one-task jobs, created by ``clients`` threads over keep-alive connections;
then, while the region is idle:

* ``list_first_ms``: the first ``GET /v1/jobs`` after the start (every job, no
  ``limit``);
* ``list_all_ms``: the median wall time of ``GET /v1/jobs`` over ``repeat`` calls
  after the first, and ``list_all_bytes`` its size;
* ``list_page_ms``: the median of ``GET /v1/jobs?limit=100`` (one page), and
  ``list_page_bytes``, ``list_page_items``;
* ``list_paged_all_ms``: every job read page after page (``limit=page``, following
  ``continue``), and ``list_paged_items`` how many came back (each job once);
* ``cli_job_list_s``: the wall time of ``plait job list`` (a whole process, its table
  written to a pipe), and ``cli_job_list_rows``: the rows it printed.

A server that does not page (an older plait) answers every job to the page
requests: ``list_page_items`` then shows it.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from plait.bench.api import Server
from plait.bench.cli import _plait


def _spec(name: str) -> dict[str, Any]:
    return {"name": name, "entitlement": "bench", "task_count": 1,
            "resources": {"cpu": 1, "memory_gb": 0.1}, "command": "serve"}


def _create(url: str, token: str, names: list[str], clients: int) -> int:
    """Create the jobs from ``clients`` threads (keep-alive); returns the failures."""
    failures = [0]

    def one(share: list[str]) -> None:
        with httpx.Client(base_url=url, timeout=60,
                          headers={"Authorization": f"Bearer {token}"}) as c:
            for name in share:
                if c.post("/v1/jobs", json=_spec(name)).status_code not in (200, 201):
                    failures[0] += 1

    threads = [threading.Thread(target=one, args=(names[k::clients],)) for k in range(clients)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return failures[0]


def run(jobs: int = 2000, machines: int = 1000, clients: int = 8, repeat: int = 5,
        page: int = 100) -> dict[str, Any]:
    plait = _plait()
    with Server(max(machines, 1), tick=0.1) as server, tempfile.TemporaryDirectory() as tmp:
        server.entitlement()
        failures = _create(server.url, server.token, [f"list-{i:05d}" for i in range(jobs)],
                           clients)
        headers = {"Authorization": f"Bearer {server.token}"}
        with httpx.Client(base_url=server.url, timeout=120, headers=headers) as c:
            def timed(params: dict[str, Any]) -> tuple[float, httpx.Response]:
                started = time.perf_counter()
                r = c.get("/v1/jobs", params=params)
                took = time.perf_counter() - started
                r.raise_for_status()
                return took * 1000, r

            first_ms, _ = timed({})  # (the first list after a start reads every record)
            all_ms, all_bytes, page_ms = [], 0, []
            page_items = page_bytes = 0
            for _ in range(repeat):  # (interleaved: both see the same load)
                took, r = timed({})
                all_ms.append(took)
                all_bytes = len(r.content)
                took, r = timed({"limit": page})
                page_ms.append(took)
                page_bytes, page_items = len(r.content), len(r.json()["jobs"])
            started = time.perf_counter()
            seen: list[str] = []
            token: str | None = None
            while True:
                body = c.get("/v1/jobs", params={"limit": page, **(
                    {"continue": token} if token else {})}).json()
                seen += [j["name"] for j in body["jobs"]]
                token = body.get("continue")
                if not token:
                    break
            paged_ms = (time.perf_counter() - started) * 1000
        env = {**os.environ, "PLAIT_URL": server.url, "PLAIT_TOKEN": server.token,
               "PLAIT_CONFIG": str(Path(tmp) / "config.yaml"), "COLUMNS": "200"}
        started = time.perf_counter()
        done = subprocess.run([*plait, "job", "list"], env=env, capture_output=True,
                              stdin=subprocess.DEVNULL)
        cli_s = time.perf_counter() - started
        rows = sum(1 for line in done.stdout.decode().splitlines() if "list-" in line)
    return {
        "jobs": jobs, "create_failures": failures, "list_first_ms": round(first_ms, 1),
        "list_all_ms": round(statistics.median(all_ms), 1),
        "list_all_min_ms": round(min(all_ms), 1), "list_all_max_ms": round(max(all_ms), 1),
        "list_all_bytes": all_bytes,
        "list_page_ms": round(statistics.median(page_ms), 1),
        "list_page_min_ms": round(min(page_ms), 1),
        "list_page_max_ms": round(max(page_ms), 1),
        "list_page_bytes": page_bytes, "list_page_items": page_items, "page": page,
        "list_paged_all_ms": round(paged_ms, 1), "list_paged_items": len(seen),
        "list_paged_distinct": len(set(seen)),
        "cli_job_list_s": round(cli_s, 2), "cli_job_list_rows": rows,
        "cli_job_list_exit": done.returncode,
    }
