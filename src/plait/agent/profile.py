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
from plait.model.agentmachine import SWITCH_RETRY, SWITCH_RETRY_MAX, ProfileGate
from plait.model.agentwire import DesiredSet
from plait.sidekick.appliers import Applier, ApplyError

log = logconfig.get("plait.agent.profile")

#: the first retry after a failed switch, and the longest wait between tries (the
#: state machine's: ``plait.model.agentmachine``)
RETRY, RETRY_MAX = SWITCH_RETRY, SWITCH_RETRY_MAX


def _ref(profile: dict[str, Any] | None) -> tuple[str, int] | None:
    return None if profile is None else (str(profile["name"]), int(profile["version"]))


class ProfileSwitcher:
    """Carries out the state machine's profile decisions (``gate``: when a switch may
    begin, whether tasks may start) with the agent's applier, on a thread."""

    def __init__(self, applier: Applier, wake: Callable[[], None],
                 machine: str = "", gate: ProfileGate | None = None) -> None:
        self.applier = applier
        self.wake = wake
        self.log = log.bind(machine=machine, applier=applier.name)
        self.gate = gate if gate is not None else ProfileGate()
        #: the profile applied (wire form), and the one the desired set names
        self.applied: dict[str, Any] | None = None
        self.target: dict[str, Any] | None = None
        self._running: tuple[dict[str, Any], Future[None]] | None = None
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="plait-profile")

    @property
    def error(self) -> str | None:
        """Why the last switch failed (None once one succeeds)."""
        return self.gate.error

    @property
    def failures(self) -> int:
        return self.gate.failures

    # -- state ------------------------------------------------------------------------------
    def load(self, applied: dict[str, Any] | None) -> None:
        self.applied = applied
        self.gate.applied = _ref(applied)

    def want(self, desired: DesiredSet) -> None:
        """The profile the latest desired set names. A set without it comes from a
        control plane that knows no profiles: nothing is switched, nothing held back;
        one whose profile is null names a profile the control plane does not know
        (yet): nothing starts."""
        target = desired.profile
        self.target = None if target is None else target.model_dump(mode="json")
        self.gate.want(None if target is None else target.ref, desired.profile_unknown,
                       True if target is None else target.switch)

    def may_start(self) -> bool:
        """Whether a task may start: the machine carries the profile it must."""
        return self.gate.carries()

    def report(self) -> dict[str, Any] | None:
        """The profile part of a heartbeat."""
        if self.target is None and self.applied is None:
            return None
        ref = _ref(self.applied)
        return {"name": None if ref is None else ref[0], "version": 0 if ref is None
                else ref[1], "error": self.error, "failures": self.failures}

    # -- the run loop's turn -----------------------------------------------------------------
    def tick(self, now: float, idle: bool) -> bool:
        """Take a finished switch; begin one when the state machine says one may
        (``idle``: nothing runs or stops on the machine). True when something a
        heartbeat tells changed."""
        changed = False
        if self._running is not None and self._running[1].done():
            profile, done = self._running
            self._running = None
            changed = True
            error: str | None = None
            try:
                done.result()
            except ApplyError as exc:
                error = str(exc)
            except Exception as exc:  # (an applier's bug: reported, the machine kept out)
                error = f"{type(exc).__name__}: {exc}"
            ref = _ref(profile)
            assert ref is not None
            wait = self.gate.done(ref, error, now)
            if error is None:
                self.applied = profile
                self.log.info("host profile applied", profile=profile["name"],
                              version=profile["version"])
            else:
                self.log.warning("host profile switch failed", profile=profile["name"],
                                 version=profile["version"], error=error, retry_in=wait)
        if self._running is None and self.target is not None and self.gate.begin(now, idle):
            profile, previous = self.target, self.applied
            self.log.info("switching host profile", profile=profile["name"],
                          version=profile["version"],
                          previous=None if previous is None else previous["name"])
            future = self._pool.submit(self.applier.apply, profile, previous)
            future.add_done_callback(lambda _: self.wake())
            self._running = (profile, future)
        return changed

    def next_due(self) -> float | None:
        """When a retry may begin (for the run loop's sleep), if one waits."""
        return self.gate.next_due()

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
