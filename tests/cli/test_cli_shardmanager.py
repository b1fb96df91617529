"""plait shardmanager: serve makes its token file (mode 0600) and serves; define takes
the job's controller key from plait when it is not given; show prints what it
holds; a missing token file and a malformed key are refused by name."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from test_cli_client import plait, write

from plait.testing import free_port, wait_for


def test_serve_define_and_show(plane, tmp_path: Path) -> None:
    token_file, port = tmp_path / "sm-token", free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "plait.cli.main", "shardmanager", "serve", "--port", str(port),
         "--token-file", str(token_file), "--data-dir", str(tmp_path / "sm")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_for(lambda: proc.poll() is not None
                 or httpx.get(f"{url}/healthz").status_code == 200,
                 what="the shard manager serves", ignore=(httpx.HTTPError,))
        assert proc.poll() is None
        assert stat.S_IMODE(os.stat(token_file).st_mode) == 0o600
        plait("entitlement", "create", "--name", "e", "--owner", "alice", "--machines", "4")
        plait("job", "deploy", str(write(tmp_path, "kv.yaml", "name: kv\nentitlement: e\n"
                                         "task_count: 2\ncommand: sleep\nargs: ['3600']\n"
                                         "resources: {cpu: 1, memory_gb: 1}\n")))
        said = plait("shardmanager", "define", "kv", "--job", "kv", "--shards", "8",
                     "--url", url, "--token-file", str(token_file)).stdout
        assert f"{url}/v1/apps/kv/taskcontrol" in said
        shown = json.loads(plait("shardmanager", "show", "kv", "--url", url,
                                 "--token-file", str(token_file)).stdout)
        assert shown["shards"] == 8 and shown["controller"] is True
        assert shown["spec"]["job"] == "kv" and "controller_key" not in shown["spec"]
        assert shown["spec"]["tasks"] == 2  # (the job's task count, read from plait)
        secret = plait("shardmanager", "token", "kv", "--token-file", str(token_file)
                       ).stdout.strip()
        reader = plait("shardmanager", "token", "kv", "--reader", "--token-file",
                       str(token_file)).stdout.strip()
        assert secret.startswith("smt_") and reader.startswith("smr_")
        assert httpx.get(f"{url}/v1/apps/kv/map", headers={
            "Authorization": f"Bearer {reader}"}).status_code == 200
        assert httpx.get(f"{url}/v1/apps/kv/map", headers={
            "Authorization": f"Bearer {secret}"}).status_code == 401
        bad = plait("shardmanager", "define", "kv2", "--job", "kv", "--shards", "8",
                    "--controller-key", "nope", "--url", url, "--token-file",
                    str(token_file), ok=False)
        assert bad.exit_code == 1 and "controller_key" in bad.output
        missing = plait("shardmanager", "show", "kv", "--url", url, "--token-file",
                        str(tmp_path / "none"), ok=False)
        said = " ".join(missing.output.replace("│", " ").split())
        assert missing.exit_code != 0 and "does not exist" in said
        # a job plait does not have, a Shard Manager not there: one line each, named
        nojob = plait("shardmanager", "define", "kv3", "--job", "nojob", "--shards", "8",
                      "--url", url, "--token-file", str(token_file), ok=False)
        assert nojob.exit_code != 0, nojob.output
        assert "nojob" in nojob.output and "Traceback" not in nojob.output
        assert nojob.exception is None or isinstance(nojob.exception, SystemExit)
        away = f"http://127.0.0.1:{free_port()}"
        gone = plait("shardmanager", "show", "kv", "--url", away, "--token-file",
                     str(token_file), ok=False)
        assert gone.exit_code == 3 and isinstance(gone.exception, SystemExit)
        assert f"Shard Manager at {away}/v1/apps/kv not reached" in gone.output
        assert len(gone.output.strip().splitlines()) <= 2
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


def serve_in_background(tmp_path: Path, port: int) -> subprocess.Popen[bytes]:
    """``plait shardmanager serve`` as a script's background job starts it: SIGINT
    ignored (a non-interactive shell's ``&``)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "plait.cli.main", "shardmanager", "serve", "--port", str(port),
         "--token-file", str(tmp_path / "sm-token"), "--data-dir", str(tmp_path / "sm")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    wait_for(lambda: proc.poll() is not None
             or httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200,
             what="the shard manager serves", ignore=(httpx.HTTPError,))
    assert proc.poll() is None
    return proc


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_serve_stops_cleanly_on_sigint_and_sigterm(tmp_path: Path, sig: int) -> None:
    port = free_port()
    proc = serve_in_background(tmp_path, port)
    try:
        token = (tmp_path / "sm-token").read_text().strip()
        r = httpx.put(f"http://127.0.0.1:{port}/v1/apps/kv", json={"job": "kv", "shards": 3},
                      headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 200
        proc.send_signal(sig)
        assert proc.wait(timeout=60) == 0
        # the clean stop saved the maps
        saved = json.loads((tmp_path / "sm" / "shardmanager.json").read_text())
        assert "kv" in saved["apps"]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
