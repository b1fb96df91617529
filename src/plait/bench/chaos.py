"""``plait bench chaos``: a region on this box (``plait up``) under random SIGKILLs.

For ``seconds``, a seeded schedule updates and resizes a job of real HTTP servers
through the API while it SIGKILLs task processes, agents (started again by hand a
moment later, with the same command line) and the control plane itself (``plait up``,
started again: it adopts the agents). Then every process is brought back and:

* ``acknowledged``: job operations the API acknowledged; ``lost``: those whose
  version is not stored as sent (a kept version's spec is read back from the API;
  one the record no longer keeps must be in the job's operation log);
* ``double_serving_samples``: samples (every 0.25 s) in which discovery listed one
  task index twice, or an endpoint that another index's process serves;
* ``converge_s``: from the last restart to the job settled at its latest version,
  every task serving (None: not within the bound);
* ``orphans``: processes of the region left after Ctrl-C of ``plait up``.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from plait.localprocs import alive, kill_groups, plait_processes, processes_under

SERVER = "exec python3 -m http.server $PLAIT_PORT --bind 127.0.0.1"


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(e.decode(errors="replace").split("=", 1) for e in raw.split(b"\0") if b"=" in e)


def _argv(pid: int) -> list[str]:
    """The process's argv; [] once it is gone (it may exit between two reads)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return raw.decode(errors="replace").split("\0")[:-1]


class Region:
    def __init__(self, work: Path, machines: int) -> None:
        from plait.testing import free_port

        self.work, self.machines = work, machines
        self.data = work / "data"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {k: v for k, v in os.environ.items() if k not in ("PLAIT_URL", "PLAIT_TOKEN")}
        self.env["PLAIT_CONFIG"] = str(work / "config.yaml")
        self.up: subprocess.Popen[bytes] | None = None
        self.hand: list[subprocess.Popen[bytes]] = []
        self.api = httpx.Client(base_url=self.url, timeout=5.0)

    def start(self, timeout: float = 90.0) -> None:
        with open(self.work / "up.log", "ab") as log:
            self.up = subprocess.Popen(
                [sys.executable, "-m", "plait.cli.main", "up", "--data-dir", str(self.data),
                 "--machines", str(self.machines), "--port", str(self.port),
                 "--heartbeat-timeout", "3", "--startup-grace", "5"],
                env=self.env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if self.api.get("/healthz").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        else:
            raise RuntimeError("plait up did not start within its bound")
        token = (self.data / "admin-token").read_text().strip()
        self.api.headers["Authorization"] = f"Bearer {token}"

    def tasks(self) -> dict[int, int]:
        """pid of each live task process of the job (by the index it runs as)."""
        found = {}
        for pid in processes_under(self.data):
            env = _environ(pid)
            if env.get("PLAIT_JOB") == "web" and alive(pid) and "http.server" in " ".join(
                    _argv(pid)):
                found[pid] = int(env["PLAIT_TASK_INDEX"])
        return found

    def restart_by_hand(self, pid: int, delay: float) -> bool:
        """SIGKILL the agent ``pid`` and start it again after ``delay`` s as it was
        started; False if it was gone already."""
        argv, env = _argv(pid), _environ(pid)
        if not argv:
            return False
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)

        def again() -> None:
            time.sleep(delay)
            with open(self.work / "hand.log", "ab") as log:
                self.hand.append(subprocess.Popen(argv, env=env, stdout=log,
                                                  stderr=subprocess.STDOUT,
                                                  start_new_session=True))
        threading.Thread(target=again, daemon=True).start()
        return True

    def stop(self) -> int:
        """Ctrl-C ``plait up``; the processes of the region it left (killed then)."""
        if self.up is not None and self.up.poll() is None:
            self.up.send_signal(signal.SIGINT)
            try:
                self.up.wait(timeout=90)
            except subprocess.TimeoutExpired:
                self.up.kill()
        for p in self.hand:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=10)
        left = {p for p in processes_under(self.data) if alive(p)}
        kill_groups(left)
        return len(left)


def run(seconds: float = 300.0, seed: int = 0, machines: int = 4, tasks: int = 3,
        converge_bound: float = 120.0) -> dict[str, Any]:
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory(prefix="plait-chaos-") as tmp:
        region = Region(Path(tmp), machines)
        region.start()
        api = region.api
        spec: dict[str, Any] = {
            "name": "web", "entitlement": "web", "task_count": tasks, "command": "sh",
            "args": ["-c", SERVER], "env": {"V": "0"}, "resources": {"cpu": 0.1, "memory_gb": 0.1},
            "update": {"max_unavailable": 1},
            "health": {"http": "/", "interval_seconds": 0.5, "failure_threshold": 2},
            "kill_timeout_seconds": 2}
        api.post("/v1/entitlements", json={"name": "web", "owner": "o",
                                           "quota": {"machines": machines}})
        r = api.post("/v1/jobs", json=spec)
        r.raise_for_status()
        #: version -> (V, task_count) as sent and acknowledged
        acked: dict[int, tuple[str, int]] = {1: ("0", tasks)}
        kills = {"task": 0, "agent": 0, "control_plane": 0}
        samples = {"n": 0, "double": 0}
        stop = threading.Event()

        def sample() -> None:
            while not stop.is_set():
                try:
                    found = api.get("/v1/discovery/web").json()["endpoints"]
                except (httpx.HTTPError, ValueError, KeyError, OSError):
                    stop.wait(0.25)
                    continue
                samples["n"] += 1
                indices = [e["index"] for e in found]
                ports = {int(_environ(pid).get("PLAIT_PORT", 0)): index
                         for pid, index in region.tasks().items()}
                wrong = [e for e in found if e["endpoint"] and ports.get(
                    int(e["endpoint"].rsplit(":", 1)[1]), e["index"]) != e["index"]]
                if len(indices) != len(set(indices)) or wrong:
                    samples["double"] += 1
                stop.wait(0.25)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        current: dict[str, Any] = dict(spec)
        started = time.monotonic()
        while time.monotonic() - started < seconds:
            time.sleep(rng.uniform(0.5, 2.0))
            action = rng.random()
            try:
                if action < 0.35:
                    body = {**current, "env": {"V": str(rng.randrange(10**6))}}
                    r = api.put("/v1/jobs/web", json=body)
                    if r.status_code == 200:
                        current = body
                        acked[r.json()["version"]] = (body["env"]["V"], body["task_count"])
                elif action < 0.5:
                    count = rng.randint(max(1, tasks - 1), tasks + 1)
                    r = api.post("/v1/jobs/web/resize", json={"task_count": count})
                    if r.status_code == 200:
                        current = {**current, "task_count": count}
                        acked[r.json()["version"]] = (current["env"]["V"], count)
                elif action < 0.65:
                    live = list(region.tasks())
                    if live:
                        kill_groups([rng.choice(live)])
                        kills["task"] += 1
                elif action < 0.8:
                    agents = sorted(plait_processes(region.data / "agents", "agent"))
                    if agents and region.restart_by_hand(rng.choice(agents),
                                                         rng.uniform(0.5, 3.0)):
                        kills["agent"] += 1
                elif action < 0.9 and region.up is not None:
                    os.kill(region.up.pid, signal.SIGKILL)
                    region.up.wait(timeout=30)
                    kills["control_plane"] += 1
                    time.sleep(rng.uniform(0.5, 2.0))
                    region.start()
            except httpx.HTTPError:
                pass  # (the control plane is down: nothing acknowledged)
        # every process back (agents restarted by hand are; the control plane too)
        time.sleep(3.5)
        quiet = time.monotonic()
        converged: float | None = None
        latest = max(acked)
        job: dict[str, Any] = {}
        resumed = 0
        while time.monotonic() - quiet < converge_bound:
            try:
                job = api.get("/v1/jobs/web").json()
                if job["settled"] and job["version"] >= latest and job["serving"] == (
                        job["task_count"]):
                    converged = time.monotonic() - quiet
                    break
                if job["halted"] and not resumed:
                    # the kills halted the last rollout (without a memory cgroup an
                    # agent cannot tell a kill from out of memory, and a new task killed
                    # counts as the version failing): an operator resumes
                    api.post("/v1/jobs/web/resume").raise_for_status()
                    resumed += 1
            except (httpx.HTTPError, ValueError, KeyError):
                pass
            time.sleep(0.2)
        stop.set()
        sampler.join(timeout=10)
        lost = 0
        try:  # the versions the record keeps; the others only as logged operations
            history = api.get("/v1/jobs/web/history").json()
            kept = set(history["kept"])
            logged = {e.get("version") for e in history["operations"]}
        except (httpx.HTTPError, ValueError, KeyError):
            kept, logged = set(acked), set()
        for version, (v, count) in acked.items():
            if version not in kept:  # trimmed (keep_versions): logged, and not the last
                lost += version not in logged or version == max(acked)
                continue
            try:
                got = api.get(f"/v1/jobs/web/versions/{version}").json()
                if got["env"].get("V") != v or got["task_count"] != count:
                    lost += 1
            except (httpx.HTTPError, ValueError, KeyError):
                lost += 1
        orphans = region.stop()
    return {"seconds": seconds, "seed": seed, "machines": machines, "kills": sum(kills.values()),
            "kills_by_kind": kills, "acknowledged": len(acked), "lost": lost,
            "samples": samples["n"], "double_serving_samples": samples["double"],
            "converge_s": None if converged is None else round(converged, 2),
            "halted_and_resumed": resumed,
            "unconverged_job": None if converged is not None else {
                k: job.get(k) for k in ("version", "applied_version", "halted", "tasks",
                                        "serving", "updated", "unplaced_reason", "error")},
            "orphans": orphans}
