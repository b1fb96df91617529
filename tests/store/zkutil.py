"""Helpers shared by the store tests (a module of its own: test modules import it,
not conftest)."""

import socket
import time
from collections.abc import Callable

ZK_SERVER = "/usr/share/zookeeper/bin/zkServer.sh"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(cond: Callable[[], bool], timeout: float = 15.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.02)
    return cond()
