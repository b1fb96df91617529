"""The front end's hop to a shard's leader: a pooled keep-alive HTTP client (aiohttp).

``httpx.AsyncClient`` cost the front end about 1 ms of CPU per proxied request (its
pool scans every connection, and httpcore tries ``import sniffio`` again on every
request when sniffio is absent: a walk of the import path each time), a third of the
front end's CPU under a burst of creates. aiohttp's pool keeps connections alive per
host and costs a fraction of that. The answer is handed back as an ``httpx.Response``
(status, headers, the whole body), and failures are httpx's exceptions, so callers
(``proxy.call``, ``router.ShardRouter``) treat it as they treat an httpx client:
``httpx.ConnectError`` when the leader could not be connected to (nothing was sent),
another ``httpx.HTTPError`` when the request may have reached it."""

from __future__ import annotations

import ssl
from typing import Any

import aiohttp
import httpx


class Hop:
    """``request`` as ``httpx.AsyncClient.request`` takes it (the arguments the proxy
    gives); ``verify``: what ``plait.tls.verify`` returns (a context, or whether to
    check certificates against the system's authorities)."""

    def __init__(self, verify: ssl.SSLContext | bool = True) -> None:
        self.verify = verify
        self._session: aiohttp.ClientSession | None = None

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            check: Any = self.verify if isinstance(self.verify, ssl.SSLContext) else (
                None if self.verify else False)
            # no limit on connections (the shards bound their own), kept alive 30 s
            connector = aiohttp.TCPConnector(limit=0, ssl=check, keepalive_timeout=30.0)
            self._session = aiohttp.ClientSession(
                connector=connector, auto_decompress=False,
                # the caller's headers go as they are: none of aiohttp's own
                skip_auto_headers=("User-Agent", "Accept-Encoding", "Accept",
                                   "Content-Type"))
        return self._session

    async def request(self, method: str, url: httpx.URL | str, *, content: bytes = b"",
                      headers: list[tuple[str, str]] | None = None,
                      timeout: float = 30.0) -> httpx.Response:
        session = self._open()
        try:
            async with session.request(method, str(url), data=content or None,
                                       headers=headers, allow_redirects=False,
                                       timeout=aiohttp.ClientTimeout(total=timeout)) as r:
                body = await r.read()
                back = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in r.raw_headers]
                return httpx.Response(r.status, headers=back, content=body)
        except aiohttp.ClientConnectorError as exc:
            raise httpx.ConnectError(f"{url}: {exc}") from exc
        except TimeoutError as exc:
            raise httpx.ReadTimeout(f"{url}: no answer within {timeout:g}s") from exc
        except aiohttp.ClientError as exc:
            raise httpx.ReadError(f"{url}: {type(exc).__name__}: {exc}") from exc

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
