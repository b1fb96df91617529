"""Liveness of machines from their agents' heartbeats (pure: time is passed in).

A machine is *watched* once its agent has joined or heartbeated; a watched machine
whose last heartbeat is older than ``timeout`` is down, and up again at its next
heartbeat. ``check`` reports only the transitions, so the caller raises or ends
one failure event per transition.

A machine watched with a ``grace`` (the control plane just started, and its agents
may take a while to start too: ``plait up`` starts them all at once) is not late
before its grace ends, unless it has heartbeated since: from its first heartbeat on,
only ``timeout`` counts. (Kubernetes gives nodes the same startup grace.)

Silence of most machines at once is not taken for their failure. When more than
``hold_fraction`` of the watched machines that have heartbeated (at least
``hold_min`` of them) are late together, those going late are not reported down:
the likelier fault is the path from the agents to this control plane (a front end
down, this process paused or cut off), not half a fleet failing in the same few
seconds, and failing them would replace every task in the region (the paper's
fail-safe against destructive operations in bulk). They are reported down once
the silent share is at or below the bound again and they are still late. A
machine never heard from (its agent not started) fails as before. Kubernetes'
node lifecycle controller stops evicting in a zone past 55 % unready nodes for the
same reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class HealthCheck:
    timeout: float = 5.0
    last: dict[str, float] = field(default_factory=dict)
    down: set[str] = field(default_factory=set)
    #: machines not heard from since the watch began: not late before this time
    grace: dict[str, float] = field(default_factory=dict)
    #: more than this share of the machines heard from silent together: none of them
    #: is reported down (see the module's text); 1.0 never holds
    hold_fraction: float = 0.5
    #: and only among at least this many machines heard from
    hold_min: int = 3
    #: machines that have heartbeated since they were watched
    heard: set[str] = field(default_factory=set)
    #: how many late machines the last ``check`` held back (0: none), and how many
    #: machines heard from were silent then
    held: int = 0
    silent: int = 0
    #: ``held`` of the check before the last (the hold began or ended in between)
    was_held: int = 0

    def watch(self, machine: str, now: float, grace: float = 0.0) -> None:
        """Start watching a machine as if it had just heartbeated (at join, or when the
        control plane starts and expects its agents back, then with a ``grace``)."""
        self.last.setdefault(machine, now)
        if grace > self.timeout:
            self.grace[machine] = now + grace - self.timeout

    def beat(self, machine: str, now: float) -> None:
        self.last[machine] = max(now, self.last.get(machine, now))
        self.grace.pop(machine, None)
        self.heard.add(machine)

    def forget(self, machine: str) -> None:
        """Stop watching ``machine`` (it left this control plane)."""
        self.last.pop(machine, None)
        self.grace.pop(machine, None)
        self.down.discard(machine)
        self.heard.discard(machine)

    def check(self, now: float) -> tuple[list[str], list[str]]:
        """(machines that just went down, machines that just came back); ``held``
        says how many late machines were not reported down (silent together)."""
        self.was_held = self.held
        went, came = [], []
        silent = 0  # machines heard from, late now (down already or going down)
        for machine, seen in self.last.items():
            late = now - max(seen, self.grace.get(machine, seen)) > self.timeout
            if late and machine in self.heard:
                silent += 1
            if late and machine not in self.down:
                went.append(machine)
            elif not late and machine in self.down:
                self.down.discard(machine)
                came.append(machine)
        self.silent = silent
        heard = len(self.heard)
        if heard >= self.hold_min and silent > self.hold_fraction * heard:
            self.held = sum(1 for m in went if m in self.heard)
            went = [m for m in went if m not in self.heard]
        else:
            self.held = 0
        self.down.update(went)
        return sorted(went), sorted(came)
