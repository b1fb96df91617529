"""Fault tests of a replicated control plane: two ``plait serve`` replicas on a
3-member ZooKeeper ensemble started here, real agents running sleeping tasks, all on
loopback. SIGKILL the leading replica, a ZooKeeper member, or every control-plane
process; partition one agent. Every wait is a generous liveness bound; nothing asserts
speed (``plait bench failover`` measures it)."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from pathlib import Path

import pytest

from plait.harness.replicas import NOT_YET, ReplicatedRegion, Writer
from plait.harness.zkensemble import installed
from plait.testing import wait_for

WAIT = 90.0

pytestmark = pytest.mark.skipif(not installed() and not os.environ.get("CI"),
                                reason="ZooKeeper not installed here (apt-get install "
                                       "zookeeper); CI installs it")


def sleepers(region: ReplicatedRegion, tasks: int, per_machine: int | None = None) -> None:
    admin = region.admin
    assert admin is not None
    r = admin.post("/v1/entitlements", json={"name": "e", "owner": "o",
                                             "quota": {"machines": region.machines}})
    assert r.status_code == 201, r.text
    spec = {"name": "s", "entitlement": "e", "task_count": tasks, "command": "sleep",
            "args": ["infinity"], "resources": {"cpu": 0.1, "memory_gb": 0.1}}
    if per_machine:
        spec["policy"] = {"requirements": {"max_tasks_per_machine": per_machine}}
    r = admin.post("/v1/jobs", json=spec)
    assert r.status_code == 201, r.text
    wait_for(lambda: region.running("s", tasks) and len(region.task_pids()) == tasks, WAIT,
             "the tasks run", ignore=NOT_YET)


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


@pytest.fixture
def region(tmp_path):
    r = ReplicatedRegion(tmp_path, replicas=2, machines=3)
    with r:
        yield r


def test_a_follower_takes_over_from_a_killed_leader_and_nothing_is_lost(region):
    sleepers(region, 3)
    pids = region.task_pids()
    writer = Writer(region, "e", rate=10).start()
    try:
        wait_for(lambda: len(writer.acked) >= 10, WAIT, "writes acknowledged", ignore=NOT_YET)
        leader = region.leader()
        assert leader is not None
        before = len(writer.acked)
        killed = time.time()
        region.kill_replica(leader)
        wait_for(lambda: region.leader() == 1 - leader, WAIT, "the follower leads", ignore=NOT_YET)
        wait_for(lambda: len(writer.acked) > before and writer.acked[-1][1] > killed, WAIT,
                 "a write acknowledged by the new leader", ignore=NOT_YET)
    finally:
        writer.stop()
    assert writer.lost() == []  # every acknowledged job is there
    assert region.task_pids() == pids and all(alive(p) for p in pids.values())
    assert region.running("s", 3)
    elected = region.events("leader_elected")
    assert len(elected) == 2 and region.urls[1 - leader] in elected[-1]["message"]
    # the agents follow the new leader: they keep beating, no machine is lost
    time.sleep(region.heartbeat_timeout + 1)  # (the subject: a heartbeat timeout passes)
    assert region.events("machine_unreachable") == []
    # the new leader's passes (their writes carry its election's fence) all went through
    assert region.events("step_failed") == []
    assert region.task_pids() == pids


def test_the_control_plane_keeps_serving_when_a_zookeeper_member_dies(region):
    sleepers(region, 3)
    pids = region.task_pids()
    writer = Writer(region, "e", rate=10).start()
    try:
        wait_for(lambda: len(writer.acked) >= 10, WAIT, "writes acknowledged", ignore=NOT_YET)
        member = region.ensemble.leader()  # the ensemble's leader, even
        assert member is not None
        before = len(writer.acked)
        killed = time.time()
        region.ensemble.kill(member)
        wait_for(lambda: len(writer.acked) >= before + 20 and writer.acked[-1][1] > killed,
                 WAIT, "writes acknowledged after the member died", ignore=NOT_YET)
    finally:
        writer.stop()
    assert writer.lost() == []
    assert region.task_pids() == pids and region.running("s", 3)


def test_tasks_keep_running_when_every_control_plane_process_dies(region):
    sleepers(region, 3)
    pids = region.task_pids()
    for i in range(region.replicas):
        region.kill_replica(i)
    time.sleep(region.heartbeat_timeout + 1)  # longer than a machine may stay silent
    assert all(alive(p) for p in pids.values())
    for i in range(region.replicas):
        region.start_replica(i)
    wait_for(lambda: region.leader() is not None, WAIT, "a replica leads again", ignore=NOT_YET)
    wait_for(lambda: region.running("s", 3), WAIT, "the tasks are reported running", ignore=NOT_YET)
    time.sleep(region.heartbeat_timeout + 1)  # (the subject: a heartbeat timeout passes)
    assert region.task_pids() == pids  # adopted, none restarted
    assert region.running("s", 3)


class Partition:
    """TCP forwarders standing between one agent and the replicas: ``cut`` drops every
    connection and refuses new ones (the agent's traffic is lost both ways), ``heal``
    lets it through again."""

    def __init__(self, targets: list[int]) -> None:
        self.cut_ = threading.Event()
        self.servers: list[socket.socket] = []
        self.conns: list[socket.socket] = []
        self.lock = threading.Lock()
        self.urls = []
        for port in targets:
            server = socket.create_server(("127.0.0.1", 0))
            self.servers.append(server)
            self.urls.append(f"http://127.0.0.1:{server.getsockname()[1]}")
            threading.Thread(target=self._accept, args=(server, port), daemon=True).start()

    def _accept(self, server: socket.socket, port: int) -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            if self.cut_.is_set():
                conn.close()
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", port), timeout=5)
            except OSError:
                conn.close()
                continue
            with self.lock:
                self.conns += [conn, upstream]
            for a, b in ((conn, upstream), (upstream, conn)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, a: socket.socket, b: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := a.recv(65536):
                if self.cut_.is_set():
                    break
                b.sendall(data)
        for s in (a, b):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        self.cut_.set()
        with self.lock:
            conns, self.conns = self.conns, []
        for s in conns:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def heal(self) -> None:
        self.cut_.clear()

    def close(self) -> None:
        self.cut()
        for s in self.servers:
            s.close()


def test_a_partitioned_agent_keeps_its_tasks_until_it_hears_they_moved(tmp_path):
    region = ReplicatedRegion(tmp_path, replicas=2, machines=4)
    # every agent behind forwarders of its own; one task a machine, three tasks: a
    # fourth machine to move to
    partitions = {f"m{m:07d}": Partition(region.ports) for m in range(4)}
    region.agent_urls = {m: p.urls for m, p in partitions.items()}
    try:
        with region:
            sleepers(region, 3, per_machine=1)
            admin = region.admin
            assert admin is not None
            task = admin.get("/v1/jobs/s/tasks").json()["tasks"][0]
            index, victim = task["index"], task["machine"]
            pid = region.task_pids()[f"s.{index}"]
            others = {k: v for k, v in region.task_pids().items() if k != f"s.{index}"}
            partitions[victim].cut()
            wait_for(lambda: any(e["machine"] == victim
                                 for e in region.events("machine_unreachable")),
                     WAIT, "the partitioned machine is found unreachable", ignore=NOT_YET)

            def moved() -> bool:
                t = admin.get("/v1/jobs/s/tasks").json()["tasks"][index]
                return bool(t["machine"] != victim and t["state"] == "running")
            wait_for(moved, WAIT, "its task runs on another machine", ignore=NOT_YET)
            # the agent cannot know: its copy runs on, out of service discovery
            assert alive(pid)
            endpoints = admin.get("/v1/discovery/s").json()["endpoints"]
            assert [e["machine"] for e in endpoints if e["index"] == index] != [victim]
            partitions[victim].heal()
            wait_for(lambda: not alive(pid), WAIT, "the stale copy is stopped on heal",
                     ignore=NOT_YET)
            wait_for(lambda: any(e["machine"] == victim
                                 for e in region.events("machine_back")),
                     WAIT, "the machine is back", ignore=NOT_YET)
            # one copy of each index (once the agent has recorded the stop); the other
            # tasks were left alone
            wait_for(lambda: region.task_pids().get(f"s.{index}") not in (None, pid), WAIT,
                     "the agents' records show one copy of the task", ignore=NOT_YET)
            pids = region.task_pids()
            assert sorted(pids) == ["s.0", "s.1", "s.2"] and pids[f"s.{index}"] != pid
            assert all(alive(p) for p in pids.values())
            assert {k: v for k, v in pids.items() if k != f"s.{index}"} == others
            assert region.running("s", 3)
    finally:
        for p in partitions.values():
            p.close()
