"""Limits per owner on jobs and tasks, and the jobs no quota could ever hold.

An owner (the name its tokens and entitlements carry) may hold at most so many jobs
and so many tasks in all its entitlements: ``ControlPlaneConfig.owner_max_jobs`` and
``owner_max_tasks`` (``plait serve --owner-max-jobs/--owner-max-tasks``; 1,000 and
50,000 by default), or what an admin set for it (``PUT /v1/owners/{owner}/limits``,
``plait owner limits set``), stored at ``/owners/limits/{owner}``. A job's task count
counts from its create until its deletion has finished.

Every write of a job record that changes what it holds (a create, an update, a
resize, a rollback, a move: the API's, a sizing intent's, the autoscaler's) is
checked by ``admit`` before it is written (``JobStore.reserve``), and refused (422,
naming the limit) when it would take the owner over a limit it is under, or further
over one it is over already (an admin lowered it: what it holds stays, it only cannot
grow); nothing of a refused write is stored. The same check refuses (422, naming the
quota) a job whose tasks its entitlement's quota could never hold at once:

* an RRU quota: the tasks' CPU in all (``task_count`` x ``resources.cpu``) above it;
* a machines quota: the tasks' CPU, memory or disk in all above that of the quota's
  count of the region's largest machines (tasks stack on a machine). With no machine
  known yet, or a task larger than every machine (the job is stored and waits for
  such machines to join, as the allocator says), nothing is refused.

A job over its quota only for now (machines busy, a quota lowered since) is taken,
and its tasks wait, as before.
"""

from __future__ import annotations

import json
import threading
import time
from typing import TYPE_CHECKING, Any

import pydantic

from plait.errors import NotFound, ValidationError
from plait.model.base import Value
from plait.model.entitlement import check_name
from plait.model.resources import CPU_UNITS_PER_RRU, Resources
from plait.store.protocol import Namespace

if TYPE_CHECKING:
    from plait.persist.scheduler import Usage
    from plait.server.controlplane.recorder import EventRecorder
    from plait.server.controlplane.regionstate import RegionState

#: the stored limits are read again this often (another replica's or shard's writes)
REFRESH = 5.0


class LimitsBody(Value):
    """What ``PUT /v1/owners/{owner}/limits`` takes: each limit, or null for the
    region's default."""

    jobs: int | None = pydantic.Field(default=None, ge=0, le=10_000_000)
    tasks: int | None = pydantic.Field(default=None, ge=0, le=1_000_000_000)


def never_fits(quota_machines: int | None, quota_rru: float | None, tasks: int,
               need: Resources, largest: tuple[int, int, int] | None) -> str | None:
    """Why ``tasks`` tasks of ``need`` could never all run in a quota (None: they
    could): see the module's rules. ``largest``: the region's largest machine's cpu,
    memory and disk (index units), each the largest of any machine; None: no machine."""
    if tasks <= 0:
        return None
    if quota_rru is not None:
        total = tasks * need.cpu
        if total > quota_rru + 1e-9:
            return (f"its {tasks:,} tasks need {total:,.6g} RRU in all, above the "
                    f"quota of {quota_rru:g} RRU")
        return None
    if quota_machines is None or largest is None:
        return None
    cpu, memory, disk = need.to_units()
    if cpu > largest[0] or memory > largest[1] or disk > largest[2]:
        return None  # no machine holds one yet: it waits for one (the allocator says so)
    for what, each, most, unit in (("CPU", cpu, largest[0], CPU_UNITS_PER_RRU),
                                   ("memory", memory, largest[1], 1024),
                                   ("disk", disk, largest[2], 1024)):
        if tasks * each > quota_machines * most:
            given = "RRU" if what == "CPU" else "GB"
            return (f"its {tasks:,} tasks need {tasks * each / unit:,.6g} {given} of "
                    f"{what} in all, above what {quota_machines:,} of the region's "
                    f"largest machines hold ({quota_machines * most / unit:,.6g} {given})")
    return None


class Owners:
    def __init__(self, state: RegionState, recorder: EventRecorder) -> None:
        self.state, self.recorder = state, recorder
        self.ns = Namespace(state.store, "/owners")
        self._lock = threading.Lock()
        #: the limits set per owner: {"jobs": n | None, "tasks": n | None}
        self._set: dict[str, dict[str, int | None]] = {}
        self._read_at = float("-inf")
        #: owner -> its entitlements (owners never change), and the entitlements
        #: dict it was made from
        self._index: tuple[int, dict[str, list[str]]] = (-1, {})
        #: (fleet, its largest machine's cpu, memory, disk)
        self._largest: tuple[object, tuple[int, int, int] | None] = (None, None)

    # -- the limits --------------------------------------------------------------------
    def _refresh(self) -> dict[str, dict[str, int | None]]:
        now = time.monotonic()
        if now - self._read_at < REFRESH:
            return self._set
        try:
            names = self.ns.children("/limits")
        except NotFound:
            names = []
        found = self.ns.get_many([f"/limits/{n}" for n in names]) if names else {}
        limits = {key.rsplit("/", 1)[1]: json.loads(value) for key, (value, _) in found.items()}
        with self._lock:
            self._set, self._read_at = limits, now
        return limits

    def limits(self, owner: str) -> tuple[int, int]:
        """The owner's limits: (jobs, tasks)."""
        config = self.state.config
        mine = self._refresh().get(owner, {})
        jobs, tasks = mine.get("jobs"), mine.get("tasks")
        return (config.owner_max_jobs if jobs is None else jobs,
                config.owner_max_tasks if tasks is None else tasks)

    def set(self, owner: str, body: LimitsBody) -> dict[str, Any]:
        try:
            check_name(owner)
        except ValueError as exc:
            raise ValidationError("owner", str(exc)) from None
        value = json.dumps({"jobs": body.jobs, "tasks": body.tasks}, sort_keys=True).encode()
        key = f"/limits/{owner}"
        with self._lock:
            try:
                _, version = self.ns.get(key)
                self.ns.set(key, value, version)
            except NotFound:
                self.ns.create(key, value)
            self._set = {**self._set, owner: {"jobs": body.jobs, "tasks": body.tasks}}
        jobs, tasks = self.limits(owner)
        self.recorder.record("api", "owner_limits_set", f"owner {owner}: at most {jobs:,} jobs "
                             f"and {tasks:,} tasks")
        return self.view(owner)

    def view(self, owner: str) -> dict[str, Any]:
        jobs, tasks = self.limits(owner)
        mine = self._refresh().get(owner, {})
        used_jobs, used_tasks = self.used(owner)
        return {"owner": owner, "jobs": jobs, "tasks": tasks,
                "set": {k: v for k, v in mine.items() if v is not None},
                "used": {"jobs": used_jobs, "tasks": used_tasks}}

    def views(self) -> dict[str, Any]:
        """Every owner with an entitlement or a limit set."""
        config = self.state.config
        owners = set(self._owners()) | set(self._refresh())
        return {"defaults": {"jobs": config.owner_max_jobs, "tasks": config.owner_max_tasks},
                "owners": [self.view(o) for o in sorted(owners)]}

    # -- what an owner holds -------------------------------------------------------------
    def _owners(self) -> dict[str, list[str]]:
        ents = self.state.allocator.entitlements
        size, index = self._index
        if size != len(ents):
            index = {}
            for name, ent in list(ents.items()):
                index.setdefault(ent.owner, []).append(name)
            self._index = (len(ents), index)
        return index

    def owner_of(self, entitlement: str) -> str | None:
        ent = self.state.allocator.entitlements.get(entitlement)
        return None if ent is None else ent.owner

    def used(self, owner: str) -> tuple[int, int]:
        """The jobs and tasks the owner's entitlements hold (``JobStore.held``)."""
        held = self.state.jobs.held
        jobs = tasks = 0
        for ent in self._owners().get(owner, ()):
            got = held.get(ent)
            if got is not None:
                jobs += got[0]
                tasks += got[1]
        return jobs, tasks

    def _largest_machine(self) -> tuple[int, int, int] | None:
        fleet = self.state.fleet
        if self._largest[0] is not fleet:
            size = None if len(fleet) == 0 else (int(fleet.cpu.max()), int(fleet.memory.max()),
                                                 int(fleet.disk.max()))
            self._largest = (fleet, size)
        return self._largest[1]

    # -- the checks ----------------------------------------------------------------------
    def quota_refusal(self, entitlement: str, tasks: int, need: Resources) -> str | None:
        """Why the entitlement's quota could never hold these tasks (None: it could)."""
        ent = self.state.allocator.entitlements.get(entitlement)
        if ent is None:
            return None
        why = never_fits(ent.quota.machines, ent.quota.rru, tasks, need,
                         self._largest_machine())
        return None if why is None else (f"entitlement {entitlement}'s quota of "
                                         f"{ent.quota} could never hold this job: {why}")

    def admit(self, name: str, new: Usage, old: Usage | None) -> None:
        """``JobStore.admit``: refuse a job's new record that no quota could hold, or
        that takes its owner over a limit (see the module)."""
        ent, tasks, need = new
        grows = old is None or old[0] != ent or tasks > old[1] or need != old[2]
        if grows:
            why = self.quota_refusal(ent, tasks, need)
            if why is not None:
                raise ValidationError("task_count", why)
        owner = self.owner_of(ent)
        if owner is None:
            return
        same = old is not None and self.owner_of(old[0]) == owner
        more_jobs = 0 if same else 1
        more_tasks = tasks - (old[1] if same and old is not None else 0)
        if more_jobs <= 0 and more_tasks <= 0:
            return
        max_jobs, max_tasks = self.limits(owner)
        used_jobs, used_tasks = self.used(owner)
        if more_jobs > 0 and used_jobs + more_jobs > max_jobs:
            raise ValidationError("limits.jobs", (
                f"owner {owner} may hold at most {max_jobs:,} jobs (its limit: plait owner "
                f"limits show {owner}) and holds {used_jobs:,}: job {name} would be one "
                "more (delete a job, or ask an admin to raise the limit)"))
        if more_tasks > 0 and used_tasks + more_tasks > max_tasks:
            raise ValidationError("limits.tasks", (
                f"owner {owner} may hold at most {max_tasks:,} tasks (its limit: plait "
                f"owner limits show {owner}) and holds {used_tasks:,}: job {name} at "
                f"{tasks:,} tasks would make {used_tasks + more_tasks:,} (make it smaller, "
                "or ask an admin to raise the limit)"))

    def room(self, name: str, entitlement: str, tasks: int, need: Resources) -> tuple[int, str]:
        """The most tasks job ``name`` (now ``tasks`` of ``need``) may be sized to under
        its owner's task limit and its quota's reach, and what bounds it (for the
        autoscaler and a sizing intent: a size above it would be refused)."""
        best, why = 1 << 62, ""
        owner = self.owner_of(entitlement)
        if owner is not None:
            _, max_tasks = self.limits(owner)
            _, used = self.used(owner)
            best = max(max_tasks - (used - tasks), 0)
            why = f"owner {owner}'s limit of {max_tasks:,} tasks"
        ent = self.state.allocator.entitlements.get(entitlement)
        if ent is not None and self.quota_refusal(entitlement, best, need) is not None:
            low, high = 0, best  # the largest count the quota could hold
            while low < high:
                mid = (low + high + 1) // 2
                if self.quota_refusal(entitlement, mid, need) is None:
                    low = mid
                else:
                    high = mid - 1
            best, why = low, f"entitlement {entitlement}'s quota of {ent.quota}"
        return best, why
