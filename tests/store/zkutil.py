"""Helpers shared by the store tests (a module of its own: test modules import it,
not conftest)."""

import time
from collections.abc import Callable

from plait.localprocs import free_port_block

ZK_SERVER = "/usr/share/zookeeper/bin/zkServer.sh"


def _free_port() -> int:
    return free_port_block()


def wait_until(cond: Callable[[], bool], timeout: float = 15.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.02)
    return cond()
