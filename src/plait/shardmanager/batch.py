"""The batch rule of Shard Manager's TaskController: which of the requested tasks may
go down together. A pure function of the shard map and what is down.

A shard may have at most ``max_down`` replicas down (1 by default: with three
replicas, two always serve). A replica is down when its task is down (unhealthy,
failed, under maintenance, or under an operation acked and not yet completed), and a
shard with fewer replicas than its replication factor counts the missing ones as
down. A task may go down only if every shard it hosts can lose one more replica:
with ``max_down`` 1, a task that hosts a shard already missing a replica is never
taken. Of the tasks that may, ``safe_batch`` takes as many as it can together such
that no shard ends with more than ``max_down`` replicas down.

The largest such batch is a maximum independent set of the tasks' conflict graph
(two tasks conflict when a shard with room for one more down replica lives on both),
NP-hard in general; ``safe_batch`` takes a greedy one: repeatedly the task whose
taking rules out the fewest others (``plait.shardmanager.optimal`` computes the
exact optimum with a solver, to judge it). Tasks already down cost nothing and are
always taken: taking them down again cannot make any shard worse.

This is a purely computational module with no side effects.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence


def missing(replicas: Mapping[str, Sequence[int]], down: Collection[int],
            replication: int | None = None) -> dict[str, int]:
    """Per shard, its replicas down now: on a down task, or missing from its
    replication factor."""
    out: dict[str, int] = {}
    downs = down if isinstance(down, (set, frozenset)) else set(down)
    contains = downs.__contains__
    for shard, tasks in replicas.items():
        n = sum(map(contains, tasks)) if downs else 0
        if replication is not None and len(tasks) < replication:
            n += replication - len(tasks)
        out[shard] = n
    return out


def safe_batch(candidates: Iterable[int], replicas: Mapping[str, Sequence[int]],
               down: Collection[int], max_down: int = 1,
               replication: int | None = None) -> list[int]:
    """The tasks of ``candidates`` that may go down together (sorted): every candidate
    already ``down``, plus a greedy maximal set of the others such that no shard of
    ``replicas`` (shard -> the tasks holding its replicas) ends with more than
    ``max_down`` replicas down. ``replication``: the replicas each shard should have
    (fewer count as down)."""
    cands = set(candidates)
    down = down if isinstance(down, (set, frozenset)) else set(down)
    taken = sorted(cands & down)
    pending = cands - down
    if not pending:
        return taken
    room: dict[str, int] = {}
    shards_of: dict[int, list[str]] = {t: [] for t in pending}
    for shard, n in missing(replicas, down, replication).items():
        left = max_down - n
        tasks = pending.intersection(replicas[shard])
        if not tasks:
            continue
        if left <= 0:  # a shard with no room: none of its tasks may go down
            for t in tasks:
                shards_of.pop(t, None)
            continue
        room[shard] = left
        for t in tasks:
            if t in shards_of:
                shards_of[t].append(shard)
    # the candidates still possible, per shard
    members: dict[str, set[int]] = {}
    for t, shards in shards_of.items():
        for s in shards:
            members.setdefault(s, set()).add(t)

    # how many other candidates taking a task could rule out (with multiplicity),
    # kept exact as candidates are ruled out; tasks bucketed by it (a bucket queue:
    # costs are small integers that only fall)
    cost = {t: sum(len(members[s]) - 1 for s in shards if room[s] == 1)
            for t, shards in shards_of.items()}
    buckets: dict[int, set[int]] = {}
    for t, c in cost.items():
        buckets.setdefault(c, set()).add(t)
    alive = set(shards_of)
    chosen: list[int] = []
    top = max(buckets, default=0)

    def drop(u: int) -> None:
        """``u`` leaves the candidates: the others of its full shards cost less."""
        alive.discard(u)
        buckets[cost[u]].discard(u)
        for s2 in shards_of[u]:
            group = members[s2]
            group.discard(u)
            if room[s2] == 1:
                for w in group:
                    c = cost[w]
                    buckets[c].discard(w)
                    cost[w] = c - 1
                    buckets.setdefault(c - 1, set()).add(w)

    while alive:
        low = next(k for k in range(top + 1) if buckets.get(k))
        t = min(buckets[low])  # (the lowest index of the cheapest: deterministic)
        drop(t)
        chosen.append(t)
        for s in shards_of[t]:
            room[s] -= 1
            if room[s] == 0:  # full: every other task of it is ruled out
                for u in list(members[s]):
                    drop(u)
            elif room[s] == 1:  # (its tasks now count it)
                for w in members[s]:
                    c = cost[w]
                    buckets[c].discard(w)
                    cost[w] = c + len(members[s]) - 1
                    buckets.setdefault(cost[w], set()).add(w)
                    top = max(top, cost[w])
    return sorted(taken + chosen)
