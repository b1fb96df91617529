"""The control plane's book of host profiles (pure core): every profile's current
version, and per machine the profile its agent last reported applied and why its
last switch failed.

A machine must carry its entitlement's profile (``default`` while free). A machine
that joins an entitlement whose profile it does not carry is *pending* until its
agent reports that profile applied: the scheduler gives its agent no task that has
not started yet until then. A task an agent was given is never taken back for its
profile (that would stop what may have started): the agent itself never starts a
task on a profile other than the one its desired set names, so a machine the
control plane knows nothing of (after a takeover, or an agent's first start) is
guarded by its agent alone.
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
    #: switches that failed in a row (each new one is a new failure; reset by success)
    failures: int = 0


@dataclass(frozen=True, slots=True)
class Transition:
    """A machine's profile changed state: ``kind`` is ``profile_switched`` (now
    carries its target), ``profile_switch_failed`` (its agent could not apply it:
    ``reason``; the machine is out of service for ``out_for`` seconds) or
    ``profile_switch_retried`` (the profile that failed is applied now)."""

    machine: int
    kind: str
    profile: str
    version: int
    reason: str | None = None
    out_for: float = 0.0
    #: which failure this is, for a machine (1, 2, ...; 0 for the others)
    failures: int = 0
    #: the entitlement, for a roll's transitions (``machine`` is -1 for the whole of it)
    entitlement: str | None = None


#: a machine whose switch failed is out of service this long after its first failure
#: in a row, doubled for each next one up to ``OUT_MAX``; the allocator may claim it
#: again afterwards (its agent tries again on its own backoff meanwhile)
OUT_FIRST, OUT_MAX = 30.0, 3600.0


def out_for(failures: int) -> float:
    # (the exponent bounded: an agent reports the count, up to 2**31, and 30.0 * 2**5000
    # does not fit a float)
    return float(min(OUT_MAX, OUT_FIRST * 2.0 ** min(max(0, failures - 1), 32)))


class ProfileBook:
    """Kept small at region scale: a machine has an entry only while it carries (or
    must carry) a profile other than ``default``, or its switch fails; a machine
    without one carries ``default`` or has not been heard from."""

    def __init__(self) -> None:
        #: the current version of every profile (``default`` always)
        self.profiles: dict[str, HostProfile] = {DEFAULT_PROFILE: default_profile()}
        #: bumped by every change of ``profiles``
        self.generation = 0
        #: per machine, what its agent last reported (see the class's note)
        self.applied: dict[int, Applied] = {}
        #: machines that joined an entitlement and do not carry its profile yet
        self.pending: set[int] = set()
        #: machines whose switch failed and has not succeeded since: the profile and
        #: version that failed, and the failures in a row the agent reported
        self.failing: dict[int, tuple[str, int, int]] = {}
        #: per machine, 1 once its agent reported since this book was made (a byte a
        #: machine: a machine without an entry in ``applied`` carries ``default`` only
        #: once heard; before, after a start or a takeover, it is not known)
        self._heard = bytearray()

    def heard(self, machine: int) -> bool:
        """Has the machine's agent reported its profile to this book?"""
        return machine < len(self._heard) and self._heard[machine] == 1

    def define(self, profile: HostProfile) -> bool:
        """Keep ``profile`` as its name's current version (an older one is ignored).
        True if that changed anything."""
        have = self.profiles.get(profile.name)
        if have is not None and have.version >= profile.version:
            return False
        self.profiles[profile.name] = profile
        self.generation += 1
        return True

    def forget(self, name: str) -> None:
        if name != DEFAULT_PROFILE and self.profiles.pop(name, None) is not None:
            self.generation += 1

    def target(self, name: str | None) -> HostProfile | None:
        """The profile a machine of an entitlement naming ``name`` must carry (None
        for a free machine: ``default``); None when no such profile is known, which no
        machine can match."""
        return self.profiles.get(DEFAULT_PROFILE if name is None else name)

    def joined(self, machine: int, target: HostProfile | None) -> None:
        """The machine joined an entitlement: it came from the free pool, so it carries
        ``default`` unless its agent said otherwise; pending unless it carries the
        entitlement's profile."""
        seen = self.applied.get(machine, DEFAULT_APPLIED)
        if target is None or (seen.name, seen.version) != (target.name, target.version):
            self.pending.add(machine)
            if machine not in self.applied:
                self.applied[machine] = DEFAULT_APPLIED

    def left(self, machine: int) -> None:
        """The machine went back to the free pool."""
        self.pending.discard(machine)

    def ready(self, machine: int, target: HostProfile | None) -> bool:
        """Whether its agent may be given tasks that have not started yet."""
        return target is not None and machine not in self.pending

    def report(self, machine: int, applied: Applied,
               target: HostProfile | None) -> Transition | None:
        """Record an agent's report; the transition it makes, if any."""
        if machine >= len(self._heard):
            self._heard.extend(bytes(machine + 1 - len(self._heard)))
        self._heard[machine] = 1
        before = self.applied.get(machine)
        matches = (target is not None and applied.name == target.name
                   and applied.version == target.version)
        if matches and applied.name == DEFAULT_PROFILE and applied.error is None:
            self.applied.pop(machine, None)  # (what a machine without an entry carries)
        elif before != applied:
            self.applied[machine] = applied
        if matches:
            self.pending.discard(machine)
        if target is None:
            return None
        failing = self.failing.get(machine)
        if matches:
            if failing is not None and failing[:2] == (target.name, target.version):
                del self.failing[machine]  # what failed is applied now
                return Transition(machine, "profile_switch_retried", target.name,
                                  target.version, failures=failing[2])
            if failing is not None and applied.error is None:
                del self.failing[machine]  # (a success elsewhere: the streak is over)
            # (a first report only tells what the machine carried already: after a
            # takeover, every machine's first report matches)
            if before is not None and (before.name, before.version) != (applied.name,
                                                                        applied.version):
                return Transition(machine, "profile_switched", target.name, target.version)
            return None
        # (each heartbeat repeats the count: a new count is a new failure, a lower one a
        # restarted agent's)
        if applied.error is not None and applied.failures != (
                0 if failing is None else failing[2]):
            self.failing[machine] = (target.name, target.version, applied.failures)
            return Transition(machine, "profile_switch_failed", target.name,
                              target.version, applied.error, out_for(applied.failures),
                              applied.failures)
        return None


#: what a machine fresh from the free pool carries
DEFAULT_APPLIED = Applied(DEFAULT_PROFILE, 1)
