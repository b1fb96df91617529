"""A sharded region as separate processes, each started by its own command: two
`plait serve --shard S` and a `plait frontend` on one SQLite store, an agent given
the front end's URL only, and the CLI. Every wait is a liveness bound."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import httpx
from e2e_region import wait_for

from plait.harness.region import cmdline, kill_groups, processes_under
from plait.testing import free_port


def plait(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "plait.cli.main", *args], env=env,
                          capture_output=True, text=True, timeout=120)


def sleeps(root) -> list[int]:
    return sorted(p for p in processes_under(root) if cmdline(p).startswith("sleep"))


def test_shards_and_a_front_end_by_their_own_commands(tmp_path):
    env = {**os.environ, "PLAIT_CONFIG": str(tmp_path / "config.yaml")}
    for var in ("PLAIT_URL", "PLAIT_TOKEN", "PLAIT_CA_FILE"):
        env.pop(var, None)
    data = str(tmp_path / "cp")
    ports = [free_port() for _ in range(3)]
    front = f"http://127.0.0.1:{ports[2]}"
    procs: list[subprocess.Popen[bytes]] = []

    def spawn(log: str, *args: str) -> None:
        with open(tmp_path / f"{log}.log", "ab") as out:
            procs.append(subprocess.Popen([sys.executable, "-m", "plait.cli.main", *args],
                                          env=env, stdout=out, stderr=subprocess.STDOUT,
                                          start_new_session=True))

    probe = httpx.Client(timeout=10)

    def healthy(url: str) -> bool:
        try:
            return probe.get(f"{url}/healthz").status_code == 200
        except httpx.HTTPError:
            return False

    try:
        for s in (0, 1):
            spawn(f"shard-{s}", "serve", "--shard", str(s), "--data-dir", data,
                  "--port", str(ports[s]), "--machines", "2", "--dcs", "1",
                  "--msbs-per-dc", "1", "--heartbeat-timeout", "5")
            wait_for(lambda s=s: healthy(f"http://127.0.0.1:{ports[s]}"),
                     what=f"shard {s} serves")
        spawn("frontend", "frontend", "--data-dir", data, "--port", str(ports[2]),
              "--shards", "2")
        wait_for(lambda: healthy(front), what="the front end sees both shards' leaders")
        shards = probe.get(f"{front}/healthz").json()["shards"]
        assert shards == {"0": f"http://127.0.0.1:{ports[0]}",
                          "1": f"http://127.0.0.1:{ports[1]}"}
        # the front end wrote the client configuration: the CLI works at once
        for name in ("a", "b"):
            made = plait(env, "entitlement", "create", "--name", name, "--owner", "o",
                         "--machines", "1")
            assert made.returncode == 0, made.stderr
        join = plait(env, "token", "create", "--role", "join", "--name", "j", "-o", "json")
        assert join.returncode == 0, join.stderr
        with open(tmp_path / "agent.log", "ab") as out:
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "plait.cli.agent", "--machine-id", "m0000000",
                 "--control-plane", front, "--data-dir", str(tmp_path / "agent"),
                 "--interval", "0.2"],
                env={**env, "PLAIT_JOIN_TOKEN": json.loads(join.stdout)["token"]},
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True))
        job = tmp_path / "job.yaml"
        job.write_text("name: s\nentitlement: b\ntask_count: 1\ncommand: sleep\n"
                       "args: ['600']\nresources: {cpu: 0.1, memory_gb: 0.1}\n")
        deployed = plait(env, "job", "deploy", str(job))
        assert deployed.returncode == 0, deployed.stderr

        def tasks() -> list[dict]:
            shown = plait(env, "task", "list", "s", "-o", "json")
            return json.loads(shown.stdout)["tasks"] if shown.returncode == 0 else []

        wait_for(lambda: [t["state"] for t in tasks()] == ["running"], what="the task runs")
        pid = sleeps(tmp_path / "agent")
        assert len(pid) == 1
        # b went to shard 1 (the least loaded); moved to shard 0 by the CLI
        moved = plait(env, "admin", "entitlement", "move", "b", "--to-shard", "0",
                      "-o", "json")
        assert moved.returncode == 0, moved.stderr
        assert json.loads(moved.stdout)["from_shard"] == 1
        assert json.loads(moved.stdout)["to_shard"] == 0
        again = plait(env, "admin", "entitlement", "move", "b", "--to-shard", "0")
        assert again.returncode != 0 and "already" in again.stderr
        wait_for(lambda: [t["state"] for t in tasks()] == ["running"], what="still runs")
        assert sleeps(tmp_path / "agent") == pid
    finally:
        kill_groups([p.pid for p in procs] + sorted(processes_under(tmp_path)))
