"""A control plane started as `plait serve` would, for the CLI's tests."""

from __future__ import annotations

import pytest

from plait.model import RegionSpec
from plait.server.controlplane import ControlPlaneConfig
from plait.server.serve import ApiServer, prepare
from plait.testing import free_port

REGION = RegionSpec.sized(24, dcs=2, msbs_per_dc=2, rows_per_msb=1, racks_per_row=2)


@pytest.fixture
def plane(tmp_path, monkeypatch):
    """A control plane started as `plait serve` would: first start writes the admin
    token into the client configuration."""
    config = tmp_path / "config.yaml"
    monkeypatch.setenv("PLAIT_CONFIG", str(config))
    monkeypatch.delenv("PLAIT_URL", raising=False)
    monkeypatch.delenv("PLAIT_TOKEN", raising=False)
    port = free_port()
    started = prepare(tmp_path / "data", None, ControlPlaneConfig(
        region=REGION, tick_seconds=0.05, sim_agents=True, sim_start_seconds=0.2),
        port=port)
    server = ApiServer(started.control_plane, port=port).start()
    yield started
    server.stop()
    started.control_plane.store.close()
