"""Push gates asked over HTTP, off the reconcile and per owner (shell).

A staged push whose gate is a URL has it asked once its stage's tasks are ready: a
``GET`` with the job and the stage's number, any 2xx passes, anything else (an error
status, no whole answer within the deadline, an answer over the size cap, a URL the
policy refuses) fails. The URL is its owner's: it may answer slowly, never, or a byte
every two seconds. So every gate is asked on one event loop in a thread of its own
(``plait-gates``), with the bounds of ``plait.taskcontrol.tenantcalls``:

* a hard total deadline (``deadline``, 5 s): from resolving the host to the answer's
  last byte, not a limit per read that each trickled byte renews;
* an answer of at most ``max_bytes`` (64 KiB), read as a stream;
* the TaskController URL policy, checked on the addresses the host resolves to now;
* at most ``per_owner`` gates of one owner asked at once (4): an owner's tarpits wait
  behind each other, never in front of another owner's gates. A gate waiting for its
  owner's slot has not started its deadline.

``ask`` returns a future at once; the reconcile takes the verdict when it is done.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import aiohttp

from plait.taskcontrol.tenantcalls import (
    Oversized,
    Refused,
    TenantSlots,
    read_capped,
    resolve_checked,
)
from plait.taskcontrol.urlpolicy import UrlPolicy

#: a gate's hard total deadline, the most of its answer read, its owner's gates asked
#: at once, and every owner's
DEADLINE = 5.0
MAX_BYTES = 64 * 1024
PER_OWNER = 4
TOTAL = 256


class GateAsker:
    def __init__(self, policy: Callable[[], UrlPolicy], *,
                 verify: Callable[[str], Any] = lambda url: True,
                 deadline: float = DEADLINE, max_bytes: int = MAX_BYTES,
                 per_owner: int = PER_OWNER, total: int = TOTAL) -> None:
        """``policy()``: the URL policy now (the API's own addresses join it once it
        serves); ``verify(url)``: what an https gate's certificate is checked against."""
        self.policy = policy
        self.verify = verify
        self.deadline = deadline
        self.max_bytes = max_bytes
        self.per_owner = per_owner
        self.total = total
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._started = threading.Lock()
        self._slots: TenantSlots | None = None
        self._session: aiohttp.ClientSession | None = None

    def ask(self, owner: str, url: str, job: str, stage: int) -> Future[tuple[bool, str]]:
        """Ask ``url`` about ``job``'s stage (numbered from 1): a future of (passed,
        message). Never raises; the future never fails."""
        loop = self._running()
        return asyncio.run_coroutine_threadsafe(self._ask(owner, url, job, stage), loop)

    def in_flight(self, owner: str) -> int:
        """An owner's gates being asked or waiting for its slots (read on the loop's
        thread's data: a snapshot for tests and metrics)."""
        return 0 if self._slots is None else self._slots.in_flight(owner)

    def close(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None or not loop.is_running():
            return
        done = asyncio.run_coroutine_threadsafe(self._aclose(), loop)
        with contextlib.suppress(Exception):  # closing is best effort
            done.result(timeout=5)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=5)

    # -- the loop's side -----------------------------------------------------------------
    def _running(self) -> asyncio.AbstractEventLoop:
        with self._started:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                ready = threading.Event()

                def run() -> None:
                    asyncio.set_event_loop(loop)
                    self._slots = TenantSlots(self.per_owner, self.total)
                    ready.set()
                    loop.run_forever()
                self._thread = threading.Thread(target=run, name="plait-gates", daemon=True)
                self._thread.start()
                ready.wait()
                self._loop = loop
            return self._loop

    async def _aclose(self) -> None:
        for task in [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]:
            task.cancel()
        if self._session is not None:
            await self._session.close()

    async def _ask(self, owner: str, url: str, job: str, stage: int) -> tuple[bool, str]:
        assert self._slots is not None
        async with self._slots.slot(owner or job):
            try:
                async with asyncio.timeout(self.deadline):
                    return await self._get(url, job, stage)
            except TimeoutError:
                return False, f"{url}: no whole answer within the {self.deadline:g}s deadline"
            except (Refused, Oversized) as exc:
                return False, str(exc)
            except Exception as exc:  # whatever the gate did, it did not pass
                return False, f"{url}: {type(exc).__name__}: {exc}"

    async def _get(self, url: str, job: str, stage: int) -> tuple[bool, str]:
        await resolve_checked(self.policy(), url, "gate")
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self.total, ttl_dns_cache=10),
                trust_env=False, auto_decompress=False,
                timeout=aiohttp.ClientTimeout(total=None))
        verify = self.verify(url) if url.startswith("https:") else True
        async with self._session.get(url, params={"job": job, "stage": str(stage)},
                                     ssl=verify, allow_redirects=False) as reply:
            body = await read_capped(reply, self.max_bytes, f"gate {url}")
            status = reply.status
        text = body.decode("utf-8", "replace").strip()[:200]
        said = f"{url} answered {status}" + (f": {text}" if text else "")
        return 200 <= status < 300, said
