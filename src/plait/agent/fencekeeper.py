"""The fence keeper: stops a machine's fenced tasks when its agent cannot.

A job with a fence (``JobSpec.fence``, ``plait.model.fence``) asks that its task be
stopped once its agent has not reached the control plane for ``fence.seconds``. The
agent does that itself while it runs; but an agent process that is frozen (SIGSTOP,
a debugger, a swapped-out host), wedged or dead stops nothing. So each agent with
fenced tasks starts this small process, in a session of its own, which outlives it:
every ``POLL`` seconds it reads the lease file the agent writes at every heartbeat
(``DATA/fence.json``: when the last heartbeat the control plane took was sent, on
the machine's boot-time clock, and the fenced tasks' process handles) and signals
the tasks whose lease ran out, as ``plait.model.fence.verdict`` says: SIGTERM, then
SIGKILL to their process group and cgroups. It keeps nothing running and starts
nothing. It exits once none of the tasks it guards runs and its agent is gone or
has none.

One keeper per data dir (``DATA/fence.lock``, held for its life): an agent that
finds the lock free starts one. Run as ``python -m plait.agent.fencekeeper DATA``.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from plait.agent.runtime import Handle, ProcessRuntime, _proc_stat
from plait.model.fence import Verdict, verdict

#: the lease file the agent writes and the keeper reads, in the agent's data dir
LEASE_FILE = "fence.json"
#: held by the keeper for its life
LOCK_FILE = "fence.lock"
#: seconds between two looks at the lease
POLL = 0.1


def boottime() -> float:
    """The clock of leases: seconds since boot, suspend included (a machine that
    slept through its lease must not wake up believing it holds)."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def _alive(pid: int, start_time: int) -> bool:
    """That process still runs (not a zombie, not a reused pid)."""
    st = _proc_stat(pid)
    return st is not None and st[2] == start_time and st[0] not in ("Z", "X")


def signal_task(handle: Handle, sig: int) -> None:
    """``sig`` to the task's process group (or, its leader gone, to the members that
    started after it: its pid may be reused); SIGKILL also to whatever is in its
    cgroups."""
    if _alive(handle.pid, handle.start_time):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(handle.pgid, sig)
    else:
        for pid in ProcessRuntime._group_members(handle):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
    if sig != signal.SIGKILL:
        return
    for group in handle.cgroups:
        kill = group / "cgroup.kill"
        if kill.exists():
            with contextlib.suppress(OSError):
                kill.write_text("1")
            continue
        with contextlib.suppress(OSError, ValueError):
            for pid in (int(x) for x in (group / "cgroup.procs").read_text().split()):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)


def read_lease(data_dir: Path) -> dict[str, Any] | None:
    try:
        lease = json.loads((data_dir / LEASE_FILE).read_text())
    except (OSError, ValueError):
        return None
    return lease if isinstance(lease, dict) else None


def write_lease(data_dir: Path, lease: dict[str, Any]) -> None:
    """Replace the lease file whole (the keeper never reads half of one). Not synced:
    the keeper reads it from memory, and after a crash of the machine no task it
    named runs."""
    tmp = data_dir / f".{LEASE_FILE}.{os.getpid()}"
    tmp.write_text(json.dumps(lease))
    os.replace(tmp, data_dir / LEASE_FILE)


class Keeper:
    """One look at the lease per ``step``; what it signalled is remembered so each
    signal goes once per lapse of the lease."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.lease: dict[str, Any] = {}
        #: task key -> the last signal sent while its lease is out
        self.sent: dict[str, Verdict] = {}

    def step(self, now: float) -> bool:
        """Signal what the lease says must stop; False once there is nothing left to
        guard: no fenced task runs, and the agent is gone or has none (it starts a
        keeper again when it has)."""
        lease = read_lease(self.data_dir)
        if lease is not None:
            self.lease = lease
        contact = self.lease.get("contact")
        tasks = self.lease.get("tasks") or {}
        running = False
        for key, task in tasks.items():
            try:
                handle = Handle.from_dict(task["handle"])
                seconds = float(task["seconds"])
            except (KeyError, TypeError, ValueError):
                continue
            alive = _alive(handle.pid, handle.start_time)
            running = running or alive
            said = verdict(seconds, contact if isinstance(contact, int | float) else None, now)
            if said is Verdict.RUN:
                self.sent.pop(key, None)
                continue
            if self.sent.get(key) is said or not (alive or said is Verdict.KILL):
                continue
            signal_task(handle, signal.SIGTERM if said is Verdict.TERM else signal.SIGKILL)
            self.sent[key] = said
            print(f"fence keeper: {key} {'SIGTERM' if said is Verdict.TERM else 'SIGKILL'}: "
                  f"no heartbeat taken for {seconds:g}s or more", flush=True)
        for key in [k for k in self.sent if k not in tasks]:
            del self.sent[key]
        agent = self.lease.get("agent") or {}
        try:
            agent_alive = _alive(int(agent["pid"]), int(agent["start_time"]))
        except (KeyError, TypeError, ValueError):
            agent_alive = False
        return running or (agent_alive and bool(tasks))


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m plait.agent.fencekeeper DATA_DIR", file=sys.stderr)
        return 2
    data_dir = Path(args[0])
    fd = os.open(data_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return 0  # another keeper guards this data dir
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    keeper = Keeper(data_dir)
    while keeper.step(boottime()):
        time.sleep(POLL)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
