"""Machine operations: registration by an agent, failure and repair by an operator,
cordon, drain, planned maintenance. Each goes to the region's brokers (which write it
through) under the lock, and wakes the loop."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from plait.errors import Conflict, NotFound, Taken, ValidationError
from plait.model.events import (
    LOAN_REVOKE_PREFIX,
    MACHINE_DRAIN_PREFIX,
    PROFILE_ROLL_PREFIX,
    EventKind,
    UnavailabilityEvent,
)
from plait.model.machine import Machine, MachineState
from plait.scheduler.drain import occupied

if TYPE_CHECKING:
    from plait.server.controlplane.inbox import Inbox
    from plait.server.controlplane.recorder import EventRecorder
    from plait.server.controlplane.regionstate import RegionState
    from plait.server.controlplane.views import Views

#: a drained machine stays out of service until uncordoned (at most this long)
DRAIN_HOLD = 365 * 86400.0
#: the reasons of a drain's maintenance event: kept out of service once empty, or
#: given back to the free pool
DRAIN, DRAIN_TO_FREE = "drain", "drain to free"


class MachineOps:
    def __init__(self, state: RegionState, inbox: Inbox, recorder: EventRecorder,
                 views: Views, rebuild: Callable[[float], None]) -> None:
        """``rebuild``: the region's state and what is built on it, from the store
        again (a machine registered)."""
        self.state, self.inbox, self.recorder = state, inbox, recorder
        self.views, self.rebuild = views, rebuild
        self._drains = 0
        #: machines being drained: their drain's event and where they go once empty
        #: (found again from the brokers' events after a build)
        self._draining: dict[int, tuple[str, str]] = {}
        self._draining_of: object = None

    def register(self, machine: Machine) -> bool:
        """A machine as its agent describes it. A machine the region has must match
        (a conflict names what differs); a new one is stored and joins the region.
        Returns whether it was new."""
        with self.state.lock:
            try:
                have = self.state.fleet.machine(self.state.fleet.index_of(machine.id))
            except NotFound:
                have = None
            if have is not None:
                differs: dict[str, tuple[str, str]] = {}
                if have.fault_domain != machine.fault_domain:
                    differs["fault_domain"] = (str(have.fault_domain), str(machine.fault_domain))
                if have.type != machine.type:
                    differs["type"] = (have.type, machine.type)
                ours, theirs = have.resources.to_units(), machine.resources.to_units()
                for i, f in enumerate(("cpu", "memory_gb")):
                    if ours[i] != theirs[i]:
                        differs[f] = (f"{getattr(have.resources, f):g}",
                                      f"{getattr(machine.resources, f):g}")
                if differs:
                    raise Conflict(
                        f"machine {machine.id}",
                        ", ".join(f"{f} {a}" for f, (a, _) in differs.items()),
                        ", ".join(f"{f} {b}" for f, (_, b) in differs.items()))
                return False
            if machine.fault_domain.region != self.state.fleet.region:
                raise ValidationError("fault_domain", f"this control plane runs region "
                                      f"{self.state.fleet.region!r}, not "
                                      f"{machine.fault_domain.region!r}")
            record = {"seq": len(self.state.fleet), "id": machine.id, "type": machine.type,
                      "fault_domain": str(machine.fault_domain),
                      "cpu": machine.resources.cpu, "memory_gb": machine.resources.memory_gb,
                      "disk_gb": machine.resources.disk_gb}
            # (already stored by an attempt that did not finish: rebuilt below)
            with contextlib.suppress(Conflict):
                self.state.meta.create(f"/machines/{machine.id}", json.dumps(record).encode())
            now = self.state.clock()
            events, self.state.scheduler.events[:] = list(self.state.scheduler.events), []
            for ev in events:
                self.recorder.record("scheduler", ev.kind, ev.message, job=ev.job, at=ev.time,
                                     machine=ev.machine, actor=ev.actor or "scheduler",
                                     task=ev.task, op=ev.op, reason=ev.reason,
                                     decision=ev.decision, request=ev.request)
            # (nothing in memory is lost by the rebuild)
            self.state.persist.save(self.state.allocator)
            self.rebuild(now)
            self.recorder.record("broker", "machine_registered",
                                 f"{machine.id}: {machine.type} in {machine.fault_domain}, "
                                 f"{machine.resources.cpu:g} cpu, "
                                 f"{machine.resources.memory_gb:g} GB",
                                 machine=machine.id)
        self.inbox.wake.set()
        return True

    def event_id(self, prefix: str, machine: str) -> str:
        with self.state.lock:
            self._drains += 1
            return f"{prefix}-{machine}-{int(self.state.clock() * 1000)}-{self._drains}"

    def fail_machine(self, machine: str, reason: str = "marked failed by an operator") -> str:
        m = self.state.machine_index(machine)
        with self.state.lock:
            if self.state.region.broker_of(m).state(m) is MachineState.FAILED:
                raise Conflict(f"machine {machine}", "healthy", "failed")
            now = self.state.clock()
            event_id = self.event_id("failure", machine)
            self.state.region.add_event(UnavailabilityEvent(event_id, EventKind.FAILURE, (machine,),
                                                            now, None, reason), now)
            if self.state.sim is not None:
                self.state.sim.agent(m).fail()
        self.recorder.record("broker", "machine_failed", f"{machine}: {reason}", machine=machine)
        self.inbox.wake.set()
        return event_id

    def repair_machine(self, machine: str) -> list[str]:
        m = self.state.machine_index(machine)
        with self.state.lock:
            now = self.state.clock()
            ended = [e.id for e in self.state.region.broker_of(m).events_for(m)
                     if e.kind is EventKind.FAILURE]
            for event_id in ended:
                self.state.region.end_event(event_id, now)
            if self.state.sim is not None:
                self.state.sim.agent(m).repair()
                self.state.sim.wake(m)
        if not ended:
            raise Conflict(f"machine {machine}", "failed", "not failed")
        self.recorder.record("broker", "machine_repaired", machine, machine=machine)
        self.inbox.wake.set()
        return ended

    def cordon(self, machine: str, cordoned: bool) -> dict[str, Any]:
        m = self.state.machine_index(machine)
        with self.state.lock:
            if not cordoned:
                # a host-profile roll or a loan's revoke holds its machine cordoned until
                # it is empty: an uncordon said "done" and changed nothing
                held = [e.id for e in self.state.region.broker_of(m).events_for(m)
                        if e.id.startswith((LOAN_REVOKE_PREFIX, PROFILE_ROLL_PREFIX))]
                if held:
                    raise Conflict(f"machine {machine}", "a cordon an operator may lift",
                                   f"held by {held[0]} until the machine is drained")
            self.state.region.set_cordon(m, cordoned)
            ended = []
            if not cordoned:  # uncordon also ends drains that have not finished
                now = self.state.clock()
                for event in self.state.region.broker_of(m).events_for(m):
                    if event.reason in (DRAIN, DRAIN_TO_FREE):
                        self.state.region.end_event(event.id, now)
                        ended.append(event.id)
            view = self.views.machine_view(m)
        self.recorder.record("broker", "machine_cordoned" if cordoned else "machine_uncordoned",
                             machine + (f" (ended {', '.join(ended)})" if ended else ""),
                             machine=machine)
        self.inbox.wake.set()
        return view

    def drain(self, machine: str, deadline_seconds: float | None = None,
              to: str = "maintenance") -> str:
        """Move every task off the machine through TaskControl; what is left at the
        deadline is stopped. Once empty the machine goes back to the free pool
        (``to="free"``) or stays out of service until uncordoned (``maintenance``)."""
        if to not in ("free", "maintenance"):
            raise ValidationError("to", f"{to!r}: free or maintenance")
        m = self.state.machine_index(machine)
        deadline = self.state.config.drain_deadline_seconds if deadline_seconds is None \
            else deadline_seconds
        if deadline < 0:
            raise ValidationError("deadline_seconds", "must be >= 0")
        with self.state.lock:
            now = self.state.clock()
            self.state.region.set_cordon(m, True)
            event_id = self.event_id(MACHINE_DRAIN_PREFIX[:-1], machine)
            self.state.region.add_event(UnavailabilityEvent(
                event_id, EventKind.MAINTENANCE, (machine,), now + deadline,
                now + deadline + DRAIN_HOLD, DRAIN_TO_FREE if to == "free" else DRAIN), now)
            self._draining[m] = (event_id, to)
        self.recorder.record("broker", "machine_drain",
                             f"{machine}: tasks move within {deadline:g}s, "
                             f"then {'the free pool' if to == 'free' else 'out of service'} "
                             f"({event_id})", machine=machine)
        self.inbox.wake.set()
        return event_id

    def finish_drains(self) -> None:
        """In the pass (under the lock): a drained machine with no task left is given
        back to the free pool (its drain ended, uncordoned) or kept out of service, as
        its drain asked; each once, with an event ``machine_drained``."""
        region = self.state.region
        if self._draining_of is not region:  # (a build: found again in the brokers)
            self._draining_of = region
            self._draining = {}
            for event in region.events():
                if event.reason in (DRAIN, DRAIN_TO_FREE):
                    for name in event.machines:
                        with contextlib.suppress(NotFound):
                            self._draining[self.state.machine_index(name)] = (
                                event.id, "free" if event.reason == DRAIN_TO_FREE
                                else "maintenance")
        if not self._draining:
            return
        now, scheduler = self.state.clock(), self.state.scheduler
        for m, (event_id, to) in list(self._draining.items()):
            if occupied(scheduler, m):
                continue
            del self._draining[m]
            if event_id not in {e.id for e in region.broker_of(m).events_for(m)}:
                continue  # ended meanwhile (uncordoned)
            name = self.state.fleet.name(m)
            if to == "free":
                region.end_event(event_id, now)
                region.set_cordon(m, False)
                self.recorder.record("broker", "machine_drained",
                                     f"{name}: drained; back in the free pool", machine=name)
            else:
                self.recorder.record("broker", "machine_drained",
                                     f"{name}: drained; out of service until uncordoned",
                                     machine=name)

    def schedule_maintenance(self, machines: list[str], start: float, duration: float,
                             reason: str = "maintenance") -> str:
        if not machines:
            raise ValidationError("machines", "give at least one machine")
        if duration <= 0:
            raise ValidationError("duration_seconds", "must be > 0")
        for machine in machines:
            self.state.machine_index(machine)
        if start + duration <= self.state.clock():
            raise ValidationError("start", f"the window ({start:.0f} + {duration:g}s) ended "
                                  "before now: nothing would be done (a window starting now "
                                  "or later, or no start for now)")
        with self.state.lock:
            now = self.state.clock()
            self._drains += 1
            event_id = f"maintenance-{int(now * 1000)}-{self._drains}"
            self.state.region.add_event(UnavailabilityEvent(
                event_id, EventKind.MAINTENANCE, tuple(machines), start, start + duration,
                reason), now)
        self.recorder.record("broker", "maintenance_scheduled",
                             f"{event_id}: {len(machines)} machines from {start:.0f} "
                             f"for {duration:g}s "
                             f"({reason})")
        self.inbox.wake.set()
        return event_id

    def cancel_maintenance(self, event_id: str) -> dict[str, Any]:
        """Cancel a planned maintenance: one announced that has not started is
        withdrawn (its machines are no longer under notice: the advance notices and
        the moves offered for it stop, and the cordon its announcement put on them is
        lifted); one under way ends now (its machines are back in service, and the
        tasks parked for it start again where they were). Drains, loan revokes and
        host-profile rolls end their own way; a failure ends with a repair."""
        with self.state.lock:
            now = self.state.clock()
            region = self.state.region
            found = [e for e in region.events() if e.id == event_id]
            if not found:
                raise NotFound("maintenance", event_id)
            event = found[0]
            if event.kind is not EventKind.MAINTENANCE:
                raise Taken(f"event {event_id}", f"{event_id} is a machine's failure, not "
                            "maintenance: plait machine repair ends it")
            if event_id.startswith(MACHINE_DRAIN_PREFIX):
                raise Taken(f"event {event_id}", f"{event_id} is a machine's drain: plait "
                            "machine uncordon ends it")
            if event_id.startswith((LOAN_REVOKE_PREFIX, PROFILE_ROLL_PREFIX)):
                raise Taken(f"event {event_id}", f"{event_id} is held by the control plane "
                            "(a loan's revoke, a host-profile roll) until its machine is "
                            "empty: it cannot be cancelled")
            started = any(e.id == event_id for b in region.brokers.values()
                          for e in b.active_events())
            machines = sorted(name for e in found for name in e.machines)
            region.end_event(event_id, now)
        n = f"{len(machines)} machine{'s' if len(machines) != 1 else ''}"
        self.recorder.record("broker", "maintenance_cancelled", f"{event_id}: " + (
            f"ended early; {n} back in service" if started else
            f"cancelled before its start; {n} no longer under notice") + f" ({event.reason})")
        self.inbox.wake.set()
        return {"event": event_id, "state": "ended" if started else "cancelled",
                "machines": machines}

    def maintenance(self) -> list[dict[str, Any]]:
        with self.state.lock:
            events: dict[str, UnavailabilityEvent] = {}
            machines: dict[str, list[str]] = {}
            for event in self.state.region.events():
                events[event.id] = event
                machines.setdefault(event.id, []).extend(event.machines)
        return [{"id": e.id, "kind": e.kind.value, "machines": sorted(machines[e.id]),
                 "start": e.start, "end": e.end, "reason": e.reason}
                for e in sorted(events.values(), key=lambda e: (e.start, e.id))]
