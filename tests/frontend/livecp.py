"""A live API on loopback over a fresh store, with simulated agents (helpers shared by
the front-end tests; the fixtures are in conftest.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from plait.model import RegionSpec
from plait.server.controlplane import ControlPlane, ControlPlaneConfig
from plait.server.serve import ApiServer, store_for
from plait.testing import wait_for as wait_for  # (the suite's one; tests import it here)

REGION = RegionSpec.sized(24, dcs=2, msbs_per_dc=2, rows_per_msb=1, racks_per_row=2)


@dataclass
class Live:
    url: str
    cp: ControlPlane
    admin: httpx.Client
    admin_token: str
    server: ApiServer
    #: what else to stop, last first (a front end, its store, a ZooKeeper)
    closers: list[Callable[[], object]] = field(default_factory=list)
    #: the front end's router, when the API is reached through one
    router: Any = None

    def client(self, token: str | None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30)

    def owner(self, name: str) -> httpx.Client:
        r = self.admin.post("/v1/tokens", json={"role": "owner", "name": name})
        assert r.status_code == 201, r.text
        return self.client(r.json()["token"])

    def agent(self, machine: str) -> tuple[httpx.Client, str]:
        """A client with the credential machine ``machine`` joins with (a new join
        token's), and the credential."""
        join = self.admin.post("/v1/tokens", json={"role": "join", "name": "c"}).json()["token"]
        r = self.client(join).post("/v1/agents/join", json={"machine": machine})
        assert r.status_code == 201, r.text
        return self.client(r.json()["token"]), r.json()["token"]


def start_live(data_dir, sim_agents: bool = True, store: str | None = None,
               **config) -> Live:
    """A control plane on ``store`` (a store URL; SQLite in ``data_dir`` by default)
    with simulated agents, served on loopback."""
    cp = ControlPlane(store_for(data_dir, store), ControlPlaneConfig(
        region=REGION, tick_seconds=0.05, sim_agents=sim_agents, sim_start_seconds=0.2,
        **config))
    token = cp.bootstrap_admin()
    assert token is not None
    server = ApiServer(cp).start()
    admin = httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {token}"},
                         timeout=30)
    return Live(server.url, cp, admin, token, server)


def start_behind_front_end(work: Path, store: str | None = None) -> Live:
    """A control plane as scheduler shard 0 of a region (elected leader of its shard,
    simulated agents), reached only through ``plait frontend``'s router."""
    from plait.frontend.router import ShardRouter
    from plait.server.serve import AsgiServer

    cp = ControlPlane(store_for(work / "cp", store), ControlPlaneConfig(
        region=REGION, tick_seconds=0.05, sim_agents=True, sim_start_seconds=0.2, shard=0))
    token = cp.bootstrap_admin()
    assert token is not None
    shard = ApiServer(cp, replica=True, session_timeout=1.0).start()
    front_store = store_for(work / "cp", store)
    router = ShardRouter(front_store)
    front = AsgiServer(router).start()
    admin = httpx.Client(base_url=front.url, headers={"Authorization": f"Bearer {token}"},
                         timeout=30)
    api = Live(front.url, cp, admin, token, shard, [front_store.close, front.stop], router)
    wait_for(lambda: admin.get("/healthz").status_code == 200)
    return api


def stop_live(api: Live) -> None:
    api.admin.close()
    for close in reversed(api.closers):
        close()
    api.server.stop()
    api.cp.store.close()
