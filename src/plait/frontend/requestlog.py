"""One request id per API request, and one access-log line per HTTP request (plain
ASGI, outermost on the front end and on each control-plane replica's API).

The caller's ``X-Request-Id`` is taken when it is safe (``requestid.accept``), else a
new id replaces it, in the request's headers too: whatever the request is passed on
to (the shard a front end routes it to, the leader a follower forwards it to) sees
the same id, and so do its log lines. The id is ``requestid.current`` while the
request is handled and comes back in the response's ``X-Request-Id``.

The access line (logger ``plait.access.<api>``) says: method, path, status, duration
in milliseconds, the request id and, once a token was verified, the token's id and
its principal (``owner:alice``; never the token). Agents' routine calls (desired
set, status, output) and ``/healthz`` / ``/metrics`` are logged at debug, so a region
of busy agents does not drown the rest; any of them that fails is logged at info,
and a 5xx at warning, but a ``/healthz`` 503 (not ready, or not the leader: what the
probe asks) at debug.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from plait import logconfig, requestid

_HEADER = requestid.HEADER.lower().encode("latin-1")
#: the last part of an agent's routine calls (``/v1/machines/{m}/<part>``)
_AGENT_PARTS = ("desired", "status", "output")
_QUIET_PATHS = ("/healthz", "/metrics")


def _routine(path: str) -> bool:
    if path in _QUIET_PATHS:
        return True
    parts = path.split("/")
    return len(parts) == 5 and parts[1:3] == ["v1", "machines"] and parts[4] in _AGENT_PARTS


def principal_of(scope: Scope) -> Any:
    """The principal whose token the handling verified (``request.state.principal``
    on the API, set by the front end's own check), or None."""
    state = scope.get("state")
    return state.get("principal") if isinstance(state, dict) else None


def _flushing(send: Send) -> Send:
    """``send`` that writes the queued log lines before the server says it has shut
    down (uvicorn then re-raises the signal that stopped it: no exit handler runs)."""
    async def sending(message: Message) -> None:
        if message["type"] == "lifespan.shutdown.complete":
            logconfig.flush()
        await send(message)
    return sending


class RequestLog:
    def __init__(self, app: ASGIApp, api: str) -> None:
        """``api``: which API this is (``frontend``, ``controlplane``), the last part
        of the access logger's name."""
        self.app = app
        self.log = logconfig.get(f"plait.access.{api}")
        #: (asked first: a line below the level costs a level check, not an event)
        self._levels = logging.getLogger(f"plait.access.{api}")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":  # the lines still queued, before the exit
            await self.app(scope, receive, _flushing(send))
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = scope["headers"]
        given = next((v for k, v in headers if k == _HEADER), None)
        rid = requestid.accept(given.decode("latin-1") if given is not None else None)
        raw = rid.encode("latin-1")
        if given != raw:  # (the id passed on is the one in force)
            scope["headers"] = [*((k, v) for k, v in headers if k != _HEADER), (_HEADER, raw)]
        status = 500  # (none sent: the server answers 500 for an app that raised)
        started = time.perf_counter()

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
                message = {**message, "headers": [
                    *((k, v) for k, v in message.get("headers", ()) if k.lower() != _HEADER),
                    (_HEADER, raw)]}
            await send(message)

        context = requestid.current.set(rid)
        try:
            await self.app(scope, receive, sending)
        finally:
            try:
                self._access(scope, status, time.perf_counter() - started)
            finally:
                requestid.current.reset(context)

    def _access(self, scope: Scope, status: int, seconds: float) -> None:
        path = str(scope.get("path", ""))
        if status == 503 and path == "/healthz":
            level = logging.DEBUG  # (not ready or not leading: the probe's answer, not a
            #                        failure; `plait up` asks it until it is ready)
        elif status >= 500:
            level = logging.WARNING
        elif status < 400 and _routine(path):
            level = logging.DEBUG
        else:
            level = logging.INFO
        if not self._levels.isEnabledFor(level):
            return
        fields: dict[str, Any] = {}
        who = principal_of(scope)
        if who is not None:
            fields = {"token_id": who.token_id, "actor": str(who)}
        self.log.log(level, "request", method=scope.get("method", ""), path=path, status=status,
             duration_ms=round(seconds * 1000, 3), **fields)
