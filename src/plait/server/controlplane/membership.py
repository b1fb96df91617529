"""A scheduler shard among others (decision 43): which machines this control plane
manages, what other shards changed in the region's shared records, and the handoff of
an entitlement to another shard."""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING, Any

from plait import logconfig
from plait.errors import Conflict, NotFound, TransientError, ValidationError
from plait.model.entitlement import NAME_RE
from plait.store.protocol import Transaction
from plait.store.shard import ShardStore, shard_prefix

if TYPE_CHECKING:
    from plait.server.controlplane.core import ControlPlane

log = logconfig.get("plait.controlplane.membership")


class Membership:
    def __init__(self, cp: ControlPlane) -> None:
        self.cp = cp
        #: a shard's machines: bound to its entitlements (and, for shard 0, the free
        #: ones); the others' agents are answered by their shards
        self.owned: set[str] = set()
        #: a handoff's rebuild failed: the next pass reads everything again
        self.stale = False

    def owns(self, m: int) -> bool:
        """Whether this control plane manages machine ``m`` (always, unsharded)."""
        if self.cp.config.shard is None:
            return True
        ent = self.cp.region.broker_of(m).entitlement_of(m)
        if ent is None:
            return self.cp.config.shard == 0
        return ent in self.cp.allocator.entitlements

    def check_owned(self, machine: str) -> int:
        m = self.cp.machine_index(machine)
        if not self.owns(m):
            raise TransientError(f"machine {machine} is not managed by scheduler shard "
                                 f"{self.cp.config.shard} (now): ask the front end again")
        return m

    def disown(self, name: str) -> None:
        """A machine another shard manages now: not watched here, and an agent
        long-polling its set here is answered (and sent on by the front end)."""
        self.cp.liveness.forget(name)
        self.cp.generation[name] = self.cp.generation.get(name, 0) + 1
        self.cp.gateway.waiters.notify([name])

    def track_owned(self, now: float) -> None:
        """Machines that came to this shard (claimed from the free pool, an
        entitlement moved here) are watched from now, with one heartbeat timeout for
        their agents to be heard here; those that left are not."""
        fleet = self.cp.fleet
        owned = {fleet.name(m) for m in range(len(fleet)) if self.owns(m)}
        if owned == self.owned:
            return
        for name in self.owned - owned:
            self.disown(name)
        down = {e.id[len("health-"):] for e in self.cp.region.events()
                if e.id.startswith("health-")}
        for name in owned - self.owned:
            if name in down:  # failed while another shard watched it
                self.cp.liveness.last[name] = float("-inf")
                self.cp.liveness.down.add(name)
            else:
                self.cp.liveness.watch(name, now, self.cp.config.heartbeat_timeout)
        self.owned = owned

    def follow(self, now: float) -> None:
        """What other shards changed in the region's shared records: machines that
        registered (a rebuild), bindings and cordons (adopted), events."""
        assert self.cp.shared is not None
        machines, events, registered = self.cp.shared.take()
        if registered and not all(self.cp.known(name)
                                  for name in self.cp.meta.children("/machines")):
            self.cp.persist.save(self.cp.allocator)  # nothing in memory is lost by the rebuild
            self.cp.build(now)
            return  # (the rebuild read every record)
        for name in machines:
            with contextlib.suppress(NotFound):
                self.cp.region.adopt(self.cp.fleet.index_of(name))
        for event_id in events:
            self.cp.region.adopt_event(event_id, now)

    def handoff(self, entitlement: str, to_shard: int) -> int:
        """Move ``entitlement`` to scheduler shard ``to_shard``: its records (the
        entitlement, its jobs and their tasks' state and placements) go from this
        shard's part of the store to the other's in one transaction, and this shard
        stops managing them. Its tasks are untouched. Returns how many jobs moved."""
        if self.cp.config.shard is None:
            raise ValidationError("shard", "this control plane is not sharded")
        if to_shard == self.cp.config.shard:
            raise ValidationError("shard", f"entitlement {entitlement!r} is on shard "
                                  f"{to_shard} already")
        # (the creates' lock too: no create of its jobs is stored meanwhile)
        with self.cp.lock, self.cp.creates.lock:
            self.cp.entitlement(entitlement)
            view = self.cp.store
            assert isinstance(view, ShardStore)
            there = shard_prefix(to_shard)
            record = f"/allocator/entitlements/{entitlement}"
            sync: Any = getattr(view.base, "sync", None)
            if sync is not None:
                # (ZooKeeper: read what an earlier attempt wrote, not a lagging copy of
                # the tree, or the records would be handed over twice)
                sync()
            if view.base.exists(there + record) and not view.exists(record):
                # handed over already: a call whose answer was lost (the front end asks
                # again), this shard's memory not yet rebuilt from the store
                self.cp.build(self.cp.clock())
                self.stale = False
                return 0
            self.cp.persist.save(self.cp.allocator)  # what is in memory, stored first
            for name, job in self.cp.scheduler.jobs.items():
                if job.moving_from is not None and entitlement in (job.moving_from,
                                                                   job.entitlement):
                    raise Conflict(f"entitlement {entitlement}", "no job moving in or out",
                                   f"job {name} moving from {job.moving_from} to "
                                   f"{job.entitlement}: wait for it to finish")
            # every job of the entitlement, applied or only stored (acknowledged, not
            # yet applied by the loop)
            stored = self.cp.jobs.get_many(self.cp.jobs.names())
            jobs = sorted({name for name, j in self.cp.scheduler.jobs.items()
                           if j.entitlement == entitlement}
                          | {name for name, doc in stored.items()
                             if doc.entitlement == entitlement})
            names = self.cp.region.entitlements.names
            for name, state in self.cp.allocator.jobs.items():
                ents = {names[e] for e in state.ents.values()} | {names[state.entitlement]}
                if entitlement in ents and ents != {entitlement}:
                    raise Conflict(f"entitlement {entitlement}", "no job moving in or out",
                                   f"job {name} moving between entitlements "
                                   f"{' and '.join(sorted(ents))}: wait for it to finish")
            keys = [f"/allocator/entitlements/{entitlement}"] + [
                f"/{part}/{name}" for name in jobs
                for part in ("allocator/jobs", "scheduler/jobs", "scheduler/state")]
            keys += [f"/scheduler{key}" for name in jobs
                     for key in self.cp.persist.part_keys(name)]  # (split state records)
            keys += [f"/allocator{key}" for name in jobs
                     for key in self.cp.allocator.part_keys(name)]  # (split placements)
            txn = Transaction()
            if self.cp.persist.fence is not None:  # only while this replica still leads
                txn.check(*self.cp.persist.fence)
            moving = view.get_many(keys)
            # a record of this entitlement already under the other shard's part is a
            # stale copy (the map gives the entitlement to this shard alone until the
            # move): this shard's is the one in force, and replaces it
            stale = view.base.get_many([there + key for key in moving])
            for key, (value, version) in moving.items():
                if there + key in stale:
                    txn.set(there + key, value, stale[there + key][1])
                else:
                    txn.create(there + key, value)
                txn.delete(view.prefix + key, version)
            if stale:
                log.warning("stale records replaced in the other shard's part",
                            entitlement=entitlement, shard=to_shard, keys=sorted(stale))
            try:
                view.base.commit(txn)
            except Conflict:
                if sync is not None:
                    sync()
                if not (view.base.exists(there + record) and not view.exists(record)):
                    raise
                # an earlier attempt's commit applied after all (its answer was lost):
                # the records are the other shard's; go on from the store as below
            # the records are gone: this shard must not go on from its memory of them
            for attempt in range(3):
                try:
                    self.cp.build(self.cp.clock())
                    break
                except Exception:
                    if attempt == 2:
                        self.stale = True  # rebuilt by the next pass
                        raise
                    time.sleep(0.1)
        self.cp.record("scheduler", "entitlement_moved",
                       f"{entitlement}: {len(jobs)} jobs handed to scheduler shard {to_shard}",
                       entitlement=entitlement)
        self.cp.wake.set()
        return len(jobs)

    def reload(self, entitlement: str | None = None) -> None:
        """Read this shard's records again (``entitlement`` was moved here: until it
        is seen in the store, a TransientError): the loop goes on from them; agents'
        long-polls see a new generation."""
        if self.cp.config.shard is None:
            raise ValidationError("shard", "this control plane is not sharded")
        if entitlement is not None and not NAME_RE.match(entitlement):
            raise ValidationError("entitlement", f"{entitlement!r} is not an entitlement name")
        with self.cp.lock:
            now = self.cp.clock()
            sync: Any = getattr(self.cp.store, "sync", None)
            if sync is not None:
                sync()  # (ZooKeeper: read what the handoff wrote, not a lagging copy)
            if entitlement is not None and not self.cp.store.exists(
                    f"/allocator/entitlements/{entitlement}"):
                raise TransientError(f"entitlement {entitlement!r} has not reached scheduler "
                                     f"shard {self.cp.config.shard} yet: retry")
            with contextlib.suppress(Conflict):  # (this memory is stale: the store's
                self.cp.persist.save(self.cp.allocator)  # records are read below)
            self.cp.build(now)
            self.cp.gen_base = int(time.time() * 1000)
            self.cp.generation.clear()
            self.cp.steps = 0  # the next pass reads every stored job
        self.cp.gateway.waiters.notify_all()
        self.cp.wake.set()
