"""Every long-running command stops cleanly on SIGINT and on SIGTERM, also when a
script started it in the background: a background job of a non-interactive shell
starts with SIGINT ignored (POSIX), and a process that only relies on the default
handlers (Python's KeyboardInterrupt, uvicorn's) never hears a Ctrl-C sent to it.
Each command here is started with SIGINT ignored, as such a shell starts it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from plait.localprocs import alive, kill_groups, processes_under
from plait.testing import free_port, wait_for

#: a liveness bound: a stop that takes longer is a stop that did not happen
STOP_BOUND = 60.0
#: a liveness bound on a start
START_BOUND = 90.0


def background(argv: list[str], tmp_path: Path, log: str) -> subprocess.Popen[bytes]:
    """``plait ARGV`` as ``plait ... &`` in a script starts it: SIGINT ignored (and a
    process group of its own, so that the test can clean up whatever is left)."""
    def as_a_background_job() -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        os.setpgid(0, 0)
    env = {**os.environ, "PLAIT_CONFIG": str(tmp_path / "config.yaml")}
    with open(tmp_path / log, "ab") as out:
        return subprocess.Popen([sys.executable, "-m", "plait.cli.main", *argv],
                                stdout=out, stderr=subprocess.STDOUT, env=env,
                                preexec_fn=as_a_background_job)


def answers(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def stops(proc: subprocess.Popen[bytes], sig: int, tmp_path: Path, log: str) -> None:
    proc.send_signal(sig)
    try:
        proc.wait(timeout=STOP_BOUND)
    except subprocess.TimeoutExpired:
        kill_groups([proc.pid])
        proc.wait()
        raise AssertionError(f"{signal.Signals(sig).name} did not stop it: "
                             f"{(tmp_path / log).read_text()[-3000:]}") from None


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_serve_stops_on_a_signal_started_in_the_background(tmp_path: Path, sig: int) -> None:
    port = free_port()
    proc = background(["serve", "--data-dir", str(tmp_path / "data"), "--port", str(port),
                       "--machines", "4", "--no-write-config"], tmp_path, "serve.log")
    try:
        wait_for(lambda: answers(f"http://127.0.0.1:{port}") or proc.poll() is not None,
                 START_BOUND)
        assert proc.poll() is None, (tmp_path / "serve.log").read_text()
        stops(proc, sig, tmp_path, "serve.log")
    finally:
        kill_groups([proc.pid])


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_serve_stops_on_a_signal_while_its_store_does_not_answer(tmp_path: Path,
                                                                 sig: int) -> None:
    """Before it serves (here: waiting for a ZooKeeper that accepts connections and
    never answers), a signal stops it too: not the store's timeout, later."""
    import socket
    import threading

    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []

    def accept() -> None:
        with contextlib.suppress(OSError):
            while True:
                held.append(listener.accept()[0])  # (and never a word)
    threading.Thread(target=accept, daemon=True).start()
    zk = f"zk://127.0.0.1:{listener.getsockname()[1]}"
    proc = background(["serve", "--data-dir", str(tmp_path / "data"), "--store", zk,
                       "--port", str(free_port()), "--machines", "4", "--no-write-config"],
                      tmp_path, "serve.log")
    try:
        # (it waits for the store)
        wait_for(lambda: bool(held) or proc.poll() is not None, START_BOUND)
        assert proc.poll() is None, (tmp_path / "serve.log").read_text()
        stops(proc, sig, tmp_path, "serve.log")
        said = (tmp_path / "serve.log").read_text()
        assert "error" not in said.lower(), said  # (stopped by the signal, not a timeout)
        assert proc.returncode in (1, 130, -sig), (proc.returncode, said)
    finally:
        kill_groups([proc.pid])
        listener.close()
        for s in held:
            s.close()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_an_agent_stops_on_a_signal_started_in_the_background(
        tmp_path: Path, sig: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # (a control plane that does not answer: the agent waits to join, and still stops)
    monkeypatch.setenv("PLAIT_JOIN_TOKEN", "plait_x_y")  # (a token nobody checks)
    proc = background(["agent", "--machine-id", "m0000000", "--control-plane",
                       f"http://127.0.0.1:{free_port()}", "--data-dir", str(tmp_path / "a"),
                       "--interval", "0.2"], tmp_path, "agent.log")
    try:
        wait_for(lambda: (tmp_path / "a" / "agent.pid").exists() or proc.poll() is not None,
                 START_BOUND)
        assert proc.poll() is None, (tmp_path / "agent.log").read_text()
        stops(proc, sig, tmp_path, "agent.log")
    finally:
        kill_groups([proc.pid])


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_up_stops_the_whole_region_on_a_signal_started_in_the_background(
        tmp_path: Path, sig: int) -> None:
    data = tmp_path / "region"
    port = free_port()
    proc = background(["up", "--data-dir", str(data), "--port", str(port), "--machines", "2",
                       "--dcs", "1", "--msbs-per-dc", "1"], tmp_path, "up.out")
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: answers(url) or proc.poll() is not None, START_BOUND)
        assert proc.poll() is None, (tmp_path / "up.out").read_text()
        # its agents run (processes of their own, under the data dir), and a job's tasks
        from plait.client import Client
        from plait.clientconfig import ClientConfig

        token = ClientConfig.load(tmp_path / "config.yaml").resolve().token
        with Client(url, token=token) as c:
            c.entitlements.create({"name": "e", "owner": "o", "quota": {"machines": 2}})
            c.jobs.create({"name": "sleepy", "entitlement": "e", "task_count": 2,
                           "command": "sleep", "args": ["3600"],
                           "resources": {"cpu": 0.1, "memory_gb": 0.1}})
            wait_for(lambda: [t["state"] for t in c.jobs.tasks("sleepy")] == ["running"] * 2,
                     START_BOUND)
        region = processes_under(data.resolve())
        assert len(region) >= 4, region  # (2 agents, 2 tasks)
        stops(proc, sig, tmp_path, "up.out")
        assert proc.returncode == 0 or proc.returncode == -sig, proc.returncode
        wait_for(lambda: not any(alive(p) for p in region), STOP_BOUND)
        assert processes_under(data.resolve()) == set()
    finally:
        left = processes_under(data.resolve())
        kill_groups([proc.pid, *left])
