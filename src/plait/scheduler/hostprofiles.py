"""Host profiles (Sidekick, paper 2.6) as the scheduler sees them: the profile each
machine must carry, whether its agent may switch now, what it is told, and what its
reports change. The rolls of changed profiles over busy machines are
``profileroll.ProfileRolls``, which this part owns (``rolls``)."""

from __future__ import annotations

import contextlib
from typing import Any

from plait.broker import BrokerChange, ChangeKind
from plait.errors import NotFound
from plait.model.events import EventKind, UnavailabilityEvent
from plait.model.hostprofile import HostProfile
from plait.scheduler.profileroll import ProfileRolls
from plait.scheduler.state import SchedulerState
from plait.sidekick.book import Applied


class HostProfiles:
    def __init__(self, state: SchedulerState, roll_at_once: int, roll_deadline: float) -> None:
        self.s = state
        self.rolls = ProfileRolls(state, roll_at_once, roll_deadline)
        self.book = self.rolls.profiles
        #: the wire form of each (profile, version, switch) an agent is told, shared
        self._wires: dict[tuple[str, int, bool], dict[str, Any]] = {}

    def machine_changed(self, change: BrokerChange) -> None:
        """A machine claimed by an entitlement of this scheduler must carry the
        entitlement's profile before a task starts there; one released goes back to
        ``default``."""
        if change.kind is ChangeKind.CLAIMED and (
                change.entitlement in self.s.allocator.entitlements):
            self.book.joined(change.machine, self.target(change.machine))
            self.s.touched.add(change.machine)
        elif change.kind is ChangeKind.RELEASED and change.machine in self.book.applied:
            self.book.left(change.machine)
            self.s.touched.add(change.machine)

    def target(self, m: int) -> HostProfile | None:
        """The profile machine ``m`` must carry: its entitlement's (``default`` while
        free, or bound to an entitlement another shard manages); None if the profile
        its entitlement names is not known here."""
        ent = self.s.region.broker_of(m).entitlement_of(m)
        found = None if ent is None else self.s.allocator.entitlements.get(ent)
        return self.book.target(None if found is None else found.host_profile)

    def ready(self, m: int) -> bool:
        return self.book.ready(m, self.target(m))

    def hold(self, m: int) -> bool:
        """Whether machine ``m``'s agent must not begin a switch: while a roll drains
        it (it goes back to the free pool), and while it is in the free pool: it keeps
        the profile it carries until an entitlement with another one claims it
        (decision 95: no switch to ``default`` and back per loan or shrink), or may
        carry one (its agent has not reported since this control plane started or took
        over). Only a free machine whose agent said it carries none yet (a new agent)
        takes ``default``. (Held or not, an agent carrying its target switches nothing:
        a free ``default`` machine is held, so its desired set does not change when its
        agent is first heard.)"""
        if m in self.rolls.rolling:
            return True
        if self.s.region.broker_of(m).entitlement_of(m) is not None:
            return False
        if not self.book.heard(m):
            return True
        seen = self.book.applied.get(m)  # (no entry: it carries ``default``)
        return seen is None or seen.name is not None

    def wire(self, m: int) -> dict[str, Any] | None:
        """What machine ``m``'s agent is told of its profile: the one it must carry
        (wire form), and whether to switch to it once idle (``switch``: not while
        ``hold``)."""
        target = self.target(m)
        if target is None:
            return None
        key = (target.name, target.version, not self.hold(m))
        wire = self._wires.get(key)
        if wire is None:  # (one per version: shared, never changed)
            if len(self._wires) > 4096:
                self._wires.clear()
            wire = self._wires[key] = {**target.wire(), "switch": key[2]}
        return wire

    def define(self, profile: HostProfile) -> None:
        """A profile's new version: the machines that must carry it are told (their
        agents switch once nothing runs there)."""
        if not self.book.define(profile):
            return
        touched = self.s.touched
        for m in list(self.book.applied):
            touched.add(m)
        for name, ent in self.s.allocator.entitlements.items():
            if ent.host_profile == profile.name:
                touched.update(int(m) for m in self.s.region.machines_of(name))
        self.notice_rolls()

    def notice_rolls(self) -> None:
        """A profile or an entitlement was defined: the machines whose target moved are
        pending now, not at the next pass (an agent that asks for its tasks before it
        must not start one on the profile it carries). Only once a pass has looked:
        what a control plane defines as it starts, one by one, is its first look's,
        and no roll."""
        if self.rolls.rolls_found:
            self.rolls.notice_changes()

    def report(self, machine: str, applied: Applied, now: float) -> None:
        """An agent's report of the profile it applied (or why its switch fails). A
        failed switch takes the machine out of service (a failure event in its broker,
        ``sidekick-{machine}-{n}``: its tasks are replaced as on any failure) for
        ``book.out_for(n)`` seconds after the n-th failure in a row, or until the
        profile that failed is applied; its agent tries again with its own backoff."""
        s, book, rolls = self.s, self.book, self.rolls
        m = s.fleet.index_of(machine)
        target = self.target(m)
        was = book.ready(m, target)
        held = self.hold(m)
        change = book.report(m, applied, target)
        if (book.ready(m, target) != was and s.desired.get(m)) or (
                held and not self.hold(m) and not rolls.carries(m, target)):
            # (the tasks its agent is given change; or it may switch now, held until
            # its first report said what it carries, and does not carry its target)
            s.touched.add(m)
        if applied.name is not None and not rolls.carries(m, target):
            rolls.found_stale(m, target)
        if change is None:
            return
        rolls.profile_transitions.append(change)
        if change.kind == "profile_switch_failed":
            s.region.add_event(UnavailabilityEvent(
                f"sidekick-{machine}-{change.failures}", EventKind.FAILURE, (machine,), now,
                now + change.out_for,
                f"host profile {change.profile} v{change.version}: {change.reason}"), now)
        elif change.kind == "profile_switch_retried":
            for n in range(1, change.failures + 1):
                with contextlib.suppress(NotFound):
                    s.region.end_event(f"sidekick-{machine}-{n}", now)
