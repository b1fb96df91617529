"""Rolling a changed host profile over an entitlement's busy machines (paper 2.6).

A machine switches profile only while nothing runs on it (decision 91). When an
entitlement's profile changes (it names another one, or its profile gets a new
version), its idle machines switch at once (they are pending: no task is given to
their agents until they carry the new profile) and its busy ones are *stale*:
cordoned (no new task goes there: it could not start before the machine switches,
and a machine switches only empty) and drained ``profile_roll_at_once`` at a time
per entitlement, through the same advance notices and TaskControl-acked moves as
planned maintenance (so every job's max_unavailable holds), with the maintenance
starting ``profile_roll_deadline`` seconds later at the latest. A drained machine
is empty: the allocator gives it back to the free pool, its drain ends and the roll
uncordons it; the entitlement claims machines again as its tasks need room, and each
joins with the new profile. A task moved off a draining machine that finds no room
(a full region: the drained machine itself, switched, is its room) waits for it, said
by its job's event ``profile_roll_waiting``; and the entitlement's next machine waits
until the tasks moved off the previous ones are placed again (a transition
``profile_roll_waiting_room`` says how many; for ``profile_roll_deadline`` at
most), so a roll has one machine's tasks down at a time. A machine is also found
stale when its agent reports a profile other than its entitlement's while tasks run
there (a control plane that took over in the middle of a roll).

An infrastructure rollout never cuts into a push (the 2023 post's Figure 7, decision
104): a stale machine that runs a task of a job whose push is under way
(``ProfileRolls.pushing``, kept by the Job Control Plane) is not drained until that push
ends. It stays cordoned meanwhile, so the push's own updates carry its tasks to
machines that carry the new profile: every task the push touches gets the new host
profile with the new spec, and the push's stages and gates judge both together.
"""

from __future__ import annotations

import contextlib

import plait.scheduler.drain as drain
from plait.errors import NotFound
from plait.model.events import PROFILE_ROLL_PREFIX, EventKind, UnavailabilityEvent
from plait.model.hostprofile import DEFAULT_PROFILE, HostProfile
from plait.model.task import TaskRef, TaskState
from plait.scheduler.state import SchedulerState
from plait.sidekick.book import ProfileBook, Transition

#: how long a roll's drained machine is held (its drain is ended once it is empty)
HOLD = 365 * 86400.0
_UNSEEN = ("", -1)


def _ref(target: HostProfile | None) -> tuple[str, int] | None:
    return None if target is None else (target.name, target.version)

class ProfileRolls:
    """The scheduler's part that rolls changed host profiles: the profile book (each
    machine's target and what its agent applied), the transitions the shell records,
    the jobs whose push is under way, and each entitlement's roll."""

    def __init__(self, state: SchedulerState, at_once: int, deadline: float) -> None:
        self.s = state
        #: machines of an entitlement drained at once, and each one's drain deadline
        self.at_once = at_once
        self.deadline = deadline
        #: host profiles: each machine's target and what its agent applied (Sidekick)
        self.profiles = ProfileBook()
        #: what the profile reports changed (the shell records them as events)
        self.profile_transitions: list[Transition] = []
        #: jobs whose push is under way (the Job Control Plane keeps it): a roll waits
        #: for them (decision 104)
        self.pushing: set[str] = set()
        #: per entitlement, how many stale machines the roll leaves for pushes
        self.roll_waiting: dict[str, int] = {}
        #: each entitlement's target as last seen, its busy machines still to drain,
        #: the machines draining (their event and entitlement), the ones it cordoned
        self.roll_targets: dict[str, tuple[str, int] | None] = {}
        self.stale: dict[str, set[int]] = {}
        self.rolling: dict[int, tuple[str, str]] = {}
        self.roll_cordoned: set[int] = set()
        #: per entitlement, the tasks moved off its draining machines that wait for
        #: room (the machine each left, and when it was seen waiting): its next drain
        #: waits for them to be placed; and per entitlement, how many it last said wait
        self.roll_moved: dict[str, dict[TaskRef, tuple[int, float]]] = {}
        self.roll_landing: dict[str, int] = {}
        self.roll_seq = 0
        #: the drains of rolls begun before this scheduler took over were looked for
        self.rolls_found = False
        #: when each draining machine's roll deadline comes (its tasks are moved then)
        self.roll_deadlines: dict[int, float] = {}
        self.roll_mark: tuple[int, int] = (-1, -1)

    def carries(self, m: int, target: HostProfile | None) -> bool:
        """Whether machine ``m`` carries ``target`` as far as its agent has said (a machine
        without an entry in the book carries ``default``)."""
        if target is None:
            return False
        seen = self.profiles.applied.get(m)
        if seen is None:
            return target.name == DEFAULT_PROFILE and target.version == 1
        return (seen.name, seen.version) == (target.name, target.version)

    def notice_changes(self) -> None:
        """Entitlements whose profile target moved since the last look: their machines are
        stale (the first look only learns the targets). Only after an entitlement or a
        profile was defined."""
        mark = (self.s.allocator.defined, self.profiles.generation)
        if mark == self.roll_mark:
            return
        self.roll_mark = mark
        seen = self.roll_targets
        for name, ent in self.s.allocator.entitlements.items():
            ref = _ref(self.profiles.target(ent.host_profile))
            old = seen.get(name, _UNSEEN)
            seen[name] = ref
            if old in (_UNSEEN, ref):
                continue
            machines = [int(m) for m in self.s.region.machines_of(name)]
            self.stale.setdefault(name, set()).update(machines)
            # no task that has not started goes to them until they carry the new profile
            self.profiles.pending.update(machines)
            self.s.touched.update(machines)
            if ref is not None:
                self.profile_transitions.append(Transition(
                    -1, "profile_roll_started", ref[0], ref[1], entitlement=name,
                    reason=f"{len(machines)} machines"))

    def roll(self, now: float) -> None:
        """One look (every pass): finish the drains of machines now empty, then drain the
        next stale machines of each entitlement."""
        self.notice_changes()
        if not self.rolls_found:
            self.rolls_found = True
            self._rediscover(now)
        if not self.stale and not self.rolling and not self.roll_moved:
            return
        index, region, names = self.s.allocator.index, self.s.region, self.s.fleet.name
        for m, (event_id, ent) in list(self.rolling.items()):
            drain.unpark_all(self.s, event_id)
            drain.unstarted(self.s, m, event_id, now)
            self._moved_off(m, event_id, ent, now)
            if drain.occupied(self.s, m):
                due = self.roll_deadlines.get(m)
                if due is None:  # (rolled before a takeover: its event says when)
                    due = self.roll_deadlines[m] = next(
                        (e.start for e in self.s.region.events() if e.id == event_id), float("inf"))
                if now >= due:
                    self.roll_deadlines[m] = float("inf")
                    drain.deadline(self.s, m, event_id, now,
                                   "its entitlement's host profile changed")
                continue
            self.roll_deadlines.pop(m, None)  # (empty: its drain is over)
            del self.rolling[m]
            with contextlib.suppress(NotFound):
                region.end_event(event_id, now)
            self._uncordon(m)
            target = self.profiles.target(self.s.allocator.entitlements[ent].host_profile
                                       if ent in self.s.allocator.entitlements else None)
            ref = _ref(target) or ("?", 0)
            self.profile_transitions.append(Transition(m, "profile_roll_drained", ref[0], ref[1],
                                                    entitlement=ent))
        at_once = self.at_once
        held: set[int] | None = None
        for name, stale in list(self.stale.items()):
            found = self.s.allocator.entitlements.get(name)
            code = region.entitlements.find(name)
            target = None if found is None else self.profiles.target(found.host_profile)
            for m in sorted(stale):
                if m in self.rolling:
                    stale.discard(m)  # (draining already: found again after a takeover)
                elif (found is None or code is None or int(index.ent[m]) != code
                        or self.carries(m, target)):
                    stale.discard(m)  # left the entitlement, or carries its profile
                    self._uncordon(m)
                elif not drain.occupied(self.s, m):
                    stale.discard(m)  # idle: it switches now, before any task starts there
                    self._uncordon(m)
                elif not region.broker_of(m).operator_cordoned(m):
                    region.set_cordon(m, True)  # no new task on a machine about to drain
                    self.roll_cordoned.add(m)
            if target is None:
                continue
            draining = sum(1 for _, ent in self.rolling.values() if ent == name)
            if held is None:
                held = self._pushing()
            if self._landing(name, target, now):
                draining = at_once  # (one machine at a time: its tasks placed again first)
            ready = [m for m in sorted(stale) if m not in held]
            waiting = len(stale) - len(ready)
            if waiting and self.roll_waiting.get(name) != waiting:
                self.profile_transitions.append(Transition(
                    -1, "profile_roll_waiting", target.name, target.version, entitlement=name,
                    reason=f"{waiting} machines"))
            self.roll_waiting[name] = waiting
            for m in ready[:max(0, at_once - draining)]:
                stale.discard(m)
                self.roll_seq += 1
                event_id = f"{PROFILE_ROLL_PREFIX}{name}-{names(m)}-{self.roll_seq}"
                start = now + self.deadline
                self.roll_deadlines[m] = start
                region.add_event(UnavailabilityEvent(
                    event_id, EventKind.MAINTENANCE, (names(m),), start, start + HOLD,
                    f"host profile {target.name} v{target.version}"), now)
                self.rolling[m] = (event_id, name)
                self.s.touched.add(m)  # (its agent is told not to switch: it goes back free)
            if not stale:
                del self.stale[name]
                self.roll_waiting.pop(name, None)
        for name in [n for n in self.roll_moved if n not in self.stale]:  # (its roll is over)
            self._landing(name, None, now)

    def _moved_off(self, m: int, event_id: str, ent: str, now: float) -> None:
        """Tasks moved off draining machine ``m`` that wait for room (pending: no machine
        of the entitlement outside the roll, nor of the free pool, has room for them) are
        kept as the roll's (``roll_moved``), each said once: its job's event
        ``profile_roll_waiting`` tells why it waits and when the drain's deadline moves
        what still runs on ``m``."""
        placed = self.s.placed.get(m)
        if not placed:
            return
        pending, jobs = TaskState.PENDING, self.s.jobs
        moved = self.roll_moved.setdefault(ent, {})
        for ref in placed.refs():
            job = jobs.get(ref.job)
            rec = job.tasks.get(ref.index) if job else None
            if job is None or rec is None or rec.state is not pending or ref in moved or (
                    job.unplaced_reason is None):
                continue  # (a pending task not tried yet may find room: looked at again)
            moved[ref] = (m, now)
            due = self.roll_deadlines.get(m, float("inf"))
            name = self.s.fleet.name(m)
            when = ("" if due == float("inf") else
                    f"; what still runs on {name} is moved at the drain's deadline, "
                    f"in {max(0.0, due - now):.0f}s")
            self.s.event(now, job.name, "profile_roll_waiting",
                    f"task {ref.index}, moved off {name} for the host-profile roll "
                    f"of entitlement {ent}, waits for room; the roll's next machine waits for "
                    f"it{when} ({job.unplaced_reason})", task=ref.index, machine=m,
                    op="maintenance", reason=f"drain {event_id}")

    def _landing(self, name: str, target: HostProfile | None, now: float) -> bool:
        """Whether tasks moved off the entitlement's drained machines still wait for room
        (then its next machine waits: one machine at a time, its tasks placed again
        before the next drain begins), for ``profile_roll_deadline`` at most each (room
        that never comes does not hold a roll for good); said when the count changes."""
        moved = self.roll_moved.get(name)
        if moved:
            pending, jobs = TaskState.PENDING, self.s.jobs
            since = now - self.deadline
            for ref in [r for r, (_, at) in moved.items() if at <= since or (
                    job := jobs.get(r.job)) is None or (rec := job.tasks.get(r.index)) is None
                    or rec.state is not pending]:
                del moved[ref]
        waiting = len(moved) if moved else 0
        if not waiting:
            self.roll_moved.pop(name, None)
        if waiting != self.roll_landing.get(name, 0):
            if waiting and target is not None:
                self.profile_transitions.append(Transition(
                    -1, "profile_roll_waiting_room", target.name, target.version,
                    entitlement=name, reason=f"{waiting} task{'s' if waiting != 1 else ''} "
                    "moved off its drained machines wait for room: the next machine waits"))
            if waiting:
                self.roll_landing[name] = waiting
            else:
                self.roll_landing.pop(name, None)
        return waiting > 0

    def _rediscover(self, now: float) -> None:
        """Drains under way when this scheduler took over (a restart, a takeover): their
        events are in the brokers' records. A machine still bound to an entitlement goes
        on draining for it; one that is free already was drained, and its event ends. The
        cordons the roll set are stored with the scheduler's state (``roll_cordoned``):
        those are lifted, and never an operator's."""
        names = self.s.fleet.name
        for ev in self.s.region.events():
            if not ev.id.startswith(PROFILE_ROLL_PREFIX) or len(ev.machines) != 1:
                continue
            m = self.s.fleet.index_of(ev.machines[0])
            ent = self.s.region.broker_of(m).entitlement_of(m)
            for stale in self.stale.values():  # (its agent's report, heard first, found it stale)
                stale.discard(m)
            if ent is None or ent not in self.s.allocator.entitlements or not ev.id.startswith(
                    f"{PROFILE_ROLL_PREFIX}{ent}-{names(m)}-"):
                with contextlib.suppress(NotFound):
                    self.s.region.end_event(ev.id, now)  # drained before: back in the free pool
                self._uncordon(m)
                continue
            self.rolling[m] = (ev.id, ent)
            self.roll_deadlines[m] = ev.start
            self.profiles.pending.add(m)  # (it goes back free; nothing new starts there)
            self.s.touched.add(m)
            with contextlib.suppress(ValueError):
                self.roll_seq = max(self.roll_seq, int(ev.id.rsplit("-", 1)[1]))

    def _pushing(self) -> set[int]:
        """The machines that hold a task of a job whose push is under way, running or
        being stopped there (a roll waits for the push to end: decision 104)."""
        held: set[int] = set()
        for name in self.pushing:
            job = self.s.jobs.get(name)
            if job is not None:
                held.update(r.machine for r in job.tasks.values() if r.machine is not None)
        return held

    def _uncordon(self, m: int) -> None:
        if m in self.roll_cordoned:
            self.roll_cordoned.discard(m)
            self.s.region.set_cordon(m, False)

    def found_stale(self, m: int, target: HostProfile | None) -> None:
        """An agent reported a profile other than its entitlement's with tasks running
        (a roll this control plane did not begin): its machine is rolled too."""
        if target is None or m in self.rolling or m in self.profiles.pending:
            return
        ent = self.s.region.broker_of(m).entitlement_of(m)
        alloc = self.s.allocator
        if ent is None or ent not in alloc.entitlements or not alloc.index.tasks[m]:
            return
        self.stale.setdefault(ent, set()).add(m)
        self.profiles.pending.add(m)
