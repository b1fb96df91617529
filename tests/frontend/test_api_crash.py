"""SIGKILL the control-plane process under a stream of creates: every acknowledged
job is there after the restart, and none is half-written."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import httpx

from plait.testing import free_port, wait_for


def serve(data: Path, port: int, config: Path) -> subprocess.Popen[bytes]:
    """``plait serve``, its log (a line per request) in ``data``/../serve.log (a
    pipe nobody reads would fill and stop it)."""
    env = {**os.environ, "PLAIT_CONFIG": str(config)}
    with open(data.parent / "serve.log", "ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "plait.cli.main", "serve", "--data-dir", str(data),
             "--port", str(port), "--machines", "200", "--tick", "0.1", "--sim-agents"],
            env=env, stdout=subprocess.DEVNULL, stderr=log)


def healthy(url: str, proc: subprocess.Popen[bytes], log: Path,
            timeout: float = 60.0) -> None:
    def up() -> bool:
        assert proc.poll() is None, log.read_text(errors="replace")[-4000:]
        return httpx.get(f"{url}/healthz", timeout=1).status_code == 200

    wait_for(up, timeout, "the control plane comes up", ignore=(httpx.TransportError,))


def test_no_acknowledged_create_is_lost_when_the_control_plane_is_killed(tmp_path):
    data, config = tmp_path / "data", tmp_path / "config.yaml"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = serve(data, port, config)
    try:
        healthy(url, proc, tmp_path / "serve.log")
        token = (data / "admin-token").read_text().strip()
        headers = {"Authorization": f"Bearer {token}"}
        httpx.post(f"{url}/v1/entitlements", headers=headers, json={
            "name": "web", "owner": "o", "quota": {"machines": 200}}).raise_for_status()
        acked: list[str] = []
        stop = threading.Event()

        def writer(w: int) -> None:
            with httpx.Client(base_url=url, headers=headers, timeout=5) as client:
                for i in range(100_000):
                    if stop.is_set():
                        return
                    name = f"w{w}-{i}"
                    try:
                        r = client.post("/v1/jobs", json={
                            "name": name, "entitlement": "web", "task_count": 1,
                            "resources": {"cpu": 0.1, "memory_gb": 0.1}, "command": "serve"})
                    except httpx.TransportError:
                        return  # the server died mid-request: not acknowledged
                    if r.status_code == 201:
                        acked.append(name)

        threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
        for t in threads:
            t.start()
        wait_for(lambda: len(acked) >= 60, what="60 creates acknowledged")
        os.kill(proc.pid, signal.SIGKILL)  # mid-stream
        proc.wait(timeout=30)
        stop.set()
        for t in threads:
            t.join(timeout=30)
        assert len(acked) >= 60

        proc = serve(data, port, config)
        healthy(url, proc, tmp_path / "serve.log")
        with httpx.Client(base_url=url, headers=headers, timeout=30) as client:
            # the restarted replica answers /healthz as a follower until the dead
            # process's lease lapses and it has loaded the state: meanwhile the API
            # answers 503 + Retry-After, as during any election
            listed = wait_for(lambda: (r := client.get("/v1/jobs")).status_code != 503 and r,
                              what="the restarted replica leads")
            assert listed.status_code == 200, listed.text
            jobs = {j["name"]: j for j in listed.json()["jobs"]}
            missing = [n for n in acked if n not in jobs]
            assert missing == []
            # every stored job is whole, and the scheduler takes them all on
            assert all(j["spec"]["task_count"] == 1 for j in jobs.values())
            wait_for(lambda: all(j["settled"] for j in client.get("/v1/jobs").json()["jobs"]),
                     what="every job settled")
    finally:
        proc.kill()
        proc.wait(timeout=30)
