"""The control plane's book of host profiles (pure core): every profile's current
version, and per machine the profile its agent last reported applied and why its
last switch failed.

A machine must carry its entitlement's profile (``default`` while free). It is
*ready* when its agent's last report names that profile at its current version; a
machine not heard from since this control plane started (a takeover, a restart) is
taken as ready until its first report says otherwise, because the agent never
starts a task on a profile other than the one its desired set names (the scheduler
withholds new tasks from a machine known to differ; the agent is the last guard).
"""

from __future__ import annotations

from dataclasses import dataclass

from plait.model.hostprofile import DEFAULT_PROFILE, HostProfile, default_profile


@dataclass(frozen=True, slots=True)
class Applied:
    """What an agent reports: the profile it has applied (None: none yet) and, while
    its switch to the profile it was asked for fails, why."""

    name: str | None
    version: int = 0
    error: str | None = None


@dataclass(frozen=True, slots=True)
class Transition:
    """A machine's profile changed state: ``kind`` is ``profile_switched`` (now
    carries its target), ``profile_switch_failed`` (its agent could not apply it:
    ``reason``) or ``profile_switch_retried`` (applied after failing)."""

    machine: int
    kind: str
    profile: str
    version: int
    reason: str | None = None


class ProfileBook:
    """Kept small at region scale: a machine has an entry only while it carries (or
    must carry) a profile other than ``default``, or its switch fails; a machine
    without one carries ``default`` or has not been heard from."""

    def __init__(self) -> None:
        #: the current version of every profile (``default`` always)
        self.profiles: dict[str, HostProfile] = {DEFAULT_PROFILE: default_profile()}
        #: per machine, what its agent last reported (see the class's note)
        self.applied: dict[int, Applied] = {}
        #: machines whose switch fails, with the profile and version it fails to
        self.failing: dict[int, tuple[str, int]] = {}

    def define(self, profile: HostProfile) -> bool:
        """Keep ``profile`` as its name's current version (an older one is ignored).
        True if that changed anything."""
        have = self.profiles.get(profile.name)
        if have is not None and have.version >= profile.version:
            return False
        self.profiles[profile.name] = profile
        return True

    def forget(self, name: str) -> None:
        if name != DEFAULT_PROFILE:
            self.profiles.pop(name, None)

    def target(self, name: str | None) -> HostProfile | None:
        """The profile a machine of an entitlement naming ``name`` must carry (None
        for a free machine: ``default``); None when no such profile is known, which no
        machine can match."""
        return self.profiles.get(DEFAULT_PROFILE if name is None else name)

    def joined(self, machine: int, target: HostProfile | None) -> None:
        """The machine joined an entitlement: it came from the free pool, so it carries
        ``default`` (until its agent says otherwise)."""
        if machine not in self.applied and (target is None or target.name != DEFAULT_PROFILE):
            self.applied[machine] = DEFAULT_APPLIED

    def ready(self, machine: int, target: HostProfile | None) -> bool:
        """Whether new tasks may start on the machine."""
        if target is None:
            return False
        seen = self.applied.get(machine)
        if seen is None:  # default, or not heard from: its agent guards its starts
            return True
        return seen.name == target.name and seen.version == target.version

    def report(self, machine: int, applied: Applied,
               target: HostProfile | None) -> Transition | None:
        """Record an agent's report; the transition it makes, if any."""
        before = self.applied.get(machine)
        matches = (target is not None and applied.name == target.name
                   and applied.version == target.version)
        if matches and applied.name == DEFAULT_PROFILE and applied.error is None:
            self.applied.pop(machine, None)  # (what a machine without an entry carries)
        elif before != applied:
            self.applied[machine] = applied
        if target is None:
            return None
        failing = self.failing.get(machine)
        if matches:
            if failing is not None:
                del self.failing[machine]
                return Transition(machine, "profile_switch_retried", target.name,
                                  target.version)
            # (a first report only tells what the machine carried already: after a
            # takeover, every machine's first report matches)
            if before is not None and (before.name, before.version) != (applied.name,
                                                                        applied.version):
                return Transition(machine, "profile_switched", target.name, target.version)
            return None
        if applied.error is not None and failing != (target.name, target.version):
            self.failing[machine] = (target.name, target.version)
            return Transition(machine, "profile_switch_failed", target.name,
                              target.version, applied.error)
        return None


#: what a machine fresh from the free pool carries
DEFAULT_APPLIED = Applied(DEFAULT_PROFILE, 1)
