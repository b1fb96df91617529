"""The scheduler's records in the store, and the rebuild after a restart.

Layout in the ``/scheduler`` namespace (records carry a schema version):

    /scheduler/jobs/{job}    what users asked for: the versions it keeps (its last
                             ``keep_versions`` and those its tasks run, each with its
                             revision) and a log of the operations on the job (create,
                             update, resize, rollback, move, restart, resume, delete),
                             each with a sequence number.
                             Written by the front end with compare-and-swap; a write
                             that returned is an acknowledged operation.
    /scheduler/state/{job}   the scheduler's view of its tasks: version, state, machine,
                             discovery flag, the operation under way; and the last
                             operation of the log it applied. Written by the scheduler.
                             A job whose record would pass ``PART_BYTES`` keeps its
                             tasks in parts, /scheduler/state/{job}~1, ~2, ...

The scheduler follows the job records (level-triggered): ``sync`` applies every
logged operation it has not applied yet, ``save`` writes the state of the jobs
that changed, and ``load`` rebuilds a scheduler from both after a restart. Offers
and acks that were not carried out yet are not kept: the rebuilt scheduler offers
them again under new operation ids (``op_counter`` is kept, so ids never repeat).
"""

from __future__ import annotations

from typing import Any, Protocol

from plait.model.task import TaskState
from plait.persist.allocator import PersistentAllocator
from plait.persist.applylog import ControllerFor, LogApplier
from plait.persist.jobdoc import (
    ADDED_FIELDS,
    JOB_SCHEMA,
    LOG_LIMIT,
    JobDoc,
    Usage,
    new_job,
    runtime_key,
    usage_of,
)
from plait.persist.jobstore import JobStore
from plait.persist.staterecords import (
    PART_BYTES,
    PART_TASKS,
    SCHEMA,
    SPLIT_SCHEMA,
    StateRecords,
)
from plait.scheduler import Scheduler
from plait.scheduler.records import NO_TASKS, JobRecord, TaskRecord
from plait.store.protocol import Store
from plait.taskcontrol.protocol import op_from_wire

__all__ = [
    "ADDED_FIELDS", "JOB_SCHEMA", "LOG_LIMIT", "PART_BYTES", "PART_TASKS", "SCHEMA",
    "SPLIT_SCHEMA", "ControllerFor", "JobDoc", "JobStore", "PersistentScheduler", "Usage",
    "WarmCopy", "new_job", "runtime_key", "usage_of",
]

_TASK_STATES = {s.value: s for s in TaskState}


class WarmCopy(Protocol):
    """The records as a follower keeps them: ``plait.persist.warm.WarmRecords``."""

    docs: dict[str, tuple[JobDoc, int]]
    states: dict[str, tuple[bytes, int]]



def _part(part: str, name: str) -> Any:
    """An attribute of one of the parts, read and set by the name callers use."""
    return property(lambda self: getattr(getattr(self, part), name),
                    lambda self, value: setattr(getattr(self, part), name, value))


class PersistentScheduler:
    """Keeps a scheduler and the store in step: ``sync`` applies stored operations
    (``applylog.LogApplier``), ``save`` writes the state of the jobs that changed
    (``staterecords.StateRecords``); ``load`` rebuilds a scheduler from both."""

    applied = _part("applier", "applied")
    key_names = _part("applier", "key_names")
    failed = _part("applier", "failed")
    only_held = _part("applier", "only_held")
    controller_for = _part("applier", "controller_for")
    fence = _part("stored", "fence")

    def __init__(self, scheduler: Scheduler, store: Store,
                 controller_for: ControllerFor = lambda spec: None) -> None:
        self.scheduler = scheduler
        self.jobs = JobStore(store)
        self.ns = self.jobs.ns
        self.applier = LogApplier(scheduler, self.jobs, controller_for)
        self.jobs.live = self.applier.live_versions
        self.stored = StateRecords(scheduler, self.jobs, self.applier.applied)
        #: from now on the scheduler tells which jobs changed (the first save writes all)
        scheduler.changed_jobs = set(scheduler.jobs)

    # -- stored operations -> scheduler ----------------------------------------------------
    def sync(self, now: float, names: list[str] | None = None,
             docs: dict[str, JobDoc] | None = None,
             known: dict[str, JobDoc] | None = None) -> list[str]:
        """``LogApplier.sync``: the errors met."""
        return self.applier.sync(now, names, docs, known)

    # -- scheduler -> stored state ---------------------------------------------------------
    def snapshot(self, job: JobRecord) -> bytes:
        return self.stored.snapshot(job)

    def records(self, job: JobRecord, read: dict[int, dict[str, set[int]]] | None = None
                ) -> list[bytes]:
        return self.stored.records(job, read)

    def part_keys(self, name: str) -> list[str]:
        return self.stored.part_keys(name)

    def state(self, name: str) -> dict[str, Any] | None:
        return self.stored.state(name)

    def save(self, allocator: PersistentAllocator | None = None) -> int:
        """Write the state of every job that changed, drop the records of jobs whose
        deletion finished, and (given a deferring allocator) write the placements
        that changed, all in one transaction. Returns the job records written."""
        sched = self.scheduler
        changed = sched.changed_jobs
        sched.changed_jobs = set()
        try:
            written, dropped = self.stored.save(changed, allocator)
        except BaseException:
            # nothing was written: those jobs are saved on the next pass
            sched.changed_jobs |= set(sched.jobs) if changed is None else changed
            raise
        for name in dropped:
            self.applier.applied.pop(name, None)
            self.applier.key_names.pop(name, None)
        return written

    # -- rebuild ---------------------------------------------------------------------------
    @classmethod
    def load(cls, scheduler: Scheduler, store: Store, now: float,
             controller_for: ControllerFor = lambda spec: None,
             warm: WarmCopy | None = None) -> PersistentScheduler:
        """Rebuild ``scheduler`` (over an allocator already loaded) from the store, then
        apply the operations stored after the state was last written. ``warm``: the
        records as a follower keeps them (``plait.persist.warm``), current already."""
        self = cls(scheduler, store, controller_for)
        if warm is not None:
            docs = {name: doc for name, (doc, _) in warm.docs.items()}
            states = {f"/state/{name}": rec for name, rec in warm.states.items()}
        else:
            # every record in two batched reads (on ZooKeeper: pipelined, not a round
            # trip per job)
            docs = self.jobs.get_many(self.jobs.names())
            states = self.ns.get_many([f"/state/{name}" for name in docs])
        self.jobs.seed(docs)
        for doc, data in self.stored.read(docs, states):
            self.applied[doc.name] = int(data["applied"])
            self._restore(doc, data)
        self.stored.read_own()
        self.sync(now, docs=docs)
        return self
    def _restore(self, doc: JobDoc, data: dict[str, Any]) -> None:
        sched = self.scheduler
        fleet = sched.fleet
        count = int(data["versions"])
        versions = [doc.standin(v) for v in range(1, count + 1)]
        target = int(data["target"])
        booked = sched.allocator.jobs.get(doc.name)
        placement = booked.placement if booked is not None else {}
        tasks: dict[int, TaskRecord] = {}
        desired = []
        for key, row in data["tasks"].items():
            (version, state, machine, want, serving, healthy, op, costly, restart, parked,
             lost_since, healthy_since) = row[:12]
            exit_code = row[12] if len(row) > 12 else None  # (records before batch jobs)
            # (records before probe failures were timed)
            unhealthy_since, served = row[13:15] if len(row) > 14 else (None, False)
            endpoint = row[15] if len(row) > 15 else None  # (before endpoints were kept)
            index = int(key)
            m = None if machine is None else fleet.index_of(machine)
            if placement.get(index) != m:
                # the allocator's booking is the truth: a task it holds nowhere waits
                # for placement, one it holds elsewhere is placed there again
                m, state, want, serving, op = None, TaskState.PENDING.value, False, False, None
            rec = TaskRecord(index, int(version), _TASK_STATES[state], m, bool(serving),
                             bool(healthy), None if op is None else op_from_wire(op),
                             bool(costly), bool(restart), parked, lost_since, healthy_since,
                             exit_code, unhealthy_since, bool(served), endpoint)
            tasks[index] = rec
            if want:
                desired.append(index)
        # the record made whole from the stored one, then taken by the scheduler (the
        # entitlement of the version applied: a move stored since is applied by the
        # ``sync`` that follows)
        job = JobRecord(
            doc.name, versions[target - 1].entitlement, versions, target,
            self.applier.controller(doc, versions[-1]), tasks,
            deleting=bool(data["deleting"]), halted=data["halted"],
            rollout_active=bool(data["rollout_active"]),
            moving_from=data.get("moving_from"),  # (absent from records before moves)
            cause=data.get("cause"),  # (absent from records before request ids)
            rollout_failures=int(data["rollout_failures"]),
            # (none: the shared empty set records are made with)
            failed_tasks=set(data["failed_tasks"]) if data["failed_tasks"] else NO_TASKS,
            op_counter=int(data["op_counter"]),
            sequence_number=int(data["sequence_number"]),
            pins={i: v for i, v in doc.pins.items() if v != target and v <= count} or None,
            surges={int(k): int(v) for k, v in data.get("surges", {}).items()} or None)
        doc.pin(job, range(1, count + 1))
        sched.restore(job, desired)
