"""A live API on loopback over a fresh store, with simulated agents (helpers shared by
the front-end tests; the fixtures are in conftest.py)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from plait.model import RegionSpec
from plait.server.controlplane import ControlPlane, ControlPlaneConfig
from plait.server.serve import ApiServer, store_for

REGION = RegionSpec.sized(24, dcs=2, msbs_per_dc=2, rows_per_msb=1, racks_per_row=2)


@dataclass
class Live:
    url: str
    cp: ControlPlane
    admin: httpx.Client
    admin_token: str
    server: ApiServer

    def client(self, token: str | None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30)

    def owner(self, name: str) -> httpx.Client:
        r = self.admin.post("/v1/tokens", json={"role": "owner", "name": name})
        assert r.status_code == 201, r.text
        return self.client(r.json()["token"])


def wait_for(check: Callable[[], bool], timeout: float = 60.0) -> None:
    """A liveness bound, not a speed assertion."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached within the liveness bound")
        time.sleep(0.05)


def start_live(data_dir, sim_agents: bool = True, **config) -> Live:
    cp = ControlPlane(store_for(data_dir), ControlPlaneConfig(
        region=REGION, tick_seconds=0.05, sim_agents=sim_agents, sim_start_seconds=0.2,
        **config))
    token = cp.bootstrap_admin()
    assert token is not None
    server = ApiServer(cp).start()
    admin = httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {token}"},
                         timeout=30)
    return Live(server.url, cp, admin, token, server)


def stop_live(api: Live) -> None:
    api.admin.close()
    api.server.stop()
    api.cp.store.close()
