"""The agent as a member of its region: its credential (joined with the cluster join
token), its own disk's state, and its calls to the control plane: the desired set's
long-poll and the report (the heartbeat). ``plait.agent.daemon.Agent`` adds what it
does with them."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from plait.agent import fencekeeper
from plait.agent.client import ControlPlaneClient, JoinRefused
from plait.agent.desired import Pulled, checked_desired
from plait.agent.host import TaskHost
from plait.agent.profile import ProfileSwitcher
from plait.agent.records import batches
from plait.agent.runtime import ProcessRuntime
from plait.model.agentwire import ProfileReport, Report, dump


class Member(TaskHost):
    #: the machine's host profile: switched before any task starts (Sidekick)
    profile: ProfileSwitcher

    def __init__(self, machine: str, urls: list[str], join_token: str | None, data_dir: Path,
                 advertise: str, timeout: float, runtime: ProcessRuntime | None,
                 describe: dict[str, Any] | None, ca_file: str | None) -> None:
        super().__init__(machine, data_dir, advertise, runtime, describe)
        self.client = ControlPlaneClient(machine, urls, timeout, ca_file)
        self.urls = self.client.urls
        self.join_token = join_token
        self.token: str | None = None
        #: the desired-set long-poll's latest answer (or why it failed), for the run
        #: loop; guarded by ``_inbox_lock``
        self._inbox: Pulled | Exception | None = None
        self._inbox_lock = threading.Lock()
        #: the last report's answer named a desired set newer than the agent has
        self._newer = False
        self.reachable = False
        #: the generation of the desired set last pulled (for the long-poll)
        self.generation: int | None = None
        #: when the last report's answer came (a desired set pulled after it may start
        #: again what the fence stopped)
        self._renewed = float("-inf")

    def _load(self) -> None:
        if not self.state_path.exists():
            return
        data = json.loads(self.state_path.read_text())
        if data.get("machine") != self.machine:
            raise ValueError(f"{self.state_path} belongs to machine {data.get('machine')}")
        lease = fencekeeper.read_lease(self.data_dir) or {}
        contact = lease.get("contact")
        if isinstance(contact, int | float) and contact <= self.fence_clock():
            self.contact = float(contact)  # (the lease of the agent before: it holds on)
        self.token = data.get("token")
        self.profile.load(data.get("profile"))
        self._load_tasks(data)

    def _save(self) -> bool:
        """Write the agent's state if it changed; False if it could not be (a full
        disk): it is tried again at the next save, which any change makes."""
        return self._write_state({"machine": self.machine, "token": self.token,
                                  "profile": self.profile.applied, **self._state()})

    def _call(self, method: str, path: str, token: str | None, body: Any = None,
              params: dict[str, Any] | None = None, wait: float = 0.0) -> Any:
        return self.client.call(method, path, token, body, params, wait)

    def join(self) -> None:
        if self.token is not None:
            return
        if not self.join_token:
            raise ValueError("this agent has no machine credential yet: give the join token "
                             "(--join-token-file, or PLAIT_JOIN_TOKEN)")
        try:
            self.token = self._call("POST", "/v1/agents/join", self.join_token,
                                    {"machine": self.machine, **self.describe})["token"]
        except httpx.HTTPStatusError as exc:
            if exc.response.status_code >= 500:
                raise
            reason, heard = "", None
            try:
                answer = exc.response.json()
                reason = str(answer.get("message", ""))
                ago = answer.get("heard_seconds_ago")
                if isinstance(ago, int | float) and not isinstance(ago, bool):
                    heard = float(ago)
            except (ValueError, AttributeError):
                pass
            raise JoinRefused(self.machine, exc.response.status_code,
                              reason or exc.response.text[:200], heard) from None
        self._save()

    def _pull(self, wait: float, since: int | None) -> Pulled:
        """The machine's desired set: a long-poll of up to ``wait`` seconds when
        ``since`` (the generation the agent has) is known."""
        params = {"wait": wait, "since": since} if wait and since is not None else None
        sent = self.fence_clock()
        return Pulled(checked_desired(self._call(
            "GET", f"/v1/machines/{self.machine}/desired", self.token, params=params,
            wait=wait if params else 0.0)), sent)

    def _report(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        self._dirty = False  # (what changes from here on is told by the next report)
        statuses, chunks = self._statuses(now)
        try:
            # output first: the control plane takes a task's output only while the task
            # is on this machine, and a final status takes a batch task off it
            for batch in batches(chunks):
                try:
                    self._call("POST", f"/v1/machines/{self.machine}/output", self.token,
                               {"chunks": batch})
                except httpx.HTTPStatusError as exc:  # refused: dropped, never a retry loop
                    self.log.warning("output refused", chunks=len(batch), error=str(exc))
            profile = self.profile.report()
            body = dump(Report.model_construct(
                tasks=statuses,
                profile=None if profile is None else ProfileReport.model_construct(**profile)))
            sent = self.fence_clock()  # (the lease counts from the send: see model.fence)
            ack = self._call("POST", f"/v1/machines/{self.machine}/status", self.token, body)
            generation = ack.get("generation") if isinstance(ack, dict) else None
            # (a set newer than the long-poll brought: pulled at once by the run loop)
            self._newer = generation is not None and generation != self.generation
            self.metrics.reports.labels("sent").inc()
            self._renewed = self.fence_clock()
            if self.core.heard(sent, self._renewed):
                # (a desired set pulled from now on may start a task its fence
                # stopped again: pulled now)
                self._newer = True
            # the control plane took the finished tasks off this machine as it took the
            # report: forget them now, so a rerun it asks for is started, not reported
            # as finished again
            for key in self.core.finished():
                self._remove(key, "finished")
            self._guard()  # (the keeper reads the renewed lease)
        except (ConnectionError, httpx.HTTPStatusError):
            self.reachable = False
            self.metrics.reports.labels("failed").inc()
            # sent with the next report (the agent keeps the whole logs on disk; this is
            # only the control plane's tail, so a long outage keeps the newest chunks)
            self._output = (chunks + self._output)[-256:]

    def _poll(self, wait: float, interval: float, stop: threading.Event,
              halt: threading.Event) -> None:
        """The desired set's long-poll, on a thread of its own: each answer (the set,
        or why there was none) is handed to the run loop, which is woken. It waits up
        to ``wait`` seconds for a change of the set it has; after a failure it asks
        again (without waiting for a change) after ``interval`` seconds."""
        since: int | None = None
        while not (stop.is_set() or halt.is_set()):
            got: Pulled | Exception
            try:
                got = self._pull(wait, since)
                since = got.desired.generation
            except Exception as exc:  # (handed over: the loop logs it)
                got, since = exc, None
            with self._inbox_lock:
                if not (isinstance(got, Exception) and isinstance(self._inbox, Pulled)):
                    self._inbox = got  # (a set not taken yet is not lost to an error)
            self.wakeup.set()
            if isinstance(got, Exception):
                halt.wait(interval)
