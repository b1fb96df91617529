"""A ZooKeeper store without credentials: the control plane says so, at start (a log
line of ``plait serve``) and in ``/healthz``'s ``warnings``; with credentials it says
nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import httpx
from kazoo.client import KazooClient

from plait.model import RegionSpec
from plait.server.controlplane import ControlPlane, ControlPlaneConfig
from plait.server.serve import ApiServer, store_for
from plait.testing import free_port, wait_for

REGION = RegionSpec.sized(4, dcs=1, msbs_per_dc=1, rows_per_msb=1, racks_per_row=1)


def chroot(zookeeper: str, name: str) -> str:
    """``host:port/name``, made (a control plane of its own there)."""
    client = KazooClient(hosts=zookeeper, timeout=5)
    client.start(timeout=10)
    try:
        client.ensure_path(f"/{name}")
    finally:
        client.stop()
        client.close()
    return f"{zookeeper}/{name}"


def health(store_url: str, tmp_path) -> dict:
    cp = ControlPlane(store_for(tmp_path, store_url), ControlPlaneConfig(
        region=REGION, tick_seconds=0.05))
    server = ApiServer(cp).start()
    try:
        return httpx.get(f"{server.url}/healthz", timeout=30).json()
    finally:
        server.stop()
        cp.store.close()


def test_healthz_warns_of_a_zookeeper_store_without_credentials(zookeeper, tmp_path):
    said = health(f"zk://{chroot(zookeeper, 'warn-open')}", tmp_path / "a")
    assert len(said["warnings"]) == 1, said
    assert "no credentials" in said["warnings"][0]
    assert "auth_file" in said["warnings"][0]
    creds = tmp_path / "zk-auth"
    creds.write_text("plait:s3cret\n")
    said = health(f"zk://{chroot(zookeeper, 'warn-closed')}?auth_file={creds}", tmp_path / "b")
    assert said["warnings"] == [], said


def test_healthz_of_a_sqlite_store_has_no_warnings(tmp_path):
    assert health(None, tmp_path)["warnings"] == []  # type: ignore[arg-type]


def test_plait_serve_logs_the_warning_at_start(zookeeper, tmp_path):
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "plait.cli.main", "serve", "--data-dir", str(tmp_path),
         "--store", f"zk://{chroot(zookeeper, 'warn-serve')}", "--port", str(port),
         "--machines", "4", "--no-write-config"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PLAIT_CONFIG": str(tmp_path / "config.yaml")})
    try:
        wait_for(lambda: httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5
                                   ).status_code == 200,
                 what="plait serve answers", ignore=(httpx.HTTPError,))
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    assert "has no credentials" in out and "auth_file" in out, out
