"""TLS on every connection that crosses hosts, on loopback: two `plait serve` replicas
with a certificate of a lab CA (`plait admin certs`), a follower forwarding to its
leader over https, an agent and the CLI trusting that CA, and refusals without it."""

from __future__ import annotations

import os
import signal
import ssl
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
from e2e_region import wait_for

from plait.harness.region import kill_groups, processes_under
from plait.testing import free_port

JOB = {"name": "s", "entitlement": "e", "task_count": 1, "command": "sleep",
       "args": ["infinity"], "resources": {"cpu": 0.1, "memory_gb": 0.1}}



def secret_file(tmp_path: Path, token: str) -> str:
    """The join token in a file of its own (agents take it by file, never on argv)."""
    path = tmp_path / "join-token"
    path.write_text(token + "\n")
    return str(path)


def plait(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "plait.cli.main", *args], env=env,
                          capture_output=True, text=True, timeout=120)


def stop(procs: list[subprocess.Popen[bytes]], tmp_path,
         clients: list[httpx.Client]) -> None:
    """Close the test's own clients, Ctrl-C every process started, then kill what is
    left (a failed run's). The clients go first: a server shutting down waits for the
    TLS close of each idle keep-alive connection, and a pooled connection nobody reads
    never answers it (asyncio gives up after 30 s)."""
    for client in clients:
        client.close()
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
    for proc in procs:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
    kill_groups(processes_under(tmp_path))


def test_replicas_agents_and_the_cli_speak_tls(tmp_path):
    env = {**os.environ, "PLAIT_CONFIG": str(tmp_path / "config.yaml")}
    env.pop("PLAIT_CA_FILE", None)
    made = plait(env, "admin", "certs", "--out", str(tmp_path / "certs"), "--host",
                 "127.0.0.1", "--host", "localhost")
    assert made.returncode == 0, made.stderr
    certs = tmp_path / "certs"
    assert oct((certs / "server-key.pem").stat().st_mode & 0o777) == "0o600"
    ca = str(certs / "ca.pem")
    ports = [free_port(), free_port()]
    urls = [f"https://127.0.0.1:{p}" for p in ports]
    procs: list[subprocess.Popen[bytes]] = []

    def spawn(log: str, *args: str) -> None:
        with open(tmp_path / f"{log}.log", "ab") as out:
            procs.append(subprocess.Popen([sys.executable, "-m", *args], env=env, stdout=out,
                                          stderr=subprocess.STDOUT, start_new_session=True))

    tls = ["--tls-cert", str(certs / "server.pem"), "--tls-key", str(certs / "server-key.pem"),
           "--ca-file", ca]
    trust = ssl.create_default_context(cafile=ca)
    client = httpx.Client(verify=trust, timeout=10)
    clients = [client]
    try:
        # one machine: the agent's, so the task is placed on it at once (a second
        # machine, never joined, would hold the task until its startup grace ran out)
        for i, port in enumerate(ports):
            spawn(f"serve-{i}", "plait.cli.main", "serve", "--data-dir", str(tmp_path / "cp"),
                  "--port", str(port), "--machines", "1", "--dcs", "1", "--msbs-per-dc", "1",
                  "--heartbeat-timeout", "5", *tls, *(["--no-write-config"] if i else []))
            wait_for(lambda port=port: client.get(f"https://127.0.0.1:{port}/healthz")
                     .json().get("role") in ("leader", "follower"), what="a replica serves")
        assert client.get(f"{urls[0]}/healthz").json()["role"] == "leader"
        token = (tmp_path / "cp" / "admin-token").read_text().strip()
        admin = httpx.Client(base_url=urls[1], timeout=30,  # the follower: forwarded
                             verify=trust,
                             headers={"Authorization": f"Bearer {token}"})
        clients.append(admin)
        assert admin.post("/v1/entitlements", json={
            "name": "e", "owner": "o", "quota": {"machines": 2}}).status_code == 201
        join = admin.post("/v1/tokens", json={"role": "join", "name": "c"}).json()["token"]
        spawn("agent", "plait.cli.agent", "--machine-id", "m0000000", "--control-plane",
              ",".join(reversed(urls)), "--join-token-file", secret_file(tmp_path, join),
              "--data-dir",
              str(tmp_path / "agent"), "--interval", "0.3", "--ca-file", ca)
        assert admin.post("/v1/jobs", json=JOB).status_code == 201
        wait_for(lambda: [t["state"] for t in admin.get("/v1/jobs/s/tasks").json()["tasks"]]
                 == ["running"], what="the agent runs the task over https")

        # the CLI: the context written at first start carries the CA file
        listed = plait(env, "job", "list")
        assert listed.returncode == 0, listed.stderr
        assert "s" in listed.stdout
        # ... and without it the server's certificate is not trusted
        plain = plait({**env, "PLAIT_URL": urls[1], "PLAIT_TOKEN": token,
                       "PLAIT_CONFIG": str(tmp_path / "none.yaml")}, "job", "list")
        assert plain.returncode != 0
        assert "CERTIFICATE_VERIFY_FAILED" in plain.stderr or "certificate" in plain.stderr
        # plain http on an https port gets nowhere
        try:
            r = httpx.get(f"http://127.0.0.1:{ports[0]}/healthz", timeout=5)
            assert r.status_code >= 400
        except httpx.HTTPError:
            pass
        # an agent given a CA file that does not exist says so
        bad = subprocess.run([sys.executable, "-m", "plait.cli.agent", "--machine-id",
                              "m0000001", "--control-plane", urls[0],
                              "--join-token-file", secret_file(tmp_path, join),
                              "--data-dir", str(tmp_path / "bad"), "--ca-file",
                              str(tmp_path / "missing.pem")], env=env, capture_output=True,
                             text=True, timeout=60)
        said = " ".join(bad.stderr.split())
        assert bad.returncode != 0 and "missing.pem is not a file" in said, said
    finally:
        stop(procs, tmp_path, clients)


def test_a_sharded_region_speaks_tls_front_end_to_shards(tmp_path):
    """`plait frontend` over https, calling two `plait scheduler --shard` processes over
    https (checked against the lab CA); an agent and the CLI reach only the front end."""
    env = {**os.environ, "PLAIT_CONFIG": str(tmp_path / "config.yaml")}
    env.pop("PLAIT_CA_FILE", None)
    made = plait(env, "admin", "certs", "--out", str(tmp_path / "certs"), "--host",
                 "127.0.0.1")
    assert made.returncode == 0, made.stderr
    certs = tmp_path / "certs"
    ca = str(certs / "ca.pem")
    tls = ["--tls-cert", str(certs / "server.pem"), "--tls-key", str(certs / "server-key.pem"),
           "--ca-file", ca]
    ports = [free_port() for _ in range(3)]
    front = f"https://127.0.0.1:{ports[2]}"
    procs: list[subprocess.Popen[bytes]] = []

    def spawn(log: str, *args: str) -> None:
        with open(tmp_path / f"{log}.log", "ab") as out:
            procs.append(subprocess.Popen([sys.executable, "-m", *args], env=env, stdout=out,
                                          stderr=subprocess.STDOUT, start_new_session=True))

    client = httpx.Client(verify=ssl.create_default_context(cafile=ca), timeout=10)
    clients = [client]
    try:
        for s in (0, 1):
            spawn(f"shard-{s}", "plait.cli.main", "scheduler", "--shard", str(s), "--data-dir",
                  str(tmp_path / "cp"), "--port", str(ports[s]), "--machines", "2", "--dcs",
                  "1", "--msbs-per-dc", "1", *tls)
            wait_for(lambda s=s: client.get(f"https://127.0.0.1:{ports[s]}/healthz")
                     .json().get("role") == "leader", what=f"shard {s} leads")
        spawn("frontend", "plait.cli.main", "frontend", "--data-dir", str(tmp_path / "cp"),
              "--port", str(ports[2]), "--shards", "2", *tls)
        wait_for(lambda: client.get(f"{front}/healthz").status_code == 200,
                 what="the front end reaches both shards over https")
        token = (tmp_path / "cp" / "admin-token").read_text().strip()
        admin = httpx.Client(base_url=front, timeout=30, verify=ssl.create_default_context(
            cafile=ca), headers={"Authorization": f"Bearer {token}"})
        clients.append(admin)
        for ent in ("a", "b"):  # one on each shard
            assert admin.post("/v1/entitlements", json={
                "name": ent, "owner": "o", "quota": {"machines": 1}}).status_code == 201
        join = admin.post("/v1/tokens", json={"role": "join", "name": "c"}).json()["token"]
        spawn("agent", "plait.cli.agent", "--machine-id", "m0000000", "--control-plane",
              front, "--join-token-file", secret_file(tmp_path, join),
              "--data-dir", str(tmp_path / "agent"),
              "--interval", "0.3", "--ca-file", ca)
        assert admin.post("/v1/jobs", json={**JOB, "entitlement": "b"}).status_code == 201
        seen: list[Any] = []

        def task_runs() -> bool:
            seen[:] = [admin.get("/v1/jobs/s/tasks").json(), admin.get("/v1/machines").json()]
            return [t["state"] for t in seen[0]["tasks"]] == ["running"]
        try:
            wait_for(task_runs, what="shard 1's task runs, its agent reached over https",
                     logs=tmp_path)
        except AssertionError as e:
            raise AssertionError(f"{e}\nlast seen: {seen}") from None
        # the CLI, configured by the front end with the CA file
        listed = plait(env, "job", "list")
        assert listed.returncode == 0 and "s" in listed.stdout, listed.stderr
        moved = plait(env, "admin", "entitlement", "move", "b", "--to-shard", "0")
        assert moved.returncode == 0, moved.stderr
    finally:
        stop(procs, tmp_path, clients)
