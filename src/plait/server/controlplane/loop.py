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
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from plait import logconfig, tracing
from plait.errors import Conflict
from plait.scheduler.scheduler import STAGES
from plait.server.controlplane.passes import RESYNC, Pass, PassInput, PassOutcome

if TYPE_CHECKING:
    from plait.metrics import Metrics
    from plait.server.controlplane.controllers import Controllers
    from plait.server.controlplane.creates import CreateCommitter
    from plait.server.controlplane.inbox import Inbox
    from plait.server.controlplane.membership import Membership
    from plait.server.controlplane.published import Published
    from plait.server.controlplane.recorder import EventRecorder
    from plait.server.controlplane.regionstate import RegionState
    from plait.server.controlplane.views import Views
    from plait.server.logs import TaskLogs

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
    def __init__(self, state: RegionState, inbox: Inbox, published: Published,
                 recorder: EventRecorder, pass_: Pass, controllers: Controllers,
                 creates: CreateCommitter, membership: Membership, views: Views,
                 logs: TaskLogs, metrics: Metrics, forget_warm: Callable[[], None]) -> None:
        """``pass_``: the pass the loop drives; ``forget_warm``: a follower's copy of
        the job records is stale (a save found the store ahead of this memory)."""
        self.state, self.inbox, self.published = state, inbox, published
        self.recorder, self.pass_, self.controllers = recorder, pass_, controllers
        self.creates, self.membership, self.views = creates, membership, views
        self.logs, self.forget_warm = logs, forget_warm
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._sync_errors: dict[str, None] = {}
        self._last_full = self._last_freeze = 0.0
        #: passes since this replica began leading (0: the next reads every stored
        #: job), failed passes, when the last one ended (monotonic)
        self.steps = 0
        self.failures = 0
        self.last_step: float | None = None
        #: what a full collection took per object, the last time (an estimate before)
        self.full_seconds_per_object = FULL_SECONDS_PER_OBJECT
        #: full collections skipped as too long (``collect``)
        self.full_skipped = 0
        #: times each pass and its stages into the control plane's metrics
        self.timer = metrics.pass_timer()

    def phase(self, name: str, **attrs: Any) -> None:
        """The pass enters phase ``name``: the trace's and the metrics' alike."""
        self.timer.enter(name)
        tracing.phase(name, **attrs)

    @tracing.phased("pass")
    def step(self) -> None:
        """One pass: what arrived taken under the lock, the pass run over it
        (``Pass.run``) and its outcome acted on (desired sets published and long-polls
        woken, events recorded, the outcome stored, the read views published); then,
        off the lock, the TaskControl calls sent and the autoscaler and the Job Control
        Plane run (``Pass.after``)."""
        state, inbox = self.state, self.inbox
        with state.lock, self.timer as stage:
            given = self.take_input()
            now = given.now
            try:
                outcome = self.pass_.run(given, self.phase, stage)
            finally:  # what could not be read or applied is tried again next pass
                with inbox.lock:
                    inbox.jobs |= state.persist.failed
            if state.sim is not None:
                self.sim_output()
            self.publish_desired(outcome.touched)
            self.act(outcome)
        if outcome.calls:  # TaskControl after the pass, off the lock (decision 45)
            tracing.phase("taskcontrol", calls=len(outcome.calls))
            self.controllers.send(outcome.calls)
        self.pass_.after(now)  # (sizing intents, intents into pins: stored writes)

    def take_input(self) -> PassInput:
        """What arrived since the last pass (the caller holds the lock)."""
        now = self.state.clock()
        reports, beats = self.inbox.take_reports()
        names = self.take_inbox()
        return PassInput(now=now, names=None if names is None else tuple(names),
                         reports=tuple(reports), beats=beats,
                         answers=tuple(self.controllers.take_answers()),
                         stored=self.creates.take_stored())

    def publish_desired(self, touched: list[int]) -> None:
        """Desired sets that changed (in this pass, or by reports since the last): wake
        the agents long-polling them (simulated agents are stepped by the simulation,
        which reads the same set); the set is kept first, then the generation bumped,
        so a long-poll never reads a generation newer than the set."""
        if not touched:
            return
        published, scheduler = self.published, self.state.scheduler
        gen, name, view = published.generation, self.state.fleet.name, published.desired_view
        keys = [name(m) for m in touched]
        for m, key in zip(touched, keys, strict=True):
            g = gen.get(key, 0) + 1
            view[key] = (published.gen_base + g, scheduler.desired_for(key),
                         scheduler.stops_for(key), scheduler.profile_wire(m))
            gen[key] = g
        published.waiters.notify(keys)  # (after the bumps: none is missed)

    def act(self, outcome: PassOutcome) -> None:
        """The pass's outcome recorded and stored, the read views published (under
        the lock)."""
        state, recorder, phase = self.state, self.recorder, self.phase
        for error in outcome.errors:
            if error not in self._sync_errors:  # once, not on every pass
                self._sync_errors[error] = None
                while len(self._sync_errors) > 1000:
                    del self._sync_errors[next(iter(self._sync_errors))]
                recorder.record("scheduler", "operation_failed", error)
        # events are attributed before the save drops the records of deleted jobs
        recorder.record_scheduler_events(outcome.events)
        changed = outcome.changed
        tracing.idle(not outcome.events and changed == set())
        # jobs whose deletion this save finishes: their output goes first, so a job
        # made under the name once the record is gone starts with none
        jobs, applied = state.scheduler.jobs, state.persist.applied
        for gone in [n for n in (applied if changed is None else changed)
                     if n not in jobs and n in applied]:
            self.logs.forget(gone)
        phase("save", changed_jobs=-1 if changed is None else len(changed))
        try:
            state.persist.save(state.allocator)
        except Conflict:
            # the stored records are not the versions this control plane holds (a
            # takeover from a follower's copy that missed the old leader's last
            # writes): its memory is stale, so nothing of it is written; the next
            # pass reads everything from the store again and goes on from that
            self.membership.stale = True
            self.forget_warm()
            raise
        phase("publish")
        self.views.publish(changed)
        if self.steps % state.config.resync_passes == 0 and self.steps:
            with self.inbox.lock:  # a safety net: every stored job is looked at
                self.inbox.jobs.add(RESYNC)
        self.steps += 1
        self.last_step = time.monotonic()
        # before the lock goes: whoever reads the outcome of this pass (a job that
        # failed) can read the events that say why
        phase("flush_events")
        recorder.flush()

    def sim_output(self) -> None:
        sim = self.state.sim
        assert sim is not None and sim.output is not None
        lines, sim.output[:] = list(sim.output), []
        job_of = self.state.scheduler.jobs.get
        for ref, at, line in lines:
            job = job_of(ref.job)
            rec = job.tasks.get(ref.index) if job is not None else None
            machine = self.state.fleet.name(rec.machine) if rec is not None and (
                rec.machine is not None) else "?"
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(at))
            self.logs.append(ref.job, ref.index, machine, f"{stamp} {line}\n")

    def take_inbox(self) -> list[str] | None:
        names = self.inbox.take_jobs()
        if self.steps == 0 or RESYNC in names:
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
        config = self.state.config
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
            self.inbox.wake.clear()
            started = time.monotonic()
            try:
                self.step()
                self.collect(started)
                last_failure = None
            except Exception as exc:  # the loop must outlive one bad pass (a store outage)
                self.failures += 1
                what = f"{type(exc).__name__}: {exc}"
                self.recorder.record("controlplane", "step_failed", what)
                if what != last_failure:  # its traceback once per run of the same failure
                    log.exception("pass failed", error=what, failures=self.failures)
                    last_failure = what
                with contextlib.suppress(Exception):  # the store is still down: the
                    self.recorder.flush()                # events wait for the next flush
            woken = self.inbox.wake.wait(self.state.config.tick_seconds)
            # a burst of requests (creates, reports) is taken in batches, passes
            # ``min_pass_gap`` apart, not one pass per request; once the loop was
            # woken and nothing woke it again for ``QUIET``, the burst is over, and
            # its last requests wait for no more of it, though for half the gap at
            # least (a trickle of wake-ups: twice as many passes at most, not one
            # per wake-up)
            gap = self.state.config.min_pass_gap
            while not self._stop.is_set():
                now = time.monotonic()
                ran, quiet = now - started, now - self.inbox.wake.at
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
        if self.last_step is None:
            return False, "no pass finished yet"
        late = time.monotonic() - self.last_step
        limit = max(10.0, 20 * self.state.config.tick_seconds)
        if late > limit:
            return False, f"no pass finished for {late:.0f}s ({self.failures} passes failed)"
        return True, "ok"

    def stop(self) -> None:
        self._stop.set()
        self.inbox.wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None
        if self.controllers.dispatcher is not None:
            self.controllers.dispatcher.close()
            self.controllers.dispatcher = None
