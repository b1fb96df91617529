"""``plait bench versions``: what a job's update costs as its versions pile up.

A control plane over a fresh SQLite store (simulated agents, served on loopback in
this process) gets one job with a large spec (``spec_kb`` of environment), then
``updates`` PUTs of it, each a new version. Reported: the PUT latency of the first and
the last ten updates (median, ms), the largest job record stored, and how many
versions the record keeps at the end. A job keeps its last ``keep_versions`` versions
and those its tasks run (decision 62), so the latency and the record stay flat
however many versions the job has had.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from plait.model import RegionSpec
from plait.server.controlplane import ControlPlane, ControlPlaneConfig
from plait.server.serve import ApiServer, store_for


def run(updates: int = 40, spec_kb: int = 40, keep_versions: int = 10) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="plait-bench-versions-") as work:
        cp = ControlPlane(store_for(Path(work) / "data"), ControlPlaneConfig(
            region=RegionSpec.sized(8, dcs=1, msbs_per_dc=1, rows_per_msb=1,
                                    racks_per_row=2),
            tick_seconds=0.05, sim_agents=True))
        token = cp.bootstrap_admin()
        server = ApiServer(cp).start()
        try:
            with httpx.Client(base_url=server.url, timeout=60, headers={
                    "Authorization": f"Bearer {token}"}) as api:
                api.post("/v1/entitlements", json={
                    "name": "bench", "owner": "bench", "quota": {"machines": 4}}
                         ).raise_for_status()
                blob = "x" * 1000

                def spec(v: int) -> dict[str, Any]:
                    env = {f"BLOB{i}": blob for i in range(spec_kb)}
                    return {"name": "big", "entitlement": "bench", "task_count": 2,
                            "command": "serve", "resources": {"cpu": 0.1, "memory_gb": 0.1},
                            "keep_versions": keep_versions, "env": {**env, "V": str(v)}}

                api.post("/v1/jobs", json=spec(0)).raise_for_status()
                took: list[float] = []
                largest = 0
                for v in range(1, updates + 1):
                    started = time.perf_counter()
                    api.put("/v1/jobs/big", json=spec(v)).raise_for_status()
                    took.append((time.perf_counter() - started) * 1000)
                    largest = max(largest, len(cp.store.get("/scheduler/jobs/big")[0]))
                history = api.get("/v1/jobs/big/history").json()
        finally:
            server.stop()
            cp.store.close()
    first, last = took[:10], took[-10:]
    return {"updates": updates, "spec_kb": spec_kb, "keep_versions": keep_versions,
            "put_ms_median_first10": round(statistics.median(first), 2),
            "put_ms_median_last10": round(statistics.median(last), 2),
            "record_bytes_max": largest, "versions": history["versions"],
            "kept": len(history["kept"])}
