"""The front door's hot path: a plain ``POST /v1/jobs`` answered without FastAPI.

A create is the request a region takes most of under load, and FastAPI's routing
(a match against every route), dependency resolution and response model cost about
as much CPU as storing the create. ``FastCreate`` sits inside the control plane's
other middleware (request log, metrics, body limit, a follower's forwarding), so a
create it answers is logged, counted, bounded and forwarded as any other request. It
reads the body and asks ``create`` (``fastpaths.FastPaths.create``) for the
answer; when that is None (anything but a plain, authorized, valid create that was stored), the
request goes to the FastAPI route with its body given again, so every refusal and
error is the route's own answer, word for word.

It answers the front end's batches of creates (``POST /v1/shard/creates``,
``plait.frontend.batch``) too, with ``batch`` (``FastPaths.batch``; a batch whose own
token is not a cached owner's or admin's goes to the route, which refuses it as any
route refuses a token), and an agent's heartbeat (``POST
/v1/machines/{machine}/status``) with ``report`` (``FastPaths.report``): every agent
sends one each second, so a shard of a thousand machines takes a thousand a second
while nothing changes, and FastAPI's share of each was most of its cost. A report
it does not answer (None) goes to the route, as a create does.

A hot path answers only a request whose Authorization and Content-Type each come
once, the type ``application/json`` (``plain_headers``): a repeated header, or
another JSON type, is the route's to read and answer.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.types import ASGIApp, Receive, Scope, Send

from plait.frontend.batch import PATH as BATCH_PATH
from plait.frontend.batch import headers_once, is_json, plain_headers
from plait.frontend.proxy import read_body, replaying

#: a plain create's answer: (status, JSON body), or None for the route to answer
Create = Callable[[Scope, bytes], Awaitable[tuple[int, bytes] | None]]
#: a batch's answer: (status, body, content type), or None for the route to answer
Batch = Callable[[Scope, bytes], Awaitable[tuple[int, bytes, bytes] | None]]
#: an agent's report's answer, given its machine: (status, JSON body), or None
Report = Callable[[Scope, str, bytes], Awaitable[tuple[int, bytes] | None]]

MACHINES = "/v1/machines/"
STATUS = "/status"

__all__ = ["FastCreate", "headers_once", "is_json", "plain_headers"]


class FastCreate:
    def __init__(self, app: ASGIApp, create: Create, batch: Batch,
                 report: Report | None = None) -> None:
        self.app, self.create, self.batch, self.report = app, create, batch, report

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope.get("query_string"):
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        machine = None
        if path.startswith(MACHINES) and path.endswith(STATUS) and self.report is not None:
            machine = path[len(MACHINES):-len(STATUS)]
            if not machine or "/" in machine:
                machine = None
        if machine is None and path not in ("/v1/jobs", BATCH_PATH):
            await self.app(scope, receive, send)
            return
        body = await read_body(receive)  # (bounded by the body limit, outside)
        assert body is not None
        if path == BATCH_PATH:
            got = await self.batch(scope, body)
            if got is None:
                await self.app(scope, replaying(body, receive), send)
                return
            status, payload, content_type = got
        else:
            if machine is not None:
                assert self.report is not None
                answer = await self.report(scope, machine, body)
            else:
                answer = await self.create(scope, body)
            if answer is None:
                await self.app(scope, replaying(body, receive), send)
                return
            status, payload = answer
            content_type = b"application/json"
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-length", str(len(payload)).encode()),
                                (b"content-type", content_type)]})
        await send({"type": "http.response.body", "body": payload})
