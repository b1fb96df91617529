"""A ZooKeeper ensemble on 127.0.0.1, started from Debian's ``zookeeper`` package: the
store of the fault tests and of ``plait bench failover``, and a lab's ZooKeeper for a
control plane spread over processes (``plait serve --store zk://...``)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
from pathlib import Path

from plait.errors import PlaitError
from plait.testing import WaitTimeout, free_port, wait_for

ZK_SERVER = "/usr/share/zookeeper/bin/zkServer.sh"
#: the largest request the ensemble takes (bytes): a pass's transaction may carry a
#: split job's parts, several records of up to 1 MB (plait.store.zookeeper.MAX_TXN_BYTES)
JUTE_MAXBUFFER = 16 * 1024 * 1024


def installed() -> bool:
    return os.path.exists(ZK_SERVER) and shutil.which("java") is not None


def _free_ports(size: int) -> list[tuple[int, int, int]]:
    """Client, quorum and election ports for ``size`` members, all different (one
    member's election port was once another's quorum port, and the ensemble could not
    elect a leader once its first one died) and outside the ephemeral range (no
    client's connection takes one before its member listens)."""
    base = free_port(size=3 * size)
    return [(base + 3 * i, base + 3 * i + 1, base + 3 * i + 2) for i in range(size)]


def mode(port: int) -> str:
    """The member's role as it says (``leader``, ``follower``, ``standalone``), or ""
    when it does not answer."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as conn:
            conn.sendall(b"srvr")
            data = conn.recv(4096).decode(errors="replace")
    except OSError:
        return ""
    for line in data.splitlines():
        if line.startswith("Mode:"):
            return line.split(":", 1)[1].strip()
    return ""


class LocalEnsemble:
    """``size`` members, each a JVM of its own (its own process group) with its data and
    logs under ``work/zkN``. ``tick_ms`` is ZooKeeper's tick: sessions may be as short
    as two ticks, which a control plane's fast failover needs (the default 2 s tick
    allows none shorter than 4 s)."""

    def __init__(self, work: Path, size: int = 3, tick_ms: int = 200) -> None:
        if not installed():
            raise PlaitError("ZooKeeper is not installed (apt-get install zookeeper)")
        self.work = Path(work)
        self.size = size
        self.tick_ms = tick_ms
        self.ports = _free_ports(size)
        self.procs: list[subprocess.Popen[bytes] | None] = [None] * size

    @property
    def clients(self) -> list[int]:
        return [c for c, _, _ in self.ports]

    @property
    def hosts(self) -> str:
        return ",".join(f"127.0.0.1:{c}" for c in self.clients)

    @property
    def url(self) -> str:
        return f"zk://{self.hosts}"

    def _config(self, i: int) -> Path:
        work = self.work / f"zk{i + 1}"
        (work / "data").mkdir(parents=True, exist_ok=True)
        (work / "data" / "myid").write_text(f"{i + 1}\n")
        servers = "".join(f"server.{k + 1}=127.0.0.1:{p}:{e}\n"
                          for k, (_, p, e) in enumerate(self.ports)) if self.size > 1 else ""
        cfg = work / "zoo.cfg"
        # initLimit/syncLimit in ticks: 10 s / 5 s, whatever the tick
        ticks = max(1, 1000 // self.tick_ms)
        cfg.write_text(f"tickTime={self.tick_ms}\ninitLimit={10 * ticks}\n"
                       f"syncLimit={5 * ticks}\ndataDir={work / 'data'}\n"
                       f"clientPort={self.clients[i]}\nclientPortAddress=127.0.0.1\n"
                       "admin.enableServer=false\n4lw.commands.whitelist=srvr\n"
                       f"maxSessionTimeout=60000\n{servers}")
        return cfg

    def start_member(self, i: int) -> None:
        cfg = self._config(i)
        # (a heap that holds a few of the 16 MiB requests decision 106 allows: with
        # 256 MiB an ensemble under the API fuzzing once ran out of memory)
        flags = os.environ.get("JVMFLAGS", "-Xmx512m")
        if "jute.maxbuffer" not in flags:  # (what plait's transactions need: decision 106)
            flags += f" -Djute.maxbuffer={JUTE_MAXBUFFER}"
        env = dict(os.environ, ZOO_LOG_DIR=str(cfg.parent), JVMFLAGS=flags)
        with open(cfg.parent / "zookeeper.out", "ab") as out:
            self.procs[i] = subprocess.Popen([ZK_SERVER, "start-foreground", str(cfg)],
                                             env=env, stdout=out, stderr=subprocess.STDOUT,
                                             start_new_session=True)

    def start(self, timeout: float = 120.0) -> LocalEnsemble:
        """Start every member; an ensemble that has not formed within half the time
        is started once more on new ports (a port picked free may be taken by
        another process before its member binds it)."""
        for attempt in (1, 2):
            for i in range(self.size):
                self.start_member(i)
            if self.wait_serving(timeout / 2):
                return self
            self.stop()
            if attempt == 1:
                self.ports = _free_ports(self.size)
        raise PlaitError(f"the ZooKeeper ensemble did not form within {timeout:g}s, twice "
                         f"on fresh ports (logs in {self.work})")

    def modes(self) -> list[str]:
        return [mode(p) for p in self.clients]

    def wait_serving(self, timeout: float, members: int | None = None) -> bool:
        """Until ``members`` (all by default) answer, one of them leading."""
        want = self.size if members is None else members

        def serving() -> bool:
            modes = [m for m in self.modes() if m]
            return len(modes) >= want and (self.size == 1 or "leader" in modes)

        try:
            return wait_for(serving, timeout, "the ensemble serves", poll=0.1)
        except WaitTimeout:
            return False

    def leader(self) -> int | None:
        modes = self.modes()
        return modes.index("leader") if "leader" in modes else None

    def kill(self, i: int) -> None:
        """SIGKILL member ``i`` (its whole process group: the JVM too)."""
        proc = self.procs[i]
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)

    def stop(self) -> None:
        for i, proc in enumerate(self.procs):
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    self.kill(i)

    def __enter__(self) -> LocalEnsemble:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
