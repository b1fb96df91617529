"""TaskControl off the pass (decision 45): the dispatcher that sends a pass's calls
to tenants' controllers, the policy their URLs are checked against, and the keys their
calls are signed with. Nothing here runs under the control plane's lock."""

from __future__ import annotations

import contextlib
import dataclasses
import secrets
import socket
import threading
import time
from typing import TYPE_CHECKING, Any

from plait.errors import Conflict, NotFound
from plait.taskcontrol import signing
from plait.taskcontrol.dispatch import Dispatcher
from plait.taskcontrol.protocol import ControllerAnswer, ControllerCall
from plait.taskcontrol.urlpolicy import UrlPolicy, networks, own_addresses
from plait.taskcontrol.worker import DispatcherProcess, Settings
from plait.tls import verify as tls_verify

if TYPE_CHECKING:
    from plait.server.controlplane.inbox import Inbox
    from plait.server.controlplane.regionstate import RegionState


class Controllers:
    def __init__(self, state: RegionState, inbox: Inbox, metrics: Any) -> None:
        """``metrics``: where each call's outcome and latency are counted."""
        self.state, self.inbox, self.metrics = state, inbox, metrics
        #: where controller URLs may point (the API's own addresses are added when
        #: it starts serving: ``serving_at``)
        self.url_policy = UrlPolicy(allow=networks(state.config.controller_networks))
        #: guards ``_sent`` (never held long)
        self._lock = threading.Lock()
        self._signing_secret: bytes | None = None
        self.dispatcher: Dispatcher | DispatcherProcess | None = None
        #: when each call in flight was sent, by (job, sequence number): its latency
        self._sent: dict[tuple[str, int], float] = {}

    def send(self, calls: list[ControllerCall]) -> None:
        """Hand a pass's requests to the dispatcher (after the pass, off the lock)."""
        now = time.monotonic()
        calls = [dataclasses.replace(call, tenant=self.state.owner_of_job(call.job))
                 for call in calls]
        with self._lock:
            if len(self._sent) > 100_000:  # (calls a stopped dispatcher never answered)
                self._sent = {k: t for k, t in self._sent.items() if now - t < 600}
            for call in calls:
                self._sent[(call.job, call.request.sequence_number)] = now
        self._dispatcher().send(calls)

    def take_answers(self) -> list[ControllerAnswer]:
        return self.inbox.take_answers()

    def close(self) -> None:
        if self.dispatcher is not None:
            self.dispatcher.close()
            self.dispatcher = None

    def _dispatcher(self) -> Dispatcher | DispatcherProcess:
        """The TaskControl dispatcher, started at the first call: in a process of its
        own (``controller_process``), or a thread of this one."""
        if self.dispatcher is None:
            config = self.state.config
            if config.controller_process:
                self.dispatcher = DispatcherProcess(self._deliver, Settings(
                    deadline=config.controller_deadline,
                    max_reply_bytes=config.controller_reply_bytes,
                    max_in_flight=config.controller_concurrency,
                    per_tenant=config.controller_concurrency_per_owner, policy=self.url_policy,
                    ca_file=config.ca_file, secret=self._secret()))
            else:
                self.dispatcher = Dispatcher(
                    self._deliver, deadline=config.controller_deadline,
                    max_reply_bytes=config.controller_reply_bytes,
                    max_in_flight=config.controller_concurrency,
                    per_tenant=config.controller_concurrency_per_owner, policy=self.url_policy,
                    verify=lambda url: tls_verify(config.ca_file, url),
                    key_for=self._key_of, clock=self.state.clock)
        return self.dispatcher

    def _deliver(self, answer: ControllerAnswer) -> None:
        with self._lock:
            sent = self._sent.pop((answer.job, answer.sequence_number), None)
        self.inbox.answer(answer)  # (wakes the pass)
        m = self.metrics
        job = m.job_label(answer.job)  # (the largest jobs' own series; the rest summed)
        if answer.response is not None:
            outcome = "answered"
            if answer.response.ack:
                m.taskcontrol_acks.labels(job).inc(len(answer.response.ack))
        else:
            outcome = "timeout" if "deadline" in (answer.error or "") else "error"
        m.taskcontrol_calls.labels(job, outcome).inc()
        if sent is not None:
            m.taskcontrol_seconds.labels(job).observe(time.monotonic() - sent)

    def serving_at(self, *urls: str) -> None:
        """The API's own URLs: a controller URL may not point at them."""
        policy = self.url_policy
        self.url_policy = UrlPolicy(allow=policy.allow, own=policy.own | own_addresses(urls))
        if self.dispatcher is not None:
            self.dispatcher.policy = self.url_policy

    def check_controller_url(self, url: str, resolve_timeout: float = 2.0) -> None:
        """Refuse a controller URL the policy does not allow (a ``ValidationError``
        naming the rule). A name is resolved with a bound; one that does not resolve
        now is left to the check at each call."""
        policy = self.url_policy
        host, port = policy.host(url)
        literal = policy.literal(host)
        if literal is not None:
            policy.check(url, [str(literal)])
            return
        found: list[str] = []

        def resolve() -> None:
            with contextlib.suppress(OSError, UnicodeError):
                found.extend(sorted({str(i[4][0]) for i in socket.getaddrinfo(
                    host, port, type=socket.SOCK_STREAM)}))
        worker = threading.Thread(target=resolve, daemon=True)
        worker.start()
        worker.join(resolve_timeout)
        if found and not worker.is_alive():
            policy.check(url, found)

    def _secret(self) -> bytes:
        """The region's TaskControl signing secret (made at first use, shared by every
        replica and shard: it lives under /auth)."""
        if self._signing_secret is None:
            key = "/auth/taskcontrol-secret"
            try:
                self._signing_secret = bytes.fromhex(self.state.store.get(key)[0].decode())
            except NotFound:
                fresh = secrets.token_bytes(32)
                try:
                    self.state.store.create(key, fresh.hex().encode())
                    self._signing_secret = fresh
                except Conflict:  # another replica made it first
                    self._signing_secret = bytes.fromhex(self.state.store.get(key)[0].decode())
        return self._signing_secret

    def controller_key(self, job: str) -> str:
        """The key a job's controller verifies this region's calls with: of this job,
        not of its name (a job made later under the name has another)."""
        return self._key_of(signing.key_name(job, self.state.jobs.get(job).uid))

    def _key_of(self, key_name: str) -> str:
        return signing.job_key(self._secret(), key_name)

    def key_of(self, key_name: str) -> str:
        """The key of the job whose key name (``signing.key_name``) this is (reads the
        region's secret from the store at its first use: ``secret_read``)."""
        return self._key_of(key_name)

    def secret_read(self) -> bool:
        """Is the region's secret read already (``key_of`` reads nothing)?"""
        return self._signing_secret is not None
