"""A follower's API hands every request to its control plane's leader (plain ASGI): a
client or an agent may call any replica, and sees the leader's answer. ``/healthz``
is answered by the replica itself. A request that cannot reach a leader (none elected
yet, or the elected one not answering) gets a 503 with a Retry-After: it is never
applied by a follower."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote_from_bytes

import httpx
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from plait import tracing
from plait.frontend.hop import Hop

#: set on a forwarded request: a replica that is not the leader either answers 503
#: instead of forwarding it again (no loops while an election settles)
FORWARDED = "x-plait-forwarded"
#: headers not passed on (hop by hop, or recomputed)
_HOP = {b"host", b"content-length", b"connection", b"keep-alive", b"transfer-encoding",
        b"te", b"upgrade", b"proxy-authorization", b"proxy-connection"}
_BACK = {"content-type", "retry-after", "www-authenticate", "location", "allow"}
#: bytes a forwarded path keeps as they are (its escapes among them)
_PATH_SAFE = "/%:@!$&'()*+,;=-._~"


#: the largest request body taken (a job spec is a few kB)
MAX_BODY = 1 << 20


def declared_too_large(scope: Scope) -> bool:
    """The request says (Content-Length) its body is over ``MAX_BODY``, or says it
    in a form that is not a length."""
    size = dict(scope["headers"]).get(b"content-length")
    return size is not None and (not size.isdigit() or int(size) > MAX_BODY)


async def too_large(send: Send) -> None:
    body = json.dumps({"error": "too_large",
                       "message": f"request body over {MAX_BODY} bytes"}).encode()
    await send({"type": "http.response.start", "status": 413,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


async def unavailable(send: Send, message: str) -> None:
    body = json.dumps({"error": "unavailable", "message": message}).encode()
    await send({"type": "http.response.start", "status": 503,
                "headers": [(b"content-type", b"application/json"),
                            (b"retry-after", b"1"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


async def read_body(receive: Receive, limit: int | None = None) -> bytes | None:
    """The request's body; None as soon as it passes ``limit`` bytes (the rest is not
    read)."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        chunk = bytes(message.get("body", b""))
        size += len(chunk)
        if limit is not None and size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body"):
            return b"".join(chunks)


def replaying(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that gives ``body`` (read already) as the request's whole body,
    then what ``receive`` gives (a disconnect, if the client goes)."""
    given = False

    async def replay() -> Message:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()
    return replay


def forward_headers(scope: Scope) -> list[tuple[str, str]]:
    """The request's headers that are passed on (all but hop-by-hop ones)."""
    return [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"]
            if k.lower() not in _HOP]


async def call(client: httpx.AsyncClient | Hop, target: str, scope: Scope, body: bytes,
               headers: list[tuple[str, str]], path: str | None = None) -> httpx.Response:
    """Send the request of ``scope`` to the API at ``target`` (a long-poll is given
    the client's wait, plus slack). Raises httpx.HTTPError if it does not answer."""
    # the path as the client sent it (percent-encoded), not as decoded for routing: a
    # name with any byte in it reaches the shard, which answers for it
    raw = path.encode() if path is not None else (scope.get("raw_path") or
                                                  scope["path"].encode())
    raw_query = scope.get("query_string", b"")
    url = httpx.URL(target.rstrip("/") + quote_from_bytes(raw, safe=_PATH_SAFE),
                    query=raw_query)
    try:  # (most requests have no query: nothing to parse)
        wait = float(dict(httpx.QueryParams(raw_query.decode("latin-1"))).get("wait", 0)
                     or 0) if b"wait" in raw_query or b"%" in raw_query else 0.0
    except ValueError:
        wait = 0.0
    # (a wait the API refuses, negative or not a number, still gets the base timeout)
    wait = min(wait, 300.0) if wait > 0 else 0.0
    with tracing.span("proxy", kind="client", **{"server.address": target}) as hop:
        r = await client.request(scope["method"], url, content=body,
                                 headers=tracing.inject(headers), timeout=30.0 + wait)
        hop.set_attribute("http.response.status_code", r.status_code)
        return r


async def answer(send: Send, r: httpx.Response) -> None:
    """Pass an upstream answer back (status, body, and the headers that matter)."""
    back = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in r.headers.items()
            if k.lower() in _BACK]
    content = r.content
    await send({"type": "http.response.start", "status": r.status_code,
                "headers": [*back, (b"content-length", str(len(content)).encode())]})
    await send({"type": "http.response.body", "body": content})


class FollowerProxy:
    def __init__(self, app: ASGIApp, leadership: Any) -> None:
        self.app = app
        self.leadership = leadership
        self._client: httpx.AsyncClient | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        lead = self.leadership
        if scope["type"] != "http" or lead.leading or scope["path"] in ("/healthz",
                                                                         "/metrics"):
            await self.app(scope, receive, send)
            return
        headers = forward_headers(scope)
        if any(k.lower() == FORWARDED for k, _ in headers):
            await unavailable(send, f"{lead.identity} is not the leader either; the "
                                     "election is settling: retry")
            return
        target = lead.leader()
        if target is None or target == lead.identity:
            await unavailable(send, "no control-plane leader elected yet: retry")
            return
        body = None if declared_too_large(scope) else await read_body(receive, MAX_BODY)
        if body is None:
            await too_large(send)
            return
        if self._client is None:
            self._client = httpx.AsyncClient(verify=getattr(lead, "verify", True))
        try:
            r = await call(self._client, target, scope, body,
                           [*headers, (FORWARDED, lead.identity)])
        except httpx.HTTPError as exc:
            await unavailable(send, f"the leader {target} did not answer "
                                     f"({type(exc).__name__}): retry")
            return
        await answer(send, r)
