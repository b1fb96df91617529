"""The loop: one pass applies stored job operations and agents' reports, runs the
scheduler (or the simulated agents), stores the outcome and publishes the read views;
TaskControl calls go out after the pass, off the lock. The loop also keeps the garbage
collector's full passes off the request path and reports whether it is passing.

A pass's phases are marked once for both the trace (``tracing.phase``) and the metrics
(``plait_pass_stage_duration_seconds``, ``PASS_STAGES``); the metrics also time the
scheduler's own stages, through the hook it is handed (``Scheduler.stage``)."""

from __future__ import annotations

import contextlib
import gc
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

from plait import logconfig, tracing
from plait.errors import Conflict, NotFound, TransientError
from plait.model.events import EventKind, UnavailabilityEvent
from plait.scheduler.scheduler import STAGES

if TYPE_CHECKING:
    from plait.server.controlplane.core import ControlPlane

log = logconfig.get("plait.controlplane.loop")

#: the interpreter's thread switch interval while a loop runs (seconds)
SWITCH_INTERVAL = 0.001
#: seconds without a wake-up after which a burst is over (``run``)
QUIET = 0.005
#: seconds a full collection takes per object until one is timed (0.63 us measured)
FULL_SECONDS_PER_OBJECT = 1e-6

#: gen-1 collections between two automatic full ones: never, in effect (the loop runs
#: them itself, ``Loop.collect``)
FULL_COLLECTIONS_NEVER = 1 << 30

#: an inbox entry that asks for every stored job
RESYNC = "/all"

#: the stages of a pass the metrics time, in order (the trace's phases, the scheduler's
#: stages in place of its one): a rebuild and a shard's membership; agents' reports
#: taken; stored job operations applied; controllers' answers taken; heartbeats
#: checked (``health``) and the brokers' events, or the simulated agents stepped
#: (``simulate``, with ``--sim-agents``); the scheduler's own (``STAGES``); desired sets
#: published to agents' long-polls (``desired``); events attributed; the outcome
#: stored (``save``); the read views published; events written (``flush_events``)
PASS_STAGES = ("membership", "reports", "operations", "answers", "health", "brokers",
               "simulate", *STAGES, "desired", "events", "save", "publish", "flush_events")


class Loop:
    def __init__(self, cp: ControlPlane) -> None:
        self.cp = cp
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._sync_errors: dict[str, None] = {}
        self._last_full = self._last_freeze = 0.0
        #: what a full collection took per object, the last time (an estimate before)
        self.full_seconds_per_object = FULL_SECONDS_PER_OBJECT
        #: full collections skipped as too long (``collect``)
        self.full_skipped = 0
        #: times each pass and its stages into the control plane's metrics
        self.timer = cp.metrics.pass_timer()

    def phase(self, name: str, **attrs: Any) -> None:
        """The pass enters phase ``name``: the trace's and the metrics' alike."""
        self.timer.enter(name)
        tracing.phase(name, **attrs)

    @tracing.phased("pass")
    def step(self) -> None:
        """One pass: apply stored job operations, reconcile, store the outcome."""
        phase = self.phase
        with self.cp.lock, self.timer as stage:
            now = self.cp.clock()
            phase("membership")
            if self.cp.membership.stale:  # a handoff's rebuild failed, or a save found the
                # stored records other than this memory of them: read everything again
                self.cp.build(now)
                self.cp.membership.stale = False
                self.cp.steps = 0
            self.cp.scheduler.stage = stage  # (its own stages, for the metrics)
            if self.cp.shared is not None:
                self.cp.membership.follow(now)
            phase("reports")
            self.take_reports(now)
            self.cp.profiles.sync(now)
            phase("operations")
            names = self.take_inbox()
            self.cp.jcp.touch(names)  # (a job's record changed: its intents may move on)
            try:
                errors = self.cp.persist.sync(now, names, known=self.cp.creates.take_stored())
            finally:  # what could not be read or applied is tried again next pass
                with self.cp.pending_lock:
                    self.cp.inbox |= self.cp.persist.failed
            for error in errors:
                if error not in self._sync_errors:  # once, not on every pass
                    self._sync_errors[error] = None
                    while len(self._sync_errors) > 1000:
                        del self._sync_errors[next(iter(self._sync_errors))]
                    self.cp.record("scheduler", "operation_failed", error)
            phase("answers")
            for answer in self.cp.controllers.take_answers():
                self.cp.scheduler.answer(answer)
            if self.cp.sim is not None:
                phase("simulate")
                self.cp.sim.step(now)
                stage("simulate")  # (after the scheduler's stages within it)
                self.sim_output()
            else:
                phase("health")
                self.check_health(now)
                phase("brokers")
                self.cp.region.tick(now)
                # (the metrics time the scheduler's stages, which it marks itself)
                tracing.phase("scheduler", jobs=len(self.cp.scheduler.jobs))
                self.cp.scheduler.tick(now)
                stage("desired")
                # desired sets that changed (in this pass, or by reports since the
                # last): wake the agents long-polling them (simulated agents are
                # stepped by the simulation, which reads the same set); the set is
                # kept first, then the generation bumped, so a long-poll never reads
                # a generation newer than the set
                touched, self.cp.scheduler.touched = self.cp.scheduler.touched, set()
                gen, name, view = self.cp.generation, self.cp.fleet.name, self.cp.desired_view
                keys = [name(m) for m in touched]
                for m, key in zip(touched, keys, strict=True):
                    g = gen.get(key, 0) + 1
                    view[key] = (self.cp.gen_base + g, self.cp.scheduler.desired_for(key),
                                 self.cp.scheduler.stops_for(key),
                                 self.cp.scheduler.profile_wire(m))
                    gen[key] = g
                self.cp.gateway.waiters.notify(keys)  # (after the bumps: none is missed)
            self.cp.machine_ops.finish_drains()
            calls = self.cp.scheduler.take_calls()
            phase("events")
            # events are attributed before the save drops the records of deleted jobs
            events = self.cp.scheduler.events.take()
            self.cp.record_scheduler_events(events)
            changed = self.cp.scheduler.changed_jobs
            changed = None if changed is None else set(changed)
            self.cp.jcp.touch(changed)  # (its tasks changed: so may its push's health)
            tracing.idle(not events and changed == set())
            # jobs whose deletion this save finishes: their output goes first, so a job
            # made under the name once the record is gone starts with none
            jobs, applied = self.cp.scheduler.jobs, self.cp.persist.applied
            for gone in [n for n in (applied if changed is None else changed)
                         if n not in jobs and n in applied]:
                self.cp.logs.forget(gone)
            phase("save", changed_jobs=-1 if changed is None else len(changed))
            try:
                self.cp.persist.save(self.cp.allocator)
            except Conflict:
                # the stored records are not the versions this control plane holds (a
                # takeover from a follower's copy that missed the old leader's last
                # writes): its memory is stale, so nothing of it is written; the next
                # pass reads everything from the store again and goes on from that
                self.cp.membership.stale = True
                if self.cp.warm is not None:
                    self.cp.warm.forget()
                raise
            phase("publish")
            self.cp.views.publish(changed)
            if self.cp.steps % self.cp.config.resync_passes == 0 and self.cp.steps:
                with self.cp.pending_lock:  # a safety net: every stored job is looked at
                    self.cp.inbox.add(RESYNC)
            self.cp.steps += 1
            self.cp.last_step = time.monotonic()
            # before the lock goes: whoever reads the outcome of this pass (a job that
            # failed) can read the events that say why
            phase("flush_events")
            self.cp.flush_events()
        if calls:  # TaskControl after the pass, off the lock (decision 45)
            tracing.phase("taskcontrol", calls=len(calls))
            self.cp.controllers.send(calls)
        if self.cp.autoscaling.policies or self.cp.autoscaling.due(now):
            self.cp.autoscaling.decide(now)  # resizes are stored writes: off the lock
        if self.cp.jcp.records or self.cp.jcp.due(now):
            self.cp.jcp.reconcile(now)  # (intents into pins: stored writes, off the lock)

    def take_reports(self, now: float) -> None:
        """Apply the agents' reports taken since the last pass, in order, and their
        heartbeats."""
        reports, beats = self.cp.gateway.take()
        liveness = self.cp.liveness
        # a shard hears only the machines it watches (``Membership.track_owned``): a
        # beat taken just before one left this shard must not bring it back here, to
        # be failed by this shard once its agent beats elsewhere
        sharded = self.cp.shared is not None
        for machine, at in beats.items():
            if (machine in liveness.last) if sharded else self.cp.known(machine):
                liveness.beat(machine, at)
        jobs = self.cp.scheduler.jobs
        for machine, statuses, endpoints, at, profile, usage in reports:
            try:
                m = self.cp.membership.check_owned(machine)
            except (NotFound, TransientError):
                continue  # (the machine left this shard since it reported)
            when = max(at, self.cp.scheduler.now)
            self.cp.scheduler.report(machine, statuses, when)
            if profile is not None:
                self.cp.scheduler.report_profile(machine, profile, when)
            for (job, index), endpoint in endpoints.items():
                found = jobs.get(job)
                rec = found.tasks.get(index) if found is not None else None
                # only where the task is placed; a change is stored with the record
                if rec is not None and rec.machine == m and rec.endpoint != endpoint:
                    rec.endpoint = endpoint
                    self.cp.scheduler.mark(job)
            if usage:  # (only the tasks placed there: no other job's autoscaler)
                placed = {}
                for (job, index), cores in usage.items():
                    found = jobs.get(job)
                    rec = found.tasks.get(index) if found is not None else None
                    if rec is not None and rec.machine == m:
                        placed[job, index] = cores
                if placed:
                    self.cp.autoscaling.record_cpu(placed, at)

    def sim_output(self) -> None:
        assert self.cp.sim is not None and self.cp.sim.output is not None
        lines, self.cp.sim.output[:] = list(self.cp.sim.output), []
        job_of = self.cp.scheduler.jobs.get
        for ref, at, line in lines:
            job = job_of(ref.job)
            rec = job.tasks.get(ref.index) if job is not None else None
            machine = self.cp.fleet.name(rec.machine) if rec is not None and (
                rec.machine is not None) else "?"
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(at))
            self.cp.logs.append(ref.job, ref.index, machine, f"{stamp} {line}\n")

    def take_inbox(self) -> list[str] | None:
        with self.cp.pending_lock:
            names, self.cp.inbox = self.cp.inbox, set()
        if self.cp.steps == 0 or RESYNC in names:
            return None  # every stored job
        return sorted(names)

    def collect(self, started: float) -> None:
        """Keep the garbage collector's full passes off the request path: the region's
        long-lived state (job records, specs) is frozen out of the collector every
        ``gc_freeze_seconds`` after a young-generation pass, and a full collection runs
        every ``gc_full_seconds`` (a full pass over 4,000 jobs' state takes about
        0.1 s, which would otherwise land on whichever request comes next) unless it
        would hold the interpreter for longer than ``gc_full_max_pause`` (estimated
        from the last one, per object): that long, the leader's lease goes unrenewed
        (20,000 jobs of 2 tasks took 0.52 s). Then only what is not frozen is
        collected; plait's records make no reference cycles (deleted jobs left none),
        so what the frozen heap keeps is what a cycle elsewhere left."""
        config = self.cp.config
        if started - self._last_full >= config.gc_full_seconds:
            self._last_full = self._last_freeze = started
            heap = gc.get_freeze_count() + sum(gc.get_count())
            pause = heap * self.full_seconds_per_object
            if pause <= config.gc_full_max_pause:
                gc.unfreeze()
                began = time.perf_counter()
                gc.collect()
                self.full_seconds_per_object = (time.perf_counter() - began) / max(1, heap)
            else:
                self.full_skipped += 1
                if self.full_skipped == 1:  # (once: then every gc_full_seconds)
                    log.warning("full garbage collections skipped: one would hold the "
                                "interpreter past gc_full_max_pause", objects=heap,
                                estimated_seconds=round(pause, 3),
                                max_seconds=config.gc_full_max_pause)
                gc.collect()  # (what is not frozen)
            gc.freeze()
        elif started - self._last_freeze >= config.gc_freeze_seconds:
            gc.collect(1)
            gc.freeze()
            self._last_freeze = started

    def prepare(self) -> None:
        """Set the interpreter up as a running loop wants it (``run`` does this first;
        ``plait bench createcost`` too, before it times passes it calls itself)."""
        # the pass is CPU-bound Python: hand the interpreter to request threads every
        # millisecond rather than every 5 (a request that waits for the GIL a few
        # times would otherwise wait a pass's 5 ms slice each time)
        sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL))
        # full collections only from ``_collect``: an automatic one would scan what
        # survived since the last freeze, 20-70 ms under a thousand busy jobs, on
        # whichever request came next
        young, middle, _ = gc.get_threshold()
        gc.set_threshold(young, middle, FULL_COLLECTIONS_NEVER)
        self._last_full = self._last_freeze = time.monotonic()
        # the young generations only, then freeze: a full collection holds the
        # interpreter for all of its length, and it runs as a replica becomes leader,
        # when the lease must be renewed (a cold `plait up` of 40 agents stretched one
        # to 2.5 s on a 2-core box, and the new leader lost its lease at once); the
        # first full one comes from ``collect``
        gc.collect(1)
        gc.freeze()

    def run(self) -> None:
        self.prepare()
        last_failure: str | None = None
        while not self._stop.is_set():
            self.cp.wake.clear()
            started = time.monotonic()
            try:
                self.step()
                self.collect(started)
                last_failure = None
            except Exception as exc:  # the loop must outlive one bad pass (a store outage)
                self.cp.failures += 1
                what = f"{type(exc).__name__}: {exc}"
                self.cp.record("controlplane", "step_failed", what)
                if what != last_failure:  # its traceback once per run of the same failure
                    log.exception("pass failed", error=what, failures=self.cp.failures)
                    last_failure = what
                with contextlib.suppress(Exception):  # the store is still down: the
                    self.cp.flush_events()                # events wait for the next flush
            woken = self.cp.wake.wait(self.cp.config.tick_seconds)
            # a burst of requests (creates, reports) is taken in batches, passes
            # ``min_pass_gap`` apart, not one pass per request; once the loop was
            # woken and nothing woke it again for ``QUIET``, the burst is over, and
            # its last requests wait for no more of it, though for half the gap at
            # least (a trickle of wake-ups: twice as many passes at most, not one
            # per wake-up)
            gap = self.cp.config.min_pass_gap
            while not self._stop.is_set():
                now = time.monotonic()
                ran, quiet = now - started, now - self.cp.wake.at
                if ran >= gap or (woken and quiet >= QUIET and ran >= gap / 2):
                    break
                # (woken: until the burst may be over, and half the gap has passed)
                self._stop.wait(min(gap - ran, max(QUIET - quiet, gap / 2 - ran))
                                if woken else gap - ran)

    def start(self) -> None:
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self.run, name="plait-loop", daemon=True)
            self._thread.start()

    def health(self) -> tuple[bool, str]:
        """Is the loop passing? (Not if no pass ended within 20 ticks, 10 s at least.)"""
        if self._thread is None:
            return True, "loop not running in this process"
        if self.cp.last_step is None:
            return False, "no pass finished yet"
        late = time.monotonic() - self.cp.last_step
        limit = max(10.0, 20 * self.cp.config.tick_seconds)
        if late > limit:
            return False, f"no pass finished for {late:.0f}s ({self.cp.failures} passes failed)"
        return True, "ok"

    def stop(self) -> None:
        self._stop.set()
        self.cp.wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None
        if self.cp.controllers.dispatcher is not None:
            self.cp.controllers.dispatcher.close()
            self.cp.controllers.dispatcher = None

    def check_health(self, now: float) -> None:
        """Flow 2: a machine whose agent stopped heartbeating fails in its broker (its
        tasks are disabled in discovery and replaced per TaskControl); one that is
        back is healthy again. Most machines silent at once fail none of them
        (``plait.health.service``): one event says so when it starts and ends."""
        if self.cp.shared is not None:
            self.cp.membership.track_owned(now)
        liveness = self.cp.liveness
        went, came = liveness.check(now)
        if liveness.held and not liveness.was_held:
            self.cp.record("health", "heartbeats_lost", (
                f"{liveness.silent} of {len(liveness.heard)} machines stopped heartbeating "
                f"together: none of them is failed while more than "
                f"{liveness.hold_fraction:.0%} are silent (the path from the agents to this "
                "control plane is the likelier fault: a front end down, this process "
                "paused or cut off)"))
            log.warning("most machines silent at once: none failed", silent=liveness.silent,
                        heard=len(liveness.heard))
        elif liveness.was_held and not liveness.held:
            self.cp.record("health", "heartbeats_resumed", (
                f"{liveness.silent} of {len(liveness.heard)} machines silent now: those "
                f"still silent past {liveness.timeout:g}s are failed"))
        for i, machine in enumerate(went):
            try:
                self._fail(machine, now)
            except BaseException:  # (not failed: the next pass finds them late again)
                liveness.down.difference_update(went[i:])
                raise
        for machine in came:
            with contextlib.suppress(NotFound):
                self.cp.region.end_event(f"health-{machine}", now)
            self.cp.record("health", "machine_back", f"{machine}: heartbeating again",
                           machine=machine)

    def _fail(self, machine: str, now: float) -> None:
        liveness = self.cp.liveness
        event = UnavailabilityEvent(
            f"health-{machine}", EventKind.FAILURE, (machine,), now, None,
            f"no heartbeat for {liveness.timeout:g}s")
        try:
            self.cp.region.add_event(event, now)
        except Conflict:
            # stored already (another shard failed it as it moved here): the same
            # failure, taken as it is; else (this replica no longer leads) the error
            if not self.cp.region.ns.exists(f"/events/{event.id}"):
                raise
            self.cp.region.adopt_event(event.id, now)
        self.cp.record("health", "machine_unreachable",
                       f"{machine}: no heartbeat for {liveness.timeout:g}s", machine=machine)
