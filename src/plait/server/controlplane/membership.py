"""A scheduler shard among others (decision 43): which machines this control plane
manages, what other shards changed in the region's shared records, and the handoff of
an entitlement to another shard."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from plait import logconfig
from plait.errors import Conflict, NotFound, TransientError, ValidationError
from plait.model.entitlement import NAME_RE
from plait.store.protocol import Transaction
from plait.store.shard import ShardStore, shard_prefix

if TYPE_CHECKING:
    from plait.server.controlplane.creates import CreateCommitter
    from plait.server.controlplane.inbox import Inbox
    from plait.server.controlplane.published import Published
    from plait.server.controlplane.recorder import EventRecorder
    from plait.server.controlplane.regionstate import RegionState

log = logconfig.get("plait.controlplane.membership")


class Membership:
    def __init__(self, state: RegionState, inbox: Inbox, published: Published,
                 recorder: EventRecorder, creates: CreateCommitter,
                 rebuild: Callable[[float], None], read_all: Callable[[], None]) -> None:
        """``rebuild``: the region's state and what is built on it, from the store
        again; ``read_all``: the next pass reads every stored job."""
        self.state, self.inbox, self.published = state, inbox, published
        self.recorder, self.creates = recorder, creates
        self.rebuild, self.read_all = rebuild, read_all
        #: a shard's machines: bound to its entitlements (and, for shard 0, the free
        #: ones); the others' agents are answered by their shards
        self.owned: set[str] = set()
        #: a handoff's rebuild failed: the next pass reads everything again
        self.stale = False

    def owns(self, m: int) -> bool:
        """Whether this control plane manages machine ``m`` (always, unsharded)."""
        if self.state.config.shard is None:
            return True
        ent = self.state.region.broker_of(m).entitlement_of(m)
        if ent is None:
            return self.state.config.shard == 0
        return ent in self.state.allocator.entitlements

    def check_owned(self, machine: str) -> int:
        m = self.state.machine_index(machine)
        if not self.owns(m):
            raise TransientError(f"machine {machine} is not managed by scheduler shard "
                                 f"{self.state.config.shard} (now): ask the front end again")
        return m

    def disown(self, name: str) -> None:
        """A machine another shard manages now: not watched here, and an agent
        long-polling its set here is answered (and sent on by the front end)."""
        self.state.liveness.forget(name)
        self.published.bump(name)

    def watch(self, now: float, grace: float) -> None:
        """After a build, with real agents: each machine (this shard's) is up only
        while its agent beats; one not known yet has ``grace`` seconds to be heard (its
        agent may be starting too), one whose failure is on record is down."""
        state = self.state
        fleet, liveness = state.fleet, state.liveness
        down = {e.id[len("health-"):] for e in state.region.events()
                if e.id.startswith("health-")}
        if state.shared is not None:  # a shard watches its own machines only
            owned = {fleet.name(m) for m in range(len(fleet)) if self.owns(m)}
            for name in set(liveness.last) - owned:
                self.disown(name)
            self.owned = owned
        for m in range(len(fleet)):
            name = fleet.name(m)
            if name in liveness.last:
                continue  # (a rebuild: known already)
            if state.shared is not None and name not in self.owned:
                continue
            if name in down:
                liveness.last[name] = float("-inf")
                liveness.down.add(name)
            else:
                liveness.watch(name, now, grace)

    def track_owned(self, now: float) -> None:
        """Machines that came to this shard (claimed from the free pool, an
        entitlement moved here) are watched from now, with one heartbeat timeout for
        their agents to be heard here; those that left are not."""
        fleet = self.state.fleet
        owned = {fleet.name(m) for m in range(len(fleet)) if self.owns(m)}
        if owned == self.owned:
            return
        for name in self.owned - owned:
            self.disown(name)
        down = {e.id[len("health-"):] for e in self.state.region.events()
                if e.id.startswith("health-")}
        for name in owned - self.owned:
            if name in down:  # failed while another shard watched it
                self.state.liveness.last[name] = float("-inf")
                self.state.liveness.down.add(name)
            else:
                self.state.liveness.watch(name, now, self.state.config.heartbeat_timeout)
        self.owned = owned

    def follow(self, now: float) -> None:
        """What other shards changed in the region's shared records: machines that
        registered (a rebuild), bindings and cordons (adopted), events."""
        assert self.state.shared is not None
        machines, events, registered = self.state.shared.take()
        if registered and not all(self.state.known(name)
                                  for name in self.state.meta.children("/machines")):
            # (nothing in memory is lost by the rebuild)
            self.state.persist.save(self.state.allocator)
            self.rebuild(now)
            return  # (the rebuild read every record)
        for name in machines:
            with contextlib.suppress(NotFound):
                self.state.region.adopt(self.state.fleet.index_of(name))
        for event_id in events:
            self.state.region.adopt_event(event_id, now)

    def handoff(self, entitlement: str, to_shard: int) -> int:
        """Move ``entitlement`` to scheduler shard ``to_shard``: its records (the
        entitlement, its jobs and their tasks' state and placements) go from this
        shard's part of the store to the other's in one transaction, and this shard
        stops managing them. Its tasks are untouched. Returns how many jobs moved."""
        if self.state.config.shard is None:
            raise ValidationError("shard", "this control plane is not sharded")
        if to_shard == self.state.config.shard:
            raise ValidationError("shard", f"entitlement {entitlement!r} is on shard "
                                  f"{to_shard} already")
        # (the creates' lock too: no create of its jobs is stored meanwhile)
        with self.state.lock, self.creates.lock:
            self.state.entitlement(entitlement)
            view = self.state.store
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
                self.rebuild(self.state.clock())
                self.stale = False
                return 0
            self.state.persist.save(self.state.allocator)  # what is in memory, stored first
            for name, job in self.state.scheduler.jobs.items():
                if job.moving_from is not None and entitlement in (job.moving_from,
                                                                   job.entitlement):
                    raise Conflict(f"entitlement {entitlement}", "no job moving in or out",
                                   f"job {name} moving from {job.moving_from} to "
                                   f"{job.entitlement}: wait for it to finish")
            # every job of the entitlement, applied or only stored (acknowledged, not
            # yet applied by the loop)
            stored = self.state.jobs.get_many(self.state.jobs.names())
            jobs = sorted({name for name, j in self.state.scheduler.jobs.items()
                           if j.entitlement == entitlement}
                          | {name for name, doc in stored.items()
                             if doc.entitlement == entitlement})
            names = self.state.region.entitlements.names
            for name, state in self.state.allocator.jobs.items():
                ents = {names[e] for e in state.ents.values()} | {names[state.entitlement]}
                if entitlement in ents and ents != {entitlement}:
                    raise Conflict(f"entitlement {entitlement}", "no job moving in or out",
                                   f"job {name} moving between entitlements "
                                   f"{' and '.join(sorted(ents))}: wait for it to finish")
            keys = [f"/allocator/entitlements/{entitlement}"] + [
                f"/{part}/{name}" for name in jobs
                for part in ("allocator/jobs", "scheduler/jobs", "scheduler/state")]
            keys += [f"/scheduler{key}" for name in jobs
                     for key in self.state.persist.part_keys(name)]  # (split state records)
            keys += [f"/allocator{key}" for name in jobs
                     for key in self.state.allocator.part_keys(name)]  # (split placements)
            txn = Transaction()
            if self.state.persist.fence is not None:  # only while this replica still leads
                txn.check(*self.state.persist.fence)
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
                    self.rebuild(self.state.clock())
                    break
                except Exception:
                    if attempt == 2:
                        self.stale = True  # rebuilt by the next pass
                        raise
                    time.sleep(0.1)
        self.recorder.record("scheduler", "entitlement_moved",
                             f"{entitlement}: {len(jobs)} jobs handed to scheduler shard "
                             f"{to_shard}",
                             entitlement=entitlement)
        self.inbox.wake.set()
        return len(jobs)

    def reload(self, entitlement: str | None = None) -> None:
        """Read this shard's records again (``entitlement`` was moved here: until it
        is seen in the store, a TransientError): the loop goes on from them; agents'
        long-polls see a new generation."""
        if self.state.config.shard is None:
            raise ValidationError("shard", "this control plane is not sharded")
        if entitlement is not None and not NAME_RE.match(entitlement):
            raise ValidationError("entitlement", f"{entitlement!r} is not an entitlement name")
        with self.state.lock:
            now = self.state.clock()
            sync: Any = getattr(self.state.store, "sync", None)
            if sync is not None:
                sync()  # (ZooKeeper: read what the handoff wrote, not a lagging copy)
            if entitlement is not None and not self.state.store.exists(
                    f"/allocator/entitlements/{entitlement}"):
                raise TransientError(f"entitlement {entitlement!r} has not reached scheduler "
                                     f"shard {self.state.config.shard} yet: retry")
            with contextlib.suppress(Conflict):  # (this memory is stale: the store's
                self.state.persist.save(self.state.allocator)  # records are read below)
            self.rebuild(now)
            self.published.renumber()
            self.read_all()
        self.published.waiters.notify_all()
        self.inbox.wake.set()
