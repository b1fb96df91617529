"""Tracing across processes, configured as a user would: `plait serve --shard 0
--trace-file F` and a `plait frontend` given PLAIT_TRACE_FILE=F write into one file,
and a request through the front end is one trace across both processes. Every wait
is a liveness bound."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
from e2e_region import wait_for

from plait.harness.region import kill_groups, processes_under
from plait.testing import free_port


def test_a_request_through_a_front_end_process_is_one_trace_with_the_shards(
        tmp_path: Path) -> None:
    spans_file = tmp_path / "spans.jsonl"
    env = {**os.environ, "PLAIT_CONFIG": str(tmp_path / "config.yaml")}
    for var in ("PLAIT_URL", "PLAIT_TOKEN", "PLAIT_CA_FILE", "PLAIT_OTLP_ENDPOINT",
                "PLAIT_TRACE_FILE"):
        env.pop(var, None)
    data = str(tmp_path / "cp")
    shard_port, front_port = free_port(), free_port()
    front = f"http://127.0.0.1:{front_port}"
    procs: list[subprocess.Popen[bytes]] = []

    def spawn(log: str, extra_env: dict[str, str], *args: str) -> None:
        with open(tmp_path / f"{log}.log", "ab") as out:
            procs.append(subprocess.Popen([sys.executable, "-m", "plait.cli.main", *args],
                                          env={**env, **extra_env}, stdout=out,
                                          stderr=subprocess.STDOUT, start_new_session=True))

    probe = httpx.Client(timeout=10)

    def healthy(url: str) -> bool:
        try:
            return probe.get(f"{url}/healthz").status_code == 200
        except httpx.HTTPError:
            return False

    try:
        spawn("shard-0", {}, "serve", "--shard", "0", "--data-dir", data, "--port",
              str(shard_port), "--machines", "4", "--dcs", "1", "--msbs-per-dc", "1",
              "--sim-agents", "--tick", "0.1", "--trace-file", str(spans_file))
        wait_for(lambda: healthy(f"http://127.0.0.1:{shard_port}"), what="the shard serves")
        spawn("frontend", {"PLAIT_TRACE_FILE": str(spans_file)}, "frontend", "--data-dir",
              data, "--port", str(front_port), "--shards", "1", "--no-write-config")
        wait_for(lambda: healthy(front), what="the front end sees the shard's leader")
        token = (tmp_path / "cp" / "admin-token").read_text().strip()
        admin = {"Authorization": f"Bearer {token}"}
        made = probe.post(f"{front}/v1/entitlements", headers=admin, json={
            "name": "e", "owner": "alice", "quota": {"machines": 2}})
        assert made.status_code == 201, made.text
        job = probe.post(f"{front}/v1/jobs", headers=admin, json={
            "name": "web", "entitlement": "e", "task_count": 1, "command": "serve",
            "resources": {"cpu": 1, "memory_gb": 1}})
        assert job.status_code == 201, job.text
        wait_for(lambda: probe.get(f"{front}/v1/jobs/web", headers=admin).json()["settled"],
                 what="the job's task runs")
        # both stop as a user stops them: each exports its last spans on the way out
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait(timeout=60)
    finally:
        probe.close()
        kill_groups([p.pid for p in procs] + sorted(processes_under(tmp_path)))
    spans = [json.loads(line) for line in spans_file.read_text().splitlines()]
    posts = [s for s in spans if s["name"] == "POST /v1/entitlements"]
    by_service = {s["service"]: s for s in posts}
    assert by_service.keys() == {"plait-frontend", "plait-shard-0"}
    front_span, shard_span = by_service["plait-frontend"], by_service["plait-shard-0"]
    assert front_span["instance"] == front
    assert front_span["parent_id"] is None
    hop = [s for s in spans if s["parent_id"] == front_span["span_id"]
           and s["name"] == "proxy"]
    assert len(hop) == 1
    assert shard_span["parent_id"] == hop[0]["span_id"]
    assert shard_span["trace_id"] == front_span["trace_id"]
    # and the shard's own work: the passes that placed the job, with their phases
    saves = [s for s in spans if s["name"] == "pass.save"]
    assert saves and {s["service"] for s in saves} == {"plait-shard-0"}


def test_plait_up_gives_its_replicas_the_same_tracing(tmp_path: Path) -> None:
    """`plait up --replicas 2 --trace-file F`: the replica it starts writes to F too; a
    request to it (a follower) is handed to the leader in the same trace."""
    spans_file, data, port = tmp_path / "spans.jsonl", tmp_path / "region", free_port(size=2)
    env = {**os.environ, "PLAIT_CONFIG": str(tmp_path / "config.yaml")}
    for var in ("PLAIT_OTLP_ENDPOINT", "PLAIT_TRACE_FILE"):
        env.pop(var, None)
    leader, follower = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port + 1}"
    with open(tmp_path / "up.log", "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "plait.cli.main", "up", "--data-dir",
                                 str(data), "--machines", "1", "--port", str(port),
                                 "--replicas", "2", "--trace-file", str(spans_file)],
                                env=env, stdout=out, stderr=subprocess.STDOUT)
    probe = httpx.Client(timeout=10)
    try:
        def role(url: str) -> str | None:
            try:
                return probe.get(f"{url}/healthz").json().get("role")
            except (httpx.HTTPError, ValueError):
                return None

        wait_for(lambda: role(follower) == "follower" and role(leader) == "leader",
                 what="plait up's two replicas")
        token = (data / "admin-token").read_text().strip()
        listed = probe.get(f"{follower}/v1/jobs", headers={
            "Authorization": f"Bearer {token}"})
        assert listed.status_code == 200, listed.text
        proc.send_signal(signal.SIGINT)  # Ctrl-C: the replica is stopped too
        assert proc.wait(timeout=90) == 0
    finally:
        probe.close()
        kill_groups([proc.pid, *sorted(processes_under(tmp_path))])
    spans = [json.loads(line) for line in spans_file.read_text().splitlines()]
    gets = {s["service"]: s for s in spans if s["name"] == "GET /v1/jobs"}
    assert gets.keys() == {"plait-serve", "plait-up"}
    asked, answered = gets["plait-serve"], gets["plait-up"]
    assert asked["instance"] == follower
    hop = [s for s in spans if s["parent_id"] == asked["span_id"] and s["name"] == "proxy"]
    assert len(hop) == 1
    assert (answered["trace_id"], answered["parent_id"]) == (asked["trace_id"],
                                                             hop[0]["span_id"])
