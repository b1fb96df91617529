"""What tracing costs on the API path: `python benchmarks/tracing_overhead.py [off|file]`.

Starts `plait serve --shard 0 --sim-agents` and `plait frontend` as processes of their
own (a fresh SQLite data dir; `file`: both given `--trace-file`), then, from this
process, sends requests one at a time through the front end over one keep-alive
connection: ``reads`` GETs of one job (the front end reads the store, hops to the
shard, which answers from its view) and ``writes`` POSTs of new one-task jobs (the
shard stores each before it answers; passes place them meanwhile). Prints one JSON
object: per kind, the median, p90 and p99 latency (ms), requests per second, and the
CPU time per request of each server process.

It starts the processes with the ``plait`` found on PYTHONPATH and passes tracing
options only in `file` mode, so the same script measures a checkout without
``plait.tracing`` (`off` only): run it with PYTHONPATH pointing at either tree.
Measure on an otherwise idle box, and repeat: a 2-core box's noise is larger than
the differences looked for.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_healthy(client: httpx.Client, url: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if client.get(f"{url}/healthz").status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"{url} did not become healthy")


def cpu_seconds(pid: int) -> float:
    """User + system CPU a process has used (from /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def summary(latencies: list[float], seconds: float) -> dict[str, float]:
    ordered = sorted(latencies)
    n = len(ordered)
    return {"requests": n, "median_ms": round(statistics.median(ordered) * 1e3, 3),
            "p90_ms": round(ordered[int(n * 0.9)] * 1e3, 3),
            "p99_ms": round(ordered[min(n - 1, int(n * 0.99))] * 1e3, 3),
            "per_s": round(n / seconds, 1)}


def cpu_per_request(procs: list[subprocess.Popen[bytes]], before: list[float],
                    n: int) -> dict[str, float]:
    """CPU microseconds per request the shard and the front end used (the shard's
    includes its passes): less sensitive to a busy box than latency."""
    shard, front = (cpu_seconds(p.pid) - b for p, b in zip(procs, before, strict=True))
    return {"shard_cpu_us": round(shard / n * 1e6), "frontend_cpu_us": round(front / n * 1e6)}


def main(mode: str = "off", reads: int = 3000, writes: int = 600) -> dict[str, object]:
    work = Path(tempfile.mkdtemp(prefix="plait-trace-bench-"))
    spans = work / "spans.jsonl"
    tracing = ["--trace-file", str(spans)] if mode == "file" else []
    env = {k: v for k, v in os.environ.items()
           if k not in ("PLAIT_OTLP_ENDPOINT", "PLAIT_TRACE_FILE")}
    env["PLAIT_CONFIG"] = str(work / "config.yaml")
    shard_port, front_port = free_port(), free_port()
    front = f"http://127.0.0.1:{front_port}"
    procs: list[subprocess.Popen[bytes]] = []
    client = httpx.Client(timeout=30)
    try:
        with open(work / "shard.log", "wb") as log:
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "plait.cli.main", "serve", "--shard", "0",
                 "--data-dir", str(work / "cp"), "--port", str(shard_port),
                 "--machines", "48", "--sim-agents", *tracing],
                env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
        wait_healthy(client, f"http://127.0.0.1:{shard_port}")
        with open(work / "frontend.log", "wb") as log:
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "plait.cli.main", "frontend", "--data-dir",
                 str(work / "cp"), "--port", str(front_port), "--shards", "1",
                 "--no-write-config", *tracing],
                env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
        wait_healthy(client, front)
        token = (work / "cp" / "admin-token").read_text().strip()
        client.headers["Authorization"] = f"Bearer {token}"
        made = client.post(f"{front}/v1/entitlements", json={
            "name": "e", "owner": "bench", "quota": {"machines": 48}})
        assert made.status_code == 201, made.text

        def job(name: str) -> dict[str, object]:
            return {"name": name, "entitlement": "e", "task_count": 1, "command": "serve",
                    "resources": {"cpu": 0.1, "memory_gb": 0.1}}

        assert client.post(f"{front}/v1/jobs", json=job("read")).status_code == 201
        for _ in range(300):  # warm-up: connections, code paths
            client.get(f"{front}/v1/jobs/read")
        time.sleep(1.0)  # (the job placed: passes idle again)
        out: dict[str, object] = {"mode": mode, "src": os.environ.get("PYTHONPATH", "")}
        latencies = []
        cpu = [cpu_seconds(p.pid) for p in procs]
        started = time.perf_counter()
        for _ in range(reads):
            t = time.perf_counter()
            r = client.get(f"{front}/v1/jobs/read")
            latencies.append(time.perf_counter() - t)
            assert r.status_code == 200, r.text
        out["read"] = summary(latencies, time.perf_counter() - started) | cpu_per_request(
            procs, cpu, reads)
        latencies = []
        cpu = [cpu_seconds(p.pid) for p in procs]
        started = time.perf_counter()
        for i in range(writes):
            t = time.perf_counter()
            r = client.post(f"{front}/v1/jobs", json=job(f"w{i}"))
            latencies.append(time.perf_counter() - t)
            assert r.status_code == 201, r.text
        out["write"] = summary(latencies, time.perf_counter() - started) | cpu_per_request(
            procs, cpu, writes)
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait(timeout=60)
        if mode == "file":
            out["spans_written"] = len(spans.read_text().splitlines())
        return out
    finally:
        client.close()
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)


if __name__ == "__main__":
    print(json.dumps(main(*sys.argv[1:2])))
