"""The allocator's records, written to the store after every commit.

Layout in the ``/allocator`` namespace (records carry a schema version):

    /allocator/entitlements/{name}   the Entitlement as JSON
    /allocator/jobs/{job}            {"schema": 1, "entitlement": name,
                                      "tasks": {index: [machine, cpu, memory, disk, entitlement]}}

``load`` rebuilds the allocator over an index (whose brokers were loaded first):
the job placements come back and their resources are taken again on the index.
"""

from __future__ import annotations

import json
from typing import Any

from plait.allocator import AllocationResult, Allocator, JobState, MachineIndex, Plan
from plait.errors import NotFound
from plait.model import Entitlement, parse
from plait.store.protocol import Namespace, Store

SCHEMA = 1


class PersistentAllocator(Allocator):
    def __init__(self, index: MachineIndex, store: Store, max_attempts: int = 3) -> None:
        super().__init__(index, max_attempts)
        self.ns = Namespace(store, "/allocator")
        self._stored: dict[str, int] = {}

    def _put(self, key: str, data: bytes) -> None:
        seen = self._stored.get(key)
        if seen is None:
            try:
                self._stored[key] = self.ns.create(key, data)
                return
            except Exception:
                _, seen = self.ns.get(key)  # written before (a restart)
        self._stored[key] = self.ns.set(key, data, seen)

    def _drop(self, key: str) -> None:
        try:
            _, version = self.ns.get(key)
        except NotFound:
            return
        self.ns.delete(key, version)
        self._stored.pop(key, None)

    def define(self, entitlement: Entitlement) -> None:
        super().define(entitlement)
        if hasattr(self, "ns"):  # not during the base class's construction
            self._put(f"/entitlements/{entitlement.name}",
                      entitlement.model_dump_json().encode())

    def commit(self, plan: Plan, attempt: int = 1) -> AllocationResult:
        result = super().commit(plan, attempt)
        self._save(plan.request.job)
        return result

    def _save(self, job: str) -> None:
        state = self.jobs.get(job)
        key = f"/jobs/{job}"
        if state is None:
            self._drop(key)
            return
        names = self.region.entitlements.names
        fleet = self.index.fleet
        tasks = {str(t): [fleet.name(m), *state.units[t], names[state.ents[t]]]
                 for t, m in state.placement.items()}
        self._put(key, json.dumps({"schema": SCHEMA, "entitlement": names[state.entitlement],
                                   "tasks": tasks}, sort_keys=True).encode())

    @classmethod
    def load(cls, index: MachineIndex, store: Store) -> PersistentAllocator:
        allocator = cls(index, store)
        for name in allocator.ns.children("/entitlements"):
            value, version = allocator.ns.get(f"/entitlements/{name}")
            allocator._stored[f"/entitlements/{name}"] = version
            Allocator.define(allocator, parse(Entitlement, json.loads(value)))
        codes = allocator.region.entitlements
        fleet = index.fleet
        for job in allocator.ns.children("/jobs"):
            value, version = allocator.ns.get(f"/jobs/{job}")
            allocator._stored[f"/jobs/{job}"] = version
            data: dict[str, Any] = json.loads(value)
            if int(data.get("schema", 0)) > SCHEMA:
                raise ValueError(f"job {job}: a record of a newer schema than this plait reads")
            state = JobState(codes.code(data["entitlement"]))
            for t, (machine, cpu, mem, disk, ent) in data["tasks"].items():
                m = fleet.index_of(machine)
                task = int(t)
                state.placement[task] = m
                state.units[task] = (int(cpu), int(mem), int(disk))
                state.ents[task] = codes.code(ent)
                index.free_cpu[m] -= int(cpu)
                index.free_mem[m] -= int(mem)
                index.free_disk[m] -= int(disk)
                index.tasks[m] += 1
            allocator.jobs[job] = state
        index.changes += 1
        return allocator
