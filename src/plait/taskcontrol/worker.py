"""TaskControl calls from a process of their own (shell).

``DispatcherProcess`` has the ``Dispatcher``'s interface (``send``, ``close``,
``policy``, ``stats``) but runs the dispatcher in a child process
(``python -m plait.taskcontrol.worker``), so the HTTP work of a thousand controller
calls a second, and whatever a hostile controller makes the client do, costs the
control plane's process nothing but the pickling of requests and answers. The two
talk over the child's stdin and stdout in length-prefixed pickle frames (the child
is plait's own: nothing else writes to these pipes).

If the child dies, every call it had not answered is answered with an error (the
scheduler asks again), and a new child is started for the next calls.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import IO, Any

from plait.taskcontrol import signing
from plait.taskcontrol.dispatch import (
    DEFAULT_DEADLINE,
    DEFAULT_MAX_REPLY,
    DEFAULT_PER_TENANT,
    Dispatcher,
    DispatchStats,
)
from plait.taskcontrol.protocol import ControllerAnswer, ControllerCall
from plait.taskcontrol.urlpolicy import UrlPolicy

_HEADER = struct.Struct("!I")


@dataclass(frozen=True)
class Settings:
    deadline: float = DEFAULT_DEADLINE
    max_reply_bytes: int = DEFAULT_MAX_REPLY
    max_in_flight: int = 64
    per_tenant: int = DEFAULT_PER_TENANT
    policy: UrlPolicy = field(default_factory=UrlPolicy)
    #: the CA file https controllers are checked against (None: the system's)
    ca_file: str | None = None
    #: the region's signing secret (None: calls are not signed)
    secret: bytes | None = None


def _write(out: IO[bytes], lock: threading.Lock, message: Any) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    with lock:
        out.write(_HEADER.pack(len(data)) + data)
        out.flush()


def _read(source: IO[bytes]) -> Any:
    head = source.read(_HEADER.size)
    if len(head) < _HEADER.size:
        raise EOFError
    (size,) = _HEADER.unpack(head)
    data = source.read(size)
    if len(data) < size:
        raise EOFError
    return pickle.loads(data)


class DispatcherProcess:
    def __init__(self, deliver: Callable[[ControllerAnswer], None],
                 settings: Settings) -> None:
        self.deliver = deliver
        self.settings = settings
        self.stats = DispatchStats()
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        #: (job, sequence number) of the calls sent and not answered yet
        self._pending: dict[tuple[str, int], None] = {}
        self._closed = False
        self._proc: subprocess.Popen[bytes] | None = None
        self._start()

    @property
    def policy(self) -> UrlPolicy:
        return self.settings.policy

    @policy.setter
    def policy(self, policy: UrlPolicy) -> None:
        self.settings = Settings(**{**self.settings.__dict__, "policy": policy})
        proc = self._proc
        if proc is not None and proc.stdin is not None:
            with contextlib.suppress(OSError, ValueError):
                _write(proc.stdin, self._write_lock, ("policy", policy))

    def _start(self) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        proc = subprocess.Popen([sys.executable, "-m", "plait.taskcontrol.worker"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        assert proc.stdin is not None
        _write(proc.stdin, self._write_lock, self.settings)
        self._proc = proc
        threading.Thread(target=self._answers, args=(proc,), daemon=True,
                         name="plait-taskcontrol-answers").start()

    def send(self, calls: Iterable[ControllerCall]) -> None:
        batch = list(calls)
        if not batch:
            return
        with self._lock:
            if self._closed:
                return
            for call in batch:
                self._pending[(call.job, call.request.sequence_number)] = None
            self.stats.calls += len(batch)
            proc = self._proc
        try:
            assert proc is not None and proc.stdin is not None
            _write(proc.stdin, self._write_lock, ("calls", batch))
        except (OSError, ValueError, AssertionError):
            pass  # the child is gone: its reader answers what it held, then restarts it

    def _answers(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        try:
            while True:
                answers, figures = _read(proc.stdout)
                for name, value in figures.items():
                    setattr(self.stats, name, value)
                for answer in answers:
                    with self._lock:
                        self._pending.pop((answer.job, answer.sequence_number), None)
                    self.deliver(answer)
        except (EOFError, OSError, pickle.UnpicklingError):
            pass
        with self._lock:
            lost, self._pending = list(self._pending), {}
            closed = self._closed
        for job, seq in lost:
            self.deliver(ControllerAnswer(job, seq, None,
                                          "the TaskControl worker process stopped"))
        if not closed:
            with contextlib.suppress(Exception):
                proc.kill()
                proc.wait(5)
            time.sleep(0.5)
            with self._lock:
                if not self._closed:
                    self._start()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            proc = self._proc
        if proc is None:
            return
        with contextlib.suppress(Exception):
            assert proc.stdin is not None
            proc.stdin.close()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def main() -> None:
    """The child: settings, then frames of calls (and policy changes) on stdin;
    batches of answers (with the dispatcher's figures) on stdout."""
    from plait import logconfig
    from plait.tls import verify as tls_verify

    logconfig.configure("taskcontrol-worker")  # (on the control plane's stderr)
    source, out = sys.stdin.buffer, sys.stdout.buffer
    settings: Settings = _read(source)
    lock = threading.Lock()
    ready: list[ControllerAnswer] = []
    wake = threading.Event()
    keys: dict[str, str] = {}

    def key_for(job: str) -> str | None:
        if settings.secret is None:
            return None
        key = keys.get(job)
        if key is None:
            if len(keys) > 100_000:
                keys.clear()
            key = keys[job] = signing.job_key(settings.secret, job)
        return key

    def deliver(answer: ControllerAnswer) -> None:
        with lock:
            ready.append(answer)
        wake.set()

    dispatcher = Dispatcher(
        deliver, deadline=settings.deadline, max_reply_bytes=settings.max_reply_bytes,
        max_in_flight=settings.max_in_flight, per_tenant=settings.per_tenant,
        policy=settings.policy,
        verify=lambda url: tls_verify(settings.ca_file, url), key_for=key_for)
    write_lock = threading.Lock()

    def flush() -> None:
        while True:
            wake.wait()
            time.sleep(0.002)  # answers that come together go together
            wake.clear()
            with lock:
                batch = ready[:]
                ready.clear()
            if batch:
                try:
                    st = dispatcher.stats
                    _write(out, write_lock, (batch, {
                        "answered": st.answered, "errors": st.errors, "timeouts": st.timeouts,
                        "refused": st.refused, "oversized": st.oversized,
                        "in_flight": st.in_flight}))
                except (OSError, ValueError):
                    os._exit(0)  # the parent is gone

    threading.Thread(target=flush, daemon=True).start()
    try:
        while True:
            kind, value = _read(source)
            if kind == "calls":
                dispatcher.send(value)
            elif kind == "policy":
                dispatcher.policy = value
    except EOFError:
        pass
    dispatcher.close()


if __name__ == "__main__":
    main()
