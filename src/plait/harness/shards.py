"""A sharded region in one process: ``shards`` scheduler shards (each a control plane
over its part of one store, elected leader of its shard), the front end over them,
and one real agent per machine (threads; their tasks are real processes) that talks
to the front end only. Tests and ``plait bench failover`` (the entitlement move) use
it; the store is SQLite in ``work`` or any store URL (ZooKeeper)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from plait.agent.daemon import Agent
from plait.frontend.router import ShardRouter
from plait.harness.replicas import NOT_YET
from plait.model import RegionSpec
from plait.server.controlplane import ControlPlane, ControlPlaneConfig
from plait.server.serve import ApiServer, AsgiServer, store_for
from plait.testing import wait_for


class ShardedBox:
    def __init__(self, work: Path, shards: int = 2, machines: int = 6,
                 store: str | None = None, heartbeat_timeout: float = 30.0,
                 agent_urls: Callable[[str, str], list[str]] | None = None) -> None:
        """``agent_urls(machine, front end URL)``: the URLs that machine's agent is
        given (the front end's by default; a test puts a forwarder in between)."""
        self.work = work
        region = RegionSpec.sized(machines, dcs=1, msbs_per_dc=2, rows_per_msb=1,
                                  racks_per_row=1)
        self.shards: list[ApiServer] = []
        token = None
        for s in range(shards):
            cp = ControlPlane(store_for(work / "cp", store), ControlPlaneConfig(
                region=region, tick_seconds=0.05, heartbeat_timeout=heartbeat_timeout,
                shard=s))
            token = cp.bootstrap_admin() or token
            self.shards.append(ApiServer(cp, replica=True, session_timeout=1.0).start())
        if token is None:
            raise RuntimeError(f"the store at {store or work} has a region already")
        self.token = token
        self.front_store = store_for(work / "cp", store)
        self.front = AsgiServer(ShardRouter(self.front_store)).start()
        self.api = httpx.Client(base_url=self.front.url, timeout=30,
                                headers={"Authorization": f"Bearer {token}"})
        wait_for(lambda: self.api.get("/healthz").status_code == 200, 60,
                 "every shard has a leader", ignore=NOT_YET)
        join = self.api.post("/v1/tokens", json={"role": "join", "name": "j"}).json()["token"]
        self.stop_agents = threading.Event()
        names = [self.cp(0).fleet.name(m)
                 for m in range(len(self.cp(0).fleet))]
        self.agents = [Agent(m, agent_urls(m, self.front.url) if agent_urls else
                             [self.front.url], join, work / m) for m in names]
        self.threads = [threading.Thread(target=a.run, args=(0.2, self.stop_agents),
                                         daemon=True) for a in self.agents]
        for t in self.threads:
            t.start()

    def cp(self, shard: int) -> ControlPlane:
        return self.shards[shard].cp

    def entry(self, ent: str) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self.front_store.get(f"/frontend/entitlements/{ent}")[0])
        return data

    def pids(self) -> dict[str, int]:
        """Every running task's process id, by machine and task."""
        return {f"{a.machine}/{key}": h.pid for a in self.agents
                for key, h in list(a.handles.items())}

    def running(self, name: str, n: int) -> bool:
        r = self.api.get(f"/v1/jobs/{name}/tasks")
        return r.status_code == 200 and [t["state"] for t in r.json()["tasks"]].count(
            "running") == n

    def close(self) -> None:
        self.stop_agents.set()
        # the agents' desired-set long-polls answered now (as a shard's own stop does),
        # not when their wait runs out: a poll held through the front end would hold
        # the agent's thread, and then the front end's stop, for up to 10 s
        for s in self.shards:
            s.cp.gateway.waiters.close()
        for t in self.threads:
            t.join(timeout=30)
        for a in self.agents:
            a.shutdown()
            a.close()
        self.api.close()
        self.front.stop()
        for s in self.shards:
            s.stop()
            s.cp.store.close()
        self.front_store.close()

    def __enter__(self) -> ShardedBox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def measure_move(work: Path, store: str | None = None, tasks: int = 4,
                 rate: float = 20.0, timeout: float = 120.0) -> dict[str, Any]:
    """Move an entitlement with running tasks between two shards while a client writes
    to it (a job update at ``rate`` per second): how long its writes were refused, as
    the client saw it and as the front end measured it, and how many tasks restarted."""
    with ShardedBox(work, shards=2, machines=tasks, store=store) as box:
        api = box.api
        r = api.post("/v1/entitlements", json={"name": "moving", "owner": "bench",
                                               "quota": {"machines": tasks}})
        r.raise_for_status()
        spec = {"name": "sleepers", "entitlement": "moving", "task_count": tasks,
                "command": "sleep", "args": ["infinity"], "env": {"N": "0"},
                "resources": {"cpu": 0.1, "memory_gb": 0.1}}
        api.post("/v1/jobs", json=spec).raise_for_status()
        wait_for(lambda: box.running("sleepers", tasks) and len(box.pids()) == tasks,
                 timeout, "the tasks run", ignore=NOT_YET)
        pids = box.pids()
        shard = box.entry("moving")["shard"]
        log: list[tuple[float, int]] = []
        stop = threading.Event()

        def write() -> None:  # a resize to the same count: a write that changes nothing
            with httpx.Client(base_url=box.front.url, timeout=30, headers={
                    "Authorization": f"Bearer {box.token}"}) as c:
                while not stop.is_set():
                    at = time.monotonic()
                    code = c.post("/v1/jobs/sleepers/resize",
                                  json={"task_count": tasks}).status_code
                    log.append((at, code))
                    stop.wait(max(0.0, 1.0 / rate - (time.monotonic() - at)))

        writer = threading.Thread(target=write, daemon=True)
        writer.start()
        time.sleep(1.0)
        started = time.monotonic()
        moved = api.post("/v1/admin/entitlements/moving/move", json={"shard": 1 - shard})
        moved.raise_for_status()
        time.sleep(1.0)
        stop.set()
        writer.join(timeout=30)
        refused = [t for t, code in log if code == 409]
        after = [t for t, code in log if code == 200 and t > started]
        window = (min(after) - min(refused)) if refused and after else 0.0
        others = sorted({code for _, code in log} - {200, 409})
        wait_for(lambda: box.running("sleepers", tasks) and len(box.pids()) == tasks,
                 timeout, "the tasks run after the move", ignore=NOT_YET)
        now = box.pids()
    return {
        "entitlement_move_unavailable_s": round(window, 3),
        "entitlement_move_server_s": moved.json()["unavailable_s"],
        "entitlement_move_task_restarts": sum(1 for k, p in pids.items() if now.get(k) != p),
        "entitlement_move_refused_writes": len(refused),
        "entitlement_move_other_statuses": others,
    }
