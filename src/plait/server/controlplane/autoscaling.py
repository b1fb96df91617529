"""The autoscaler on the control plane: per-job policies, the load pushed to it, and
its decisions written as sizing intents by actor ``autoscaler`` (the Job Control Plane
resizes the job: ``plait.server.controlplane.jcp``).

A job's policy is stored at ``/autoscaler/{job}`` (``PUT /v1/jobs/{job}/autoscale``);
its load is either the CPU its tasks use, as their agents report it (the ``cpu``
metric: cores used over the cores a task asks for, in tasks' worth of work), or a
series pushed through the API (``POST /v1/jobs/{job}/load``: the ``external``
metric). After each pass, off the
lock, the leader decides for every job whose interval has passed and whose load is
fresh (``plait.autoscaler.recommend``), never past the tasks its entitlement and the
region can place now (``plait.autoscaler.within_room``: event ``autoscale_capped``),
and writes the job's sizing intent (decision 101), which the Job Control Plane's
reconciler turns into a resize right after.
The load history is kept in memory (two weeks): a new leader predicts from what it has
measured since it took over.

A policy belongs to the job it was set on (its ``JobDoc.uid``, stored with it): a job
made later under the same name has none until its owner sets one, and the stale
record is dropped at the next decision.
"""

from __future__ import annotations

import contextlib
import json
import threading
from typing import TYPE_CHECKING, Any

import pydantic

from plait import logconfig, requestid
from plait.autoscaler import AutoscalePolicy, Capped, History, Room, recommend, within_room
from plait.errors import Conflict, NotFound, PlaitError
from plait.jcp.intents import SizingIntent
from plait.model.base import Value, parse
from plait.store.protocol import Namespace

if TYPE_CHECKING:
    from plait.server.controlplane.inbox import Inbox
    from plait.server.controlplane.jcp import JobControlPlane
    from plait.server.controlplane.owners import Owners
    from plait.server.controlplane.recorder import EventRecorder
    from plait.server.controlplane.regionstate import RegionState

log = logconfig.get("plait.controlplane.autoscaling")

SCHEMA = 1
#: the stored policies are read again this often
REFRESH = 5.0


class JobAutoscale(Value):
    """What ``PUT /v1/jobs/{job}/autoscale`` takes: the policy, and how often it
    decides."""

    policy: AutoscalePolicy = AutoscalePolicy()
    interval_seconds: float = pydantic.Field(default=300.0, ge=1, le=86_400)


class Autoscaling:
    def __init__(self, state: RegionState, inbox: Inbox, recorder: EventRecorder,
                 owners: Owners, jcp: JobControlPlane) -> None:
        """``owners``: the owners' limits a decision is clamped to (held as ``limits``:
        ``owners`` maps each policy to the job it was set on); ``jcp``: where the
        decisions go, as sizing intents."""
        self.state, self.inbox, self.recorder = state, inbox, recorder
        self.limits, self.jcp = owners, jcp
        self.ns = Namespace(state.store, "/autoscaler")
        self._lock = threading.Lock()
        #: per job: its load history, the last load pushed (time, value), and when it
        #: last decided
        self.history: dict[str, History] = {}
        self.live: dict[str, tuple[float, float]] = {}
        self.decided: dict[str, float] = {}
        #: when each job was last looked at (its record read: 2,000 policies read and
        #: parsed their jobs at every pass, 74 ms of each)
        self.looked: dict[str, float] = {}
        self.decisions = 0
        #: the stored policies, read again every ``REFRESH`` seconds (another replica
        #: may have written them) and at once after a write here; and the job (its
        #: uid) each was set on
        self.policies: dict[str, JobAutoscale] = {}
        self.owners: dict[str, str] = {}
        self._read_at: float | None = None
        #: per job with a ``cpu`` policy: per task, the cores it used as its agent last
        #: reported, and when
        self.cpu: dict[str, dict[int, tuple[float, float]]] = {}
        #: per job, the last decision cut to the room there was (wanted, capped at)
        self.capped: dict[str, tuple[int, int] | None] = {}

    # -- the API --------------------------------------------------------------------------
    def put(self, job: str, body: JobAutoscale) -> dict[str, Any]:
        doc = self.state.jobs.get(job)  # NotFound for an unknown job
        if doc.deleting:
            raise Conflict(f"job {job}", "a live job", "being deleted")
        value = json.dumps({"schema": SCHEMA, "job_uid": doc.uid,
                            **body.model_dump(mode="json")}, sort_keys=True).encode()
        try:
            stored, version = self.ns.get(f"/{job}")
            fresh = json.loads(stored).get("job_uid", "") != doc.uid  # (a former job's)
            self.ns.set(f"/{job}", value, version)
        except NotFound:
            fresh = True
            self.ns.create(f"/{job}", value)
        with self._lock:
            if fresh:  # (what was measured for a former job of the name is not its)
                self._drop(job)
            self.policies[job] = body
            self.owners[job] = doc.uid
        return self.view(job)

    def _read(self, job: str) -> tuple[JobAutoscale, str, int]:
        """The stored policy of ``job``'s name, the uid of the job it was set on, and
        the record's version."""
        value, version = self.ns.get(f"/{job}")
        data = json.loads(value)
        data.pop("schema", None)
        uid = str(data.pop("job_uid", ""))
        return parse(JobAutoscale, data), uid, version

    def get(self, job: str) -> JobAutoscale:
        doc = self.state.jobs.get(job)
        try:
            body, uid, _ = self._read(job)
        except NotFound:
            raise NotFound("autoscale policy of job", job) from None
        if uid != doc.uid:  # (set on a former job of the name: not this one's)
            raise NotFound("autoscale policy of job", job)
        return body

    def _drop(self, job: str) -> None:
        """Forget what is kept in memory for ``job`` (the caller holds ``_lock``)."""
        for kept in (self.policies, self.owners, self.history, self.live, self.decided,
                     self.looked,
                     self.cpu, self.capped):
            kept.pop(job, None)

    def _forget_stale(self, job: str, uid: str) -> None:
        """The policy set on a job that is gone (uid ``uid``): dropped from memory, and
        its record deleted unless it was set again meanwhile."""
        with self._lock:
            if self.owners.get(job) == uid:
                self._drop(job)
        try:
            _, stored, version = self._read(job)
            if stored == uid:
                self.ns.delete(f"/{job}", version)
        except (NotFound, Conflict):
            pass

    def view(self, job: str) -> dict[str, Any]:
        body = self.get(job)
        with self._lock:
            live = self.live.get(job)
            decided = self.decided.get(job)
        return {"job": job, **body.model_dump(mode="json"),
                "load": None if live is None else {"time": live[0], "value": live[1]},
                "decided_at": decided}

    def delete(self, job: str) -> None:
        """The policy removed; and the sizing intent it wrote, so the job's size is its
        own again (the intent would put back its last decision over a resize)."""
        self.get(job)
        _, version = self.ns.get(f"/{job}")
        self.ns.delete(f"/{job}", version)
        with self._lock:
            self._drop(job)
        sizing = self.jcp.record(job).sizing
        if sizing is not None and sizing.actor == "autoscaler":
            with contextlib.suppress(NotFound):
                self.jcp.delete_sizing(job)

    def push_load(self, job: str, value: float, at: float | None = None) -> dict[str, Any]:
        """A measurement of the job's load (tasks' worth of work)."""
        body = self.get(job)  # only for a job with a policy
        if body.policy.metric != "external":
            raise Conflict(f"autoscale policy of job {job}", "the external metric",
                           f"the {body.policy.metric} metric (its agents report its load)")
        now = self.state.clock() if at is None else at
        with self._lock:
            self.history.setdefault(job, History()).add(now, value)
            self.live[job] = (now, value)
        self.inbox.wake.set()
        return {"job": job, "time": now, "value": value}

    def record_cpu(self, usage: dict[tuple[str, int], float], now: float) -> None:
        """Cores used per task, from an agent's report: kept for jobs whose policy
        reads CPU utilization."""
        with self._lock:
            for (job, index), cores in usage.items():
                body = self.policies.get(job)
                if body is not None and body.policy.metric == "cpu":
                    self.cpu.setdefault(job, {})[index] = (cores, now)

    def _cpu_load(self, job: str, tasks: int, cpu: float, now: float,
                  fresh: float) -> tuple[float, float] | None:
        """The job's load from its tasks' CPU use (in tasks' worth: cores used over the
        cores a task asks for), and when it was measured; None while no task of it
        reported within ``fresh`` seconds."""
        with self._lock:
            seen = {i: v for i, v in self.cpu.get(job, {}).items()
                    if i < tasks and now - v[1] <= fresh}
            self.cpu[job] = seen
        if not seen:
            return None
        return sum(c for c, _ in seen.values()) / cpu, max(t for _, t in seen.values())

    # -- the decisions (after a pass, off the lock) ---------------------------------------
    def due(self, now: float) -> bool:
        """Whether the stored policies are to be read again."""
        return self._read_at is None or now - self._read_at >= REFRESH

    def _refresh(self, now: float) -> None:
        if self._read_at is not None and now - self._read_at < REFRESH:
            return
        self._read_at = now
        found: dict[str, JobAutoscale] = {}
        owners: dict[str, str] = {}
        try:
            for job in self.ns.children("/"):
                found[job], owners[job], _ = self._read(job)
        except NotFound:
            pass
        except (OSError, PlaitError, ValueError) as exc:
            log.warning("autoscale policies not read", error=str(exc))
            return
        with self._lock:
            self.policies, self.owners = found, owners

    def decide(self, now: float) -> None:
        """The leader, after a pass: resize the jobs whose decision is due."""
        self._refresh(now)
        with self._lock:
            due = [(job, body, self.owners.get(job, "")) for job, body in self.policies.items()]
        for job, body, uid in due:
            try:
                self._decide(job, body, uid, now)
            except (PlaitError, OSError, ValueError) as exc:
                log.warning("autoscaling failed", job=job, error=str(exc))

    def _decide(self, job: str, body: JobAutoscale, uid: str, now: float) -> None:
        with self._lock:  # (a job's record is read once an interval, not every pass)
            looked = self.looked.get(job)
            if looked is not None and now - looked < body.interval_seconds:
                return
            self.looked[job] = now
        try:
            doc = self.state.jobs.get(job)
        except NotFound:
            doc = None
        if doc is None or doc.uid != uid:  # the job it was set on is gone
            self._forget_stale(job, uid)
            return
        with self._lock:
            last = self.decided.get(job)
        if last is not None and now - last < body.interval_seconds:
            return
        tasks = doc.spec.task_count
        if body.policy.metric == "cpu":  # what the job's agents reported
            measured = self._cpu_load(job, tasks, doc.spec.resources.cpu, now,
                                      max(30.0, body.interval_seconds))
            if measured is not None:
                with self._lock:
                    self.live[job] = (measured[1], measured[0])
                    self.history.setdefault(job, History()).add(now, measured[0])
        with self._lock:
            live = self.live.get(job)
        if live is None or now - live[0] > 2 * body.interval_seconds:
            return  # no fresh load: nothing to decide on
        with self._lock:
            self.decided[job] = now
            history = self.history.setdefault(job, History())
        want = recommend(body.policy, history, now, tasks, live[1])
        self.decisions += 1
        low, high = body.policy.min_tasks, body.policy.max_tasks
        if max(want, low) > tasks:  # the owner's task limit, the quota's reach: a clamp
            room, bound = self.limits.room(job, doc.entitlement, tasks, doc.spec.resources)
            if max(want, low) > room:
                clamped = max(min(want, room), min(tasks, want))
                self.recorder.record("autoscaler", "autoscale_clamped",
                                     f"{want} tasks wanted, {clamped} at most: {bound}",
                                     job=job, entitlement=doc.entitlement,
                                     actor="autoscaler")
                want, low, high = clamped, min(low, clamped), min(high, max(clamped, 0))
        # then what the entitlement and the region can place now
        capped = self._within_room(job, body, want, tasks, doc.entitlement)
        want = capped.tasks
        if want == tasks:
            return
        token = requestid.actor.set("autoscaler")
        try:  # a sizing intent: the Job Control Plane resizes the job
            self.jcp.put_sizing(job, SizingIntent(task_count=want, min=low, max=high),
                                actor="autoscaler")
        except Conflict as exc:
            log.info("autoscaling waits", job=job, error=str(exc))
            return
        finally:
            requestid.actor.reset(token)
        cut = "" if capped.why is None else f"; wanted {capped.wanted}, capped: {capped.why}"
        self.recorder.record("autoscaler", "autoscaled",
                             f"{tasks} -> {want} tasks for a load of {live[1]:g} tasks' "
                             f"worth (target utilization "
                             f"{body.policy.target_utilization:g}){cut}",
                             job=job, entitlement=doc.entitlement, actor="autoscaler")

    def _within_room(self, job: str, body: JobAutoscale, want: int, tasks: int,
                     entitlement: str) -> Capped:
        """``want`` within the room there is (``plait.autoscaler.within_room``): the
        tasks the job's entitlement and the region can place now, as the scheduler's
        allocator proposes without committing. Asked when the decision keeps or grows
        the job; a cut is an event (``autoscale_capped``) when it begins or changes."""
        if want < tasks:
            return Capped(want, want)
        with self.state.lock:
            try:
                room = Room(*self.state.scheduler.placeable(job, want))
            except NotFound:  # (not in this scheduler yet: nothing to cap against)
                return Capped(want, want)
        capped = within_room(body.policy, want, room)
        with self._lock:
            said = self.capped.get(job)
            self.capped[job] = None if capped.why is None else (capped.wanted, capped.tasks)
        if capped.why is not None and said != (capped.wanted, capped.tasks):
            self.recorder.record("autoscaler", "autoscale_capped",
                                 f"wanted {capped.wanted} tasks, capped at {capped.tasks}: "
                                 f"{capped.why}", job=job, entitlement=entitlement,
                                 actor="autoscaler")
        return capped

