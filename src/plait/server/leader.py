"""Replicated control planes: every replica of a control plane (``plait serve`` on one
store) campaigns in the store's election; the leader runs the loop and answers the API,
the followers keep warm (store open, region built, API up) and hand every request to
the leader (``plait.frontend`` proxies it), so a client or an agent may call any
replica. When the leader's session lapses (its process died, or lost the store), a
follower is elected, loads the state the leader left in the store and starts its loop.

On ZooKeeper the election is kazoo's Election recipe and the session is ZooKeeper's;
on SQLite it is a host-local lease: an ephemeral key of a session the leader renews.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

from plait.errors import NotFound
from plait.server.controlplane import ControlPlane
from plait.tls import verify as tls_verify

#: seconds a leader's session outlives its last sign of life: short enough for a fast
#: failover, long enough for a busy host's pauses not to depose a live leader
SESSION_TIMEOUT = 1.0
#: seconds between a follower's catch-ups with the stored state
WARM_EVERY = 1.0


class Leadership:
    """This replica's part in the election ``name`` of its control plane's store;
    ``identity`` is the URL other replicas reach its API at."""

    def __init__(self, cp: ControlPlane, identity: str, name: str | None = None,
                 session_timeout: float = SESSION_TIMEOUT, poll: float = 0.05) -> None:
        self.cp = cp
        self.identity = identity
        #: (a scheduler shard's replicas elect the shard's leader)
        shard = cp.config.shard
        self.name = name or ("controlplane" if shard is None else f"shard-{shard}")
        self.session_timeout = session_timeout
        self.poll = poll
        #: what the leader's certificate is checked against when forwarding to it
        self.verify = tls_verify(cp.config.ca_file, identity)
        self.session: Any = cp.store.session(session_timeout)
        self.election: Any = cp.store.election(self.name, identity, self.session)
        #: True while this replica leads and its loop runs (set once the state is loaded)
        self.leading = False
        #: times this replica became leader
        self.terms = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._leader: tuple[float, str | None] = (0.0, None)
        self._beat = self._warmed = time.monotonic()

    def leader(self) -> str | None:
        """The current leader's identity (its API URL), read at most every poll."""
        now = time.monotonic()
        at, who = self._leader
        if now - at > self.poll:
            try:
                who = self.election.leader()
            except Exception:  # the store is unreachable: no leader known
                who = None
            self._leader = (now, who)
        return who

    def step(self) -> None:
        """Renew the session, campaign, and start or stop leading accordingly."""
        try:
            now = time.monotonic()
            if now - self._beat >= self.session_timeout / 4:
                self.session.heartbeat()
                self._beat = now
            won = bool(self.election.campaign())
        except NotFound:  # (a lease) the session lapsed: campaign again on a new one
            won = False
            self._renew()
        except Exception:  # the store is unreachable: not a leader any more
            won = False
        if won and not self.leading:
            started = time.monotonic()
            fence = getattr(self.election, "fence", None)
            with self._renewing():  # (a large state loads for longer than a session)
                self.cp.take_over(fence() if fence is not None else None)
            self.cp.loop.start()
            self.leading = True
            self.terms += 1
            self.cp.record("controlplane", "leader_elected",
                           f"{self.identity} leads {self.name} (state loaded in "
                           f"{time.monotonic() - started:.3f}s)")
        elif not won and self.leading:
            self.leading = False
            self.cp.loop.stop()  # the loop writes nothing more
            # the agents' long-polls waiting here are answered at once: 503, not a
            # set this replica kept and may no longer hold
            self.cp.gateway.waiters.notify_all()
            # what its last passes recorded tells of decisions they could not store
            # (the fence refused them): not the region's history
            dropped = self.cp.drop_pending_events()
            with contextlib.suppress(Exception):
                self.cp.record("controlplane", "leadership_lost",
                               f"{self.identity} no longer leads {self.name}" + (
                                   f" ({dropped} events of its last passes, not stored, "
                                   "dropped)" if dropped else ""))
        elif not won and time.monotonic() - self._warmed >= WARM_EVERY:
            self._warmed = time.monotonic()
            with contextlib.suppress(Exception):  # (the store may be unreachable)
                self.cp.keep_warm()

    @contextlib.contextmanager
    def _renewing(self) -> Iterator[None]:
        """Renew the session from a thread of its own while the body runs: the state
        a new leader loads may take longer than a session to load (ZooKeeper's client
        pings by itself; a SQLite lease is renewed by ``step`` alone, which waits for
        the load), and a lapsed lease would go to a follower, which would lose it the
        same way."""
        done = threading.Event()

        def renew() -> None:
            while not done.wait(self.session_timeout / 4):
                with contextlib.suppress(Exception):  # (step sees a lapsed session)
                    self.session.heartbeat()
                    self._beat = time.monotonic()

        thread = threading.Thread(target=renew, name="plait-lease", daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join()

    def _renew(self) -> None:
        with contextlib.suppress(Exception):
            self.session.close()
        with contextlib.suppress(Exception):
            self.session = self.cp.store.session(self.session_timeout)
            self.election = self.cp.store.election(self.name, self.identity, self.session)

    def run(self) -> None:
        while not self._stop.is_set():
            self.step()
            self._stop.wait(self.poll)

    def start(self) -> Leadership:
        if self._thread is None:
            self._thread = threading.Thread(target=self.run, name="plait-leadership",
                                            daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop campaigning; a leader stops its loop and resigns (a follower takes over
        at once, without waiting for the session to lapse)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None
        if self.leading:
            self.leading = False
            self.cp.loop.stop()
        with contextlib.suppress(Exception):
            self.election.resign()
        with contextlib.suppress(Exception):
            self.session.close()
