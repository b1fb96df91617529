"""The allocator's records, written to the store after every commit.

Layout in the ``/allocator`` namespace (records carry a schema version):

    /allocator/entitlements/{name}   the Entitlement as JSON
    /allocator/jobs/{job}            {"schema": 1, "entitlement": name,
                                      "tasks": {index: [machine, cpu, memory, disk, entitlement]}}
    /allocator/jobs/{job}~{j}        a record past ``PART_BYTES`` (a job of some 30,000
                                     tasks): {"tasks": {...}} parts j = 1..n, under a
                                     header {"schema": 2, "entitlement": name,
                                     "tasks": {}, "parts": n} (``~`` is never in a name)

``load`` rebuilds the allocator over an index (whose brokers were loaded first):
the job placements come back and their resources are taken again on the index.
Each allocation request is timed here, in the shell (the allocator is pure), for the
control plane's metrics (``sink``).
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable
from time import perf_counter
from typing import Any, Protocol

from plait import fastjson
from plait.allocator import (
    AllocationRequest,
    AllocationResult,
    Allocator,
    JobState,
    MachineIndex,
    Plan,
)
from plait.errors import Conflict, NotFound
from plait.model import Entitlement, parse
from plait.persist.parts import index_parts
from plait.store.protocol import Namespace, Store, Transaction

SCHEMA = 1
#: the schema of a job's record split into parts
SPLIT_SCHEMA = 2
#: a job's record above this size is split into parts of at most this size, under the
#: store's limit per record (one record of 32,000 tasks passed it: the pass's whole
#: transaction was refused, every pass, for every job of the region)
PART_BYTES = 800_000
#: tasks of a job past which its record is split, and tasks per part: a change to a
#: few tasks of a job of 100,000 rewrites their parts only
PART_TASKS = 2048


def _digest(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=16).digest()


class AllocationSink(Protocol):
    def allocated(self, result: AllocationResult, seconds: float) -> None:
        """An allocation request was answered with ``result`` in ``seconds``."""
        ...


class _Nobody:
    def allocated(self, result: AllocationResult, seconds: float) -> None:
        pass


class PersistentAllocator(Allocator):
    #: told of every allocation request answered and how long it took (the control
    #: plane's metrics, ``plait.metrics``); nobody unless set
    sink: AllocationSink = _Nobody()

    def __init__(self, index: MachineIndex, store: Store, max_attempts: int = 3) -> None:
        super().__init__(index, max_attempts)
        self.ns = Namespace(store, "/allocator")
        self._stored: dict[str, int] = {}
        #: per job: the parts its stored record has (0: one whole record)
        self._parts: dict[str, int] = {}
        #: jobs whose placement changed and is not written yet (None: written at once)
        self.deferred: set[str] | None = None
        #: per key of a split record, a digest of what was last written there (a
        #: part left as it was is not written again)
        self._digests: dict[str, bytes] = {}

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
        if hasattr(self, "ns"):  # stored first: a failed write changes nothing
            self._put(f"/entitlements/{entitlement.name}",
                      entitlement.model_dump_json().encode())
        super().define(entitlement)

    def undefine(self, name: str) -> list[int]:
        if hasattr(self, "ns") and not self.in_use(name):  # (removed from the store first)
            for n in [*sorted(self._canaries(name)), name]:
                self._drop(f"/entitlements/{n}")
        return super().undefine(name)

    def allocate(self, request: AllocationRequest) -> AllocationResult:
        started = perf_counter()
        result = super().allocate(request)
        self.sink.allocated(result, perf_counter() - started)
        return result

    def commit(self, plan: Plan, attempt: int = 1) -> AllocationResult:
        result = super().commit(plan, attempt)
        if self.deferred is None:
            self._save(plan.request.job)
        else:
            self.deferred.add(plan.request.job)
        return result

    def defer(self) -> None:
        """Stop writing each job's placement at its commit; ``flush_into`` adds the
        placements changed since the last flush to the caller's transaction (the
        control plane writes them with the scheduler's state, in one commit)."""
        self.deferred = set()

    def flush_into(self, txn: Transaction) -> Callable[[], None]:
        """Add the changed placements to ``txn`` (full keys); returns what to call
        once ``txn`` is committed."""
        done: list[tuple[str, int | None]] = []
        parts: dict[str, int] = {}
        digests: dict[str, bytes | None] = {}
        for job in sorted(self.deferred or ()):
            records = self._records(job)
            split = len(records) > 1
            for key, data in self._keyed(job, records):
                seen = self._stored.get(key)
                if data is None:
                    digests[key] = None
                    if seen is not None:
                        txn.delete(self.ns.prefix + key, seen)
                        done.append((key, None))
                    continue
                digest = _digest(data) if split else None
                digests[key] = digest
                if seen is None:
                    txn.create(self.ns.prefix + key, data)
                    done.append((key, 0))
                elif digest is None or self._digests.get(key) != digest:
                    txn.set(self.ns.prefix + key, data, seen)
                    done.append((key, seen + 1))
            parts[job] = len(records) - 1

        def committed() -> None:
            for key, version in done:
                if version is None:
                    self._stored.pop(key, None)
                else:
                    self._stored[key] = version
            for key, digest in digests.items():  # (only a split record's keys are kept)
                if digest is None:
                    self._digests.pop(key, None)
                else:
                    self._digests[key] = digest
            for job, n in parts.items():
                if n > 0:
                    self._parts[job] = n
                else:
                    self._parts.pop(job, None)
            if self.deferred is not None:
                self.deferred.clear()
        return committed

    def part_keys(self, job: str) -> list[str]:
        """The keys of the parts of the job's stored record (none when it is whole)."""
        return [f"/jobs/{job}~{j}" for j in range(1, self._parts.get(job, 0) + 1)]

    def _keyed(self, job: str, records: list[bytes]) -> list[tuple[str, bytes | None]]:
        """Each key of the job's record and what it holds now: the whole record or its
        header, its parts, and None for a key to delete (parts it no longer needs, or
        every key of a job that has no record)."""
        n = max(self._parts.get(job, 0), len(records) - 1)
        keys = [f"/jobs/{job}"] + [f"/jobs/{job}~{j}" for j in range(1, n + 1)]
        return [(key, records[i] if i < len(records) else None) for i, key in enumerate(keys)]

    def _records(self, job: str) -> list[bytes]:
        """The job's record (none for a job with no placement), or for a job of more
        than ``PART_TASKS`` tasks or past ``PART_BYTES``, its header and parts
        (``PART_TASKS`` tasks by index each, split further past ``PART_BYTES``)."""
        state = self.jobs.get(job)
        if state is None:
            return []
        names = self.region.entitlements.names
        machine = functools.cache(self.index.fleet.name)  # (a name made once per machine)
        units, ents = state.units, state.ents
        tasks = {str(t): [machine(m), *units[t], names[ents[t]]]
                 for t, m in state.placement.items()}
        entitlement = names[state.entitlement]
        if len(tasks) <= PART_TASKS:
            whole = fastjson.dumps({"schema": SCHEMA, "entitlement": entitlement,
                                    "tasks": tasks}, sort_keys=True)
            if len(whole) <= PART_BYTES:
                return [whole]
        parts = index_parts(state.placement, tasks, PART_TASKS, PART_BYTES)
        header = fastjson.dumps({"schema": SPLIT_SCHEMA, "entitlement": entitlement,
                                 "tasks": {}, "parts": len(parts)}, sort_keys=True)
        return [header, *parts]

    def _save(self, job: str) -> None:
        records = self._records(job)
        for key, data in self._keyed(job, records):
            self._digests.pop(key, None)  # (written whatever it holds)
            if data is None:
                self._drop(key)
            else:
                self._put(key, data)
        if len(records) > 1:
            self._parts[job] = len(records) - 1
        else:
            self._parts.pop(job, None)

    @classmethod
    def load(cls, index: MachineIndex, store: Store,
             shared_pool: bool = False) -> PersistentAllocator:
        """``shared_pool``: other allocators (scheduler shards) hold the region's other
        entitlements; machines bound to those are theirs, never released here."""
        allocator = cls(index, store)
        for name in allocator.ns.children("/entitlements"):
            value, version = allocator.ns.get(f"/entitlements/{name}")
            allocator._stored[f"/entitlements/{name}"] = version
            Allocator.define(allocator, parse(Entitlement, json.loads(value)))
        codes = allocator.region.entitlements
        fleet = index.fleet
        records: list[tuple[str, dict[str, Any]]] = []
        for job in allocator.ns.children("/jobs"):
            if "~" in job:
                continue  # (a part: read with its header)
            value, version = allocator.ns.get(f"/jobs/{job}")
            allocator._stored[f"/jobs/{job}"] = version
            data: dict[str, Any] = fastjson.loads(value)
            if int(data.get("schema", 0)) > SPLIT_SCHEMA:
                raise ValueError(f"job {job}: a record of a newer schema than this plait reads")
            for j in range(1, int(data.get("parts", 0)) + 1):
                value, version = allocator.ns.get(f"/jobs/{job}~{j}")
                allocator._stored[f"/jobs/{job}~{j}"] = version
                data["tasks"].update(fastjson.loads(value)["tasks"])
                allocator._parts[job] = j
            records.append((job, data))
        allocator._release_unused({(fleet.index_of(machine), ent) for _, data in records
                                   for machine, *_, ent in data["tasks"].values()},
                                  shared_pool)
        for job, data in records:
            state = JobState(codes.code(data["entitlement"]))
            for t, (machine, cpu, mem, disk, ent) in data["tasks"].items():
                m = fleet.index_of(machine)
                task = int(t)
                if not allocator._bound(m, ent):
                    continue  # its machine went to another entitlement: placed again
                state.placement[task] = m
                state.units[task] = (int(cpu), int(mem), int(disk))
                state.ents[task] = codes.code(ent)
                index.free_cpu[m] -= int(cpu)
                index.free_mem[m] -= int(mem)
                index.free_disk[m] -= int(disk)
                index.add_task(m)
            allocator.jobs[job] = state
        index.changes += 1
        return allocator

    # -- repair after a crash -------------------------------------------------------------
    # A machine's binding is written when it is claimed or released, the placements at
    # the end of the pass: a crash in between leaves a placement on a machine its
    # entitlement no longer holds, or a machine bound with no tasks. ``load`` mends both.
    def _bound(self, m: int, entitlement: str) -> bool:
        """Is machine ``m`` bound to ``entitlement`` (claiming it if it is free)?"""
        region = self.region
        bound = region.broker_of(m).entitlement_of(m)
        if bound == entitlement:
            return True
        if bound is not None:
            return False
        try:
            region.claim(m, entitlement, region.version(m))
        except Conflict:
            return False
        return True

    def _release_unused(self, used: set[tuple[int, str]], shared_pool: bool = False) -> None:
        """Machines bound to an entitlement that no stored placement of it uses go back
        to the free pool (the allocator releases emptied machines at once, so only a
        crash leaves them). With a shared pool, only this allocator's entitlements'."""
        region, index = self.region, self.index
        names = region.entitlements.names
        for code, members in list(index.members.items()):
            if shared_pool and names[code] not in self.entitlements:
                continue  # another shard's
            for m in members.ids.tolist():
                if (m, names[code]) not in used:
                    region.release(m, names[code], region.version(m))
