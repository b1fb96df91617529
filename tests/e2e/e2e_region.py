"""A region of real processes on loopback for the e2e tests: `plait serve` and one
`plait agent` per machine, whose tasks are real processes. Every wait is bounded by a
generous liveness timeout; nothing here asserts speed."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from plait.testing import WaitTimeout, free_port
from plait.testing import wait_for as _wait_for


def wait_for(check: Callable[[], Any], timeout: float = 60.0, what: str | None = None,
             logs: Path | None = None) -> Any:
    """:func:`plait.testing.wait_for` a check of the region (not answering yet counts
    as "not yet"); on timeout, fail with the tail of every `*.log` under `logs` (the
    region's processes), so that a failure in CI says why."""
    try:
        return _wait_for(check, timeout, what, poll=0.2, ignore=(httpx.TransportError,))
    except WaitTimeout as exc:
        tails = "".join(f"\n--- {p.name}\n{p.read_text(errors='replace')[-2000:]}"
                        for p in sorted(logs.rglob("*.log"))) if logs else ""
        raise WaitTimeout(f"{exc}{tails}") from None


def answers(endpoint: str) -> bool:
    return httpx.get(f"http://{endpoint}/", timeout=2).status_code == 200


def content(endpoint: str, timeout: float = 3.0, client: httpx.Client | None = None) -> str | None:
    """What GET / answers with (None: no 200 answer, or no answer at all). Pass a
    ``client`` when probing often: a new one costs tens of milliseconds (TLS setup)."""
    try:
        if client is None:
            r = httpx.get(f"http://{endpoint}/", timeout=timeout)
        else:
            r = client.get(f"http://{endpoint}/", timeout=timeout)
    except httpx.HTTPError:
        return None
    return r.text if r.status_code == 200 else None


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


class Region:
    """``plait serve`` with ``machines`` machines (``dcs`` x ``msbs_per_dc`` MSBs), and
    agents started per machine (joining as that existing machine id). Logs of every
    process are in ``tmp/logs``."""

    def __init__(self, tmp: Path, machines: int = 8, dcs: int = 2, msbs_per_dc: int = 2,
                 heartbeat_timeout: float = 3.0, startup_grace: float = 0.0,
                 interval: float = 0.3) -> None:
        self.tmp = tmp
        self.interval = interval
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {**os.environ, "PLAIT_CONFIG": str(tmp / "config.yaml")}
        self.procs: list[subprocess.Popen[bytes]] = []
        self.agents: dict[str, subprocess.Popen[bytes]] = {}
        (tmp / "logs").mkdir(parents=True, exist_ok=True)
        self.serve = self._spawn("serve", "serve", "--data-dir", str(tmp / "cp"), "--port",
                                 str(self.port), "--machines", str(machines), "--dcs",
                                 str(dcs), "--msbs-per-dc", str(msbs_per_dc), "--tick", "0.2",
                                 "--heartbeat-timeout", str(heartbeat_timeout),
                                 # machines whose agent never starts fail after the
                                 # heartbeat timeout, unless a longer grace is given
                                 "--startup-grace", str(startup_grace))
        wait_for(lambda: httpx.get(f"{self.url}/healthz").status_code == 200,
                 what="the control plane starts")
        token = (tmp / "cp" / "admin-token").read_text().strip()
        self.admin = httpx.Client(base_url=self.url, timeout=30,
                                  headers={"Authorization": f"Bearer {token}"})
        self.join = self.admin.post("/v1/tokens", json={"role": "join",
                                                        "name": "cluster"}).json()["token"]
        self.join_file = tmp / "join-token"
        self.join_file.write_text(self.join + "\n")

    def _spawn(self, log: str, *args: str) -> subprocess.Popen[bytes]:
        with open(self.tmp / "logs" / f"{log}.log", "ab") as out:
            proc = subprocess.Popen([sys.executable, "-m", "plait.cli.main", *args],
                                    env=self.env, stdout=out, stderr=subprocess.STDOUT)
        self.procs.append(proc)
        return proc

    def client(self) -> httpx.Client:
        """Another admin client (one per thread)."""
        return httpx.Client(base_url=self.url, timeout=30, headers=dict(self.admin.headers))

    def machine_names(self) -> list[str]:
        found = self.admin.get("/v1/machines", params={"limit": 1000}).json()["machines"]
        return [m["id"] for m in found]

    def start_agent(self, machine: str) -> None:
        self.agents[machine] = self._spawn(
            f"agent-{machine}", "agent", "--machine-id", machine, "--control-plane", self.url,
            "--join-token-file", str(self.join_file),
            "--data-dir", str(self.tmp / "agents" / machine),
            "--interval", str(self.interval))

    def task_pids(self, machine: str) -> dict[str, int]:
        state = json.loads((self.tmp / "agents" / machine / "agent.json").read_text())
        return {k: t["handle"]["pid"] for k, t in state["tasks"].items() if t["handle"]}

    def kill_machine(self, machine: str) -> dict[str, int]:
        """The machine dies: its agent and every task it runs are SIGKILLed (the agent
        first, so it starts nothing more; then each task's process group, its pid, as
        the agent recorded it in agent.json). Returns the tasks' pids."""
        proc = self.agents[machine]
        proc.kill()
        proc.wait(timeout=30)
        pids = self.task_pids(machine)
        for pid in pids.values():
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)
        return pids

    def endpoints(self, job: str = "web", client: httpx.Client | None = None) -> dict[int, str]:
        found = (client or self.admin).get(f"/v1/discovery/{job}").json()["endpoints"]
        return {e["index"]: e["endpoint"] for e in found if e["endpoint"]}

    def tasks(self, job: str = "web", client: httpx.Client | None = None) -> list[dict[str, Any]]:
        return (client or self.admin).get(f"/v1/jobs/{job}/tasks").json()["tasks"]

    def events(self, job: str | None = None) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        after = 0
        while True:
            params: dict[str, Any] = {"after": after, "limit": 1000}
            if job is not None:
                params["job"] = job
            page = self.admin.get("/v1/events", params=params).json()
            out.extend(page["events"])
            if not page["events"] or page["next"] is None:
                return out
            after = page["next"]

    def task_errors(self, lines: int = 5) -> dict[str, list[str]]:
        """The last lines of every task log that shows an error (for diagnoses)."""
        found = {}
        for log in sorted((self.tmp / "agents").glob("*/logs/*.log")):
            text = log.read_text(errors="replace").splitlines()
            if any("Error" in line or "Traceback" in line for line in text):
                found[f"{log.parent.parent.name}/{log.name}"] = text[-lines:]
        return found

    def ours(self) -> list[int]:
        """Processes still running that this region started (directly or through its
        agents): every one has this region's directory in its environment."""
        mark = str(self.tmp).encode()
        found = []
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                env = Path(f"/proc/{entry.name}/environ").read_bytes()
            except OSError:
                continue
            if mark in env and alive(int(entry.name)):
                found.append(int(entry.name))
        return found

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=20)
        for machine in self.agents:  # the tasks outlive their agents by design
            try:
                for pid in self.task_pids(machine).values():
                    os.killpg(pid, signal.SIGKILL)
            except (OSError, ValueError):
                pass
        # and whatever an agent started but had not recorded yet (killed mid-step); a
        # SIGKILLed process takes a moment to be gone
        def killed() -> bool:
            for pid in (left := self.ours()):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            return not left

        with contextlib.suppress(WaitTimeout):  # (a clean-up: best effort, bounded)
            _wait_for(killed, 20, "every process of the region gone")
        self.admin.close()


@dataclass
class Sample:
    """One look at a job: its discovery, then a GET / on each listed endpoint, then its
    discovery again and its tasks view. The looks are not one instant, so a task is
    judged down at the first discovery (not listed then, or listed and not answering
    while still listed at the second) and at the second (not listed then, or not
    answering): a task that came up while another went down during the sample is not
    counted twice, while two tasks down together at either end are both counted."""

    #: wall-clock time (the control plane's clock) when the sample was started...
    at: float
    #: ...and when it ended (the tasks view was read)
    end: float
    #: task index -> discovery endpoint, as listed first...
    endpoints: dict[int, str]
    #: ...and after the probes
    endpoints_after: dict[int, str]
    #: task index -> what GET / answered (only the indices that answered 200)
    up: dict[int, str]
    #: the tasks view, read last
    tasks: list[dict[str, Any]]

    def down(self, count: int) -> set[int]:
        """The task indices down at the start or at the end, whichever are more."""
        indices = set(range(count))
        failed = set(self.endpoints) - set(self.up)
        first = (indices - set(self.endpoints)) | (failed & set(self.endpoints_after))
        last = (indices - set(self.endpoints_after)) | (failed & set(self.endpoints_after))
        return max(first, last, key=len)


@dataclass
class Sampler:
    """Every ``period`` seconds, in a thread: a :class:`Sample` of the job, which
    tells which of its task indices answer HTTP 200 on their discovery endpoint (one
    that is not listed, or does not answer, is down)."""

    region: Region
    job: str = "web"
    period: float = 0.1
    samples: list[Sample] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sampler", daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=60)

    def _run(self) -> None:
        with self.region.client() as api, httpx.Client() as probe:
            while not self._stop.is_set():
                started, at = time.monotonic(), time.time()
                try:
                    endpoints = self.region.endpoints(self.job, api)
                    up = {}
                    for index, endpoint in endpoints.items():
                        text = content(endpoint, client=probe)
                        if text is not None:
                            up[index] = text
                    after = self.region.endpoints(self.job, api)
                    tasks = self.region.tasks(self.job, api)
                    self.samples.append(Sample(at, time.time(), endpoints, after, up, tasks))
                except (httpx.HTTPError, ValueError, KeyError) as exc:  # the API, not a task
                    self.errors.append(f"{at:.3f}: {type(exc).__name__}: {exc}")
                self._stop.wait(max(0.0, self.period - (time.monotonic() - started)))
