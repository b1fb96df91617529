"""`plait up --shards 2 --replicas 2 --store zk://...` on a 3-member ZooKeeper ensemble
started by the test. A client writes continuously to an entitlement of shard 1 while
one ZooKeeper member, then that shard's leader, are SIGKILLed: no acknowledged write
is lost and no task restarts. An entitlement moves between the shards. SIGKILL of
every control-plane process leaves the tasks running, and a new `plait up` adopts
them; Ctrl-C stops every process. Liveness bounds only; nothing asserts speed."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time

import httpx
from test_e2e_agents import alive, wait_for
from test_e2e_up import task_pids

from plait.harness.region import cmdline, kill_groups, processes_under
from plait.harness.zkensemble import LocalEnsemble
from plait.testing import free_port


def sleepers(name: str, ent: str) -> dict:
    return {"name": name, "entitlement": ent, "task_count": 2, "command": "sleep",
            "args": ["infinity"], "resources": {"cpu": 0.1, "memory_gb": 0.1}}


def role(url: str) -> str | None:
    try:
        return httpx.get(f"{url}/healthz", timeout=2).json().get("role")
    except (httpx.HTTPError, ValueError):
        return None


def test_up_with_shards_on_zookeeper_survives_a_shard_leader_kill(tmp_path):
    data, port = tmp_path / "region", free_port(size=5)
    front = f"http://127.0.0.1:{port}"
    shard1 = [f"http://127.0.0.1:{port + 3}", f"http://127.0.0.1:{port + 4}"]
    env = {**os.environ, "PLAIT_CONFIG": str(tmp_path / "config.yaml")}
    ensemble = LocalEnsemble(tmp_path / "zk").start()
    proc = None
    left: set[int] = set()

    def up() -> subprocess.Popen[bytes]:
        started = subprocess.Popen(
            [sys.executable, "-m", "plait.cli.main", "up", "--data-dir", str(data),
             "--machines", "4", "--port", str(port), "--heartbeat-timeout", "5",
             "--shards", "2", "--replicas", "2", "--store", ensemble.url],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        wait_for(lambda: role(front) == "frontend" and httpx.get(
            f"{front}/healthz").status_code == 200, what="every shard has a leader", logs=data)
        return started

    first: dict[str, int] = {}
    try:
        proc = up()
        token = (data / "admin-token").read_text().strip()
        admin = httpx.Client(base_url=front, timeout=30,
                             headers={"Authorization": f"Bearer {token}"})
        for ent in ("a", "b"):
            r = admin.post("/v1/entitlements", json={"name": ent, "owner": "o",
                                                     "quota": {"machines": 2}})
            assert r.status_code == 201, r.text
            assert admin.post("/v1/jobs", json=sleepers(f"s{ent}", ent)).status_code == 201
        wait_for(lambda: [(e["entitlement"], e["shard"]) for e in admin.get(
            "/v1/events", params={"kind": "entitlement_created"}).json().get("events", [])] == [
            ("a", 0), ("b", 1)], what="a went to shard 0, b to shard 1 (the least loaded)")
        wait_for(lambda: len(task_pids(data)) == 4 and all(
            t["state"] == "running" for j in ("sa", "sb")
            for t in admin.get(f"/v1/jobs/{j}/tasks").json()["tasks"]), what="both run")
        first = task_pids(data)

        # a client creates jobs in b (shard 1) through the front end, continuously
        acked: list[str] = []
        stop = threading.Event()

        def write() -> None:
            k = 0
            with httpx.Client(base_url=front, timeout=10, headers={
                    "Authorization": f"Bearer {token}"}) as c:
                while not stop.is_set():
                    name = f"w{k:05d}"
                    try:
                        r = c.post("/v1/jobs", json={**sleepers(name, "b"), "task_count": 0})
                        if r.status_code in (200, 201):
                            acked.append(name)
                            k += 1
                    except httpx.HTTPError:
                        pass  # (the same name again: a create is idempotent)
                    stop.wait(0.1)

        writer = threading.Thread(target=write, daemon=True)
        writer.start()
        wait_for(lambda: len(acked) >= 5, what="writes acknowledged")
        # one ZooKeeper member dies (the ensemble's leader): the shards keep serving
        member = ensemble.leader()
        assert member is not None
        ensemble.kill(member)
        wait_for(lambda: ensemble.wait_serving(1, members=2), what="the ensemble re-forms")
        before_member = len(acked)
        wait_for(lambda: len(acked) >= before_member + 10, what="writes go on")
        wait_for(lambda: "leader" in [role(u) for u in shard1], what="shard 1 leads")
        leader = [role(u) for u in shard1].index("leader")
        pid = int((data / "replicas" / f"1-{leader}.pid").read_text())
        os.kill(pid, signal.SIGKILL)
        killed = len(acked)
        wait_for(lambda: role(shard1[1 - leader]) == "leader", what="the follower takes over")
        wait_for(lambda: len(acked) >= killed + 10, what="writes after the takeover")
        stop.set()
        writer.join(timeout=30)
        stored = {j["name"] for j in admin.get("/v1/jobs", params={"entitlement": "b"}).json()[
            "jobs"]}
        assert [n for n in acked if n not in stored] == []  # no acknowledged write lost
        assert task_pids(data) == first and all(alive(p) for p in first.values())

        # an entitlement moves to the other shard; its tasks run on untouched
        r = admin.post("/v1/admin/entitlements/a/move", json={"shard": 1})
        assert r.status_code == 200, r.text
        time.sleep(1.0)  # (the subject is time: a while after the move, seen from outside)
        assert task_pids(data) == first
        assert admin.put("/v1/jobs/sa", json={**sleepers("sa", "a"), "task_count": 1}
                         ).status_code == 200  # managed by shard 1 now
        wait_for(lambda: len(task_pids(data)) == 3, what="the resize by the new shard")
        kept = task_pids(data)

        # SIGKILL every control-plane process: the tasks run on; a new `plait up`
        # adopts the agents and their tasks, and every job is back
        proc.kill()
        proc.wait(timeout=30)
        for pid_file in (data / "replicas").glob("*.pid"):
            with contextlib.suppress(OSError, ValueError):
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
        time.sleep(2.0)  # (the subject is time: a while with no control plane at all)
        assert task_pids(data) == kept and all(alive(p) for p in kept.values())
        proc = up()
        wait_for(lambda: all(t["state"] == "running" for j in ("sa", "sb")
                             for t in admin.get(f"/v1/jobs/{j}/tasks").json()["tasks"]),
                 what="the jobs are back")
        assert task_pids(data) == kept
        assert len(admin.get("/v1/jobs", params={"entitlement": "b"}).json()["jobs"]) == len(
            stored)
    finally:
        output = b""
        if proc is not None:
            proc.send_signal(signal.SIGINT)
            try:
                output = proc.communicate(timeout=90)[0]
            except subprocess.TimeoutExpired:
                proc.kill()
                output = proc.communicate()[0]
        left = processes_under(data)  # (only when this test failed)
        kill_groups(left)
        ensemble.stop()
    assert proc.returncode == 0, output.decode(errors="replace")
    assert not left, [cmdline(p) for p in left]  # Ctrl-C stopped every process
    assert not any(alive(p) for p in first.values())
