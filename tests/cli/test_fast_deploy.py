"""`plait job deploy FILE` without the full command: the same request and the same
line, and the full command for everything else."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from plait.cli import fast
from plait.clientconfig import ClientConfig

SPEC = {"name": "fast", "entitlement": "web", "task_count": 1, "command": "serve",
        "resources": {"cpu": 0.5, "memory_gb": 0.5}}


@pytest.fixture
def region(plane):
    ctx = ClientConfig.load().resolve()
    with httpx.Client(base_url=ctx.urls[0], timeout=30,
                      headers={"Authorization": f"Bearer {ctx.token}"}) as admin:
        admin.post("/v1/entitlements", json={"name": "web", "owner": "o",
                                             "quota": {"machines": 4}}).raise_for_status()
        yield admin


def stored(admin: httpx.Client, name: str) -> dict:
    r = admin.get(f"/v1/jobs/{name}")
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.parametrize("form", ["yaml", "json"])
def test_a_deploy_is_one_put_and_prints_what_the_full_command_prints(
        region, tmp_path, capsys, form):
    path = tmp_path / f"fast.{form}"
    path.write_text(json.dumps(SPEC) if form == "json" else
                    "\n".join(f"{k}: {json.dumps(v)}" for k, v in SPEC.items()))
    assert fast.deploy(["plait", "job", "deploy", str(path)]) == 0
    assert capsys.readouterr().err == "job fast: version 1 stored (created)\n"
    assert stored(region, "fast")["spec"]["task_count"] == 1
    assert fast.deploy(["plait", "job", "deploy", str(path)]) == 0  # the same spec again
    assert capsys.readouterr().err == ("job fast: version 1 stored (unchanged: the job runs "
                                       "this spec already)\n")
    path.write_text(json.dumps({**SPEC, "task_count": 2}))
    assert fast.deploy(["plait", "job", "deploy", str(path)]) == 0
    assert capsys.readouterr().err == "job fast: version 2 stored (updated)\n"
    assert stored(region, "fast")["version"] == 2


def test_everything_else_goes_to_the_full_command(region, tmp_path, monkeypatch):
    def deploy(text: str, *options: str) -> int | None:
        path = tmp_path / "spec.yaml"
        path.write_text(text)
        return fast.deploy(["plait", "job", "deploy", *options, str(path)])

    good = json.dumps(SPEC)
    assert deploy(good, "--wait") is None  # any option
    assert deploy(good, "-o", "json") is None
    assert deploy(json.dumps({**SPEC, "entitlement": "nosuch"})) is None  # a 422
    assert deploy(json.dumps({k: v for k, v in SPEC.items() if k != "name"})) is None
    assert deploy("jobs:\n  - name: a\n  - name: b\n") is None  # a list of jobs
    assert deploy(f"{good}\n---\n{good}") is None  # two documents
    assert deploy("a: [b") is None  # not YAML
    assert fast.deploy(["plait", "job", "deploy", str(tmp_path / "missing.yaml")]) is None
    assert fast.deploy(["plait", "job", "list"]) is None
    monkeypatch.setenv("PLAIT_TOKEN", "plait_0000_wrong")
    assert deploy(good) is None  # a 401
    monkeypatch.setenv("PLAIT_TOKEN", "plait_x\r\nX-Injected: 1")
    assert deploy(good) is None  # nothing that could end a header line is sent
    monkeypatch.setenv("PLAIT_TOKEN", "t")
    monkeypatch.setenv("PLAIT_URL", "https://127.0.0.1:1")
    assert deploy(good) is None  # https: the SDK, with its certificate checks
    assert "fast" not in [j["name"] for j in region.get("/v1/jobs").json()["jobs"]]


def test_the_plait_command_falls_back_and_reports_the_error(region, tmp_path):
    """As a script runs it: one process, and the full command's message and exit code
    for what the fast path does not take."""
    script = Path(sys.executable).parent / "plait"
    command = [str(script)] if script.exists() else [sys.executable, "-c",
                                                     "from plait.cli.fast import run; run()"]
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({**SPEC, "entitlement": "nosuch"}))
    done = subprocess.run([*command, "job", "deploy", str(path)], capture_output=True,
                          env=os.environ, timeout=60)
    assert done.returncode == 2
    assert "entitlement" in done.stderr.decode() and "nosuch" in done.stderr.decode()
    path.write_text(json.dumps(SPEC))
    done = subprocess.run([*command, "job", "deploy", str(path)], capture_output=True,
                          env=os.environ, timeout=60)
    assert done.returncode == 0 and done.stderr.decode() == \
        "job fast: version 1 stored (created)\n"


def test_the_client_configuration_is_written_as_json_and_read_as_yaml_too(tmp_path):
    path = tmp_path / "config.yaml"
    config = ClientConfig()
    config.set_context("a", "http://127.0.0.1:1", "plait_t", ca_file=None)
    config.save(path)
    assert json.loads(path.read_text())["contexts"]["a"]["url"] == "http://127.0.0.1:1"
    assert ClientConfig.load(path).contexts["a"].token == "plait_t"
    path.write_text("current_context: b\ncontexts:\n  b: {url: 'http://h:2', token: x}\n")
    loaded = ClientConfig.load(path)
    assert loaded.current_context == "b" and loaded.contexts["b"].url == "http://h:2"
