"""The scheduler's view of its tasks as stored (``/scheduler/state/{job}``, split into
parts for a large job) and its own records (``/scheduler/loans``, ``/rolls``):
``StateRecords`` makes them from the scheduler, writes those that changed, and
keeps what it last wrote (see ``plait.persist.scheduler`` for the layout)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from plait import fastjson
from plait.errors import NotFound, ValidationError
from plait.model.task import TaskState
from plait.persist.allocator import PersistentAllocator
from plait.persist.jobdoc import JobDoc
from plait.persist.jobstore import JobStore
from plait.persist.parts import index_parts
from plait.scheduler import Scheduler
from plait.scheduler.machinesets import DesiredSet
from plait.scheduler.records import SEQUENCE_BLOCK, JobRecord, TaskRecord
from plait.store.protocol import Transaction
from plait.taskcontrol.protocol import (
    op_to_wire,
)

SCHEMA = 1
#: the schema of a state record split into parts (``PersistentScheduler.records``)
SPLIT_SCHEMA = 2
#: a state record above this size is split: its tasks go into parts of at most this
#: size (``/state/{job}~1``, ``~2``...: ``~`` is never in a job's name), under the
#: store's limit per record
PART_BYTES = 800_000
#: tasks of a job past which its state record is split, and tasks per part
PART_TASKS = 2048
#: tasks in a machine's desired set past which a save reads it whole, once, by job
#: (a look-up per task searches the set in C; a read goes over it once in Python)
_READ_SET_AFTER = 16

_TASK_STATES = {s.value: s for s in TaskState}


def _task_state(job: JobRecord, rec: TaskRecord, desired: bool, fleet_name: Callable[[int], str]
                ) -> list[Any]:
    if rec.apart is None:  # (the fields kept apart all at their defaults)
        return [rec.spec_version, rec.state.value,
                None if rec.machine is None else fleet_name(rec.machine), desired,
                rec.serving, rec.healthy, None if rec.op is None else op_to_wire(rec.op),
                rec.op_costly, rec.restart, None, None, rec.healthy_since, None, None, False,
                rec.endpoint]
    return [rec.spec_version, rec.state.value,
            None if rec.machine is None else fleet_name(rec.machine), desired, rec.serving,
            rec.healthy, None if rec.op is None else op_to_wire(rec.op), rec.op_costly,
            rec.restart, rec.parked, rec.lost_since, rec.healthy_since, rec.exit_code,
            rec.unhealthy_since, rec.served, rec.endpoint]


class StateRecords:
    def __init__(self, scheduler: Scheduler, jobs: JobStore, applied: dict[str, int]) -> None:
        self.scheduler = scheduler
        self.jobs = jobs
        self.ns = jobs.ns
        #: per job: the last logged operation applied (the log follower's, read here)
        self.applied = applied
        #: per job: (stored version, bytes) of its state record
        self._saved: dict[str, tuple[int, bytes]] = {}
        #: per job whose state record is split: how many parts it has
        self._parts: dict[str, int] = {}
        #: (key, version) every save checks: the election's fence of the replica that
        #: leads (``Election.fence``), or None
        self.fence: tuple[str, int] | None = None
        #: (stored version, bytes) of the scheduler's own records, kept across a
        #: takeover: ``loans``, when each borrower's revokes of its reclaim window began
        #: (``Scheduler.revoke_starts``: a new leader keeps to the published rate), and
        #: ``rolls``, the machines a profile roll cordoned (``roll_cordoned``: a new
        #: leader lifts those, and never an operator's cordon)
        self._own: dict[str, tuple[int, bytes]] = {}

    def snapshot(self, job: JobRecord) -> bytes:
        """The job's state as one record (see ``records``)."""
        return self._whole(job)
    def records(self, job: JobRecord, read: dict[int, dict[str, set[int]]] | None = None
                ) -> list[bytes]:
        """The job's state as the records that store it: one, or for a job of more
        than ``PART_TASKS`` tasks or whose record would pass ``PART_BYTES``, a header
        (every field but the tasks, the number of parts and the versions its tasks
        run) and parts holding the tasks, ``PART_TASKS`` by index each (a part past
        ``PART_BYTES`` split further). A pass that changes a few tasks of a big job
        rewrites their parts only, and nothing is made twice: a job of 100,000 tasks
        is saved at every pass that changes it, for as long as it is deleted."""
        fields = self._fields(job)
        rows = self._rows(job, read)
        if len(rows) <= PART_TASKS:
            whole = fastjson.dumps({**fields, "tasks": rows}, sort_keys=True)
            if len(whole) <= PART_BYTES:
                return [whole]
        parts = index_parts(job.tasks, rows, PART_TASKS, PART_BYTES)
        header = {**fields, "schema": SPLIT_SCHEMA, "tasks": {}, "parts": len(parts),
                  "run": sorted({int(row[0]) for row in rows.values()})}
        return [fastjson.dumps(header, sort_keys=True), *parts]
    def _whole(self, job: JobRecord) -> bytes:
        return fastjson.dumps({**self._fields(job), "tasks": self._rows(job)},
                              sort_keys=True)
    def _rows(self, job: JobRecord, read: dict[int, dict[str, set[int]]] | None = None
              ) -> dict[str, list[Any]]:
        """Each task's row, by its index (as a string). ``read``: machines' desired
        sets read whole, by job, kept by the caller for the other jobs it writes."""
        sched = self.scheduler
        fleet_name = sched.fleet.name
        names: dict[int, str] = {}

        def name(m: int) -> str:  # (made once per machine of the job; a closure and a
            got = names.get(m)    # dict cost a job of one task less than a cache would)
            if got is None:
                got = names[m] = fleet_name(m)
            return got
        tasks = {}
        # whether each task is in its machine's desired set: a search in C of a short
        # set; a large one (hundreds of small tasks, of this job or of many) is read
        # whole once, by job, for every job the save writes (a job of 40 tasks over
        # 40 machines of thousands of other jobs' tasks: a search per task made the
        # job's list of each set, and reading each set for each job cost as much)
        sets, nothing = sched.desired, DesiredSet()
        if read is None:
            read = {}
        for index, rec in job.tasks.items():
            m = rec.machine
            desired = False
            if m is not None:
                have = sets.get(m, nothing)
                if len(have) <= _READ_SET_AFTER:
                    desired = job.ref(index) in have
                else:
                    jobs = read.get(m)
                    if jobs is None:
                        jobs = read[m] = have.by_job()
                    desired = index in jobs.get(job.name, ())
            tasks[str(index)] = _task_state(job, rec, desired, name)
        return tasks
    def _fields(self, job: JobRecord) -> dict[str, Any]:
        """Every field of the job's state record but its tasks."""
        return {
            "schema": SCHEMA, "applied": self.applied.get(job.name, 0),
            "versions": len(job.versions), "target": job.target, "deleting": job.deleting,
            "halted": job.halted, "rollout_active": job.rollout_active,
            "moving_from": job.moving_from, "cause": job.cause,
            "rollout_failures": job.rollout_failures, "failed_tasks": sorted(job.failed_tasks),
            "op_counter": job.op_counter,
            **({"surges": {str(k): v for k, v in sorted(job.surges.items())}}
               if job.surges else {}),
            # a block reserved ahead (records.SEQUENCE_BLOCK)
            "sequence_number": -(-job.sequence_number // SEQUENCE_BLOCK) * SEQUENCE_BLOCK,
        }
    def save(self, changed: set[str] | None, allocator: PersistentAllocator | None
             ) -> tuple[int, list[str]]:
        """Write the state of the jobs ``changed`` (None: every job), drop the records of
        jobs whose deletion finished, write the scheduler's own records and (given a
        deferring allocator) the placements that changed, all in one transaction.
        Returns the job records written and the jobs whose records were dropped."""
        sched = self.scheduler
        names = sched.jobs.keys() if changed is None else changed
        txn = Transaction()
        p = self.ns.prefix
        #: by key (a job's name, or a part's ``name~j``): what is written, None: deleted
        pending: dict[str, bytes | None] = {}
        parts: dict[str, int] = {}
        written = 0
        read: dict[int, dict[str, set[int]]] = {}  # (large desired sets, read once)
        for name in sorted(names):
            job = sched.jobs.get(name)
            if job is None:
                continue
            records = self.records(job, read)
            keys = [name] + [f"{name}~{j}" for j in range(1, len(records))]
            touched = False
            for key, data in zip(keys, records, strict=True):
                saved = self._saved.get(key)
                if saved is not None and saved[1] == data:
                    continue
                if saved is None:
                    txn.create(f"{p}/state/{key}", data)
                else:
                    txn.set(f"{p}/state/{key}", data, saved[0])
                pending[key] = data
                touched = True
            for j in range(len(records), self._parts.get(name, 0) + 1):
                saved = self._saved.get(f"{name}~{j}")  # (parts it no longer needs)
                if j and saved is not None:
                    txn.delete(f"{p}/state/{name}~{j}", saved[0])
                    pending[f"{name}~{j}"] = None
                    touched = True
            parts[name] = len(records) - 1
            written += touched
        gone = [n for n in self.applied if n not in sched.jobs] if changed is None else [
            n for n in changed if n not in sched.jobs and n in self.applied]
        for name in gone:
            # the deletion finished: both records go (the state's parts too)
            for key in [name] + [f"{name}~{j}" for j in range(1, self._parts.get(name, 0) + 1)]:
                saved = self._saved.get(key)
                if saved is not None:
                    txn.delete(f"{p}/state/{key}", saved[0])
                pending[key] = None
            try:
                _, version = self.ns.get(f"/jobs/{name}")
                txn.delete(f"{p}/jobs/{name}", version)
            except NotFound:
                pass
            parts[name] = -1
            written += 1
        own: dict[str, bytes] = {}
        for key, data in (
                ("loans", fastjson.dumps({b: sorted(ts) for b, ts in
                                          sched.revoke_starts.items() if ts}, sort_keys=True)),
                ("rolls", fastjson.dumps({"cordoned": sorted(
                    sched.fleet.name(m) for m in sched.roll_cordoned)}))):
            had = self._own.get(key)
            if had is None and data in (b"{}", b'{"cordoned":[]}'):
                continue
            if had is None:
                txn.create(f"{p}/{key}", data)
            elif had[1] != data:
                txn.set(f"{p}/{key}", data, had[0])
            else:
                continue
            own[key] = data
        placed = allocator.flush_into(txn) if allocator is not None else None
        if not txn.ops:
            return 0, []
        if self.fence is not None:  # applied only while this replica still leads
            txn.check(*self.fence)
        held = {name: self.jobs.usage.get(name) for name in gone}
        self.ns.store.commit(txn)
        if held:
            self.jobs.forget(held)
        for key, data in own.items():
            had = self._own.get(key)
            self._own[key] = (0 if had is None else had[0] + 1, data)
        if placed is not None:
            placed()
        for key, stored in pending.items():
            if stored is None:
                self._saved.pop(key, None)
            else:
                saved = self._saved.get(key)
                self._saved[key] = (0 if saved is None else saved[0] + 1, stored)
        dropped = []
        for name, count in parts.items():
            if count < 0:  # (deleted)
                self._parts.pop(name, None)
                dropped.append(name)
            elif count:
                self._parts[name] = count
            else:
                self._parts.pop(name, None)
        return written, dropped
    def part_keys(self, name: str) -> list[str]:
        """The keys (under the namespace) of the parts of the job's split state record,
        as last written."""
        return [f"/state/{name}~{j}" for j in range(1, self._parts.get(name, 0) + 1)]
    def state(self, name: str) -> dict[str, Any] | None:
        """The job's state as last written (its parts' tasks merged in)."""
        saved = self._saved.get(name)
        if saved is None:
            return None
        data = dict(fastjson.loads(saved[1]))
        for j in range(1, self._parts.get(name, 0) + 1):
            part = self._saved.get(f"{name}~{j}")
            if part is not None:
                data["tasks"].update(fastjson.loads(part[1])["tasks"])
        return data

    # -- reading them back -----------------------------------------------------------------
    def read(self, docs: dict[str, JobDoc], states: dict[str, tuple[bytes, int]]
             ) -> Iterator[tuple[JobDoc, dict[str, Any]]]:
        """Each stored job's state record (its parts' tasks merged in), kept as last
        written; jobs never applied have none."""
        for name, doc in docs.items():
            try:
                value, version = states[f"/state/{name}"]
            except KeyError:
                continue  # never applied: sync creates it
            data = fastjson.loads(value)
            if int(data.get("schema", 1)) > SPLIT_SCHEMA:
                raise ValidationError("schema", f"state record of job {name} has schema "
                                      f"{data['schema']}, newer than this plait "
                                      f"({SPLIT_SCHEMA})")
            self._saved[name] = (version, value)
            count = int(data.get("parts", 0))
            if count:  # a split record: its tasks are in its parts
                keys = [f"/state/{name}~{j}" for j in range(1, count + 1)]
                missing = [k for k in keys if k not in states]
                found = {**{k: states[k] for k in keys if k in states},
                         **(self.ns.get_many(missing) if missing else {})}
                for j, key in enumerate(keys, 1):
                    if key not in found:
                        raise ValidationError("state", f"state record of job {name} lacks "
                                              f"part {j} of {count}")
                    part, part_version = found[key]
                    self._saved[f"{name}~{j}"] = (part_version, part)
                    data["tasks"].update(fastjson.loads(part)["tasks"])
                self._parts[name] = count
            yield doc, data

    def read_own(self) -> None:
        """The scheduler's own records, back into the scheduler."""
        scheduler = self.scheduler
        for own_key, (own_value, own_version) in self.ns.get_many(
                ["/loans", "/rolls"]).items():
            self._own[own_key.rsplit("/", 1)[1]] = (own_version, own_value)
            kept = fastjson.loads(own_value)
            if own_key.endswith("/loans"):
                scheduler.revoke_starts = {str(b): [float(t) for t in ts]
                                           for b, ts in kept.items()}
            else:
                for machine in kept.get("cordoned", ()):
                    with contextlib.suppress(NotFound):  # (a machine gone since)
                        scheduler.roll_cordoned.add(scheduler.fleet.index_of(machine))
