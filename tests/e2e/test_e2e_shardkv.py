"""shardkv (examples/shardkv) on real processes: `plait up` with 6 machines, Shard
Manager on loopback as the job's TaskController, 6 tasks holding 32 shards 3 times
over. A routing client writes and reads while the job rolls to a new version; after
the rollout every acknowledged write reads back, no shard was ever without a ready
replica in any map the client saw, and every task runs the new version. Liveness
bounds only; nothing asserts speed."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import secrets
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import yaml

from plait.harness.region import LocalRegion
from plait.shardmanager.credentials import read_token
from plait.shardmanager.service import ShardManager, app_token

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "shardkv"
TASKS, SHARDS, REPLICATION = 6, 32, 3


def example_client() -> ModuleType:
    spec = importlib.util.spec_from_file_location("shardkv_client", EXAMPLE / "client.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def kv_job(sm_url: str, version: str) -> dict[str, Any]:
    """examples/shardkv/kv.yaml with its placeholders filled in (this Python, this
    repository, this Shard Manager) and KV_VERSION set."""
    text = (EXAMPLE / "kv.yaml").read_text()
    for name, value in {"@PYTHON@": sys.executable, "@REPO@": str(EXAMPLE.parents[1]),
                        "@SM_URL@": sm_url}.items():
        text = text.replace(name, value)
    spec: dict[str, Any] = yaml.safe_load(text)
    spec["env"]["KV_VERSION"] = version
    # (the tasks import this tree's plait, as this test does: an agent passes no
    # PYTHONPATH of its own)
    spec["env"]["PYTHONPATH"] = str(EXAMPLE.parents[1] / "src")
    return spec


def test_a_rolling_update_of_shardkv_loses_no_acknowledged_write() -> None:
    kv = example_client()
    token = secrets.token_urlsafe(32)
    region = LocalRegion(TASKS, heartbeat_timeout=15.0)
    sm: ShardManager | None = None
    client = load = None
    sm_api: httpx.Client | None = None
    started = time.monotonic()
    phases: dict[str, float] = {}

    def phase(name: str) -> None:
        phases[name] = round(time.monotonic() - started - sum(phases.values()), 1)

    try:
        region.start()
        region.wait_ready(120)
        phase("region")
        sm = ShardManager(token).start("127.0.0.1", 0)
        sm_api = httpx.Client(base_url=sm.url, timeout=30,
                              headers={"Authorization": f"Bearer {token}"})
        app = {"job": "kv", "shards": SHARDS, "replication": REPLICATION, "max_down": 1}
        assert sm_api.put("/v1/apps/kv", json=app).status_code == 200
        region.send("POST", "/v1/entitlements", {"name": "kv", "owner": "o",
                                                 "quota": {"machines": TASKS}})
        region.send("PUT", "/v1/jobs/kv", kv_job(sm.url, "1"))
        # Shard Manager becomes the job's controller once it has the job's key, and
        # takes each task's registration signed with its own credential only (the
        # tasks are refused until then, and register at their next beat)
        key = region.get("/v1/jobs/kv/controller-key")["key"]
        r = sm_api.put("/v1/apps/kv", json={**app, "controller_key": key})
        assert r.status_code == 200, r.text

        def shards(api: httpx.Client = sm_api) -> dict[str, Any]:
            view: dict[str, Any] = api.get("/v1/apps/kv").json()
            return view

        region.wait(lambda: shards()["fully_replicated"] == SHARDS, 120,
                    "every shard has 3 ready replicas")
        phase("deployed")
        first = {t["index"]: t for t in region.get("/v1/jobs/kv/tasks")["tasks"]}
        assert len(first) == TASKS and {t["version"] for t in first.values()} == {1}

        # the client starts on a fully replicated map: from here on it tracks the
        # fewest ready replicas of each shard in every map it sees
        client = kv.KvClient(sm.url, read_token(token, "kv"))  # (read-only)
        assert client.wait_for_map(lambda m: m["shards"] and all(
            len(ready) == REPLICATION for ready in m["shards"].values()), 30)
        load = kv.Load(client, writers=3, readers=2, keys=2000).start()
        region.wait(lambda: load.writes_acked >= 50, 60, "writes acknowledged")

        # roll the job to version 2
        before_update = load.writes_acked
        phase("load")
        region.send("PUT", "/v1/jobs/kv", kv_job(sm.url, "2"))

        def rolled() -> bool:
            job = region.get("/v1/jobs/kv")
            tasks = region.get("/v1/jobs/kv/tasks")["tasks"]
            return bool(job["settled"] and job["applied_version"] == job["version"] == 2
                        and len(tasks) == TASKS
                        and all(t["version"] == 2 and t["state"] == "running"
                                for t in tasks))

        region.wait(rolled, 240, "every task runs version 2")
        phase("rollout")
        region.wait(lambda: shards()["fully_replicated"] == SHARDS, 120,
                    "every shard has 3 ready replicas again")
        phase("replicated")
        during_update = load.writes_acked - before_update
        after_update = load.writes_acked
        region.wait(lambda: load.writes_acked >= after_update + 50, 60,
                    "writes acknowledged after the rollout")
        load.stop()
        checked = load.verify()
        phase("verify")
        report = {**load.report(), "verify": checked, "acked_during_rollout": during_update,
                  "min_ready_by_shard": dict(sorted(client.min_ready.items())),
                  "phase_seconds": phases}
        print(json.dumps(report))  # (what the run measured: pytest -s shows it)

        # no acknowledged write lost, and nothing read back older than acknowledged
        assert checked["lost"] == 0 and checked["wrong"] == 0, report
        assert checked["unreadable"] == 0, report
        assert load.stale_reads == 0, report
        # the service kept taking writes while it rolled
        assert during_update > 0, report
        # no shard was ever without a ready replica, in any map the client saw (it
        # saw the rollout: some shard was short of a replica at some point)
        assert set(client.min_ready) == {f"s{i:05d}" for i in range(SHARDS)}, report
        # (replication 3, at most one replica down: two always serve)
        assert min(client.min_ready.values()) >= 2, report
        assert client.short, report
        # every task runs the new version (its environment is its process's: a new one)
        tasks = {t["index"]: t for t in region.get("/v1/jobs/kv/tasks")["tasks"]}
        view = shards()
        assert sorted(int(i) for i in view["tasks"]) == list(range(TASKS))
        for index, task in view["tasks"].items():
            health = httpx.get(f"{task['endpoint']}/health", timeout=10).json()
            assert health["version"] == "2" and health["index"] == int(index), health
        assert all(tasks[i]["version"] == 2 for i in range(TASKS))
    finally:
        if load is not None:
            load.stop()
        if client is not None:
            client.close()
        if sm_api is not None:
            sm_api.close()
        if sm is not None:
            with contextlib.suppress(Exception):
                sm.stop()
        region.stop()
    assert region.leftovers == [], f"processes left behind: {region.leftovers}"


def example_server() -> ModuleType:
    spec = importlib.util.spec_from_file_location("shardkv_server", EXAMPLE / "server.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_load_across_a_killed_and_restarted_shard_manager(tmp_path: Path) -> None:
    """Shard Manager (`plait shardmanager serve` on a data dir) is killed with SIGKILL
    under a shardkv load and started again on the same port and data dir: the map's
    generation never goes back (the client takes the new maps at once), the restored
    map names only replicas that confirmed, and no acknowledged write is lost, no read
    is stale, no client is stuck. Loopback only; the tasks run in this process."""
    import os
    import signal
    import subprocess

    from plait.shardmanager.client import ShardTask
    from plait.testing import free_port, wait_for

    kv, srv = example_client(), example_server()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    token_file, data = tmp_path / "sm-token", tmp_path / "sm"

    def serve() -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            [sys.executable, "-m", "plait.cli.main", "shardmanager", "serve", "--port",
             str(port), "--token-file", str(token_file), "--data-dir", str(data)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        wait_for(lambda: proc.poll() is not None
                 or httpx.get(f"{url}/healthz", timeout=5).status_code == 200,
                 what="the shard manager serves", ignore=(httpx.HTTPError,))
        assert proc.poll() is None
        return proc

    proc = serve()
    token = token_file.read_text().strip()
    admin = httpx.Client(base_url=url, timeout=30, headers={"Authorization": f"Bearer {token}"})
    tasks: list[Any] = []
    client = load = None
    try:
        r = admin.put("/v1/apps/kv", json={"job": "kv", "shards": 16, "replication": 3,
                                           "tasks": 6})
        assert r.status_code == 200, r.text
        for i in range(6):
            tasks.append(ShardTask(srv.ShardKv(i, "1"), app="kv", job="kv", index=i,
                                   port=free_port(), manager=url,
                                   token=app_token(token, "kv"),
                                   domains=(f"msb{i % 3}", f"rack{i}", f"m{i}")).start())

        def fully() -> bool:
            with contextlib.suppress(httpx.HTTPError):
                return bool(admin.get("/v1/apps/kv").json()["fully_replicated"] == 16)
            return False

        wait_for(fully, what="every shard has 3 replicas")
        client = kv.KvClient(url, read_token(token, "kv"), deadline=60)
        assert client.wait_for_map(lambda m: all(
            len(r) == 3 for r in m["shards"].values()) and bool(m["shards"]), 30)
        load = kv.Load(client, writers=2, readers=2, keys=300).start()
        wait_for(lambda: load.writes_acked >= 50, what="writes acknowledged")
        before = client.map["generation"]
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        acked_at_kill = load.writes_acked
        time.sleep(1.0)  # (the subject is time: the load runs on a while with its map)
        proc = serve()
        # the restarted service's maps are newer than any the client holds, and the
        # client takes them: it is not stuck on the old generation
        assert client.wait_for_map(lambda m: m["generation"] > before and all(
            len(r) == 3 for r in m["shards"].values()), 60), client.map["generation"]
        live = {t.endpoint for t in tasks}
        assert {e for r in client.map["shards"].values() for e in r} <= live
        wait_for(lambda: load.writes_acked >= acked_at_kill + 100,
                 what="writes acknowledged after the restart")
        load.stop()
        checked = load.verify()
        report = {**load.report(), "verify": checked}
        assert checked["lost"] == 0 and checked["wrong"] == 0, report
        assert checked["unreadable"] == 0, report
        assert load.stale_reads == 0, report
    finally:
        if load is not None:
            load.stop()
        if client is not None:
            client.close()
        for t in tasks:
            t.stop()
        admin.close()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
