"""A lean HTTP/1.1 client for the load generators: one request at a time on a
keep-alive connection, on asyncio streams (``Connection``) or a blocking socket
(``BlockingConnection``). The benchmarks measure the server, so the client must cost
far less than it (see ``Connection``)."""

from __future__ import annotations

import asyncio
import socket
from typing import Any


class HttpError(Exception):
    """A response that is not HTTP/1.1 as expected."""


#: what ends a response's head (an empty line), or the connection closed
_END = (b"\r\n", b"")


def _retry_or_raise(last: bool) -> None:
    """A request got no byte back: sent once more on a new connection, unless the
    connection was new (or this was the second try)."""
    if last:
        raise ConnectionError("the server closed the connection without answering")


def _status(line: bytes) -> int:
    """The status of a response's first line."""
    parts = line.split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
        raise HttpError(f"bad status line {line[:80]!r}")
    return int(parts[1])


class _Head:
    """What a response's headers say of its body and connection, a line at a time."""

    __slots__ = ("chunked", "close", "length")

    def __init__(self) -> None:
        self.length: int | None = None
        self.chunked = self.close = False

    def add(self, header: bytes) -> None:
        name, _, value = header.partition(b":")
        name, value = name.strip().lower(), value.strip().lower()
        if name == b"content-length":
            self.length = int(value)
        elif name == b"transfer-encoding":
            self.chunked = b"chunked" in value
        elif name == b"connection":
            self.close = b"close" in value


class Connection:
    """One keep-alive HTTP/1.1 connection, one request at a time: a lean client on
    asyncio streams. (``httpx.AsyncClient`` was measured at ~110 requests/s over 50
    connections on a 2-core box against a server that answers at once: its pool scans
    every connection per request, and httpcore retries a failed ``import sniffio`` on
    every call when sniffio is absent. That would make the generator the bottleneck.)"""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def request(self, data: bytes) -> tuple[int, bytes]:
        """Send one whole request; the status and body of the response. A request
        that gets no byte back on a reused connection (closed by the server while
        idle) is sent once more on a new one."""
        for attempt in (0, 1):
            fresh = self.writer is None
            if self.writer is None:
                self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
            assert self.reader is not None
            try:
                self.writer.write(data)
                await self.writer.drain()
                line = await self.reader.readline()
            except (ConnectionError, asyncio.IncompleteReadError):
                line = b""
            if line:
                break
            self.close()
            _retry_or_raise(fresh or attempt > 0)
        try:
            return await self._response(line)
        except BaseException:
            self.close()  # the connection's state is unknown (an error, or cancelled)
            raise

    async def _response(self, line: bytes) -> tuple[int, bytes]:
        assert self.reader is not None
        status, head = _status(line), _Head()
        while (header := await self.reader.readline()) not in _END:
            head.add(header)
        length, close = head.length, head.close
        if head.chunked:
            body = bytearray()
            while size := int((await self.reader.readline()).split(b";")[0], 16):
                body += await self.reader.readexactly(size + 2)
                del body[-2:]
            while await self.reader.readline() not in (b"\r\n", b""):
                pass  # trailers
        elif length is not None:
            body = bytearray(await self.reader.readexactly(length))
        else:
            body, close = bytearray(await self.reader.read()), True
        if close:
            self.close()
        return status, bytes(body)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


class BlockingConnection:
    """``Connection`` on a blocking socket, for a closed-loop client that has one
    request out at a time: no event loop between the request and its answer. Each
    request costs the client about a quarter of what it costs on asyncio streams,
    CPU that a load generator on the same box as the server takes from the server.
    ``timeout``: seconds to connect, and for each read of the answer."""

    def __init__(self, host: str, port: int, timeout: float) -> None:
        self.host, self.port, self.timeout = host, port, timeout
        self.sock: socket.socket | None = None
        self.reader: Any = None

    def open(self) -> None:
        self.close()
        sock = socket.create_connection((self.host, self.port), timeout=self.timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock, self.reader = sock, sock.makefile("rb")

    def request(self, data: bytes) -> tuple[int, bytes]:
        """As ``Connection.request``: a request that gets no byte back on a reused
        connection is sent once more on a new one."""
        for attempt in (0, 1):
            fresh = self.sock is None
            if self.sock is None:
                self.open()
            assert self.sock is not None
            try:
                self.sock.sendall(data)
                line = self.reader.readline()
            except ConnectionError:
                line = b""
            if line:
                break
            self.close()
            _retry_or_raise(fresh or attempt > 0)
        try:
            return self._response(line)
        except BaseException:
            self.close()
            raise

    def _response(self, line: bytes) -> tuple[int, bytes]:
        status, head = _status(line), _Head()
        while (header := self.reader.readline()) not in _END:
            head.add(header)
        if head.chunked:
            raise HttpError("a chunked answer (not expected here)")
        length, close = head.length, head.close
        if length is None:
            body, close = self.reader.read(), True
        else:
            body = self.reader.read(length)
            if len(body) != length:
                raise EOFError("the connection closed within the answer's body")
        if close:
            self.close()
        return status, body

    def close(self) -> None:
        if self.sock is not None:
            self.reader.close()
            self.sock.close()
        self.sock = self.reader = None
