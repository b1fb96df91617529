"""Scheduler shards on a 3-member ZooKeeper ensemble started by the test (two shards
and the front end in this process, real agents whose tasks are processes): an agent
of a machine of shard 1, cut off from the front end, keeps its task until it hears it
moved; the shard finds the machine unreachable and runs the task elsewhere; on heal
the stale copy is stopped. Liveness bounds only."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from test_e2e_replicas import Partition, alive

from plait.harness.replicas import NOT_YET
from plait.harness.shards import ShardedBox
from plait.harness.zkensemble import LocalEnsemble, installed
from plait.testing import wait_for

WAIT = 90.0

pytestmark = pytest.mark.skipif(not installed() and not os.environ.get("CI"),
                                reason="ZooKeeper not installed here (apt-get install "
                                       "zookeeper); CI installs it")


def test_a_partitioned_agent_of_a_shard_keeps_its_task_until_it_hears_it_moved(
        tmp_path: Path) -> None:
    partitions: dict[str, Partition] = {}

    def through(machine: str, url: str) -> list[str]:
        partitions[machine] = Partition([int(url.rsplit(":", 1)[1])])
        return partitions[machine].urls

    with LocalEnsemble(tmp_path / "zk") as ensemble:
        try:
            with ShardedBox(tmp_path, shards=2, machines=4, store=ensemble.url,
                            heartbeat_timeout=3.0, agent_urls=through) as box:
                api = box.api
                for ent, n in (("a", 4), ("b", 4)):
                    assert api.post("/v1/entitlements", json={
                        "name": ent, "owner": "o", "quota": {"machines": n}}).status_code == 201
                assert box.entry("b")["shard"] == 1
                spec = {"name": "s", "entitlement": "b", "task_count": 3, "command": "sleep",
                        "args": ["infinity"], "resources": {"cpu": 0.1, "memory_gb": 0.1},
                        "policy": {"requirements": {"max_tasks_per_machine": 1}}}
                assert api.post("/v1/jobs", json=spec).status_code == 201
                wait_for(lambda: box.running("s", 3) and len(box.pids()) == 3, WAIT,
                         "the tasks run", ignore=NOT_YET)
                task = api.get("/v1/jobs/s/tasks").json()["tasks"][0]
                index, victim = task["index"], task["machine"]
                pid = box.pids()[f"{victim}/s.{index}"]
                others = {k: v for k, v in box.pids().items() if not k.startswith(victim)}
                partitions[victim].cut()

                def events(kind: str) -> list[dict]:
                    return api.get("/v1/events", params={"kind": kind}).json().get(
                        "events", [])
                wait_for(lambda: any(e["machine"] == victim and e["shard"] == 1
                                     for e in events("machine_unreachable")),
                         WAIT, "shard 1 finds the partitioned machine unreachable",
                         ignore=NOT_YET)

                def moved() -> bool:
                    t = api.get("/v1/jobs/s/tasks").json()["tasks"][index]
                    return bool(t["machine"] != victim and t["state"] == "running")
                wait_for(moved, WAIT, "its task runs on another machine", ignore=NOT_YET)
                assert alive(pid)  # the agent cannot know: its copy runs on
                endpoints = api.get("/v1/discovery/s").json()["endpoints"]
                assert victim not in [e["machine"] for e in endpoints if e["index"] == index]
                partitions[victim].heal()
                wait_for(lambda: not alive(pid), WAIT, "the stale copy is stopped on heal",
                         ignore=NOT_YET)
                wait_for(lambda: sorted(k.split("/")[1] for k in box.pids()) == [
                    "s.0", "s.1", "s.2"], WAIT, "one copy of each task", ignore=NOT_YET)
                now = box.pids()
                assert all(now.get(k) == v for k, v in others.items())  # left alone
                assert box.running("s", 3)
        finally:
            for p in partitions.values():
                p.close()
