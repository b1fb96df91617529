"""Liveness of machines from their agents' heartbeats (pure: time is passed in).

A machine is *watched* once its agent has joined or heartbeated; a watched machine
whose last heartbeat is older than ``timeout`` is down, and up again at its next
heartbeat. ``check`` reports only the transitions, so the caller raises or ends
one failure event per transition.

A machine watched with a ``grace`` (the control plane just started, and its agents
may take a while to start too: ``plait up`` starts them all at once) is not late
before its grace ends, unless it has heartbeated since: from its first heartbeat on,
only ``timeout`` counts. (Kubernetes gives nodes the same startup grace.)
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

    def watch(self, machine: str, now: float, grace: float = 0.0) -> None:
        """Start watching a machine as if it had just heartbeated (at join, or when the
        control plane starts and expects its agents back, then with a ``grace``)."""
        self.last.setdefault(machine, now)
        if grace > self.timeout:
            self.grace[machine] = now + grace - self.timeout

    def beat(self, machine: str, now: float) -> None:
        self.last[machine] = max(now, self.last.get(machine, now))
        self.grace.pop(machine, None)

    def check(self, now: float) -> tuple[list[str], list[str]]:
        """(machines that just went down, machines that just came back)."""
        went, came = [], []
        for machine, seen in self.last.items():
            late = now - max(seen, self.grace.get(machine, seen)) > self.timeout
            if late and machine not in self.down:
                self.down.add(machine)
                went.append(machine)
            elif not late and machine in self.down:
                self.down.discard(machine)
                came.append(machine)
        return sorted(went), sorted(came)
