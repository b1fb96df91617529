"""Sending TaskControl calls off the pass (shell, outside the pure core).

The scheduler's pass leaves each job's request for its remote controller in
``Scheduler.outbox``; the control plane hands them to ``Dispatcher.send`` after the
pass and goes on. The dispatcher runs its own event loop in one thread and sends
the calls concurrently (at most ``max_in_flight`` at once, and at most ``per_tenant``
of one tenant's: ``plait.taskcontrol.tenantcalls``), each with:

* a hard total deadline (``deadline`` seconds from connect to the last byte of the
  reply, whatever the controller does: a tarpit that sends one byte every two
  seconds is cut off at the deadline, not kept alive by each byte);
* a reply-size cap (``max_reply_bytes``; the reply is read as a stream and dropped
  as soon as it is larger);
* the URL policy checked on the addresses the host resolves to at call time;
* a signature the controller can verify (``plait.taskcontrol.signing``).

Every call ends in exactly one ``ControllerAnswer`` passed to ``deliver`` (from the
dispatcher's thread): the response, or why there is none. The scheduler applies it
at its next pass. A slow or broken controller costs one of its tenant's slots for at
most ``deadline`` seconds and delays its own tenant's calls only.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import aiohttp

from plait.errors import ValidationError
from plait.model.redact import redact_text
from plait.taskcontrol import signing
from plait.taskcontrol.protocol import (
    ControllerAnswer,
    ControllerCall,
    response_from_wire,
    to_wire,
)
from plait.taskcontrol.tenantcalls import (
    Oversized,
    Refused,
    TenantSlots,
    read_capped,
    resolve_checked,
)
from plait.taskcontrol.urlpolicy import UrlPolicy

#: the default hard deadline of one call, and the default reply cap
DEFAULT_DEADLINE = 5.0
DEFAULT_MAX_REPLY = 1 << 20
#: the default bound on one tenant's calls in flight at once
DEFAULT_PER_TENANT = 16


@dataclass
class DispatchStats:
    calls: int = 0
    answered: int = 0
    errors: int = 0
    timeouts: int = 0
    refused: int = 0
    oversized: int = 0
    in_flight: int = 0


class Dispatcher:
    def __init__(self, deliver: Callable[[ControllerAnswer], None], *,
                 deadline: float = DEFAULT_DEADLINE,
                 max_reply_bytes: int = DEFAULT_MAX_REPLY,
                 max_in_flight: int = 64,
                 per_tenant: int = DEFAULT_PER_TENANT,
                 policy: UrlPolicy | None = None,
                 verify: Callable[[str], Any] = lambda url: True,
                 key_for: Callable[[str], str | None] = lambda job: None,
                 clock: Callable[[], float] = time.time) -> None:
        """``verify(url)``: what an https controller's certificate is checked against;
        ``key_for(name)``: the signing key of a job's ``key_name`` (None: unsigned)."""
        self.deliver = deliver
        self.deadline = deadline
        self.max_reply_bytes = max_reply_bytes
        self.max_in_flight = max_in_flight
        self.per_tenant = min(per_tenant, max_in_flight)
        self.policy = policy or UrlPolicy()
        self.verify = verify
        self.key_for = key_for
        self.clock = clock
        self.stats = DispatchStats()
        self._clients: dict[int, aiohttp.ClientSession] = {}
        self._verify_ids: dict[str, Any] = {}
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="plait-taskcontrol",
                                        daemon=True)
        self._thread.start()
        self._ready.wait()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._slots = TenantSlots(self.per_tenant, self.max_in_flight)
        self._ready.set()
        self._loop.run_forever()

    # -- the caller's side ---------------------------------------------------------------
    def send(self, calls: Iterable[ControllerCall]) -> None:
        """Send each call (returns at once; answers come to ``deliver``)."""
        batch = list(calls)
        if batch:
            self._loop.call_soon_threadsafe(self._start, batch)

    def close(self) -> None:
        if not self._loop.is_running():
            return
        done: Future[None] = asyncio.run_coroutine_threadsafe(self._aclose(), self._loop)
        with contextlib.suppress(Exception):  # closing is best effort
            done.result(timeout=5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)

    async def _aclose(self) -> None:
        for task in [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]:
            task.cancel()
        for client in self._clients.values():
            await client.close()

    # -- the loop's side -----------------------------------------------------------------
    def _start(self, batch: list[ControllerCall]) -> None:
        for call in batch:
            self.stats.calls += 1
            self._loop.create_task(self._call(call))

    def _client(self, url: str) -> tuple[aiohttp.ClientSession, Any]:
        """A session per way of checking certificates (aiohttp: its C parser and
        connection pool carry a thousand calls a second on one core, where
        httpx's async client managed about 120 here)."""
        verify = self.verify(url) if url.startswith("https:") else True
        key = id(verify) if not isinstance(verify, bool) else int(verify)
        client = self._clients.get(key)
        if client is None:
            self._verify_ids[url] = verify  # (keeps the context alive with its id)
            connector = aiohttp.TCPConnector(limit=self.max_in_flight, limit_per_host=0,
                                             ttl_dns_cache=10)
            client = self._clients[key] = aiohttp.ClientSession(
                connector=connector, trust_env=False, auto_decompress=False,
                timeout=aiohttp.ClientTimeout(total=None))
        return client, verify

    async def _call(self, call: ControllerCall) -> None:
        async with self._slots.slot(call.tenant or call.job):
            self.stats.in_flight += 1
            response = None
            error: str | None = None
            try:
                async with asyncio.timeout(self.deadline):
                    response = await self._exchange(call)
                self.stats.answered += 1
            except TimeoutError:
                self.stats.timeouts += 1
                error = (f"controller {call.url}: no whole reply within the "
                         f"{self.deadline:g}s deadline")
            except Refused as exc:
                self.stats.refused += 1
                error = str(exc)
            except Oversized as exc:
                self.stats.oversized += 1
                error = str(exc)
            except _Unusable as exc:
                error = f"controller {call.url}: {exc}"
            except Exception as exc:  # whatever the controller did, it acks nothing
                error = f"controller {call.url}: {type(exc).__name__}: {exc}"
            finally:
                self.stats.in_flight -= 1
            if error is not None:
                self.stats.errors += 1
                error = redact_text(error)  # (the URL's credentials: never shown)
        self.deliver(ControllerAnswer(call.job, call.request.sequence_number, response, error))

    async def _exchange(self, call: ControllerCall) -> Any:
        url = call.url
        await resolve_checked(self.policy, url, "controller")
        body = json.dumps(to_wire(call.request), separators=(",", ":")).encode()
        headers = {"Content-Type": "application/json", "Accept-Encoding": "identity",
                   signing.JOB_HEADER: call.job}
        key = self.key_for(call.key_name or call.job)
        if key is not None:
            headers[signing.SIGNATURE_HEADER] = signing.sign(key, body, self.clock())
        client, ssl = self._client(url)
        async with client.post(url, data=body, headers=headers, ssl=ssl,
                               allow_redirects=False) as reply:
            if not 200 <= reply.status < 300:
                raise _Unusable(f"HTTP {reply.status}")
            data = await read_capped(reply, self.max_reply_bytes, f"controller {url}")
        try:
            parsed = json.loads(data)
        except ValueError:
            raise _Unusable("reply is not JSON") from None
        try:
            return response_from_wire(parsed)
        except ValidationError as exc:
            raise _Unusable(f"malformed reply: {exc}") from None


class _Unusable(Exception):
    pass
