"""What the agent's loop sleeps on between the things it has to do.

The loop sleeps until the next thing is due (a report, a probe, a restart after its
backoff) or until it is woken: ``set()`` from any thread (the desired set's long-poll
answered, a probe changed a task's health, a stop finished), or a watched process
exited (a pidfd per task process, Linux 5.3 and later; elsewhere an exit is noticed
by the next report). Nothing wakes it otherwise: an agent whose tasks run quietly
wakes for its reports and its probes only.
"""

from __future__ import annotations

import contextlib
import os
import select
import threading


class Wakeup:
    def __init__(self) -> None:
        #: guards the pipe's write end against its closing (no write to a reused fd)
        self._guard = threading.Lock()
        self._closed = False
        self._r, self._w = os.pipe()
        os.set_blocking(self._r, False)
        os.set_blocking(self._w, False)
        self._poll = select.poll()
        self._poll.register(self._r, select.POLLIN)
        #: the pidfd watched per key, and which key each fd is
        self._fds: dict[str, tuple[int, int]] = {}
        self._keys: dict[int, str] = {}
        #: the processes whose exit woke the loop already (never watched again)
        self._fired: dict[str, int] = {}

    def set(self) -> None:
        """Wake the sleeping loop (from any thread; a wake-up before it sleeps is
        kept)."""
        with self._guard, contextlib.suppress(OSError):  # (a full pipe: awake anyway)
            if not self._closed:
                os.write(self._w, b"!")

    def watch(self, key: str, pid: int) -> None:
        """Wake the loop when process ``pid`` (the task ``key``'s) exits; once. The
        loop thread only."""
        old = self._fds.get(key)
        if (old is not None and old[1] == pid) or self._fired.get(key) == pid:
            return
        self.unwatch(key)
        try:
            fd = os.pidfd_open(pid)
        except (AttributeError, OSError):  # (no pidfds here, or it has gone already)
            if not _alive(pid):
                self._fired[key] = pid
                self.set()
            return
        self._fds[key] = (fd, pid)
        self._keys[fd] = key
        self._poll.register(fd, select.POLLIN)

    def unwatch(self, key: str) -> None:
        found = self._fds.pop(key, None)
        if found is None:
            return
        fd = found[0]
        self._keys.pop(fd, None)
        with contextlib.suppress(KeyError, ValueError):
            self._poll.unregister(fd)
        os.close(fd)

    def keep(self, watched: dict[str, int]) -> None:
        """Watch exactly these processes (key: pid); the loop thread only."""
        for key in [k for k in self._fds if k not in watched]:
            self.unwatch(key)
        for key in [k for k, pid in self._fired.items() if watched.get(k) != pid]:
            del self._fired[key]
        for key, pid in watched.items():
            self.watch(key, pid)

    def wait(self, timeout: float) -> list[str]:
        """Sleep until woken or ``timeout`` seconds have passed; the keys of the
        watched processes that exited (no longer watched)."""
        try:
            events = self._poll.poll(max(0.0, timeout) * 1000.0)
        except InterruptedError:  # (a signal: the caller looks again)
            return []
        exited: list[str] = []
        for fd, _ in events:
            if fd == self._r:
                with contextlib.suppress(BlockingIOError, OSError):
                    while os.read(self._r, 4096):
                        pass
            elif fd in self._keys:
                key = self._keys[fd]
                exited.append(key)
                self._fired[key] = self._fds[key][1]
                self.unwatch(key)  # (readable from now on: watched once)
        return exited

    def close(self) -> None:
        with self._guard:
            if self._closed:
                return
            self._closed = True
            for key in list(self._fds):
                self.unwatch(key)
            for fd in (self._r, self._w):
                with contextlib.suppress(OSError):
                    os.close(fd)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
