"""The agent's side of Sidekick: switching its machine to the host profile its
desired set names, before any task starts there.

The desired set carries the profile the machine must carry (its entitlement's, or
``default`` while free). The switcher applies it with the agent's applier
(``plait.sidekick.appliers``) on a thread of its own, so heartbeats go on while a
slow switch runs (hugepages take minutes), and only while no task runs on the
machine. Until the machine carries its profile the agent starts nothing
(``may_start``); the control plane withholds new tasks too, but the agent is the
last guard. A failed switch is reported (the control plane takes the machine out of
service, with the reason) and tried again after a backoff that doubles up to
``RETRY_MAX``. What was applied is kept in the agent's state, so a restarted agent
neither switches again nor starts tasks on a profile it has not applied.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from plait import logconfig
from plait.sidekick.appliers import Applier, ApplyError

log = logconfig.get("plait.agent.profile")

#: the first retry after a failed switch, and the longest wait between tries
RETRY, RETRY_MAX = 5.0, 300.0


def _ref(profile: dict[str, Any] | None) -> tuple[str, int] | None:
    return None if profile is None else (str(profile["name"]), int(profile["version"]))


class ProfileSwitcher:
    def __init__(self, applier: Applier, wake: Callable[[], None],
                 machine: str = "") -> None:
        self.applier = applier
        self.wake = wake
        self.log = log.bind(machine=machine, applier=applier.name)
        #: the profile applied (wire form), and the one the desired set names
        self.applied: dict[str, Any] | None = None
        self.target: dict[str, Any] | None = None
        #: the desired set names a profile the control plane does not know
        self.unknown = False
        #: why the last switch failed (None once one succeeds), failures in a row, and
        #: when the next try may begin
        self.error: str | None = None
        self.failures = 0
        self.next_try = 0.0
        self._running: tuple[dict[str, Any], Future[None]] | None = None
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="plait-profile")

    # -- state ------------------------------------------------------------------------------
    def load(self, applied: dict[str, Any] | None) -> None:
        self.applied = applied

    def want(self, desired: dict[str, Any]) -> None:
        """The profile the latest desired set names. A set without the key comes from
        a control plane that knows no profiles: nothing is switched, nothing held back;
        one whose profile is null names a profile the control plane does not know (yet):
        nothing starts."""
        self.unknown = "profile" in desired and desired["profile"] is None
        self.target = desired.get("profile")

    def may_start(self) -> bool:
        """Whether a task may start: the machine carries the profile it must."""
        if self.target is None:
            return not self.unknown
        return _ref(self.applied) == _ref(self.target)

    def report(self) -> dict[str, Any] | None:
        """The profile part of a heartbeat."""
        if self.target is None and self.applied is None:
            return None
        ref = _ref(self.applied)
        return {"name": None if ref is None else ref[0], "version": 0 if ref is None
                else ref[1], "error": self.error, "failures": self.failures}

    # -- the run loop's turn -----------------------------------------------------------------
    def tick(self, now: float, idle: bool) -> bool:
        """Take a finished switch; begin one when the machine does not carry its
        profile, nothing runs on it (``idle``) and no retry is pending. True when
        something a heartbeat tells changed."""
        changed = False
        if self._running is not None and self._running[1].done():
            profile, done = self._running
            self._running = None
            changed = True
            try:
                done.result()
            except ApplyError as exc:
                self._failed(profile, str(exc), now)
            except Exception as exc:  # (an applier's bug: reported, the machine kept out)
                self._failed(profile, f"{type(exc).__name__}: {exc}", now)
            else:
                self.applied, self.error, self.failures = profile, None, 0
                self.log.info("host profile applied", profile=profile["name"],
                              version=profile["version"])
        if (self._running is None and self.target is not None and not self.may_start()
                and self.target.get("switch", True) and idle and now >= self.next_try):
            profile, previous = self.target, self.applied
            self.log.info("switching host profile", profile=profile["name"],
                          version=profile["version"],
                          previous=None if previous is None else previous["name"])
            future = self._pool.submit(self.applier.apply, profile, previous)
            future.add_done_callback(lambda _: self.wake())
            self._running = (profile, future)
        return changed

    def _failed(self, profile: dict[str, Any], reason: str, now: float) -> None:
        self.error = reason
        self.failures += 1
        wait = min(RETRY_MAX, RETRY * 2.0 ** min(self.failures - 1, 32))
        self.next_try = now + wait
        self.log.warning("host profile switch failed", profile=profile["name"],
                         version=profile["version"], error=reason, retry_in=wait)

    def next_due(self) -> float | None:
        """When a retry may begin (for the run loop's sleep), if one waits."""
        if self._running is None and self.error is not None and not self.may_start():
            return self.next_try
        return None

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
