"""The processes of a local region on this box (Linux ``/proc``): who is alive, who
belongs to a data dir. ``plait up`` stops everything of its data dir with them, and
the test harnesses check that nothing was left behind."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
from collections.abc import Iterable
from pathlib import Path


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def processes_under(root: Path) -> set[int]:
    """The processes of the local region under ``root``: tasks (an agent gives each
    one a ``PLAIT_DATA_DIR`` there, which their children inherit), and plait agents and
    replicas given a ``--data-dir`` there. Not this process or any of its ancestors,
    and nothing that merely names the path (a ``tail -f`` of a log there, a script
    given the data dir): ``plait up`` stops what this returns."""
    where = str(root)
    mine = _ancestors()
    found = plait_processes(root, "agent") | plait_processes(root, "serve")
    for pid in _others():
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        for entry in env.split(b"\0"):
            if entry.startswith(b"PLAIT_DATA_DIR="):
                value = entry[len(b"PLAIT_DATA_DIR="):].decode(errors="replace")
                if value == where or value.startswith(where + "/"):
                    found.add(pid)
                break
    return found - mine


def _ancestors() -> set[int]:
    """This process and its ancestors (a ``timeout`` or a script that started it)."""
    found, pid = set(), os.getpid()
    while pid > 1 and pid not in found:
        found.add(pid)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            pid = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            break
    return found


def _others() -> list[int]:
    """Every process of this box but this one."""
    me = os.getpid()
    return [int(e.name) for e in Path("/proc").iterdir() if e.name.isdigit()
            and int(e.name) != me]


def argv_bytes(pid: int) -> bytes:
    """The process's command line, NUL-separated (OSError once it is gone)."""
    return Path(f"/proc/{pid}/cmdline").read_bytes()


def kill_groups(pids: Iterable[int]) -> None:
    """SIGKILL the process group of each pid (and the pid itself, if it leads none)."""
    for pid in pids:
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def cmdline(pid: int) -> str:
    try:
        return argv_bytes(pid).replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


def read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def plait_processes(data_dir: Path, verb: str) -> set[int]:
    """Running ``plait VERB`` processes given ``--data-dir`` ``data_dir`` or a path
    under it (those started by hand count too: same data dir, same region)."""
    root = str(data_dir.resolve())
    found = set()
    for pid in _others():
        try:
            argv = argv_bytes(pid).decode(errors="replace").split("\0")
        except OSError:
            continue
        if verb not in argv and f"plait.cli.{verb}" not in argv:
            continue
        for k, arg in enumerate(argv[:-1]):
            if arg == "--data-dir":
                where = str(Path(argv[k + 1]).resolve()) if argv[k + 1] else ""
                if where == root or where.startswith(root + "/"):
                    found.add(pid)
    return {pid for pid in found if alive(pid)}


def listen_error(host: str, port: int) -> str | None:
    """Why a server could not listen on ``host:port`` now, or None if it could (bound as
    a server binds it: connections of its last run in TIME_WAIT do not count)."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            return exc.strerror or str(exc)
    return None


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999  # (Linux's default)


def free_port_block(size: int = 1, host: str = "127.0.0.1") -> int:
    """The first of ``size`` consecutive ports on ``host`` that a server could listen on
    now, outside the kernel's ephemeral range: a port picked inside it (``bind`` to port
    0) may be handed to any outgoing connection before its server binds it, and so may
    its neighbours that a region of several servers (PORT+1...) listens on."""
    low, high = _ephemeral_range()
    # (a box whose ephemeral range leaves no room outside it: anywhere, checked alike)
    spans = [(lo, hi) for lo, hi in ((10_000, low - 1), (high + 1, 65_535))
             if hi - lo + 1 >= size] or [(10_000, 65_535)]
    for _ in range(500):
        lo, hi = random.choice(spans)
        base = random.randint(lo, hi - size + 1)
        if all(listen_error(host, base + k) is None for k in range(size)):
            return base
    raise OSError(f"no {size} consecutive free ports on {host}")
