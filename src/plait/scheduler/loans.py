"""Elastic loans: revoking them when lenders need their machines back (decision 94).

Elastic entitlements borrow whole machines against the lenders' unused quota
(``plait.allocator.loans``). Every pass this stage

1. tells the allocator how many machines each lender's waiting tasks need
   (``short``: tasks the allocator could not place for want of a machine), so
   lenders that wait for machines the free pool does not have take their unused
   quota back;
2. revokes loans while more are out than the lenders can spare, or while a lender's
   waiting tasks need machines the free pool does not have (``allocator.loans.owed``:
   the lenders' quotas may add up to more than the region): an idle loaned
   machine goes back to the free pool at once; a busy one gets a planned
   maintenance event (``loan-revoke-...``) whose start is the revoke's deadline,
   ``min_notice_seconds`` of the borrower's terms ahead. Its tasks are cordoned off,
   their controllers get a ``loan_revoke`` advance notice, and they are offered a
   move or a stop, as for maintenance. At most ``max_reclaim_fraction_per_minute``
   of a borrower's loaned machines (at least one) are revoked in any minute; the
   busiest borrowers' least busy machines go first;
3. at a revoke's deadline, moves what still runs there without an ack (each task is
   stopped by its agent and placed again elsewhere once the stop is seen, so no task
   runs twice), re-places tasks a controller chose to stop, and once the machine is
   empty (the allocator gives it back to the free pool) ends the event: the lender
   claims it and Sidekick switches it to the lender's profile. A machine back later
   than ``deadline + loan_return_grace`` is a revoke past its deadline.

The shell records ``loan_events``; ``counters`` count revokes and late returns.
After a takeover, revokes under way are found again from their events.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import plait.scheduler.drain as drain
from plait.allocator.loans import held, owed
from plait.broker import BrokerChange, ChangeKind
from plait.errors import NotFound
from plait.model.events import LOAN_REVOKE_PREFIX, EventKind, UnavailabilityEvent
from plait.model.task import TaskState
from plait.scheduler.machinesets import NOTHING_PLACED
from plait.scheduler.state import SchedulerState

#: a revoke's event is held open until its machine is back (then ended)
HOLD = 365 * 86400.0
#: loan events kept for the shell at most
KEEP = 10_000
#: the window of the reclaim rate (the terms are per minute)
WINDOW = 60.0


@dataclass(slots=True)
class Revoke:
    """A loan being revoked."""

    event_id: str
    borrower: str
    noticed: float
    #: the tasks are stopped then (the event's start)
    deadline: float
    #: the machine is due back in the free pool by then
    return_by: float
    #: the deadline's moves were made
    forced: bool = False


@dataclass(frozen=True, slots=True)
class LoanEvent:
    """A loan changed: ``loan_started`` (an elastic entitlement claimed a machine),
    ``loan_revoked`` (notice given: ``deadline``), ``loan_returned`` (a revoked
    machine is back in the free pool: ``late`` seconds past its due time) or
    ``loan_ended`` (the borrower let it go, empty)."""

    at: float
    machine: int
    kind: str
    borrower: str
    reason: str = ""
    deadline: float | None = None
    late: float = 0.0

class Loans:
    """The scheduler's part that revokes elastic loans: revokes under way by machine,
    when each borrower's recent revokes began, the machines on loan it saw claimed,
    and what the shell records as events (``loan_events``)."""

    def __init__(self, state: SchedulerState, return_grace: float) -> None:
        self.s = state
        #: a revoked loan's machine is due back this long after the revoke's deadline
        self.return_grace = return_grace
        self.revokes: dict[int, Revoke] = {}
        self.revoke_starts: dict[str, list[float]] = {}
        self.revoke_seq = 0
        #: machines on loan this scheduler saw claimed: borrower and since when
        self.loaned: dict[int, tuple[str, float]] = {}
        self.loan_events: list[LoanEvent] = []
        self.elastic: set[str] = set()
        self.lenders: set[str] = set()
        self.loan_mark = -1
        self.loans_found = False
        state.counters.update(loan_revokes=0, loan_revokes_late=0)

    def machine_changed(self, change: BrokerChange) -> None:
        """A claim by an elastic entitlement starts a loan; its release ends it."""
        if change.kind is ChangeKind.CLAIMED and change.entitlement in self.elastic:
            self.loaned[change.machine] = (change.entitlement, self.s.now)
            self.loan_events.append(LoanEvent(
                self.s.now, change.machine, "loan_started", change.entitlement))
        elif change.kind is ChangeKind.RELEASED and change.machine in self.loaned:
            borrower, _ = self.loaned.pop(change.machine)
            if change.machine not in self.revokes:
                self.loan_events.append(LoanEvent(
                    self.s.now, change.machine, "loan_ended", borrower, "empty"))

    def step(self, now: float) -> None:
        """One look, every pass (cheap when no entitlement is elastic)."""
        alloc = self.s.allocator
        if self.loan_mark != alloc.defined:
            self.loan_mark = alloc.defined
            self.elastic = {n for n, e in alloc.entitlements.items() if e.elastic is not None}
            self.lenders = {n for n, e in alloc.entitlements.items() if e.lends}
        if not self.loans_found:
            self.loans_found = True
            self._rediscover(now)
        if self.revokes:
            self._progress(now)
        if len(self.loan_events) > KEEP:  # (a shell that records them empties the list)
            del self.loan_events[:len(self.loan_events) - KEEP]
        if not self.elastic:
            alloc.loans.short.clear()
            return
        self._demand()
        due = owed(alloc.index, alloc.entitlements, alloc.loans)
        if due > 0:
            self._revoke(due, now)

    def _demand(self) -> None:
        """Each lender's waiting tasks, in machines of the region's mean size, within the
        quota it does not use."""
        alloc = self.s.allocator
        need: dict[str, int] = {}
        pending = TaskState.PENDING
        for name, (ent, cpu) in list(self.s.short.items()):
            job = self.s.jobs.get(name)
            if job is None or not any(r.state is pending for r in job.tasks.values()):
                del self.s.short[name]  # placed since (or gone)
            elif ent in self.lenders:
                need[ent] = need.get(ent, 0) + cpu
        short: dict[str, int] = {}
        if need:
            mean = max(1, int(alloc.index.total_cpu.mean()))
            for ent, cpu in need.items():
                quota = alloc.entitlements[ent].quota.machines or 0
                short[ent] = min(max(0, quota - held(alloc.index, ent)), -(-cpu // mean))
        alloc.loans.short = short

    def _revoke(self, owed: int, now: float) -> None:
        """Revoke ``owed`` loans, within each borrower's reclaim rate."""
        alloc, region, index = self.s.allocator, self.s.region, self.s.allocator.index
        allowed: dict[str, int] = {}
        candidates: list[tuple[int, str, int]] = []
        for name in sorted(self.elastic):
            ent = alloc.entitlements[name]
            assert ent.elastic is not None
            machines = [int(m) for m in region.machines_of(name)]
            starts = [t for t in self.revoke_starts.get(name, ()) if t > now - WINDOW]
            self.revoke_starts[name] = starts
            rate = max(1, math.floor(ent.elastic.max_reclaim_fraction_per_minute * len(machines)))
            allowed[name] = rate - len(starts)
            candidates += [(len(self.s.placed.get(m, NOTHING_PLACED)), name, m)
                           for m in machines if m not in self.revokes]
        for busy, name, m in sorted(candidates):
            if owed <= 0:
                break
            if not busy and not index.tasks[m]:  # idle: back at once, nothing to stop
                region.release(m, name, region.version(m))
                self.s.counters["loan_revokes"] += 1
                self.loan_events.append(LoanEvent(now, m, "loan_returned", name, "idle"))
                owed -= 1
                continue
            if allowed[name] <= 0:
                continue  # its terms: no more revokes from it this minute
            allowed[name] -= 1
            owed -= 1
            terms = alloc.entitlements[name].elastic
            assert terms is not None
            self.revoke_seq += 1
            event_id = f"{LOAN_REVOKE_PREFIX}{name}-{self.s.fleet.name(m)}-{self.revoke_seq}"
            deadline = now + terms.min_notice_seconds
            region.add_event(UnavailabilityEvent(
                event_id, EventKind.MAINTENANCE, (self.s.fleet.name(m),), deadline, deadline + HOLD,
                f"loan to {name} revoked"), now)
            self.revokes[m] = Revoke(event_id, name, now, deadline,
                                  deadline + self.return_grace)
            alloc.loans.revoking[m] = name
            self.revoke_starts[name].append(now)
            self.s.counters["loan_revokes"] += 1
            self.s.touched.add(m)
            self.loan_events.append(LoanEvent(now, m, "loan_revoked", name, deadline=deadline))
            for ref in self.s.placed.get(m, NOTHING_PLACED):
                self.s.mark(ref.job)

    def _progress(self, now: float) -> None:
        """Revokes under way: re-place what a controller stopped, move what runs at the
        deadline, and end those whose machine is back."""
        index, region, codes = self.s.allocator.index, self.s.region, self.s.region.entitlements
        for m, r in list(self.revokes.items()):
            code = codes.find(r.borrower)
            if code is None or int(index.ent[m]) != code:
                self._returned(m, r, now)
                continue
            drain.unpark_all(self.s, r.event_id)
            drain.unstarted(self.s, m, r.event_id, now)
            if now >= r.deadline and not r.forced:
                r.forced = True
                drain.deadline(self.s, m, r.event_id, now, f"the loan to {r.borrower} was revoked")
            if not drain.occupied(self.s, m):
                # nothing left (tasks gone some other way): back to the free pool now
                region.release(m, r.borrower, region.version(m))
                self._returned(m, r, now)

    def _returned(self, m: int, r: Revoke, now: float) -> None:
        del self.revokes[m]
        self.s.allocator.loans.revoking.pop(m, None)
        with contextlib.suppress(NotFound):
            self.s.region.end_event(r.event_id, now)
        drain.unpark_all(self.s, r.event_id)
        late = max(0.0, now - r.return_by)
        if late > 0:
            self.s.counters["loan_revokes_late"] += 1
        self.s.touched.add(m)
        self.loan_events.append(LoanEvent(
            now, m, "loan_returned", r.borrower, f"{now - r.noticed:.0f}s after its notice",
            r.deadline, late))

    def _rediscover(self, now: float) -> None:
        """Revokes under way when this scheduler took over: their events are in the
        brokers' records; the borrower is the machine's binding."""
        alloc, fleet = self.s.allocator, self.s.fleet
        for ev in self.s.region.events():
            if not ev.id.startswith(LOAN_REVOKE_PREFIX) or len(ev.machines) != 1:
                continue
            m = fleet.index_of(ev.machines[0])
            borrower = self.s.region.broker_of(m).entitlement_of(m)
            ent = alloc.entitlements.get(borrower) if borrower else None
            if borrower is None or ent is None or ent.elastic is None:
                with contextlib.suppress(NotFound):
                    self.s.region.end_event(ev.id, now)  # its machine is back already
                continue
            noticed = ev.start - ent.elastic.min_notice_seconds
            self.revokes[m] = Revoke(ev.id, borrower, noticed, ev.start,
                                  ev.start + self.return_grace, forced=False)
            alloc.loans.revoking[m] = borrower
            # (it counts in its borrower's reclaim rate as it did, once: the stored
            # window holds it already when this scheduler's store kept it)
            starts = self.revoke_starts.setdefault(borrower, [])
            if not any(abs(t - noticed) < 1e-3 for t in starts):
                starts.append(noticed)
            with contextlib.suppress(ValueError):  # (a new revoke's id is never one of these)
                self.revoke_seq = max(self.revoke_seq, int(ev.id.rsplit("-", 1)[1]))
