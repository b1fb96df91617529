"""The Resource Broker of one data center (paper section 2.3).

It is the source of truth for its machines' binding (free, or assigned to one
entitlement) and for unavailability events (failures, planned maintenance). Every
binding change is a compare-and-swap on the machine record's version, so two
allocators (two scheduler shards) racing for the same free machine cannot both win.
Subscribers (allocators, schedulers) are told of every change, synchronously.

Records are columnar (a region holds a million machines): one entitlement code,
one version and two open-event counters per machine. This is pure state: time is
passed in (``now``), nothing here reads a clock, sleeps or does I/O.
"""

from __future__ import annotations

import enum
import heapq
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from plait.errors import Conflict, NotFound, ValidationError
from plait.model.events import EventKind, UnavailabilityEvent
from plait.model.machine import MachineState
from plait.model.topology import Fleet

FREE = -1


class Interner:
    """Names <-> small integer codes, shared region-wide (entitlement names)."""

    def __init__(self) -> None:
        self._codes: dict[str, int] = {}
        self.names: list[str] = []

    def code(self, name: str) -> int:
        code = self._codes.get(name)
        if code is None:
            code = self._codes[name] = len(self.names)
            self.names.append(name)
        return code

    def find(self, name: str) -> int | None:
        return self._codes.get(name)

    def __len__(self) -> int:
        return len(self.names)


class ChangeKind(enum.StrEnum):
    CLAIMED = "claimed"
    RELEASED = "released"
    STATE = "state"
    #: maintenance was announced (or the last announcement was withdrawn)
    NOTICE = "notice"


@dataclass(frozen=True, slots=True)
class BrokerChange:
    """One machine record changed. ``machine`` is the region-wide machine index."""

    kind: ChangeKind
    machine: int
    entitlement: str | None
    version: int
    state: MachineState
    #: announced maintenance is pending: keep new work off the machine
    cordoned: bool = False


@dataclass(frozen=True, slots=True)
class MachineRecord:
    machine: str
    dc: str
    entitlement: str | None
    version: int
    state: MachineState
    #: announced maintenance is pending: keep new work off the machine
    cordoned: bool = False


Subscriber = Callable[[BrokerChange], None]


class ResourceBroker:
    """Machine records and unavailability events of one data center."""

    def __init__(
        self, fleet: Fleet, dc: str, entitlements: Interner,
        local: npt.NDArray[np.int32] | None = None,
    ) -> None:
        self.fleet = fleet
        self.dc = dc
        self._ents = entitlements
        self._dc_code = fleet.dc_code(dc)
        #: region-wide indices of this DC's machines
        self.machines: npt.NDArray[np.int64] = np.flatnonzero(fleet.codes["dc"] == self._dc_code)
        if local is None:  # region-wide index -> position among this DC's machines
            local = _local_positions(fleet)
        self._local = local
        m = self.machines.size
        self._ent = np.full(m, FREE, np.int32)
        self._version = np.zeros(m, np.int64)
        self._failures = np.zeros(m, np.int32)
        self._maintenance = np.zeros(m, np.int32)
        #: announced maintenance that has not started yet, per machine
        self._announced = np.zeros(m, np.int32)
        self._announced_events: set[str] = set()
        #: cordoned by an operator (no new tasks; the ones there keep running)
        self._cordon = np.zeros(m, np.bool_)
        self._events: dict[str, UnavailabilityEvent] = {}
        self._event_machines: dict[str, npt.NDArray[np.int64]] = {}
        self._active: set[str] = set()
        #: (when, seq, "start"|"end", event id, incarnation of that id)
        self._timeline: list[tuple[float, int, str, str, int]] = []
        self._incarnation: dict[str, int] = {}
        self._seq = 0
        self._subscribers: list[Subscriber] = []

    # -- reading ---------------------------------------------------------------------
    def _pos(self, machine: int) -> int:
        if not self.owns(machine):
            raise NotFound("machine", f"{self._name(machine)} in {self.dc}")
        return int(self._local[machine])

    def _name(self, machine: int) -> str:
        try:
            return self.fleet.name(machine)
        except IndexError:
            return str(machine)

    def owns(self, machine: int) -> bool:
        return (0 <= machine < self._local.size
                and int(self.fleet.codes["dc"][machine]) == self._dc_code)

    def entitlement_of(self, machine: int) -> str | None:
        code = int(self._ent[self._pos(machine)])
        return None if code == FREE else self._ents.names[code]

    def version(self, machine: int) -> int:
        return int(self._version[self._pos(machine)])

    def state(self, machine: int) -> MachineState:
        return self._state_at(self._pos(machine))

    def _state_at(self, p: int) -> MachineState:
        if self._failures[p]:
            return MachineState.FAILED
        if self._maintenance[p]:
            return MachineState.MAINTENANCE
        return MachineState.HEALTHY

    def record(self, machine: int) -> MachineRecord:
        return MachineRecord(self.fleet.name(machine), self.dc, self.entitlement_of(machine),
                             self.version(machine), self.state(machine), self.cordoned(machine))

    def free_machines(self) -> npt.NDArray[np.int64]:
        return np.asarray(self.machines[self._ent == FREE], np.int64)

    def machines_of(self, entitlement: str) -> npt.NDArray[np.int64]:
        code = self._ents.find(entitlement)
        if code is None:
            return np.empty(0, np.int64)
        return np.asarray(self.machines[self._ent == code], np.int64)

    def entitlement_codes(self) -> npt.NDArray[np.int32]:
        """Entitlement code per machine of ``self.machines`` (-1 free); a copy."""
        return self._ent.copy()

    def versions(self) -> npt.NDArray[np.int64]:
        """Record version per machine of ``self.machines``; a copy."""
        return self._version.copy()

    def cordoned(self, machine: int) -> bool:
        """Takes no new tasks: maintenance is announced on the machine and has not
        started yet, or an operator cordoned it."""
        p = self._pos(machine)
        return bool(self._announced[p] > 0 or self._cordon[p])

    def cordon_flags(self) -> npt.NDArray[np.bool_]:
        """Per machine of ``self.machines``: cordoned (announced maintenance pending, or
        an operator's cordon)."""
        return (self._announced > 0) | self._cordon

    def set_cordon(self, machine: int, cordoned: bool) -> None:
        """An operator's cordon: the machine takes no new tasks while it is set."""
        p = self._pos(machine)
        before = self.cordoned(machine)
        self._cordon[p] = cordoned
        if self.cordoned(machine) != before:
            self._version[p] += 1
            self._notify(ChangeKind.NOTICE, machine, p)

    def operator_cordoned(self, machine: int) -> bool:
        return bool(self._cordon[self._pos(machine)])

    def state_codes(self) -> npt.NDArray[np.int8]:
        """Per machine of ``self.machines``: 0 healthy, 1 failed, 2 in maintenance."""
        return np.where(self._failures > 0, 1, np.where(self._maintenance > 0, 2, 0)).astype(
            np.int8)

    # -- binding (compare-and-swap) -----------------------------------------------------
    def claim(self, machine: int, entitlement: str, expected_version: int) -> int:
        """Assign a free machine to ``entitlement``; returns the new version.

        Raises ``Conflict`` if the record changed since ``expected_version`` was read
        or if the machine is not free.
        """
        p = self._pos(machine)
        version = int(self._version[p])
        if version != expected_version:
            raise Conflict(f"machine {self._name(machine)} version", expected_version, version)
        code = int(self._ent[p])
        if code != FREE:
            raise Conflict(f"machine {self._name(machine)} binding", None, self._ents.names[code])
        code = self._ents.code(entitlement)
        version += 1
        self._ent[p] = code
        self._version[p] = version
        self._notify_bound(ChangeKind.CLAIMED, machine, entitlement, version, p)
        return version

    def release(self, machine: int, entitlement: str, expected_version: int) -> int:
        """Return a machine of ``entitlement`` to the free pool; returns the new version."""
        p = self._pos(machine)
        version = int(self._version[p])
        if version != expected_version:
            raise Conflict(f"machine {self._name(machine)} version", expected_version, version)
        code = int(self._ent[p])
        actual = None if code == FREE else self._ents.names[code]
        if actual != entitlement:
            raise Conflict(f"machine {self._name(machine)} binding", entitlement, actual)
        version += 1
        self._ent[p] = FREE
        self._version[p] = version
        self._notify_bound(ChangeKind.RELEASED, machine, None, version, p)
        return version

    # -- unavailability events ------------------------------------------------------------
    def add_event(self, event: UnavailabilityEvent, now: float) -> None:
        """Record an event; it takes effect at ``event.start`` (at once if already due)."""
        if event.id in self._events:
            raise Conflict(f"event {event.id}", None, "exists")
        idx = np.empty(len(event.machines), np.int64)
        for k, name in enumerate(event.machines):
            i = self.fleet.index_of(name)
            if not self.owns(i):
                raise ValidationError("machines", f"machine {name} is not in {self.dc}")
            idx[k] = i
        self._events[event.id] = event
        self._event_machines[event.id] = idx
        self._seq += 1
        self._incarnation[event.id] = self._seq
        self._schedule(event.start, "start", event.id)
        if event.end is not None:
            self._schedule(event.end, "end", event.id)
        if event.kind is EventKind.MAINTENANCE and event.start > now:
            self._announce(event.id, +1)
        self.tick(now)

    def end_event(self, event_id: str, now: float) -> None:
        """End an event now: a failure is repaired, or maintenance is finished/cancelled."""
        if event_id not in self._events:
            raise NotFound("event", event_id)
        self._apply(event_id, "end")
        self.tick(now)

    def events(self) -> list[UnavailabilityEvent]:
        return list(self._events.values())

    def active_events(self) -> list[UnavailabilityEvent]:
        return [self._events[e] for e in sorted(self._active)]

    def events_for(self, machine: int) -> list[UnavailabilityEvent]:
        return [ev for eid, ev in self._events.items()
                if machine in self._event_machines[eid]]

    def tick(self, now: float) -> None:
        """Apply every event start/end due at or before ``now``."""
        while self._timeline and self._timeline[0][0] <= now:
            _, _, what, eid, incarnation = heapq.heappop(self._timeline)
            # an id reused after its event ended must not get the old event's times
            if self._incarnation.get(eid) == incarnation:
                self._apply(eid, what)

    def _schedule(self, when: float, what: str, event_id: str) -> None:
        self._seq += 1
        heapq.heappush(self._timeline,
                       (when, self._seq, what, event_id, self._incarnation[event_id]))

    def _apply(self, event_id: str, what: str) -> None:
        event = self._events.get(event_id)
        if event is None:
            return
        counter = self._failures if event.kind is EventKind.FAILURE else self._maintenance
        machines = self._event_machines[event_id]
        before = {m: (self._state_at(int(self._local[m])), self.cordoned(m))
                  for m in machines.tolist()}
        if event_id in self._announced_events:  # it starts, or is withdrawn
            self._announce(event_id, -1, notify=False)
        if what == "start":
            if event_id in self._active:
                return
            self._active.add(event_id)
            delta = 1
        else:
            if event_id not in self._active:  # ended before it started: cancelled
                del self._events[event_id]
                del self._event_machines[event_id]
                self._incarnation.pop(event_id, None)
                self._changed(before)
                return
            self._active.discard(event_id)
            del self._events[event_id]
            del self._event_machines[event_id]
            self._incarnation.pop(event_id, None)
            delta = -1
        for machine in machines.tolist():
            p = int(self._local[machine])
            counter[p] = counter[p] + delta
        self._changed(before)

    def _changed(self, before: dict[int, tuple[MachineState, bool]]) -> None:
        """One version bump and one notification per machine whose state or cordon
        changed (a maintenance start does both at once)."""
        for machine, (state, cordoned) in before.items():
            p = int(self._local[machine])
            now_state, now_cordoned = self._state_at(p), self.cordoned(machine)
            if now_state is not state or now_cordoned != cordoned:
                self._version[p] += 1
                self._notify(ChangeKind.STATE if now_state is not state else ChangeKind.NOTICE,
                             machine, p)

    def _announce(self, event_id: str, delta: int, notify: bool = True) -> None:
        if delta > 0:
            self._announced_events.add(event_id)
        else:
            self._announced_events.discard(event_id)
        for machine in self._event_machines[event_id].tolist():
            p = int(self._local[machine])
            before = self.cordoned(machine)
            self._announced[p] += delta
            if notify and self.cordoned(machine) != before:
                self._version[p] += 1
                self._notify(ChangeKind.NOTICE, machine, p)

    # -- subscriptions ----------------------------------------------------------------
    def subscribe(self, subscriber: Subscriber) -> None:
        self._subscribers.append(subscriber)

    def _notify(self, kind: ChangeKind, machine: int, p: int) -> None:
        code = int(self._ent[p])
        self._notify_bound(kind, machine, None if code == FREE else self._ents.names[code],
                           int(self._version[p]), p)

    def _notify_bound(self, kind: ChangeKind, machine: int, entitlement: str | None,
                      version: int, p: int) -> None:
        """``_notify`` when the caller already has the new binding and version."""
        change = BrokerChange(kind, machine, entitlement, version, self._state_at(p),
                              bool(self._announced[p] > 0 or self._cordon[p]))
        for subscriber in self._subscribers:
            subscriber(change)


def _local_positions(fleet: Fleet) -> npt.NDArray[np.int32]:
    """For every machine, its position among the machines of its own DC."""
    dc = fleet.codes["dc"]
    order = np.argsort(dc, kind="stable")
    counts = np.bincount(dc, minlength=len(fleet.level_names["dc"]))
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    local = np.empty(len(fleet), np.int32)
    local[order] = np.arange(len(fleet), dtype=np.int64) - np.repeat(starts, counts)
    return local


class Region:
    """All brokers of a region: together they hold the regional free pool.

    Calls name a machine by its region-wide index and are routed to the broker of
    the machine's DC.
    """

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.entitlements = Interner()
        local = _local_positions(fleet)
        self.brokers = {dc: ResourceBroker(fleet, dc, self.entitlements, local)
                        for dc in fleet.level_names["dc"]}
        self._by_code = list(self.brokers.values())

    def broker_of(self, machine: int) -> ResourceBroker:
        if not 0 <= machine < len(self.fleet):
            raise NotFound("machine", str(machine))
        return self._by_code[int(self.fleet.codes["dc"][machine])]

    def claim(self, machine: int, entitlement: str, expected_version: int) -> int:
        return self.broker_of(machine).claim(machine, entitlement, expected_version)

    def release(self, machine: int, entitlement: str, expected_version: int) -> int:
        return self.broker_of(machine).release(machine, entitlement, expected_version)

    def record(self, machine: int) -> MachineRecord:
        return self.broker_of(machine).record(machine)

    def version(self, machine: int) -> int:
        return self.broker_of(machine).version(machine)

    def free_machines(self) -> npt.NDArray[np.int64]:
        return np.concatenate([b.free_machines() for b in self.brokers.values()])

    def machines_of(self, entitlement: str) -> npt.NDArray[np.int64]:
        return np.concatenate([b.machines_of(entitlement) for b in self.brokers.values()])

    def add_event(self, event: UnavailabilityEvent, now: float) -> None:
        """Split an event by DC and hand each part to its broker (all parts or none)."""
        parts: dict[str, list[str]] = {}
        for name in event.machines:
            i = self.fleet.index_of(name)
            parts.setdefault(self.broker_of(i).dc, []).append(name)
        if any(e.id == event.id for b in self.brokers.values() for e in b.events()):
            raise Conflict(f"event {event.id}", None, "exists")
        for dc, names in parts.items():
            self.brokers[dc].add_event(
                UnavailabilityEvent(event.id, event.kind, tuple(names), event.start, event.end,
                                    event.reason), now)

    def end_event(self, event_id: str, now: float) -> None:
        found = False
        for broker in self.brokers.values():
            if any(e.id == event_id for e in broker.events()):
                broker.end_event(event_id, now)
                found = True
        if not found:
            raise NotFound("event", event_id)

    def events(self) -> list[UnavailabilityEvent]:
        return [e for b in self.brokers.values() for e in b.events()]

    def set_cordon(self, machine: int, cordoned: bool) -> None:
        self.broker_of(machine).set_cordon(machine, cordoned)

    def tick(self, now: float) -> None:
        for broker in self.brokers.values():
            broker.tick(now)

    def subscribe(self, subscriber: Subscriber) -> None:
        for broker in self.brokers.values():
            broker.subscribe(subscriber)

    def states(self, machines: Iterable[int]) -> list[MachineState]:
        return [self.broker_of(m).state(m) for m in machines]
