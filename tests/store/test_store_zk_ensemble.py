"""A 3-member ZooKeeper ensemble on 127.0.0.1: the store keeps serving when one
member (the leader, even) is killed with SIGKILL, and loses no acknowledged write."""

import os
import signal
import subprocess

import pytest
from zkutil import ZK_SERVER

from plait.harness.zkensemble import _free_ports
from plait.harness.zkensemble import mode as _mode
from plait.testing import wait_for


@pytest.fixture
def ensemble(tmp_path, zookeeper):  # ``zookeeper``: installed, or skipped/failed there
    ports = _free_ports(3)  # (all different: picked one by one, two could repeat)
    servers = "".join(f"server.{i + 1}=127.0.0.1:{p}:{e}\n" for i, (_, p, e) in enumerate(ports))
    procs = []
    for i, (client, _, _) in enumerate(ports):
        work = tmp_path / f"zk{i + 1}"
        (work / "data").mkdir(parents=True)
        (work / "data" / "myid").write_text(f"{i + 1}\n")
        cfg = work / "zoo.cfg"
        cfg.write_text(f"tickTime=500\ninitLimit=20\nsyncLimit=10\ndataDir={work / 'data'}\n"
                       f"clientPort={client}\nclientPortAddress=127.0.0.1\n"
                       "admin.enableServer=false\n4lw.commands.whitelist=srvr\n" + servers)
        env = dict(os.environ, ZOO_LOG_DIR=str(work))
        procs.append(subprocess.Popen([ZK_SERVER, "start-foreground", str(cfg)], env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                      start_new_session=True))
    clients = [c for c, _, _ in ports]
    wait_for(lambda: sorted(_mode(p) for p in clients) == ["follower", "follower", "leader"],
             90, "the ensemble elects a leader")
    yield clients, procs
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
            p.wait(timeout=30)


def test_the_store_survives_the_loss_of_the_leading_member(ensemble):
    from plait.store.zookeeper import ZkStore

    clients, procs = ensemble
    store = ZkStore(",".join(f"127.0.0.1:{p}" for p in clients), timeout=10)
    acked = [k for k in range(20) if store.create(f"/jobs/j{k}", b"spec") == 0]
    leader = next(i for i, p in enumerate(clients) if _mode(p) == "leader")
    os.killpg(procs[leader].pid, signal.SIGKILL)
    procs[leader].wait(timeout=30)

    def writes() -> bool:
        try:
            store.create("/after", b"x")
            return True
        except Exception:
            return False

    wait_for(writes, 60)  # a new leader is elected; the client reconnects
    assert store.children("/jobs") == sorted(f"j{k}" for k in acked)  # nothing lost
    value, version = store.get("/jobs/j3")
    assert value == b"spec"
    assert store.set("/jobs/j3", b"updated", version) == version + 1
    store.close()


def test_an_ensembles_ports_are_all_different():
    # a member's election port once equalled another's quorum port (each picked free
    # one at a time): once its first leader died, the ensemble never elected another
    for _ in range(50):
        ports = [p for member in _free_ports(5) for p in member]
        assert len(set(ports)) == len(ports) == 15
