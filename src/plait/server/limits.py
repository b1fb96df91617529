"""HTTP limits of every plait server (a control plane replica, a front end): a bound
on the size of a request's headers, and a deadline to receive a whole request.

uvicorn's default parser (httptools) takes headers of any size, and no uvicorn
parser bounds the time a client takes to send a request: eight connections sending
50 MB of headers grew a server by 450 MB, and a client that sends one byte a second
holds a connection for ever. plait's servers run uvicorn's h11 parser with a header
limit, and ``DeadlineH11Protocol`` closes a connection whose request (headers and
body) has not fully arrived ``REQUEST_DEADLINE`` seconds after its first byte (or
after the connection opened). An idle keep-alive connection is uvicorn's to close
(``timeout_keep_alive``); a request being answered (a long-poll) is not cut.
"""

from __future__ import annotations

import asyncio
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

#: the largest request head (request line and headers) accepted
MAX_HEADER_BYTES = 64 * 1024
#: seconds a client has to send a whole request, from its first byte
REQUEST_DEADLINE = 30.0
#: seconds an idle keep-alive connection is kept
KEEP_ALIVE = 30.0


class DeadlineH11Protocol(H11Protocol):
    """uvicorn's h11 protocol, with a deadline on receiving each request."""

    deadline = REQUEST_DEADLINE

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._receiving: asyncio.TimerHandle | None = None
        self._arm()  # a connection that sends nothing is closed too

    def data_received(self, data: bytes) -> None:
        if self._receiving is None and self.conn.their_state in (h11.IDLE, h11.SEND_BODY):
            self._arm()
        super().data_received(data)
        if self.conn.their_state not in (h11.IDLE, h11.SEND_BODY):
            self._disarm()  # the request is whole (or the connection is over)
        elif self.conn.their_state is h11.IDLE and not self.conn.trailing_data[0]:
            self._disarm()  # (between requests, nothing buffered: keep-alive's to judge)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self._receiving = self.loop.call_later(self.deadline, self._too_slow)

    def _disarm(self) -> None:
        if getattr(self, "_receiving", None) is not None:
            assert self._receiving is not None
            self._receiving.cancel()
            self._receiving = None

    def _too_slow(self) -> None:
        self._receiving = None
        if not self.transport.is_closing():
            self.transport.close()


def uvicorn_options() -> dict[str, Any]:
    """The options every plait server gives uvicorn (whose records go to the handlers
    of ``plait.logconfig``: uvicorn sets up no logging of its own)."""
    return {"http": DeadlineH11Protocol, "h11_max_incomplete_event_size": MAX_HEADER_BYTES,
            "timeout_keep_alive": int(KEEP_ALIVE), "log_config": None}
