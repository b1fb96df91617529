"""The front door's hot path: a plain ``POST /v1/jobs`` answered without FastAPI.

A create is the request a region takes most of under load, and FastAPI's routing
(a match against every route), dependency resolution and response model cost about
as much CPU as storing the create. ``FastCreate`` sits inside the control plane's
other middleware (request log, metrics, body limit, a follower's forwarding), so a
create it answers is logged, counted, bounded and forwarded as any other request. It
reads the body and asks ``create`` (the app's ``create_plain``) for the answer; when
that is None (anything but a plain, authorized, valid create that was stored), the
request goes to the FastAPI route with its body given again, so every refusal and
error is the route's own answer, word for word.

It answers the front end's batches of creates (``POST /v1/shard/creates``,
``plait.frontend.batch``) too, with ``batch`` (the app's ``create_batch``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.types import ASGIApp, Receive, Scope, Send

from plait.frontend.batch import PATH as BATCH_PATH
from plait.frontend.proxy import read_body, replaying

#: a plain create's answer: (status, JSON body), or None for the route to answer
Create = Callable[[Scope, bytes], Awaitable[tuple[int, bytes] | None]]
#: a batch's answer: (status, body, content type)
Batch = Callable[[Scope, bytes], Awaitable[tuple[int, bytes, bytes]]]


class FastCreate:
    def __init__(self, app: ASGIApp, create: Create, batch: Batch) -> None:
        self.app, self.create, self.batch = app, create, batch

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (scope["type"] != "http" or scope["method"] != "POST"
                or scope["path"] not in ("/v1/jobs", BATCH_PATH) or scope.get("query_string")):
            await self.app(scope, receive, send)
            return
        body = await read_body(receive)  # (bounded by the body limit, outside)
        assert body is not None
        if scope["path"] == BATCH_PATH:
            status, payload, content_type = await self.batch(scope, body)
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
