"""The agent's side of the fence keeper (``plait.agent.fencekeeper``): the lease file
it reads (the agent's lease and the processes of tasks of jobs with a fence), and a
keeper running while there are any, whatever becomes of the agent."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from plait.agent import fencekeeper
from plait.agent.runtime import proc_start_time


class FenceGuard:
    def __init__(self, data_dir: Path, log: Any) -> None:
        self.data_dir = data_dir
        self.log = log
        #: the lease file as written last, and when the keeper was last looked for
        self._lease: dict[str, Any] | None = None
        self._keeper_checked = float("-inf")
        self._keeper_proc: subprocess.Popen[bytes] | None = None
        self._me = {"pid": os.getpid(), "start_time": proc_start_time(os.getpid()) or -1}

    def guard(self, tasks: Mapping[str, Mapping[str, Any]], contact: float | None) -> None:
        """Write the lease file for the fence keeper (when the agent's lease, sent at
        ``contact``, or its fenced processes, ``tasks``, changed), and make sure a
        keeper runs while there are any."""
        lease = {"agent": self._me, "contact": contact, "tasks": dict(tasks)}
        if lease != self._lease and (tasks or (self._lease or {}).get("tasks")):
            try:
                fencekeeper.write_lease(self.data_dir, lease)
                self._lease = lease
            except OSError as exc:
                self.log.error("fence lease not written", error=str(exc))
        if tasks:
            self._keeper()

    def _keeper(self) -> None:
        """Start a fence keeper unless one holds the data dir's lock (looked at once a
        second at most)."""
        now = time.monotonic()
        if now - self._keeper_checked < 1.0:
            return
        self._keeper_checked = now
        if self._keeper_proc is not None and self._keeper_proc.poll() is None:
            return
        fd = os.open(self.data_dir / fencekeeper.LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return  # (one runs: left by the agent before, say)
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)
        (self.data_dir / "logs").mkdir(exist_ok=True)
        with open(self.data_dir / "logs" / "fencekeeper.log", "ab") as out:
            self._keeper_proc = subprocess.Popen(
                [sys.executable, "-m", "plait.agent.fencekeeper", str(self.data_dir)],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True, close_fds=True)
        self.log.info("fence keeper started", pid=self._keeper_proc.pid)

