"""HTTP limits of every plait server (a control plane replica, a front end): a bound
on the size of a request's headers, and a deadline to receive a whole request.

uvicorn's parsers take heads of any size (httptools) or bound them only in h11, and
no uvicorn parser bounds the time a client takes to send a request: eight
connections sending 50 MB of headers grew a server by 450 MB, and a client that
sends one byte a second holds a connection for ever. plait's servers run uvicorn's
httptools parser (a C parser: about twice as many requests per second of CPU as
h11's) through ``LimitedHttpProtocol``, which answers 431 and closes a connection
whose request head grows past ``MAX_HEADER_BYTES`` (counted as it arrives, before the
parser buffers it), and closes a connection whose request (head and body) has not
fully arrived ``REQUEST_DEADLINE`` seconds after its first byte (or after the
connection opened). An idle keep-alive connection is uvicorn's to close
(``timeout_keep_alive``); a request being answered (a long-poll) is not cut.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

#: the largest request head (request line and headers) accepted
MAX_HEADER_BYTES = 64 * 1024
#: seconds a client has to send a whole request, from its first byte
REQUEST_DEADLINE = 30.0
#: seconds an idle keep-alive connection is kept
KEEP_ALIVE = 30.0

_TOO_LARGE = b"request head over %d bytes" % MAX_HEADER_BYTES
_431 = (b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
        b"content-type: text/plain; charset=utf-8\r\n"
        b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(_TOO_LARGE), _TOO_LARGE))


class LimitedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, with a bound on each request's head and a
    deadline on receiving each request.

    The head is counted in the bytes received while a request's head is awaited
    (from the end of the previous request, or the connection's start, to the end of
    the headers) and judged after each read is parsed; a read that ends one request's
    body and begins the next one's head is not counted, so the parser holds at most
    the bound and one read (uvicorn reads 64 KiB)."""

    deadline = REQUEST_DEADLINE
    max_head = MAX_HEADER_BYTES

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._receiving: asyncio.TimerHandle | None = None
        self._head = 0  # bytes of the awaited request head received so far
        self._heading = True  # a request's head is awaited
        self._partial = False  # a request has begun and not fully arrived
        self._arm()  # a connection that sends nothing is closed too

    def data_received(self, data: bytes) -> None:
        if self._receiving is None:
            self._arm()  # a request begins
        if self._heading:
            self._head += len(data)
        super().data_received(data)
        if self._heading and self._head > self.max_head:
            self._refuse()  # (a read that completes the head may carry body bytes too)
        elif not self._partial:
            self._disarm()  # each request in it arrived whole: keep-alive's to judge

    def on_message_begin(self) -> None:
        self._partial = True
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        self._heading, self._head = False, 0
        super().on_headers_complete()
        cycle = getattr(self, "cycle", None)
        if cycle is not None and cycle.transport is self.transport:
            cycle.transport = Corked(self.transport, self.loop)

    def on_message_complete(self) -> None:
        self._partial, self._heading, self._head = False, True, 0
        super().on_message_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def shutdown(self) -> None:
        """The server stops: an idle TLS connection is dropped at once. Closed as
        uvicorn closes it, it would wait for the client's close_notify, which a pooled
        idle client never sends, for asyncio's 30 s, and the server's stop with it. (A
        connection with a request under way finishes it first, as uvicorn does.)"""
        idle = self.cycle is None or self.cycle.response_complete
        if idle and self.transport.get_extra_info("ssl_object") is not None:
            self.transport.abort()
            return
        super().shutdown()

    def _refuse(self) -> None:
        self._disarm()
        if not self.transport.is_closing():
            self.transport.write(_431)
            self.transport.close()

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


class Corked:
    """A transport whose writes within one turn of the event loop leave as one write:
    uvicorn writes a response's head and its body apart, two system calls (and two
    wake-ups of the reader) where one does. What is written is sent at the end of the
    turn, or at once when the transport is closed."""

    __slots__ = ("_loop", "_pending", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport, self._loop = transport, loop
        self._pending: list[bytes] = []

    def write(self, data: bytes) -> None:
        if not self._pending:
            self._loop.call_soon(self.flush)
        self._pending.append(data)

    def flush(self) -> None:
        if self._pending:
            data = b"".join(self._pending)
            self._pending = []
            if not self._transport.is_closing():
                self._transport.write(data)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def uvicorn_options() -> dict[str, Any]:
    """The options every plait server gives uvicorn (whose records go to the handlers
    of ``plait.logconfig``: uvicorn sets up no logging of its own)."""
    return {"http": LimitedHttpProtocol, "timeout_keep_alive": int(KEEP_ALIVE),
            "log_config": None}
