"""A replicated control plane on this box, driven from outside: a ZooKeeper ensemble
(``LocalEnsemble``), ``replicas`` processes of ``plait serve`` on it (one leads, the
others follow), and one ``plait agent`` process per machine, given every replica's URL.
The fault tests and ``plait bench failover`` use it: SIGKILL a replica, a ZooKeeper
member, or every control-plane process, and watch through the REST API.

Every process's log is in ``work/logs``; the client configuration goes to ``work`` so
the user's is left alone.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from functools import partial
from pathlib import Path
from typing import Any

import httpx

from plait.harness.zkensemble import LocalEnsemble
from plait.testing import free_port, wait_for

#: what a check of a replica still starting or just killed may raise: "not yet"
NOT_YET = (httpx.HTTPError, OSError, ValueError, KeyError)


class FailoverClient:
    """An admin client over every replica: a request goes to the replica that answered
    last, and on to the next one when it cannot be reached or cannot serve (503)."""

    def __init__(self, urls: list[str], token: str, timeout: float = 10.0) -> None:
        self.urls = urls
        self.http = httpx.Client(timeout=timeout, headers={"Authorization": f"Bearer {token}"})
        self._at = 0

    def request(self, method: str, path: str, **kw: Any) -> httpx.Response:
        last: Exception | None = None
        for k in range(len(self.urls)):
            i = (self._at + k) % len(self.urls)
            try:
                r = self.http.request(method, self.urls[i] + path, **kw)
            except httpx.TransportError as exc:
                last = exc
                continue
            if r.status_code == 503:
                last = httpx.HTTPStatusError("503", request=r.request, response=r)
                continue
            self._at = i
            return r
        raise httpx.ConnectError(f"no replica could serve {method} {path}: {last}")

    def get(self, path: str, **kw: Any) -> httpx.Response:
        return self.request("GET", path, **kw)

    def post(self, path: str, **kw: Any) -> httpx.Response:
        return self.request("POST", path, **kw)

    def close(self) -> None:
        self.http.close()


class ReplicatedRegion:
    def __init__(self, work: Path, replicas: int = 2, machines: int = 3,
                 zk_members: int = 3, heartbeat_timeout: float = 3.0,
                 session_timeout: float = 1.0, interval: float = 0.3,
                 zk_tick_ms: int = 200, frontend: bool = False) -> None:
        """``frontend``: the replicas are those of scheduler shard 0 of a sharded
        region, behind a ``plait frontend`` process that clients and agents call."""
        self.work = Path(work)
        self.replicas = replicas
        self.machines = machines
        self.heartbeat_timeout = heartbeat_timeout
        self.session_timeout = session_timeout
        self.interval = interval
        (self.work / "logs").mkdir(parents=True, exist_ok=True)
        self.ensemble = LocalEnsemble(self.work / "zk", zk_members, tick_ms=zk_tick_ms)
        self.ports = [free_port() for _ in range(replicas)]
        self.urls = [f"http://127.0.0.1:{p}" for p in self.ports]
        self.frontend: subprocess.Popen[bytes] | None = None
        self.front_port = free_port() if frontend else None
        #: what clients and agents call: the front end, or every replica
        self.api_urls = [f"http://127.0.0.1:{self.front_port}"] if frontend else self.urls
        self.serves: list[subprocess.Popen[bytes] | None] = [None] * replicas
        self.agents: dict[str, subprocess.Popen[bytes]] = {}
        self.env = {**os.environ, "PLAIT_CONFIG": str(self.work / "config.yaml"),
                    "HOME": str(self.work), "XDG_CONFIG_HOME": str(self.work)}
        self.admin: FailoverClient | None = None
        self.join = ""
        #: machine -> the URLs its agent is given, when not every replica's
        self.agent_urls: dict[str, list[str]] = {}

    # -- processes ---------------------------------------------------------------------
    def _spawn(self, log: str, *args: str) -> subprocess.Popen[bytes]:
        with open(self.work / "logs" / f"{log}.log", "ab") as out:
            return subprocess.Popen([sys.executable, "-m", *args], env=self.env, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)

    def start_replica(self, i: int) -> None:
        self.serves[i] = self._spawn(
            f"serve-{i}", "plait.cli.main", "serve", "--store", self.ensemble.url,
            "--data-dir", str(self.work / "cp"), "--port", str(self.ports[i]),
            "--machines", str(self.machines), "--dcs", "1", "--msbs-per-dc",
            str(min(3, self.machines)), "--tick", "0.2",
            "--heartbeat-timeout", str(self.heartbeat_timeout), "--startup-grace", "30",
            "--session-timeout", str(self.session_timeout),
            *(["--no-write-config"] if i else []),
            *(["--shard", "0"] if self.front_port is not None else []))

    def start(self, timeout: float = 120.0) -> ReplicatedRegion:
        self.ensemble.start(timeout)
        # the first replica alone (it creates the region and the admin token), then the rest
        self.start_replica(0)
        wait_for(lambda: self.role(0) == "leader", timeout, "the first replica leads",
                 ignore=NOT_YET)
        for i in range(1, self.replicas):
            self.start_replica(i)
        for i in range(1, self.replicas):
            wait_for(partial(self.is_follower, i), timeout, f"replica {i} follows",
                     ignore=NOT_YET)
        if self.front_port is not None:
            self.frontend = self._spawn(
                "frontend", "plait.cli.main", "frontend", "--store", self.ensemble.url,
                "--data-dir", str(self.work / "cp"), "--port", str(self.front_port),
                "--shards", "1", "--no-write-config")
            wait_for(self._front_up, timeout, "the front end serves", ignore=NOT_YET)
        token = (self.work / "cp" / "admin-token").read_text().strip()
        self.admin = FailoverClient(self.api_urls, token)
        self.join = self.admin.post("/v1/tokens", json={"role": "join",
                                                        "name": "cluster"}).json()["token"]
        self.join_file = self.work / "join-token"  # (agents read it: never on argv)
        fd = os.open(self.join_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(self.join + "\n")
        for name in self.machine_names():
            self.start_agent(name, self.agent_urls.get(name))
        return self

    def start_agent(self, machine: str, urls: list[str] | None = None) -> None:
        """``urls``: the front ends this agent is given (every replica by default)."""
        self.agents[machine] = self._spawn(
            f"agent-{machine}", "plait.cli.agent", "--machine-id", machine,
            "--control-plane", ",".join(urls or self.api_urls), "--join-token-file",
            str(self.join_file),
            "--data-dir", str(self.work / "agents" / machine),
            "--interval", str(self.interval))

    def kill_replica(self, i: int) -> None:
        proc = self.serves[i]
        assert proc is not None
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)

    # -- observation -------------------------------------------------------------------
    def health(self, i: int) -> dict[str, Any]:
        r = httpx.get(f"{self.urls[i]}/healthz", timeout=2)
        return dict(r.json())

    def role(self, i: int) -> str | None:
        try:
            return str(self.health(i).get("role"))
        except (httpx.HTTPError, ValueError):
            return None

    def _front_up(self) -> bool:
        try:
            return httpx.get(f"{self.api_urls[0]}/healthz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def is_follower(self, i: int) -> bool:
        return self.role(i) == "follower"

    def leader(self) -> int | None:
        for i in range(self.replicas):
            if self.role(i) == "leader":
                return i
        return None

    def machine_names(self) -> list[str]:
        assert self.admin is not None
        found = self.admin.get("/v1/machines", params={"limit": 1000}).json()["machines"]
        return [m["id"] for m in found]

    def task_pids(self) -> dict[str, int]:
        """Every task's pid as its agent recorded it (``job.index`` -> pid)."""
        pids: dict[str, int] = {}
        for machine in self.agents:
            path = self.work / "agents" / machine / "agent.json"
            with contextlib.suppress(OSError, ValueError):
                state = json.loads(path.read_text())
                pids.update({k: t["handle"]["pid"] for k, t in state["tasks"].items()
                             if t.get("handle")})
        return pids

    def running(self, job: str, count: int) -> bool:
        assert self.admin is not None
        tasks = self.admin.get(f"/v1/jobs/{job}/tasks").json()["tasks"]
        return len(tasks) == count and all(t["state"] == "running" for t in tasks)

    def events(self, kind: str | None = None) -> list[dict[str, Any]]:
        assert self.admin is not None
        out: list[dict[str, Any]] = []
        after = 0
        while True:
            page = self.admin.get("/v1/events", params={"after": after, "limit": 1000}).json()
            out.extend(e for e in page["events"] if kind is None or e["kind"] == kind)
            if not page["events"] or page["next"] is None:
                return out
            after = page["next"]

    # -- teardown ----------------------------------------------------------------------
    def stop(self) -> None:
        if self.admin is not None:
            self.admin.close()
        for proc in [self.frontend, *self.serves, *self.agents.values()]:
            if proc is not None and proc.poll() is None:
                with contextlib.suppress(OSError):
                    os.killpg(proc.pid, signal.SIGTERM)
        for proc in [self.frontend, *self.serves, *self.agents.values()]:
            if proc is None:
                continue
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(OSError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=20)
        # the tasks outlive their agents by design: stopped here
        for pid in self.task_pids().values():
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)
        self.ensemble.stop()

    def __enter__(self) -> ReplicatedRegion:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()


class Writer:
    """A client writing continuously: creates job after job (no tasks) through any
    replica, keeping every name the control plane acknowledged (201) and when."""

    def __init__(self, region: ReplicatedRegion, entitlement: str, rate: float = 10.0,
                 prefix: str = "w") -> None:
        assert region.admin is not None
        self.region = region
        self.client = FailoverClient(region.api_urls, region.admin.http.headers["Authorization"]
                                     .split(" ", 1)[1], timeout=5.0)
        self.entitlement = entitlement
        self.gap = 1.0 / rate
        self.prefix = prefix
        #: (name, time acknowledged)
        self.acked: list[tuple[str, float]] = []
        self.failed = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="plait-writer")

    def _run(self) -> None:
        k = 0
        while not self._stop.is_set():
            name = f"{self.prefix}{k:06d}"
            spec = {"name": name, "entitlement": self.entitlement, "task_count": 0,
                    "command": "sleep", "args": ["infinity"],
                    "resources": {"cpu": 0.1, "memory_gb": 0.1}}
            try:
                r = self.client.post("/v1/jobs", json=spec)
                if r.status_code in (200, 201):
                    self.acked.append((name, time.time()))
                    k += 1
                else:
                    self.failed += 1
            except httpx.HTTPError:
                self.failed += 1  # (retried under the same name: a create is idempotent)
            self._stop.wait(self.gap)

    def start(self) -> Writer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        self.client.close()

    def lost(self) -> list[str]:
        """Acknowledged names the control plane does not have."""
        assert self.region.admin is not None
        found = self.region.admin.get("/v1/jobs", params={"entitlement": self.entitlement})
        names = {j["name"] for j in found.json()["jobs"]}
        return [n for n, _ in self.acked if n not in names]

