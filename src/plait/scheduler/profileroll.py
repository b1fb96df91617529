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
(``Scheduler.pushing``, kept by the Job Control Plane) is not drained until that push
ends. It stays cordoned meanwhile, so the push's own updates carry its tasks to
machines that carry the new profile: every task the push touches gets the new host
profile with the new spec, and the push's stages and gates judge both together.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from plait.errors import NotFound
from plait.model.events import PROFILE_ROLL_PREFIX, EventKind, UnavailabilityEvent
from plait.model.hostprofile import DEFAULT_PROFILE, HostProfile
from plait.model.task import TaskState
from plait.scheduler import drain
from plait.sidekick.book import Transition

if TYPE_CHECKING:
    from plait.scheduler.scheduler import Scheduler

#: how long a roll's drained machine is held (its drain is ended once it is empty)
HOLD = 365 * 86400.0
_UNSEEN = ("", -1)


def _ref(target: HostProfile | None) -> tuple[str, int] | None:
    return None if target is None else (target.name, target.version)


def carries(s: Scheduler, m: int, target: HostProfile | None) -> bool:
    """Whether machine ``m`` carries ``target`` as far as its agent has said (a machine
    without an entry in the book carries ``default``)."""
    if target is None:
        return False
    seen = s.profiles.applied.get(m)
    if seen is None:
        return target.name == DEFAULT_PROFILE and target.version == 1
    return (seen.name, seen.version) == (target.name, target.version)


def notice_changes(s: Scheduler) -> None:
    """Entitlements whose profile target moved since the last look: their machines are
    stale (the first look only learns the targets). Only after an entitlement or a
    profile was defined."""
    mark = (s.allocator.defined, s.profiles.generation)
    if mark == s.roll_mark:
        return
    s.roll_mark = mark
    seen = s.roll_targets
    for name, ent in s.allocator.entitlements.items():
        ref = _ref(s.profiles.target(ent.host_profile))
        old = seen.get(name, _UNSEEN)
        seen[name] = ref
        if old in (_UNSEEN, ref):
            continue
        machines = [int(m) for m in s.region.machines_of(name)]
        s.stale.setdefault(name, set()).update(machines)
        # no task that has not started goes to them until they carry the new profile
        s.profiles.pending.update(machines)
        s.touched.update(machines)
        if ref is not None:
            s.profile_transitions.append(Transition(
                -1, "profile_roll_started", ref[0], ref[1], entitlement=name,
                reason=f"{len(machines)} machines"))


def roll(s: Scheduler, now: float) -> None:
    """One look (every pass): finish the drains of machines now empty, then drain the
    next stale machines of each entitlement."""
    notice_changes(s)
    if not s.rolls_found:
        s.rolls_found = True
        _rediscover(s, now)
    if not s.stale and not s.rolling and not s.roll_moved:
        return
    index, region, names = s.allocator.index, s.region, s.fleet.name
    for m, (event_id, ent) in list(s.rolling.items()):
        drain.unpark_all(s, event_id)
        drain.unstarted(s, m, event_id, now)
        _moved_off(s, m, event_id, ent, now)
        if drain.occupied(s, m):
            due = s.roll_deadlines.get(m)
            if due is None:  # (rolled before a takeover: its event says when)
                due = s.roll_deadlines[m] = next(
                    (e.start for e in s.region.events() if e.id == event_id), float("inf"))
            if now >= due:
                s.roll_deadlines[m] = float("inf")
                drain.deadline(s, m, event_id, now, "its entitlement's host profile changed")
            continue
        s.roll_deadlines.pop(m, None)  # (empty: its drain is over)
        del s.rolling[m]
        with contextlib.suppress(NotFound):
            region.end_event(event_id, now)
        _uncordon(s, m)
        target = s.profiles.target(s.allocator.entitlements[ent].host_profile
                                   if ent in s.allocator.entitlements else None)
        ref = _ref(target) or ("?", 0)
        s.profile_transitions.append(Transition(m, "profile_roll_drained", ref[0], ref[1],
                                                entitlement=ent))
    at_once = s.config.profile_roll_at_once
    held: set[int] | None = None
    for name, stale in list(s.stale.items()):
        found = s.allocator.entitlements.get(name)
        code = region.entitlements.find(name)
        target = None if found is None else s.profiles.target(found.host_profile)
        for m in sorted(stale):
            if m in s.rolling:
                stale.discard(m)  # (draining already: found again after a takeover)
            elif (found is None or code is None or int(index.ent[m]) != code
                    or carries(s, m, target)):
                stale.discard(m)  # left the entitlement, or carries its profile
                _uncordon(s, m)
            elif not drain.occupied(s, m):
                stale.discard(m)  # idle: it switches now, before any task starts there
                _uncordon(s, m)
            elif not region.broker_of(m).operator_cordoned(m):
                region.set_cordon(m, True)  # no new task on a machine about to drain
                s.roll_cordoned.add(m)
        if target is None:
            continue
        draining = sum(1 for _, ent in s.rolling.values() if ent == name)
        if held is None:
            held = _pushing(s)
        if _landing(s, name, target, now):
            draining = at_once  # (one machine at a time: its tasks placed again first)
        ready = [m for m in sorted(stale) if m not in held]
        waiting = len(stale) - len(ready)
        if waiting and s.roll_waiting.get(name) != waiting:
            s.profile_transitions.append(Transition(
                -1, "profile_roll_waiting", target.name, target.version, entitlement=name,
                reason=f"{waiting} machines"))
        s.roll_waiting[name] = waiting
        for m in ready[:max(0, at_once - draining)]:
            stale.discard(m)
            s.roll_seq += 1
            event_id = f"{PROFILE_ROLL_PREFIX}{name}-{names(m)}-{s.roll_seq}"
            start = now + s.config.profile_roll_deadline
            s.roll_deadlines[m] = start
            region.add_event(UnavailabilityEvent(
                event_id, EventKind.MAINTENANCE, (names(m),), start, start + HOLD,
                f"host profile {target.name} v{target.version}"), now)
            s.rolling[m] = (event_id, name)
            s.touched.add(m)  # (its agent is told not to switch: it goes back free)
        if not stale:
            del s.stale[name]
            s.roll_waiting.pop(name, None)
    for name in [n for n in s.roll_moved if n not in s.stale]:  # (its roll is over)
        _landing(s, name, None, now)


def _moved_off(s: Scheduler, m: int, event_id: str, ent: str, now: float) -> None:
    """Tasks moved off draining machine ``m`` that wait for room (pending: no machine
    of the entitlement outside the roll, nor of the free pool, has room for them) are
    kept as the roll's (``roll_moved``), each said once: its job's event
    ``profile_roll_waiting`` tells why it waits and when the drain's deadline moves
    what still runs on ``m``."""
    placed = s.placed.get(m)
    if not placed:
        return
    pending, jobs = TaskState.PENDING, s.jobs
    moved = s.roll_moved.setdefault(ent, {})
    for ref in placed.refs():
        job = jobs.get(ref.job)
        rec = job.tasks.get(ref.index) if job else None
        if job is None or rec is None or rec.state is not pending or ref in moved or (
                job.unplaced_reason is None):
            continue  # (a pending task not tried yet may find room: looked at again)
        moved[ref] = (m, now)
        due = s.roll_deadlines.get(m, float("inf"))
        when = ("" if due == float("inf") else
                f"; what still runs on {s.fleet.name(m)} is moved at the drain's deadline, "
                f"in {max(0.0, due - now):.0f}s")
        s.event(now, job.name, "profile_roll_waiting",
                f"task {ref.index}, moved off {s.fleet.name(m)} for the host-profile roll "
                f"of entitlement {ent}, waits for room; the roll's next machine waits for "
                f"it{when} ({job.unplaced_reason})", task=ref.index, machine=m, op="maintenance",
                reason=f"drain {event_id}")


def _landing(s: Scheduler, name: str, target: HostProfile | None, now: float) -> bool:
    """Whether tasks moved off the entitlement's drained machines still wait for room
    (then its next machine waits: one machine at a time, its tasks placed again
    before the next drain begins), for ``profile_roll_deadline`` at most each (room
    that never comes does not hold a roll for good); said when the count changes."""
    moved = s.roll_moved.get(name)
    if moved:
        pending, jobs = TaskState.PENDING, s.jobs
        since = now - s.config.profile_roll_deadline
        for ref in [r for r, (_, at) in moved.items() if at <= since or (
                job := jobs.get(r.job)) is None or (rec := job.tasks.get(r.index)) is None
                or rec.state is not pending]:
            del moved[ref]
    waiting = len(moved) if moved else 0
    if not waiting:
        s.roll_moved.pop(name, None)
    if waiting != s.roll_landing.get(name, 0):
        if waiting and target is not None:
            s.profile_transitions.append(Transition(
                -1, "profile_roll_waiting_room", target.name, target.version,
                entitlement=name, reason=f"{waiting} task{'s' if waiting != 1 else ''} "
                "moved off its drained machines wait for room: the next machine waits"))
        if waiting:
            s.roll_landing[name] = waiting
        else:
            s.roll_landing.pop(name, None)
    return waiting > 0


def _rediscover(s: Scheduler, now: float) -> None:
    """Drains under way when this scheduler took over (a restart, a takeover): their
    events are in the brokers' records. A machine still bound to an entitlement goes
    on draining for it; one that is free already was drained, and its event ends. The
    cordons the roll set are stored with the scheduler's state (``roll_cordoned``):
    those are lifted, and never an operator's."""
    names = s.fleet.name
    for ev in s.region.events():
        if not ev.id.startswith(PROFILE_ROLL_PREFIX) or len(ev.machines) != 1:
            continue
        m = s.fleet.index_of(ev.machines[0])
        ent = s.region.broker_of(m).entitlement_of(m)
        for stale in s.stale.values():  # (its agent's report, heard first, found it stale)
            stale.discard(m)
        if ent is None or ent not in s.allocator.entitlements or not ev.id.startswith(
                f"{PROFILE_ROLL_PREFIX}{ent}-{names(m)}-"):
            with contextlib.suppress(NotFound):
                s.region.end_event(ev.id, now)  # drained before: back in the free pool
            _uncordon(s, m)
            continue
        s.rolling[m] = (ev.id, ent)
        s.roll_deadlines[m] = ev.start
        s.profiles.pending.add(m)  # (it goes back free; nothing new starts there)
        s.touched.add(m)
        with contextlib.suppress(ValueError):
            s.roll_seq = max(s.roll_seq, int(ev.id.rsplit("-", 1)[1]))


def _pushing(s: Scheduler) -> set[int]:
    """The machines that hold a task of a job whose push is under way, running or
    being stopped there (a roll waits for the push to end: decision 104)."""
    held: set[int] = set()
    for name in s.pushing:
        job = s.jobs.get(name)
        if job is not None:
            held.update(r.machine for r in job.tasks.values() if r.machine is not None)
    return held


def _uncordon(s: Scheduler, m: int) -> None:
    if m in s.roll_cordoned:
        s.roll_cordoned.discard(m)
        s.region.set_cordon(m, False)


def found_stale(s: Scheduler, m: int, target: HostProfile | None) -> None:
    """An agent reported a profile other than its entitlement's with tasks running
    (a roll this control plane did not begin): its machine is rolled too."""
    if target is None or m in s.rolling or m in s.profiles.pending:
        return
    ent = s.region.broker_of(m).entitlement_of(m)
    if ent is None or ent not in s.allocator.entitlements or not s.allocator.index.tasks[m]:
        return
    s.stale.setdefault(ent, set()).add(m)
    s.profiles.pending.add(m)
