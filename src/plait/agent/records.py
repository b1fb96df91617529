"""What the agent keeps of its tasks on its own disk (``DATA/agent.json``): each task
(the state machine's record, ``plait.model.agentmachine.HeldTask``, with its process's
handle, its port and how much of its output was sent) and each stop under way."""

from __future__ import annotations

import fcntl
import json
import os
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from plait.model.agentmachine import HeldTask

#: output read per task and step: what one output chunk of the API may carry (the
#: rest follows with the next steps)
CHUNK_BYTES = 64 * 1024


@dataclass
class Task(HeldTask):
    port: int = 0
    handle: dict[str, Any] | None = None
    log_offset: int = 0

    @property
    def key(self) -> str:
        return f"{self.job}.{self.index}"


@dataclass
class Stopping:
    """A task being stopped in the background (kept in the agent's state, so a
    restarted agent finishes the stop)."""

    job: str
    index: int
    revision: int
    handle: dict[str, Any]
    grace: float
    #: forget its cgroups, logs and files once stopped (it left this machine)
    remove: bool
    future: Future[None] | None = None
    #: its job's ``fence.seconds``: the fence keeper guards it until it is gone
    fence: float | None = None

    def record(self) -> dict[str, Any]:
        return {"job": self.job, "index": self.index, "revision": self.revision,
                "handle": self.handle, "grace": self.grace, "remove": self.remove,
                "fence": self.fence}


def lock_data_dir(data_dir: Path) -> int:
    """Hold ``data_dir/agent.lock`` exclusively for this agent's life (the kernel lets
    go when the process dies, SIGKILL included; the descriptor is not inherited by
    tasks): a second agent on one machine's data dir would run each of its tasks
    again. Raises RuntimeError naming the agent that holds it."""
    fd = os.open(data_dir / "agent.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise RuntimeError(f"another agent (pid {holder}) runs on data dir {data_dir}: "
                           "one agent per machine (stop it first)") from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def batches(chunks: list[dict[str, Any]], limit: int = 512 * 1024
            ) -> list[list[dict[str, Any]]]:
    """Output chunks in requests well under the API's body limit."""
    out: list[list[dict[str, Any]]] = []
    size = limit
    for chunk in chunks:
        n = len(json.dumps(chunk["data"])) + 100  # (as sent: escapes included)
        if size + n > limit:
            out.append([])
            size = 0
        out[-1].append(chunk)
        size += n
    return out
