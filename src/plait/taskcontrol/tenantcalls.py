"""Calls the control plane makes to URLs its tenants control (shell, outside the pure
core): TaskControllers (``plait.taskcontrol.dispatch``) and push gates
(``plait.server.controlplane.gates``).

A tenant's URL may answer slowly, never, a byte at a time or with gigabytes, so each
call gets, whatever the other end does:

* the URL policy (``plait.taskcontrol.urlpolicy``) checked on the addresses the host
  resolves to at call time (``resolve_checked``);
* a hard total deadline, from the name's resolution to the answer's last byte, which
  the caller sets around the whole call (``asyncio.timeout``): a tarpit that sends one
  byte every two seconds is cut off at the deadline, not kept alive by each byte;
* a size cap on the answer, read as a stream and dropped as soon as it is larger
  (``read_capped``);
* a slot of its tenant's own (``TenantSlots``): at most ``per_tenant`` calls of one
  tenant are in flight at once, so a tenant's slow URLs wait behind each other and
  never behind another tenant's, nor hold the slots every tenant shares.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from typing import Any

from plait.errors import ValidationError
from plait.taskcontrol.urlpolicy import UrlPolicy


class Refused(Exception):
    """The URL policy refused the URL, or its host does not resolve."""


class Oversized(Exception):
    """The answer is larger than its cap."""


async def resolve_checked(policy: UrlPolicy, url: str, what: str) -> None:
    """Resolve ``url``'s host now and check every address against ``policy``
    (``Refused`` names the rule, or the resolution's error)."""
    try:
        host, port = policy.host(url)
        literal = policy.literal(host)
        if literal is not None:
            addresses = [str(literal)]
        else:
            infos = await asyncio.get_running_loop().getaddrinfo(
                host, port, type=socket.SOCK_STREAM)
            addresses = sorted({str(info[4][0]) for info in infos})
        policy.check(url, addresses)
    except ValidationError as exc:
        raise Refused(str(exc)) from None
    except (OSError, UnicodeError) as exc:
        raise Refused(f"{what} {url}: cannot resolve {exc}") from None


async def read_capped(reply: Any, cap: int, what: str) -> bytes:
    """An aiohttp reply's body, at most ``cap`` bytes (``Oversized`` past that, as
    soon as the declared length or the bytes read say so)."""
    declared = reply.content_length
    if declared is not None and declared > cap:
        raise Oversized(f"{what}: reply of {declared} bytes is over the {cap} byte cap")
    data = bytearray()
    async for chunk in reply.content.iter_any():
        data += chunk
        if len(data) > cap:
            raise Oversized(f"{what}: reply over the {cap} byte cap")
    return bytes(data)


class TenantSlots:
    """At most ``per_tenant`` calls of each tenant at once, and ``total`` in all.

    A call takes its tenant's slot first and a shared one only then, so a tenant
    whose calls wait for its own slots holds none of the shared ones. With
    ``total`` at least ``per_tenant`` times the tenants calling at once, no tenant
    waits for another's calls; past that, each tenant is still bounded to
    ``per_tenant`` of the shared slots. Used from one event loop."""

    def __init__(self, per_tenant: int, total: int) -> None:
        if per_tenant < 1 or total < 1:
            raise ValueError("per_tenant and total must be at least 1")
        self.per_tenant = per_tenant
        self._total = asyncio.Semaphore(total)
        #: tenant -> (its semaphore, calls holding or waiting for it); dropped at 0
        self._tenants: dict[str, tuple[asyncio.Semaphore, int]] = {}

    def in_flight(self, tenant: str) -> int:
        """The tenant's calls holding or waiting for a slot."""
        held = self._tenants.get(tenant)
        return 0 if held is None else held[1]

    @contextlib.asynccontextmanager
    async def slot(self, tenant: str) -> AsyncIterator[None]:
        sem, users = self._tenants.get(tenant) or (asyncio.Semaphore(self.per_tenant), 0)
        self._tenants[tenant] = (sem, users + 1)
        try:
            async with sem, self._total:
                yield
        finally:
            sem, users = self._tenants[tenant]
            if users <= 1:
                del self._tenants[tenant]
            else:
                self._tenants[tenant] = (sem, users - 1)
