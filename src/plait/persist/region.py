"""The Resource Brokers' records, written through to the store.

``PersistentRegion`` is a ``Region`` whose binding changes and events are stored
(compare-and-swap on the stored record) before they take effect in memory, so a
claim acknowledged to the allocator survives a crash, and two control-plane
processes sharing the store cannot both claim one machine. ``load`` rebuilds the
in-memory brokers from the store after a restart.

Layout in the ``/broker`` namespace (records carry a schema version):

    /broker/machines/{machine id}   {"schema": 1, "entitlement": name | null,
                                     "cordoned": bool}
    /broker/events/{event id}       {"schema": 1, "kind", "machines", "start", "end", "reason"}
"""

from __future__ import annotations

import json
from typing import Any

from plait.broker import Region
from plait.errors import Conflict, NotFound
from plait.model.events import UnavailabilityEvent
from plait.model.topology import Fleet
from plait.store.protocol import Namespace, Store, Transaction

SCHEMA = 1


def _record(**fields: Any) -> bytes:
    return json.dumps({"schema": SCHEMA, **fields}, sort_keys=True).encode()


def _read(value: bytes) -> dict[str, Any]:
    data = json.loads(value)
    if not isinstance(data, dict) or int(data.get("schema", 0)) > SCHEMA:
        raise ValueError("a broker record of a newer schema than this plait reads")
    return data


class PersistentRegion(Region):
    def __init__(self, fleet: Fleet, store: Store) -> None:
        super().__init__(fleet)
        self.ns = Namespace(store, "/broker")
        #: the stored version of each machine record this process has seen
        self._stored: dict[int, int] = {}
        #: (key, version) every write checks in its transaction: the election's fence
        #: of the replica that leads (``Election.fence``), or None. A leader deposed
        #: while paused writes nothing when it wakes (a failure event of its stale
        #: view of heartbeats would have every task of the machine replaced)
        self.fence: tuple[str, int] | None = None

    def _create(self, key: str, value: bytes) -> int:
        if self.fence is None:
            return self.ns.create(key, value)
        self._commit(Transaction().create(key, value))
        return 0

    def _set(self, key: str, value: bytes, version: int) -> int:
        if self.fence is None:
            return self.ns.set(key, value, version)
        self._commit(Transaction().set(key, value, version))
        return version + 1

    def _delete(self, key: str, version: int) -> None:
        if self.fence is None:
            self.ns.delete(key, version)
        else:
            self._commit(Transaction().delete(key, version))

    def _commit(self, txn: Transaction) -> None:
        assert self.fence is not None
        for op in txn.ops:
            op.key = self.ns.prefix + op.key
        txn.check(*self.fence)
        self.ns.store.commit(txn)

    # -- write-through --------------------------------------------------------------------
    def _write_binding(self, machine: int, entitlement: str | None,
                       cordoned: bool | None = None) -> None:
        key = f"/machines/{self.fleet.name(machine)}"
        broker = self.broker_of(machine)
        data = _record(entitlement=entitlement, cordoned=broker.operator_cordoned(machine)
                       if cordoned is None else cordoned)
        seen = self._stored.get(machine)
        try:
            if seen is None:  # (a Conflict if another process wrote it since we loaded)
                self._stored[machine] = self._create(key, data)
            else:
                self._stored[machine] = self._set(key, data, seen)
        except (Conflict, NotFound) as exc:
            # another process (a shard sharing the free pool) wrote it first: take its
            # binding, so the caller's next decision sees the machine as it is
            self.adopt(machine)
            if isinstance(exc, Conflict):
                raise
            raise Conflict(f"machine {self.fleet.name(machine)} record", seen,
                           "deleted") from None

    def adopt(self, machine: int) -> None:
        """Make this process's view of ``machine``'s binding and cordon the store's
        (subscribers, such as the allocator's index, are told as for any change)."""
        try:
            value, version = self.ns.get(f"/machines/{self.fleet.name(machine)}")
            data = _read(value)
        except NotFound:
            version, data = None, {"entitlement": None, "cordoned": False}
        have, want = self.broker_of(machine).entitlement_of(machine), data["entitlement"]
        if have != want:
            if have is not None:
                Region.release(self, machine, have, self.version(machine))
            if want is not None:
                Region.claim(self, machine, want, self.version(machine))
        cordoned = bool(data.get("cordoned"))
        if self.broker_of(machine).operator_cordoned(machine) != cordoned:
            Region.set_cordon(self, machine, cordoned)
        if version is None:
            self._stored.pop(machine, None)
        else:
            self._stored[machine] = version

    def adopt_event(self, event_id: str, now: float) -> None:
        """Make this process's view of event ``event_id`` the store's: raised by
        another process, changed, or ended (its record gone)."""
        try:
            value, _ = self.ns.get(f"/events/{event_id}")
        except NotFound:
            if any(e.id == event_id for e in self.events()):
                Region.end_event(self, event_id, now)
            return
        data = _read(value)
        event = UnavailabilityEvent(event_id, data["kind"], tuple(data["machines"]),
                                    float(data["start"]),
                                    None if data["end"] is None else float(data["end"]),
                                    str(data["reason"]))
        parts = [e for e in self.events() if e.id == event_id]  # (one per DC)
        if parts and {m for e in parts for m in e.machines} == set(event.machines) and all(
                (e.kind, e.start, e.end, e.reason) == (event.kind, event.start, event.end,
                                                       event.reason) for e in parts):
            return
        if parts:
            Region.end_event(self, event_id, now)
        if event.end is None or event.end > now:
            Region.add_event(self, event, now)

    def claim(self, machine: int, entitlement: str, expected_version: int) -> int:
        broker = self.broker_of(machine)
        if broker.version(machine) != expected_version or broker.entitlement_of(machine):
            return broker.claim(machine, entitlement, expected_version)  # raises Conflict
        self._write_binding(machine, entitlement)
        return super().claim(machine, entitlement, expected_version)

    def release(self, machine: int, entitlement: str, expected_version: int) -> int:
        broker = self.broker_of(machine)
        if (broker.version(machine) != expected_version
                or broker.entitlement_of(machine) != entitlement):
            return broker.release(machine, entitlement, expected_version)  # raises Conflict
        self._write_binding(machine, None)
        return super().release(machine, entitlement, expected_version)

    def set_cordon(self, machine: int, cordoned: bool) -> None:
        self._write_binding(machine, self.broker_of(machine).entitlement_of(machine), cordoned)
        super().set_cordon(machine, cordoned)

    def add_event(self, event: UnavailabilityEvent, now: float) -> None:
        self._create(f"/events/{event.id}", _record(
            kind=event.kind.value, machines=list(event.machines), start=event.start,
            end=event.end, reason=event.reason))
        try:
            super().add_event(event, now)
        except Exception:
            _, version = self.ns.get(f"/events/{event.id}")
            self._delete(f"/events/{event.id}", version)
            raise

    def end_event(self, event_id: str, now: float) -> None:
        super().end_event(event_id, now)
        try:
            _, version = self.ns.get(f"/events/{event_id}")
            self._delete(f"/events/{event_id}", version)
        except NotFound:
            pass

    # -- rebuild ----------------------------------------------------------------------------
    @classmethod
    def load(cls, fleet: Fleet, store: Store, now: float) -> PersistentRegion:
        """Rebuild the brokers from the store (after a restart, or in another
        process). Events whose end has passed are applied and ended, and dropped
        from the store."""
        region = cls(fleet, store)
        for name in region.ns.children("/machines"):
            value, version = region.ns.get(f"/machines/{name}")
            m = fleet.index_of(name)
            region._stored[m] = version
            data = _read(value)
            ent = data["entitlement"]
            if ent is not None:
                Region.claim(region, m, ent, region.version(m))
            if data.get("cordoned"):
                Region.set_cordon(region, m, True)
        for event_id in region.ns.children("/events"):
            value, version = region.ns.get(f"/events/{event_id}")
            data = _read(value)
            event = UnavailabilityEvent(event_id, data["kind"], tuple(data["machines"]),
                                        float(data["start"]),
                                        None if data["end"] is None else float(data["end"]),
                                        str(data["reason"]))
            if event.end is not None and event.end <= now:
                region.ns.delete(f"/events/{event_id}", version)  # over while we were down
                continue
            Region.add_event(region, event, now)
        return region
