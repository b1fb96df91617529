"""A farm of TaskControllers on one port, well-behaved and hostile, for the
TaskControl benchmark and the tests that hold the control plane to "a tenant's
controller delays only its own job".

One asyncio server answers ``POST /{mode}/{job}``; the mode says how:

* ``ack``: acks every operation requested (the application is always ready);
* ``one``: acks the first operation requested (one at a time);
* ``gate``: a health gate: while any of the job's tasks is unhealthy, acks nothing
  and asks to be asked again after 1 s; otherwise acks the first operation;
* ``lag``: a replica-lag gate plait cannot see: acks the first operation on one call
  in twenty (by sequence number, offset per job), and otherwise acks nothing; always
  asks to be asked again after 1 s;
* ``later``: acks nothing and asks to be asked again after 1 s, the first 3 times
  for each job; then acks everything;
* ``slow``: like ``ack``, after 4.5 s (inside a 5 s deadline);
* ``tarpit``: sends its headers, then one byte of body every 2 s, forever;
* ``hung``: reads the request and never answers;
* ``huge``: answers 10 MB;
* ``garbage``: answers 200 with a body that is not JSON.

Every request is recorded per job (sequence number, the ``Plait-Signature`` header,
the body), so a test can check the calling sequence and the signatures.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import zlib
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

MODES = ("ack", "one", "gate", "lag", "later", "slow", "tarpit", "hung", "huge", "garbage")


@dataclass
class Seen:
    sequence_number: int
    signature: str | None
    body: bytes
    request: dict[str, Any]


@dataclass
class FarmState:
    seen: dict[str, list[Seen]] = field(default_factory=lambda: defaultdict(list))
    calls: int = 0
    by_mode: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    #: keep every request (tests) or only count them (the benchmark)
    keep: bool = True


class ControllerFarm:
    """The farm, served by an event loop in a thread of this process."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, keep: bool = True) -> None:
        self.state = FarmState(keep=keep)
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(host, port), daemon=True,
                                        name="controller-farm")
        self._thread.start()
        self._started.wait(10)
        self.url = f"http://{host}:{self.port}"

    def _run(self, host: str, port: int) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(
            asyncio.start_server(self._handle, host, port, backlog=1024))
        self.port = server.sockets[0].getsockname()[1]
        self._server = server
        self._started.set()
        self._loop.run_forever()

    def controller(self, mode: str, job: str) -> str:
        return f"{self.url}/{mode}/{job}"

    def stop(self) -> None:
        """Close the server and end every connection's handler (a tarpit's too), then
        the loop."""
        async def shutdown() -> None:
            self._server.close()
            handlers = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in handlers:
                task.cancel()
            await asyncio.gather(*handlers, return_exceptions=True)

        done = asyncio.run_coroutine_threadsafe(shutdown(), self._loop)
        with contextlib.suppress(Exception):
            done.result(5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                path = lines[0].split(" ")[1]
                headers = {k.strip().lower(): v.strip() for k, v in
                           (line.split(":", 1) for line in lines[1:] if ":" in line)}
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                if not await self._answer(path, headers, body, writer):
                    return
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError,
                IndexError, ValueError):
            pass
        finally:
            writer.close()

    async def _answer(self, path: str, headers: dict[str, str], body: bytes,
                      writer: asyncio.StreamWriter) -> bool:
        """Answer one request; False: the connection ends here."""
        parts = path.strip("/").split("/", 1)
        mode, job = [*parts, ""][:2]
        if mode == "stats":
            return self._json(writer, {"calls": self.state.calls,
                                       "by_mode": dict(self.state.by_mode)})
        try:
            request = json.loads(body)
        except ValueError:
            request = {}
        self.state.calls += 1
        self.state.by_mode[mode] += 1
        log = self.state.seen[job]
        if self.state.keep or mode == "later":
            log.append(Seen(int(request.get("sequence_number", -1)),
                            headers.get("plait-signature"), body, request))
        ops = [op["op_id"] for op in request.get("request", [])]
        if mode == "ack":
            return self._json(writer, {"ack": ops})
        if mode == "one":
            return self._json(writer, {"ack": ops[:1]})
        if mode == "gate":
            if request.get("all_unhealthy_tasks"):
                return self._json(writer, {"ack": [], "ask_again_after": 1})
            return self._json(writer, {"ack": ops[:1]})
        if mode == "lag":
            turn = int(request.get("sequence_number", 0)) + zlib.crc32(job.encode())
            acked = [] if turn % 20 else ops[:1]
            return self._json(writer, {"ack": acked, "ask_again_after": 1})
        if mode == "later":
            if len(log) <= 3:
                return self._json(writer, {"ack": [], "ask_again_after": 1})
            return self._json(writer, {"ack": ops})
        if mode == "slow":
            await asyncio.sleep(4.5)
            return self._json(writer, {"ack": ops})
        if mode == "tarpit":
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 1000\r\n\r\n")
            while True:
                await writer.drain()
                await asyncio.sleep(2)
                writer.write(b" ")
        if mode == "hung":
            await asyncio.sleep(3600)
            return False
        if mode == "huge":
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                         b"Connection: close\r\n\r\n")
            writer.write(b'{"ack": [], "pad": "')
            chunk = b"x" * 65536
            for _ in range(160):  # 10 MB
                writer.write(chunk)
                await writer.drain()
            writer.write(b'"}')
            await writer.drain()
            return False
        if mode == "garbage":
            payload = b"<html>this is not json</html>"
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: " + str(len(payload)).encode()
                         + b"\r\n\r\n" + payload)
            await writer.drain()
            return True
        return self._json(writer, {"error": f"unknown mode {mode!r}"}, status=b"404 Not Found")

    def _json(self, writer: asyncio.StreamWriter, data: Any,
              status: bytes = b"200 OK") -> bool:
        payload = json.dumps(data).encode()
        writer.write(b"HTTP/1.1 " + status + b"\r\nContent-Type: application/json\r\n"
                     b"Content-Length: " + str(len(payload)).encode() + b"\r\n\r\n" + payload)
        return True


@contextlib.contextmanager
def farm_process() -> Iterator[str]:
    """The farm in a process of its own (off the benchmark's and the control plane's
    interpreters), killed on the way out: its URL."""
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-m", "plait.bench.controllers"],
                            stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().decode().strip()
        if not url.startswith("http://"):
            raise RuntimeError("the controller farm did not start")
        yield url
    finally:
        proc.kill()
        proc.wait()


def main() -> None:
    """``python -m plait.bench.controllers PORT``: serve the farm until killed (the
    benchmark runs it in a process of its own, off the control plane's GIL)."""
    import sys
    import time

    farm = ControllerFarm(port=int(sys.argv[1]) if len(sys.argv) > 1 else 0, keep=False)
    print(farm.url, flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
