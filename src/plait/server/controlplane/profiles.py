"""Host profiles on the control plane: their API (admins write, owners read), the
scheduler's book kept in step with the store, and Sidekick's events.

Profiles are region-wide (``/hostprofiles``, shared by every scheduler shard). A
write is stored first and reaches the scheduler at the next pass; every pass
re-reads the store at most every ``REFRESH`` seconds too, so a profile another
replica or shard wrote is seen here.

A machine switches profile only while no task runs on it (a join, a leave, an idle
machine). A change of the profile of machines with tasks running (a new version of
a profile in use there, an entitlement naming another profile) is rolled over them
by the scheduler, one machine of an entitlement at a time
(``plait.scheduler.profileroll``).
"""

from __future__ import annotations

import json
import threading
from typing import TYPE_CHECKING, Any

from plait import logconfig
from plait.errors import Conflict, NotFound, ValidationError
from plait.model.entitlement import Entitlement
from plait.model.hostprofile import DEFAULT_PROFILE, HostProfile, HostProfileSpec, diff
from plait.sidekick.store import ProfileStore

if TYPE_CHECKING:
    from plait.server.controlplane.inbox import Inbox
    from plait.server.controlplane.recorder import EventRecorder
    from plait.server.controlplane.regionstate import RegionState

log = logconfig.get("plait.controlplane.profiles")

#: seconds between re-reads of the store's profiles by the pass
REFRESH = 5.0


class HostProfiles:
    def __init__(self, state: RegionState, inbox: Inbox, recorder: EventRecorder) -> None:
        self.state, self.inbox, self.recorder = state, inbox, recorder
        self.store = ProfileStore(state.store)
        self._read_at: float | None = None
        self._dirty = threading.Event()

    # -- reads ---------------------------------------------------------------------------
    def current(self) -> list[HostProfile]:
        return self.store.current()

    def get(self, name: str, version: int | None = None) -> HostProfile:
        return self.store.get(name, version)

    def versions(self, name: str) -> list[HostProfile]:
        return self.store.versions(name)

    def diff(self, name: str, other: str, version: int | None = None,
             other_version: int | None = None) -> dict[str, Any]:
        a, b = self.get(name, version), self.get(other, other_version)
        return {"from": {"name": a.name, "version": a.version},
                "to": {"name": b.name, "version": b.version},
                "changes": [c.model_dump(mode="json") for c in diff(a.spec, b.spec)]}

    # -- writes --------------------------------------------------------------------------
    def put(self, spec: HostProfileSpec) -> tuple[HostProfile, bool]:
        """Store a profile's next version (the same settings again: no new version);
        the machines that carry it switch (busy ones by a roll)."""
        made, new = self.store.put(spec, self.state.clock())
        if new:
            self.recorder.record("api", "host_profile_changed" if made.version > 1
                                 else "host_profile_created",
                                 f"{made.name}: version {made.version}")
            self._dirty.set()
            self.inbox.wake.set()
        return made, new

    def naming(self, profile: str) -> list[tuple[str, str]]:
        """(entitlement, owner) of every entitlement of the region that names the
        profile: this control plane's, or in a sharded region every shard's (read from
        the store: the profile routes are answered by shard 0 alone)."""
        base = getattr(self.state.store, "base", None)
        if self.state.config.shard is None or base is None:
            with self.state.lock:
                return sorted((e.name, e.owner) for e in self.state.allocator.entitlements.values()
                              if e.host_profile == profile)
        found = []
        try:
            shards = base.children("/shards")
        except NotFound:
            shards = []
        for shard in shards:
            prefix = f"/shards/{shard}/allocator/entitlements"
            try:
                names = base.children(prefix)
            except NotFound:
                continue
            for value, _ in base.get_many([f"{prefix}/{n}" for n in names]).values():
                data = json.loads(value)
                if data.get("host_profile", DEFAULT_PROFILE) == profile:
                    found.append((str(data["name"]), str(data["owner"])))
        return sorted(found)

    def machines_of(self, entitlements: list[str]) -> int:
        """Machines held by ``entitlements`` on this control plane (in a sharded
        region, this shard's), counted under its lock."""
        with self.state.lock:
            return sum(len(self.state.region.machines_of(e)) for e in entitlements)

    def delete(self, name: str) -> None:
        users = [ent for ent, _ in self.naming(name)]
        if users:
            raise Conflict(f"host profile {name}", "named by no entitlement",
                           f"named by {', '.join(users[:5])}")
        self.store.delete(name)
        self.recorder.record("api", "host_profile_deleted", f"{name}")
        self._dirty.set()

    def check_entitlement(self, ent: Entitlement) -> None:
        """An entitlement names a profile that exists (changing it rolls the new one
        over its machines)."""
        try:
            self.store.get(ent.host_profile)
        except NotFound:
            raise ValidationError("host_profile", f"host profile {ent.host_profile!r} "
                                  "does not exist") from None

    # -- the pass ------------------------------------------------------------------------
    def sync(self, now: float) -> None:
        """Under the lock, in the pass: the store's profiles into the scheduler's book
        (after a write here, or every ``REFRESH`` seconds); Sidekick's transitions
        into events."""
        if self._dirty.is_set() or self._read_at is None or now - self._read_at >= REFRESH:
            self._dirty.clear()
            self._read_at = now
            try:
                for profile in self.store.current():
                    self.state.scheduler.define_profile(profile)
            except (OSError, NotFound, ValueError) as exc:
                log.warning("host profiles not read", error=str(exc))
        self.record_transitions()
        self.record_loans()

    def record_loans(self) -> None:
        """Loans made, revoked, returned and ended, into the region's event log."""
        sched = self.state.scheduler
        if not sched.loan_events:
            return
        moved, sched.loan_events = sched.loan_events, []
        name = self.state.fleet.name
        for e in moved:
            machine = name(e.machine)
            if e.kind == "loan_started":
                text = f"{machine}: loaned to elastic entitlement {e.borrower}"
            elif e.kind == "loan_revoked":
                text = (f"{machine}: loan to {e.borrower} revoked; its tasks move within "
                        f"{(e.deadline or e.at) - e.at:.0f}s (loan_revoke notice)")
            elif e.kind == "loan_returned":
                late = f", {e.late:.0f}s past its deadline" if e.late else ""
                text = f"{machine}: back from {e.borrower} in the free pool ({e.reason}{late})"
            else:
                text = f"{machine}: {e.borrower} let its loan go ({e.reason})"
            self.recorder.record("loans", e.kind, text, machine=machine, entitlement=e.borrower,
                                 at=e.at)

    def load(self) -> None:
        """At a build: every profile's current version into the new scheduler."""
        self._read_at = None
        for profile in self.store.current():
            self.state.scheduler.define_profile(profile)

    def record_transitions(self) -> None:
        sched = self.state.scheduler
        moved, sched.profile_transitions = sched.profile_transitions, []
        name = self.state.fleet.name
        for t in moved:
            if t.machine < 0 and t.kind == "profile_roll_waiting":
                self.recorder.record("sidekick", t.kind, f"entitlement {t.entitlement}: host "
                                     f"profile {t.profile} v{t.version} waits for pushes under "
                                     f"way on {t.reason} (drained once they end; the pushes carry "
                                     "their tasks to machines with the new profile)",
                                     entitlement=t.entitlement)
                continue
            if t.machine < 0 and t.kind == "profile_roll_waiting_room":
                self.recorder.record("sidekick", t.kind, f"entitlement {t.entitlement}: host "
                                     f"profile {t.profile} v{t.version}: {t.reason} (each "
                                     "job's event profile_roll_waiting says why)",
                                     entitlement=t.entitlement)
                continue
            if t.machine < 0:  # a roll over an entitlement
                self.recorder.record("sidekick", t.kind,
                                     f"entitlement {t.entitlement}: host profile "
                                     f"{t.profile} v{t.version} rolls over its {t.reason} "
                                     "(busy ones drained one at a time)",
                                     entitlement=t.entitlement)
                continue
            machine = name(t.machine)
            ent = t.entitlement or self.state.region.broker_of(t.machine).entitlement_of(t.machine)
            if t.kind == "profile_switched":
                text = f"{machine}: host profile {t.profile} v{t.version} applied"
            elif t.kind == "profile_switch_retried":
                text = (f"{machine}: host profile {t.profile} v{t.version} applied after "
                        "failing; back in service")
            elif t.kind == "profile_roll_drained":
                text = (f"{machine}: drained for host profile {t.profile} v{t.version}; back "
                        "in the free pool")
            else:
                text = (f"{machine}: switching to host profile {t.profile} v{t.version} "
                        f"failed (failure {t.failures} in a row): {t.reason}; out of service "
                        f"for {t.out_for:g}s, or until a retry succeeds")
            self.recorder.record("sidekick", t.kind, text, machine=machine, entitlement=ent,
                                 reason=t.reason)
