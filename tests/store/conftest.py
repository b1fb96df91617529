"""Store backends for the contract suite: SQLite on a temp file with a fake clock,
and ZooKeeper 3.8 (Debian's package) started standalone on 127.0.0.1 for the run."""

import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from zkutil import ZK_SERVER

from plait.store import SqliteStore
from plait.testing import WaitTimeout, free_port, wait_for

#: the contract suite runs with ZooKeeper ACLs on (digest credentials)
ZK_AUTH = ("plait", "contract-suite-secret")


@pytest.fixture(scope="session")
def zookeeper(tmp_path_factory):
    if not os.path.exists(ZK_SERVER) or shutil.which("java") is None:
        # (make test installs it: scripts/system-deps; never a silent skip)
        pytest.fail("ZooKeeper is not installed: run scripts/system-deps (make test does)")
    work = tmp_path_factory.mktemp("zk")
    port = free_port()
    (work / "data").mkdir()
    cfg = work / "zoo.cfg"
    cfg.write_text(f"tickTime=500\ndataDir={work / 'data'}\nclientPort={port}\n"
                   "clientPortAddress=127.0.0.1\nadmin.enableServer=false\n"
                   "minSessionTimeout=1000\nmaxSessionTimeout=60000\n")
    env = dict(os.environ, ZOO_LOG_DIR=str(work),
               JVMFLAGS=os.environ.get("JVMFLAGS", "-Xmx256m") + " -Djute.maxbuffer=16777216")
    proc = subprocess.Popen([ZK_SERVER, "start-foreground", str(cfg)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def up() -> bool:
        from kazoo.client import KazooClient

        client = KazooClient(hosts=f"127.0.0.1:{port}", timeout=2)
        try:
            client.start(timeout=2)
        except Exception:
            return False
        finally:
            client.stop()
            client.close()
        return True

    wait_for(up, 60, "ZooKeeper starts")
    yield f"127.0.0.1:{port}"
    proc.terminate()
    proc.wait(timeout=30)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Env:
    store: Any
    #: end a session as if its holder died
    kill: Callable[[Any], None]
    #: let watch events arrive; True once ``cond`` holds (within ``timeout`` s)
    settle: Callable[..., bool]
    #: a second client of the same store (another process would look the same)
    other: Callable[[], Any]


@pytest.fixture(params=["sqlite", "zookeeper"])
def env(request, tmp_path):
    opened: list[Any] = []
    if request.param == "sqlite":
        clock = Clock()
        store = SqliteStore(str(tmp_path / "plait.db"), clock=clock)

        def kill(session: Any) -> None:
            clock.now += session.ttl + 1

        def settle(cond: Callable[[], bool], timeout: float = 15.0) -> bool:
            store.poll()
            return cond()

        def other() -> Any:
            s = SqliteStore(store.path, clock=clock)
            opened.append(s)
            return s
    else:
        from plait.store.zookeeper import ZkStore

        hosts = request.getfixturevalue("zookeeper")
        root = f"/t{free_port()}"  # each test in its own part of the tree
        store = _Rooted(ZkStore(hosts, auth=ZK_AUTH), root)  # (with ACLs on every znode)

        def kill(session: Any) -> None:
            session.close()

        def settle(cond: Callable[[], bool], timeout: float = 15.0) -> bool:
            try:
                return bool(wait_for(cond, timeout))
            except WaitTimeout:
                return False

        def other() -> Any:
            s = _Rooted(ZkStore(hosts, auth=ZK_AUTH), root)
            opened.append(s)
            return s
    yield Env(store, kill, settle, other)
    for s in opened:
        s.close()
    store.close()


class _Rooted:
    """A ZkStore confined to a fresh root, so tests do not see each other's keys;
    the election and session calls pass through."""

    def __init__(self, store: Any, root: str) -> None:
        from plait.store import Namespace

        self._store, self._ns = store, Namespace(store, root)
        self.root = root

    def __getattr__(self, name: str) -> Any:
        if name in ("get", "get_many", "exists", "create", "set", "delete", "children", "commit",
                    "watch", "is_ephemeral"):
            return getattr(self._ns, name)
        return getattr(self._store, name)

    def election(self, name: str, identity: str, session: Any) -> Any:
        return self._store.election(self.root.strip("/") + "-" + name, identity, session)
