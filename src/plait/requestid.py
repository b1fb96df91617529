"""The request id: one per API request, carried wherever the request has effects.

The front end (or a replica, when called directly) takes the caller's ``X-Request-Id``
when it is a short token of safe characters, else makes one, and sets ``current`` for
the request's handling; the shard it forwards to receives the same header. Log lines
and events written while handling the request carry it, and so do the events that the
request causes later (a job remembers the id of the command that last changed it).
"""

from __future__ import annotations

import re
import uuid
from contextvars import ContextVar

HEADER = "X-Request-Id"
_SAFE = re.compile(r"[A-Za-z0-9._:-]{1,64}")

#: the id of the API request being handled in this context (None outside one)
current: ContextVar[str | None] = ContextVar("plait_request_id", default=None)
#: who makes that request, once its token is verified (``owner:alice``); events
#: recorded while handling it name this actor
actor: ContextVar[str | None] = ContextVar("plait_request_actor", default=None)


def new() -> str:
    return uuid.uuid4().hex[:16]


def accept(value: str | None) -> str:
    """A caller's id when it is safe to log and forward as is, else a new one."""
    if value and _SAFE.fullmatch(value):
        return value
    return new()


def get() -> str | None:
    return current.get()
