"""Where a sharded application's replicas go: Shard Manager's assignment, a pure
function of the application's shards, its tasks and the map it had.

Replicas of one shard go on different tasks, spread over fault domains. The tasks
are split into ``replication`` *replica groups* by fault domain: the coarsest level
of a task's domains (MSB, then rack, then machine) with at least ``replication``
values, its values dealt to the groups so each holds about as many tasks; replica
``r`` of every shard lives in group ``r``. So two replicas of a shard never share
that domain (nor anything below it), and a whole group can be updated at once
without any shard losing two replicas: the batch rule (``plait.shardmanager.batch``)
finds such batches by itself. Groups are sticky: a domain keeps the group its tasks
had. Within a group, a new replica goes to the least-loaded task; a replica stays
where it is while its task is in the map and in the right group.

``rebalance`` moves replicas within their group from the most to the least loaded
task while that narrows the spread; ``moves`` lists what changes between two maps as
(shard, from, to) migrations, which the service runs add first, drop second, so a
shard never has fewer replicas than before.

This is a purely computational module with no side effects.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class TaskPlace:
    """A task of the application and where it runs: its fault domains from the
    coarsest to the finest, e.g. (msb, rack, machine); empty while unknown."""

    index: int
    domains: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Move:
    """A replica of ``shard`` migrates from task ``source`` to task ``target`` (added
    on the target first, dropped from the source once the target serves it)."""

    shard: str
    source: int
    target: int


@dataclass(frozen=True)
class Layout:
    #: shard -> the tasks holding its replicas (replica r in group r where it can)
    replicas: Mapping[str, tuple[int, ...]]
    #: task -> its replica group
    groups: Mapping[int, int]
    #: the fault-domain level the groups split (0 = coarsest), None: by task
    level: int | None = None
    #: task -> the load of the replicas it holds
    load: Mapping[int, float] = field(default_factory=dict)

    def shards_of(self) -> dict[int, list[str]]:
        out: dict[int, list[str]] = {t: [] for t in self.groups}
        for shard, tasks in self.replicas.items():
            for t in tasks:
                out.setdefault(t, []).append(shard)
        return out


def _level(tasks: Sequence[TaskPlace], replication: int) -> int | None:
    """The coarsest domain level with at least ``replication`` values (among the
    tasks whose domains are known: one not placed yet does not undo the others')."""
    tasks = [t for t in tasks if t.domains]
    depth = min((len(t.domains) for t in tasks), default=0)
    for level in range(depth):
        if len({t.domains[level] for t in tasks}) >= replication:
            return level
    return None


def groups_of(tasks: Sequence[TaskPlace], replication: int,
              previous: Mapping[int, int] | None = None) -> tuple[dict[int, int], int | None]:
    """Each task's replica group (0..replication-1), and the level split."""
    if not tasks:
        return {}, None
    level = _level(tasks, replication)
    by_domain: dict[str, list[int]] = {}
    for t in tasks:
        key = t.domains[level] if level is not None and len(t.domains) > level else (
            f"#{t.index}")
        by_domain.setdefault(key, []).append(t.index)
    previous = previous or {}
    sizes = [0] * replication
    out: dict[int, int] = {}
    # domains that had a group keep it (the group most of their tasks had) while that
    # leaves no group over twice its share; the rest go to the smallest group
    share = len(tasks) / replication
    fresh: list[str] = []
    for key in sorted(by_domain, key=lambda k: (-len(by_domain[k]), k)):
        members = by_domain[key]
        votes = [previous[t] for t in members if previous.get(t, -1) in range(replication)]
        if votes:
            g = max(set(votes), key=lambda v: (votes.count(v), -v))
            if sizes[g] + len(members) <= max(2 * share, len(members)):
                sizes[g] += len(members)
                out.update(dict.fromkeys(members, g))
                continue
        fresh.append(key)
    for key in fresh:
        g = min(range(replication), key=lambda i: (sizes[i], i))
        sizes[g] += len(by_domain[key])
        out.update(dict.fromkeys(by_domain[key], g))
    return out, level


def assign(shards: Sequence[str], replication: int, tasks: Sequence[TaskPlace], *,
           load: Mapping[str, float] | None = None,
           previous: Layout | None = None) -> Layout:
    """The application's layout: ``replication`` replicas of every shard on distinct
    tasks (as many as there are tasks), replica r in group r where it can be, on the
    least-loaded task; a replica of ``previous`` stays where it is while its task is
    still here and no other replica of the shard is in its group."""
    load = load or {}
    groups, level = groups_of(tasks, replication,
                              previous.groups if previous is not None else None)
    per_task: dict[int, float] = {t.index: 0.0 for t in tasks}
    heaps: list[list[tuple[float, int]]] = [[] for _ in range(replication)]
    kept: dict[str, list[int]] = {}
    order = sorted(shards, key=lambda s: (-load.get(s, 1.0), s))
    before = previous.replicas if previous is not None else {}
    for shard in order:
        mine: list[int] = []
        used: set[int] = set()
        for t in before.get(shard, ()):
            g = groups.get(t)
            if g is not None and g not in used and t not in mine:
                mine.append(t)
                used.add(g)
                per_task[t] += load.get(shard, 1.0)
        kept[shard] = mine
    for t, g in groups.items():
        heaps[g].append((per_task[t], t))
    for h in heaps:
        heapq.heapify(h)
    # (groups split a finer level than the coarsest: spread over the coarser one too)
    coarse = {t.index: "/".join(t.domains[:level]) or f"#{t.index}"
              for t in tasks} if level else None
    out: dict[str, tuple[int, ...]] = {}
    for shard in order:
        mine = kept[shard]
        used = {groups[t] for t in mine}
        weight = load.get(shard, 1.0)
        taken = {coarse[t] for t in mine} if coarse is not None else None
        for g in range(replication):
            if len(mine) >= min(replication, len(groups)):
                break
            if g in used:
                continue
            found = _least(heaps[g], per_task, mine, taken, coarse)
            if found is None:  # (an empty group, or all of it holds the shard already)
                found = _least_anywhere(per_task, mine)
                if found is None:
                    break
            t = found
            mine.append(t)
            if taken is not None and coarse is not None:
                taken.add(coarse[t])
            used.add(g)
            per_task[t] += weight
            if groups[t] == g:
                heapq.heappush(heaps[g], (per_task[t], t))
        out[shard] = tuple(mine)
    return Layout(out, groups, level, per_task)


#: how many of a group's least-loaded tasks are looked at for one in another domain
_LOOK = 64


def _least(heap: list[tuple[float, int]], per_task: Mapping[int, float],
           avoid: Sequence[int], taken: set[str] | None = None,
           coarse: Mapping[int, str] | None = None) -> int | None:
    """The least-loaded task of a group's heap not in ``avoid``; with ``taken``, one
    whose coarse domain (``coarse``) is not among them if one is among the
    ``_LOOK`` least loaded (stale entries, whose load grew since, are dropped as
    they surface)."""
    skipped: list[tuple[float, int]] = []
    first = None
    found = None
    while heap and len(skipped) < _LOOK:
        weight, t = heapq.heappop(heap)
        if weight != per_task[t]:
            continue  # stale
        skipped.append((weight, t))
        if t in avoid:
            continue
        if first is None:
            first = t
        if not taken or coarse is None or coarse[t] not in taken:
            found = t
            break
    for item in skipped:
        heapq.heappush(heap, item)
    return found if found is not None else first


def _least_anywhere(per_task: Mapping[int, float], avoid: Sequence[int]) -> int | None:
    free = [(w, t) for t, w in per_task.items() if t not in avoid]
    return min(free)[1] if free else None


def rebalance(layout: Layout, load: Mapping[str, float] | None = None, *,
              limit: int = 100, tolerance: float = 0.1) -> Layout:
    """``layout`` with up to ``limit`` replicas moved within their group, each from the
    group's most loaded task to its least loaded one, while the spread between them
    is above ``tolerance`` of the group's mean and the move narrows it."""
    load = load or {}
    replicas = {s: list(ts) for s, ts in layout.replicas.items()}
    per_task = dict(layout.load) or {t: 0.0 for t in layout.groups}
    shards_of: dict[int, set[str]] = {t: set() for t in layout.groups}
    for s, ts in replicas.items():
        for t in ts:
            shards_of.setdefault(t, set()).add(s)
    members: dict[int, list[int]] = {}
    for t, g in layout.groups.items():
        members.setdefault(g, []).append(t)
    moved = 0
    for g in sorted(members):
        tasks = members[g]
        if len(tasks) < 2:
            continue
        mean = sum(per_task[t] for t in tasks) / len(tasks)
        while moved < limit:
            hi = max(tasks, key=lambda t: (per_task[t], -t))
            lo = min(tasks, key=lambda t: (per_task[t], t))
            gap = per_task[hi] - per_task[lo]
            if gap <= tolerance * max(mean, 1e-9):
                break
            # the replica whose move narrows the gap most (its load nearest gap / 2)
            best = None
            for s in sorted(shards_of[hi]):
                w = load.get(s, 1.0)
                if w < gap and lo not in replicas[s]:
                    score = abs(gap / 2 - w)
                    if best is None or score < best[0]:
                        best = (score, s, w)
            if best is None:
                break
            _, s, w = best
            replicas[s][replicas[s].index(hi)] = lo
            shards_of[hi].discard(s)
            shards_of[lo].add(s)
            per_task[hi] -= w
            per_task[lo] += w
            moved += 1
    return Layout({s: tuple(ts) for s, ts in replicas.items()}, layout.groups, layout.level,
                  per_task)


def moves(before: Mapping[str, Sequence[int]],
          after: Mapping[str, Sequence[int]]) -> list[Move]:
    """The migrations from one map to the other, shard by shard (a replica that only
    appears is added from nowhere: ``source`` -1; one that only goes is dropped:
    ``target`` -1)."""
    out: list[Move] = []
    for shard in sorted(set(before) | set(after)):
        old = [t for t in before.get(shard, ()) if t not in after.get(shard, ())]
        new = [t for t in after.get(shard, ()) if t not in before.get(shard, ())]
        for i in range(max(len(old), len(new))):
            out.append(Move(shard, old[i] if i < len(old) else -1,
                            new[i] if i < len(new) else -1))
    return out
