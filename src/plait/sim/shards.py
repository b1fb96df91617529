"""A sharded region in the simulator: scheduler shards over one region-wide machine
index (DESIGN.md "Agents and the control plane", "Scale targets").

```
              entitlement -> shard map (least load first)
             /                 |                  \\
   shard 0: Scheduler    shard 1: Scheduler  ...  shard N-1: Scheduler
            Allocator             Allocator                Allocator     (1:1)
                 \\                    |                    /
                  one MachineIndex (columnar, region-wide)
                                  |  change notifications
                     Region: one Resource Broker per DC (records, free pool)
```

Every shard's allocator works on the member sets of its own entitlements plus the
shared free pool. A machine moves from the free pool to an entitlement through the
allocator's one claim path: verify at commit that the index still has it free, then
a compare-and-swap on its broker record. A shard whose plan names a machine another
shard took meanwhile gets a ``Conflict`` and decides again, so no machine is ever
bound twice. The simulator runs shards one after the other, but nothing here relies
on it: the check is the same one real shards would race through.

Load, for the entitlement -> shard map (the front end's), is machines: an
entitlement weighs its quota in machines (an RRU quota the machines of the region's
mean size it amounts to), a shard the sum of its entitlements'.

A shell, like ``Simulation``: time is passed in, nothing here reads a clock.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from plait.allocator import Allocator
from plait.broker import FREE
from plait.errors import NotFound, ValidationError
from plait.model.entitlement import Entitlement, lends_or_borrows, place_on_shard, shard_weight
from plait.model.job import JobSpec
from plait.model.topology import Fleet
from plait.scheduler import JobRecord, Phase, Scheduler, SchedulerConfig, TaskStatus
from plait.scheduler.wiring import wire_shards


@dataclass(eq=False)
class Shard:
    """One scheduler shard and its allocator."""

    number: int
    scheduler: Scheduler
    #: the entitlements this shard owns, in the order they were given to it
    entitlements: list[str] = field(default_factory=list)
    #: machines its entitlements' quotas allow (the load the shard map balances)
    load: int = 0

    @property
    def allocator(self) -> Allocator:
        return self.scheduler.allocator

    @property
    def tasks(self) -> int:
        return sum(len(job.tasks) for job in self.scheduler.jobs.values())


class ShardedRegion:
    def __init__(self, fleet: Fleet, shards: int, config: SchedulerConfig | None = None,
                 now: float = 0.0) -> None:
        if shards < 1:
            raise ValidationError("shards", "a region needs at least one shard")
        self.fleet = fleet
        #: the one region-wide index every shard's allocator reads and writes
        self.region, self.index, schedulers = wire_shards(fleet, shards, config, now)
        self.shards = [Shard(k, scheduler) for k, scheduler in enumerate(schedulers)]
        #: entitlement -> shard number
        self.shard_map: dict[str, int] = {}
        self._mean_rru = max(1, int(fleet.cpu.sum(dtype=np.int64)) // len(fleet))

    # -- entitlements ---------------------------------------------------------------------
    def weight(self, entitlement: Entitlement) -> int:
        """An entitlement's load: its quota in machines (``shard_weight``)."""
        return shard_weight(entitlement.quota, self._mean_rru)

    def define(self, entitlement: Entitlement) -> Shard:
        """Add an entitlement to the least-loaded shard (the lowest number on a tie;
        one that lends or borrows to the shard of the others: ``place_on_shard``, the
        front end's rule), or change one where it already is."""
        name = entitlement.name
        known = self.shard_map.get(name)
        if known is not None:
            shard = self.shards[known]
            old = shard.allocator.entitlements[name]
            shard.load -= self.weight(old)
        else:
            shard = self.shards[place_on_shard(
                {s.number: s.load for s in self.shards}, lends_or_borrows(entitlement),
                {n: k for n, k in self.shard_map.items()
                 if lends_or_borrows(self.shards[k].allocator.entitlements[n])})]
            self.shard_map[name] = shard.number
            shard.entitlements.append(name)
        shard.load += self.weight(entitlement)
        shard.allocator.define(entitlement)
        return shard

    def define_all(self, entitlements: Iterable[Entitlement]) -> None:
        """Many entitlements at once, largest first: each still goes to the least
        loaded shard, and the most loaded shard ends within one entitlement of the
        mean (less when the largest are few)."""
        for ent in sorted(entitlements, key=lambda e: (-self.weight(e), e.name)):
            self.define(ent)

    def shard_of(self, entitlement: str) -> Shard:
        number = self.shard_map.get(entitlement)
        if number is None:
            raise NotFound("entitlement", entitlement)
        return self.shards[number]

    # -- jobs -----------------------------------------------------------------------------
    def create_job(self, spec: JobSpec, now: float) -> JobRecord:
        """Route the job to the shard that owns its entitlement."""
        return self.shard_of(spec.entitlement).scheduler.create_job(spec, now)

    def job(self, name: str) -> JobRecord:
        for shard in self.shards:
            found = shard.scheduler.jobs.get(name)
            if found is not None:
                return found
        raise NotFound("job", name)

    # -- the clock ------------------------------------------------------------------------
    def tick(self, now: float) -> None:
        """Every shard reconciles, one after the other."""
        self.region.tick(now)
        for shard in self.shards:
            shard.scheduler.tick(now)

    def agents_report_running(self, now: float, shards: Iterable[Shard] | None = None) -> int:
        """Stand-in agents: every machine with a desired set reports each task of it
        running and healthy (what real agents report once they started them).
        Returns the number of tasks reported."""
        names = self.fleet.name
        reported = 0
        for shard in self.shards if shards is None else shards:
            sched = shard.scheduler
            for m, desired in sched.desired.items():
                if not desired:
                    continue
                statuses = [TaskStatus(a.job, a.index, a.revision, Phase.RUNNING)
                            for a in desired.values()]
                sched.report(names(m), statuses, now)
                reported += len(statuses)
            sched.take_touched()  # (the agents have pulled their sets)
        return reported

    # -- reading --------------------------------------------------------------------------
    @property
    def tasks(self) -> int:
        return sum(shard.tasks for shard in self.shards)

    def machines_of_shard(self, shard: Shard) -> int:
        """Machines bound to the shard's entitlements."""
        codes = self.region.entitlements
        return sum(len(self.index.machines_of(c)) for c in (
            codes.find(name) for name in shard.entitlements) if c is not None)

    def audit(self) -> list[str]:
        """What breaks the sharding invariants, in words (empty when all hold):

        * every task a shard placed sits on a machine bound to that task's
          entitlement, which the shard owns;
        * the index's binding of every machine is its broker record's, and no
          machine is in the member sets of two entitlements;
        * the shared index's task count per machine is the sum of what every
          shard's allocator placed there.
        """
        ix = self.index
        problems: list[str] = []
        codes = self.region.entitlements
        counted = np.zeros(len(self.fleet), np.int64)
        for shard in self.shards:
            owned = {codes.code(name) for name in shard.entitlements}
            for name, state in shard.allocator.jobs.items():
                if not state.placement:
                    continue
                machines = np.fromiter(state.placement.values(), np.int64,
                                       len(state.placement))
                ents = np.fromiter(state.ents.values(), np.int64, len(state.ents))
                np.add.at(counted, machines, 1)
                bound = ix.ent[machines]
                if not (bound == ents).all():
                    problems.append(f"shard {shard.number}: job {name} has a task on a machine "
                                    "outside its entitlement")
                if not set(np.unique(bound).tolist()) <= owned:
                    problems.append(f"shard {shard.number}: job {name} has a task on a machine "
                                    "of another shard's entitlement")
        if not (counted == ix.tasks).all():
            problems.append("the index's task counts differ from the shards' placements")
        for broker in self.region.brokers.values():
            if not (ix.ent[broker.machines] == broker.entitlement_codes()).all():
                problems.append(f"the index's bindings differ from broker {broker.dc}'s records")
        members = np.concatenate([m.ids for m in ix.members.values()] or [np.empty(0, np.int32)])
        if np.unique(members).size != members.size:
            problems.append("a machine is in two entitlements' member sets")
        if members.size != int(np.count_nonzero(ix.ent != FREE)):
            problems.append("the member sets differ from the bound machines")
        return problems
