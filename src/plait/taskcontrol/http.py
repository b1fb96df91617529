"""TaskControl over HTTP (shell, outside the pure core): a client that calls an
application's controller at any URL, and a leader lookup for ``LeaderLast``.

The controller answers ``POST {url}`` with the JSON request of
``plait.taskcontrol.protocol.to_wire`` and must reply ``{"ack": [op ids]}``. A
timeout, a connection error, a non-2xx status or a malformed body raises
``TaskControlError``; the scheduler turns that into "acked nothing".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx

from plait.errors import PlaitError, ValidationError
from plait.model.redact import redact_url
from plait.taskcontrol.protocol import (
    TaskControlRequest,
    TaskControlResponse,
    response_from_wire,
    to_wire,
)


class TaskControlError(PlaitError):
    """The controller could not be asked, or answered something unusable."""


class HttpController:
    def __init__(self, url: str, timeout: float = 5.0, token: str | None = None,
                 client: httpx.Client | None = None, verify: Any = True) -> None:
        """``verify``: what an https controller's certificate is checked against (an
        ``ssl.SSLContext`` of the control plane's CA file, or the system's)."""
        self.url = url
        self.shown = redact_url(url)  # (in errors: no credential of the URL's)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._client = client or httpx.Client(timeout=timeout, headers=headers, verify=verify)

    def process(self, request: TaskControlRequest) -> TaskControlResponse:
        try:
            reply = self._client.post(self.url, json=to_wire(request))
        except httpx.HTTPError as exc:
            raise TaskControlError(f"controller {self.shown}: {type(exc).__name__}: {exc}") from exc
        if not reply.is_success:
            raise TaskControlError(f"controller {self.shown}: HTTP {reply.status_code}")
        try:
            body: Any = reply.json()
        except ValueError:
            raise TaskControlError(f"controller {self.shown}: reply is not JSON") from None
        try:
            return response_from_wire(body)
        except ValidationError as exc:
            raise TaskControlError(f"controller {self.shown}: malformed reply: {exc}") from None

    def close(self) -> None:
        self._client.close()


def http_leader(url: str, timeout: float = 2.0) -> Callable[[], int | None]:
    """For ``LeaderLast``: ``GET {url}`` answering ``{"leader": task index}``; any
    failure means "unknown" (and LeaderLast then acks nothing)."""
    client = httpx.Client(timeout=timeout)

    def leader() -> int | None:
        try:
            body = client.get(url).json()
        except (httpx.HTTPError, ValueError):
            return None
        value = body.get("leader") if isinstance(body, dict) else None
        return value if isinstance(value, int) else None

    return leader
