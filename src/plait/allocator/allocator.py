"""The allocator: assigns machines to entitlements and tasks to machines.

``allocate(request)`` = cache lookup, then propose/commit with optimistic
concurrency: a plan is decided against the index as it is (the snapshot), and
committed only if every machine it touches still has the room, binding and health
the plan saw; claims of free machines are compare-and-swap on the broker record,
so a shard that lost a race for a machine finds out here. On a conflict the
allocator decides again against the new state, at most ``max_attempts`` times.

Pure core: no clock, no I/O; the brokers it calls are in-memory state machines.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass
from operator import itemgetter

import numpy as np

from plait.allocator.cache import AllocationCache
from plait.allocator.index import HEALTHY, MachineIndex
from plait.allocator.loans import LoanLedger, borrowing_quota, held
from plait.allocator.placement import (
    QUOTA_REACHED,
    JobState,
    Plan,
    propose,
    releasing,
    usable,
)
from plait.allocator.policy import CompiledPolicy, compile_policy
from plait.allocator.request import AllocationRequest, AllocationResult
from plait.broker import FREE
from plait.errors import Conflict, NotFound
from plait.model.entitlement import Entitlement, Quota
from plait.model.policy import AllocationPolicy
from plait.model.resources import Resources

#: why an elastic entitlement's task waits: nothing left to borrow
NO_LOAN = ("no machine to borrow: the lenders' unused quota is all on loan, or its "
           "machines have no room left (an elastic entitlement)")


@dataclass(frozen=True, slots=True)
class EntitlementUsage:
    name: str
    machines: int
    rru: float
    quota: str


class Allocator:
    def __init__(self, index: MachineIndex, max_attempts: int = 3) -> None:
        self.index = index
        self.region = index.region
        self.max_attempts = max_attempts
        self.entitlements: dict[str, Entitlement] = {}
        #: entitlement -> its canary entitlements (``Entitlement.canary_of``)
        self.canaries: dict[str, set[str]] = {}
        #: bumped by every ``define`` (what depends on the entitlements looks again)
        self.defined = 0
        self.jobs: dict[str, JobState] = {}
        self.cache = AllocationCache()
        self.conflicts = 0
        #: elastic loans: lenders' waiting demand and machines under revoke (the
        #: scheduler keeps both; ``quota_of`` reads them for elastic entitlements)
        self.loans = LoanLedger()
        self._compiled: dict[tuple[AllocationPolicy, str, Resources], CompiledPolicy] = {}
        #: the same, keyed by the identity of the policy and resources objects (hashing
        #: those models costs more than the rest of a lookup); each entry holds the
        #: objects, so their ids cannot be reused while it is there
        self._by_id: dict[tuple[int, str, int],
                          tuple[AllocationPolicy, Resources, CompiledPolicy]] = {}

    # -- entitlements --------------------------------------------------------------------
    def define(self, entitlement: Entitlement) -> None:
        """Add or change an entitlement. A lowered quota never evicts: it only stops
        further claims until the entitlement is back under it."""
        old = self.entitlements.get(entitlement.name)
        if old is not None and old.canary_of is not None:
            self.canaries.get(old.canary_of, set()).discard(old.name)
        if entitlement.canary_of is not None:
            self.canaries.setdefault(entitlement.canary_of, set()).add(entitlement.name)
        self.entitlements[entitlement.name] = entitlement
        self.defined += 1
        self.region.entitlements.code(entitlement.name)
        self._compiled = {k: v for k, v in self._compiled.items() if k[1] != entitlement.name}
        self._by_id = {k: v for k, v in self._by_id.items() if k[1] != entitlement.name}
        self.cache.clear()  # a cached placement may no longer meet the new definition

    def in_use(self, name: str) -> list[str]:
        """What keeps entitlement ``name`` (and its canary entitlements, which go with
        it) from being removed, said: jobs placed in it, machines of it running tasks,
        machines an elastic entitlement holds on loan from it (a lender's)."""
        ent = self._entitlement(name)
        names = {name, *self._canaries(name)}
        find = self.region.entitlements.find
        codes = {c for c in (find(n) for n in names) if c is not None}
        said = [f"job {j}" for j, s in sorted(self.jobs.items()) if s.entitlement in codes]
        busy = sum(int(self.index.tasks[m]) > 0 for c in codes
                   for m in self.index.machines_of(c).tolist())
        if busy:
            said.append(f"{busy} machine{'s' if busy != 1 else ''} running its tasks")
        if ent.lends:
            said += [f"machines on loan to {e.name}" for e in self.entitlements.values()
                     if e.elastic is not None and e.name != name
                     and held(self.index, e.name) > 0]
        return said

    def undefine(self, name: str) -> list[int]:
        """Remove entitlement ``name`` and its canary entitlements (decision 103),
        which nothing may use (``in_use``: ``Conflict`` otherwise): the machines they
        hold go back to the free pool. Returns those machines."""
        used = self.in_use(name)
        if used:
            raise Conflict(f"entitlement {name}", "unused", ", ".join(used[:5]) + (
                f" and {len(used) - 5} more" if len(used) > 5 else ""))
        released: list[int] = []
        for n in [*sorted(self._canaries(name)), name]:
            code = self.region.entitlements.find(n)
            if code is not None:
                for m in sorted(self.index.machines_of(code).tolist()):
                    self.region.release(m, n, int(self.index.version[m]))
                    released.append(m)
            gone = self.entitlements.pop(n)
            if gone.canary_of is not None:
                self.canaries.get(gone.canary_of, set()).discard(n)
            self.canaries.pop(n, None)
            self._compiled = {k: v for k, v in self._compiled.items() if k[1] != n}
            self._by_id = {k: v for k, v in self._by_id.items() if k[1] != n}
        self.defined += 1
        self.index.changes += 1
        self.cache.clear()
        return released

    def quota_of(self, ent: Entitlement) -> Quota:
        """The quota a claim is checked against: the entitlement's own, or for an
        elastic one what it holds plus the loans the lenders' unused quota allows. A
        canary entitlement and the one it is a canary of share the latter's machine
        quota (decision 103): each may claim only what the other leaves."""
        if ent.elastic is not None:
            return borrowing_quota(self.index, self.entitlements, self.loans, ent)
        if ent.canary_of is not None:
            parent = self.entitlements.get(ent.canary_of)
            if parent is None or parent.quota.machines is None or ent.quota.machines is None:
                return ent.quota
            others = held(self.index, parent.name) + sum(
                held(self.index, c) for c in self._canaries(parent.name) if c != ent.name)
            return ent.quota.model_copy(update={"machines": max(0, min(
                ent.quota.machines, parent.quota.machines - others))})
        if ent.quota.machines is not None:
            canaries = self._canaries(ent.name)
            if canaries:
                return ent.quota.model_copy(update={"machines": max(
                    0, ent.quota.machines - sum(held(self.index, c) for c in canaries))})
        return ent.quota

    def _canaries(self, name: str) -> Collection[str]:
        """The canary entitlements of entitlement ``name``."""
        return self.canaries.get(name, ())

    def usage(self, name: str) -> EntitlementUsage:
        ent = self._entitlement(name)
        members = self.index.members.get(self.region.entitlements.code(name))
        n = members.size if members else 0
        rru = members.machines_rru / 1000 if members else 0.0
        return EntitlementUsage(name, n, rru, str(ent.quota))

    def machines_of(self, name: str) -> list[str]:
        code = self.region.entitlements.find(name)
        if code is None:
            return []
        return self.index.fleet.names(sorted(self.index.machines_of(code).tolist()))

    def _entitlement(self, name: str) -> Entitlement:
        ent = self.entitlements.get(name)
        if ent is None:
            raise NotFound("entitlement", name)
        return ent

    # -- allocation ------------------------------------------------------------------------
    def allocate(self, request: AllocationRequest) -> AllocationResult:
        hit = self.cache.lookup(request, self.index.gen)
        if hit is not None:
            return hit
        cp = self.compile(request)
        ent = self.entitlements[request.entitlement]
        for attempt in range(1, self.max_attempts + 1):
            plan = propose(self.index, cp, self.quota_of(ent), self.jobs.get(request.job),
                           request)
            try:
                result = self.commit(plan, attempt)
            except Conflict:
                self.conflicts += 1
                continue
            if result.complete and result.tasks:
                self.cache.store(request, result, self.index.gen)
            else:
                self.cache.drop(request.job)
            if ent.elastic is not None and result.unplaced:
                result = dataclasses.replace(result, unplaced=tuple(
                    (t, NO_LOAN if why.startswith(QUOTA_REACHED) else why)
                    for t, why in result.unplaced))
            return result
        self.cache.drop(request.job)
        plan = propose(self.index, cp, self.quota_of(ent), self.jobs.get(request.job), request)
        reason = f"gave up after {self.max_attempts} conflicting attempts"
        return AllocationResult(
            request.job, request.entitlement, (), (),
            unplaced=tuple((t, reason) for t, _ in request.tasks),
            attempts=self.max_attempts, fleet=self.index.fleet,
        )

    def compile(self, request: AllocationRequest) -> CompiledPolicy:
        policy, resources = request.policy, request.resources
        by_id = (id(policy), request.entitlement, id(resources))
        seen = self._by_id.get(by_id)
        if seen is not None and seen[0] is policy and seen[1] is resources:
            return seen[2]
        key = (policy, request.entitlement, resources)
        cp = self._compiled.get(key)
        if cp is None:
            ent = self._entitlement(request.entitlement)
            code = self.region.entitlements.code(ent.name)
            cp = self._compiled[key] = compile_policy(self.index, ent, code, policy, resources)
        if len(self._by_id) >= 4096:  # requests that build new policy objects each time
            self._by_id.clear()
        self._by_id[by_id] = (policy, resources, cp)
        return cp

    def propose(self, request: AllocationRequest) -> Plan:
        """Decide without committing (the first half of ``allocate``)."""
        cp = self.compile(request)
        return propose(self.index, cp, self.quota_of(self.entitlements[request.entitlement]),
                       self.jobs.get(request.job), request)

    def commit(self, plan: Plan, attempt: int = 1) -> AllocationResult:
        """Apply a plan if the index still agrees with what it was decided on.

        Raises ``Conflict`` (and changes nothing) when a touched machine lost the
        room, binding or health the plan relied on, or when the entitlement's quota
        no longer allows the plan's claims.
        """
        ix, req = self.index, plan.request
        ent = self.entitlements[req.entitlement]
        quota = self.quota_of(ent)
        need, floor = plan.policy.need, plan.policy.floor
        claimed = {m for m, _ in plan.claims}
        # -- verify ---------------------------------------------------------------------
        # machines: only if the index changed since the plan was decided on it (a plan
        # fits the index it was made from, so the checks could not fail)
        changed = plan.snapshot is None or plan.snapshot[0] is not ix or (
            plan.snapshot[1] != ix.changes)
        if changed:
            for m, version in plan.claims:
                if not (ix.is_free(m) and int(ix.version[m]) == version):
                    raise Conflict(f"machine {ix.fleet.name(m)}", "free", "claimed or changed")
            for t, m in plan.keep:
                if not usable(ix, plan.policy, m):
                    raise Conflict(f"machine {ix.fleet.name(m)} of task {t}", "usable",
                                   "failed, cordoned or rebound meanwhile")
        members = ix.members.get(plan.ent_code)
        gone = releasing(ix, plan.frees, plan.ent_code)
        have = (members.size if members else 0) - len(gone)
        if quota.machines is not None and plan.claims and (
                have + len(plan.claims) > quota.machines):
            raise Conflict(f"entitlement {ent.name} machines", quota.machines,
                           have + len(plan.claims))
        if ent.quota.rru is not None and plan.claims:
            rru = (members.machines_rru if members else 0) + sum(
                int(ix.total_cpu[m]) for m in claimed) - sum(int(ix.total_cpu[m]) for m in gone)
            if rru > round(ent.quota.rru * 1000):
                raise Conflict(f"entitlement {ent.name} rru", ent.quota.rru, rru / 1000)
        # one task placed (a single-task job, a replacement): checked and applied on
        # the machine's own values, without the arrays a batch of tasks is worth
        one = plan.assign[0][1] if len(plan.assign) == 1 else None
        if one is not None:
            if changed and not (
                    (one in claimed or (ix.ent[one] == plan.ent_code
                                        and ix.state[one] == HEALTHY))
                    and all(free[one] >= k + f for free, k, f in (
                        (ix.free_cpu, need[0], floor[0]), (ix.free_mem, need[1], floor[1]),
                        (ix.free_disk, need[2], floor[2])) if k or f)):
                raise Conflict(f"machine {ix.fleet.name(one)}", "room for the plan's tasks",
                               "taken meanwhile")
        elif plan.assign:
            # tasks per machine, counted in C; vectorised checks over those machines
            per_machine = Counter(map(itemgetter(1), plan.assign))
            n = len(per_machine)
            uniq = np.fromiter(per_machine, np.int64, n)
            cnt = np.fromiter(per_machine.values(), np.int64, n)
        if plan.assign and changed and one is None:
            ok = (ix.ent[uniq] == plan.ent_code) & (ix.state[uniq] == HEALTHY)
            if claimed:
                ok |= np.fromiter((m in claimed for m in per_machine), np.bool_, n)
            for free, k, f in ((ix.free_cpu, need[0], floor[0]), (ix.free_mem, need[1], floor[1]),
                               (ix.free_disk, need[2], floor[2])):
                if k or f:  # free resources are never negative: nothing to check otherwise
                    ok &= free[uniq] >= cnt * k + f
            if np.count_nonzero(ok) < n:
                bad = ix.fleet.name(int(uniq[~ok][0]))
                raise Conflict(f"machine {bad}", "room for the plan's tasks", "taken meanwhile")
        # -- claim (compare-and-swap on the broker; undo on a lost race) ------------------
        done: list[int] = []
        try:
            for m, version in plan.claims:
                self.region.claim(m, ent.name, version)
                done.append(m)
        except Conflict:
            for m in done:
                self.region.release(m, ent.name, int(ix.version[m]))
            raise
        # -- apply ----------------------------------------------------------------------------
        ix.changes += 1
        self.cache.drop(req.job)  # allocate() stores the new result if it is complete
        job = self.jobs.get(req.job)
        if job is None:
            job = self.jobs[req.job] = JobState(plan.ent_code)
        job.entitlement = plan.ent_code
        emptied: set[int] = set()
        for t, m in plan.frees:
            c, mem, d = job.units.pop(t)
            del job.placement[t]
            del job.ents[t]
            ix.free_cpu[m] += c
            ix.free_mem[m] += mem
            ix.free_disk[m] += d
            ix.remove_task(m)
            emptied.add(m)
        if one is not None:
            for free, k in zip((ix.free_cpu, ix.free_mem, ix.free_disk), need, strict=True):
                if k:
                    free[one] -= k
            ix.add_task(one)
        elif plan.assign:
            for free, k in zip((ix.free_cpu, ix.free_mem, ix.free_disk), need, strict=True):
                if k:
                    free[uniq] -= cnt * k
            ix.add_tasks(uniq, cnt)
        if plan.assign:
            job.placement.update(plan.assign)
            assigned = list(map(itemgetter(0), plan.assign))
            job.units.fill(assigned, need)
            job.ents.fill(assigned, plan.ent_code)
        released: list[int] = []
        for m in sorted(emptied):
            if ix.tasks[m] == 0 and ix.ent[m] != FREE:
                owner = self.region.entitlements.names[int(ix.ent[m])]
                self.region.release(m, owner, int(ix.version[m]))
                released.append(m)
        if not job.placement:
            del self.jobs[req.job]
        placed = sorted(plan.keep + plan.assign) if plan.keep else plan.assign
        tasks = tuple(map(itemgetter(0), placed))
        machines = tuple(map(itemgetter(1), placed))
        return AllocationResult(
            req.job, req.entitlement, tasks, machines,
            unplaced=tuple(plan.unplaced), freed=tuple(t for t, _ in plan.frees
                                                       if t not in plan.moved),
            moved=tuple(plan.moved), claimed=tuple(m for m, _ in plan.claims),
            released=tuple(released), attempts=attempt, fleet=ix.fleet,
        )

    # -- reading ----------------------------------------------------------------------------
    def placement(self, job: str) -> dict[int, str]:
        state = self.jobs.get(job)
        if state is None:
            return {}
        names = self.index.fleet.names(state.placement.values())
        return dict(zip(state.placement.keys(), names, strict=True))
