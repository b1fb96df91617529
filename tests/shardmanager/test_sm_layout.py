"""Where Shard Manager puts replicas: on distinct tasks, one replica group per replica,
the groups split by the coarsest fault domain that has enough values; balanced within
a group; sticky when tasks come and go; and shaped so that a whole group can be
updated at once."""

import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plait.shardmanager.batch import safe_batch
from plait.shardmanager.layout import (
    Layout,
    Move,
    TaskPlace,
    assign,
    groups_of,
    moves,
    rebalance,
)


def region(msbs, per_msb, racks_per_msb=5, first=0):
    """``msbs`` x ``per_msb`` tasks, one per machine, ``racks_per_msb`` racks per MSB;
    domains (msb, rack, machine)."""
    per_rack = max(1, per_msb // racks_per_msb)
    out = []
    for m in range(msbs):
        for k in range(per_msb):
            index = first + m * per_msb + k
            out.append(TaskPlace(index, (f"msb{m}", f"msb{m}.rack{k // per_rack}",
                                         f"machine{index}")))
    return out


def shard_names(n):
    return [f"s{i:05d}" for i in range(n)]


def at_level(places, level):
    return {p.index: p.domains[level] for p in places}


def spread(layout, group):
    loads = [layout.load[t] for t, g in layout.groups.items() if g == group]
    return max(loads) - min(loads)


def members(layout, group):
    return {t for t, g in layout.groups.items() if g == group}


BIG = region(20, 50)  # 1,000 tasks in 20 MSBs
BIG_SHARDS = shard_names(3000)


@pytest.fixture(scope="module")
def big():
    return assign(BIG_SHARDS, 3, BIG)


# -- where replicas go ----------------------------------------------------------------------


def test_no_two_replicas_of_a_shard_share_an_msb(big):
    msb = at_level(BIG, 0)
    assert big.level == 0
    assert set(big.replicas) == set(BIG_SHARDS)
    for shard, tasks in big.replicas.items():
        assert len(tasks) == 3
        assert len({msb[t] for t in tasks}) == 3, shard
    # replica r lives in group r, and a group is made of whole MSBs
    for tasks in big.replicas.values():
        assert [big.groups[t] for t in tasks] == [0, 1, 2]
    for g in range(3):
        in_group = {msb[t] for t in members(big, g)}
        for other in range(g + 1, 3):
            assert not in_group & {msb[t] for t in members(big, other)}


def test_groups_hold_about_as_many_tasks_each(big):
    sizes = Counter(big.groups.values())
    assert set(sizes) == {0, 1, 2}
    assert max(sizes.values()) - min(sizes.values()) <= 50  # one MSB apart at most


def test_loads_are_balanced_within_a_group(big):
    for g in range(3):
        loads = [big.load[t] for t in members(big, g)]
        assert max(loads) - min(loads) <= 1  # unit loads: as even as integers allow
    # the load the layout reports is the replicas each task holds
    held = Counter(t for tasks in big.replicas.values() for t in tasks)
    assert {t: big.load[t] for t in big.groups} == {t: float(held[t]) for t in big.groups}


def test_weighted_loads_are_balanced_within_a_group_to_one_shard():
    rng = random.Random(7)
    places = region(6, 20)
    shards = shard_names(400)
    load = {s: rng.choice([0.5, 1.0, 2.0, 4.0]) for s in shards}
    layout = assign(shards, 3, places, load=load)
    for g in range(3):
        loads = [layout.load[t] for t in members(layout, g)]
        mean = sum(loads) / len(loads)
        assert max(loads) - min(loads) <= max(load.values())
        assert max(loads) - min(loads) <= 0.25 * mean
    for t, total in layout.load.items():
        assert total == pytest.approx(sum(load[s] for s, ts in layout.replicas.items()
                                          if t in ts))


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 30), replication=st.integers(1, 4), shards=st.integers(0, 30),
       depth=st.integers(0, 3), widths=st.lists(st.integers(1, 4), min_size=3, max_size=3))
def test_replicas_go_on_distinct_tasks_and_distinct_domains_of_the_level(
        n, replication, shards, depth, widths):
    places = [TaskPlace(i, tuple(f"d{level}.{i % widths[level]}" for level in range(depth)))
              for i in range(n)]
    layout = assign(shard_names(shards), replication, places)
    assert set(layout.groups) == set(range(n))
    assert set(layout.groups.values()) <= set(range(replication))
    for shard, tasks in layout.replicas.items():
        assert len(tasks) == len(set(tasks)) == min(replication, n), shard
        assert set(tasks) <= set(range(n))
        if layout.level is not None:
            domain = at_level(places, layout.level)
            assert len({domain[t] for t in tasks}) == len(tasks), shard


# -- fewer fault domains than replicas ------------------------------------------------------


def test_with_fewer_msbs_than_replicas_racks_are_split():
    places = region(2, 12, racks_per_msb=3)
    layout = assign(shard_names(60), 3, places)
    assert layout.level == 1
    rack = at_level(places, 1)
    for tasks in layout.replicas.values():
        assert len({rack[t] for t in tasks}) == 3


def test_with_one_rack_machines_are_split_and_with_one_machine_tasks():
    one_rack = [TaskPlace(i, ("msb0", "rack0", f"machine{i}")) for i in range(6)]
    layout = assign(shard_names(10), 3, one_rack)
    assert layout.level == 2
    for tasks in layout.replicas.values():
        assert len(set(tasks)) == 3

    one_machine = [TaskPlace(i, ("msb0", "rack0", "machine0")) for i in range(5)]
    layout = assign(shard_names(10), 3, one_machine)
    assert layout.level is None
    assert sorted(Counter(layout.groups.values()).values()) == [1, 2, 2]
    for tasks in layout.replicas.values():
        assert len(set(tasks)) == 3


def test_fewer_tasks_than_replicas_gives_each_shard_every_task():
    layout = assign(shard_names(4), 3, [TaskPlace(0), TaskPlace(1)])
    assert layout.level is None
    for tasks in layout.replicas.values():
        assert sorted(tasks) == [0, 1]
    assert assign(shard_names(3), 3, []).replicas == {s: () for s in shard_names(3)}


def test_with_two_msbs_every_shard_spans_both():
    places = region(2, 12, racks_per_msb=3)
    layout = assign(shard_names(60), 3, places)
    msb = at_level(places, 0)
    for shard, tasks in layout.replicas.items():
        assert len({msb[t] for t in tasks}) == 2, shard


# -- stickiness -----------------------------------------------------------------------------


def test_removing_tasks_moves_only_their_replicas_within_their_group(big):
    gone = {3, 77, 420, 500, 999}
    after = assign(BIG_SHARDS, 3, [p for p in BIG if p.index not in gone], previous=big)
    for shard, tasks in big.replicas.items():
        kept = [t for t in tasks if t not in gone]
        assert set(kept) <= set(after.replicas[shard]), shard
        assert len(after.replicas[shard]) == 3
    lost = sum(1 for tasks in big.replicas.values() for t in tasks if t in gone)
    migrations = moves(big.replicas, after.replicas)
    assert lost > 0 and len(migrations) == lost
    for m in migrations:
        assert m.source in gone and m.target not in gone and m.target != -1
        assert big.groups[m.source] == after.groups[m.target]
    assert {t: g for t, g in big.groups.items() if t not in gone} == dict(after.groups)


def test_losing_a_whole_msb_keeps_the_groups_and_refills_its_group(big):
    msb = at_level(BIG, 0)
    after = assign(BIG_SHARDS, 3, [p for p in BIG if msb[p.index] != "msb0"], previous=big)
    group = big.groups[0]
    assert {t: g for t, g in big.groups.items() if msb[t] != "msb0"} == dict(after.groups)
    for m in moves(big.replicas, after.replicas):
        assert msb[m.source] == "msb0"
        assert after.groups[m.target] == group
    for tasks in after.replicas.values():
        assert len({msb[t] for t in tasks}) == 3


def test_the_same_tasks_again_move_nothing(big):
    again = assign(BIG_SHARDS, 3, BIG, previous=big)
    assert dict(again.replicas) == dict(big.replicas)
    assert moves(big.replicas, again.replicas) == []


def test_added_tasks_get_replicas_only_by_rebalance_which_stays_within_groups(big):
    added = [TaskPlace(1000 + k, (f"msb{k % 20}", f"msb{k % 20}.new", f"new{k}"))
             for k in range(40)]
    grown = assign(BIG_SHARDS, 3, BIG + added, previous=big)
    assert moves(big.replicas, grown.replicas) == []  # sticky: nothing moves by itself
    assert all(grown.load[p.index] == 0 for p in added)
    # a new machine joins its MSB's group
    for p in added:
        assert grown.groups[p.index] == big.groups[int(p.domains[0][3:]) * 50]
    before = [spread(grown, g) for g in range(3)]

    balanced = rebalance(grown, limit=10_000)
    after = [spread(balanced, g) for g in range(3)]
    assert all(a < b for a, b in zip(after, before, strict=True))
    assert all(a <= 1 for a in after)
    migrations = moves(grown.replicas, balanced.replicas)
    assert migrations
    for m in migrations:
        assert balanced.groups[m.source] == balanced.groups[m.target]
    msb = at_level(BIG + added, 0)
    for shard, tasks in balanced.replicas.items():
        assert len(set(tasks)) == 3 and len({msb[t] for t in tasks}) == 3, shard
    held = Counter(t for tasks in balanced.replicas.values() for t in tasks)
    assert all(balanced.load[t] == held[t] for t in balanced.groups)


@settings(max_examples=60, deadline=None)
@given(msbs=st.integers(1, 8), per_msb=st.integers(1, 10), replication=st.integers(1, 4),
       shards=st.integers(0, 40), added=st.integers(0, 10), data=st.data())
def test_tasks_coming_and_going_move_only_what_they_must(
        msbs, per_msb, replication, shards, added, data):
    places = region(msbs, per_msb, racks_per_msb=2)
    first = assign(shard_names(shards), replication, places)
    gone = data.draw(st.sets(st.sampled_from([p.index for p in places])))
    new = [TaskPlace(1000 + k, (f"msb{k % msbs}", f"new{k}", f"new{k}")) for k in range(added)]
    now = [p for p in places if p.index not in gone] + new
    after = assign(shard_names(shards), replication, now, previous=first)
    for tasks in after.replicas.values():
        assert len(tasks) == len(set(tasks)) == min(replication, len(now))
    if all(after.groups[p.index] == first.groups[p.index] for p in now if p.index < 1000):
        # while the groups hold, a replica moves only off a task that went
        for m in moves(first.replicas, after.replicas):
            assert m.source in gone or m.source == -1, m


def test_rebalance_moves_at_most_its_limit_and_nothing_when_balanced(big):
    grown = assign(BIG_SHARDS, 3, [*BIG, TaskPlace(1000, ("msb0", "r", "new"))],
                   previous=big)
    assert len(moves(grown.replicas, rebalance(grown, limit=3).replicas)) == 3
    assert moves(big.replicas, rebalance(big).replicas) == []


def test_groups_are_sticky_while_no_group_grows_over_twice_its_share():
    places = region(6, 10)
    first, _ = groups_of(places, 3)
    # a previous grouping that differs from the fresh one is kept
    swapped = {t: (g + 1) % 3 for t, g in first.items()}
    again, level = groups_of(places, 3, swapped)
    assert level == 0 and again == swapped
    # one that would put everything in one group is not
    lopsided = dict.fromkeys(first, 0)
    again, _ = groups_of(places, 3, lopsided)
    assert max(Counter(again.values()).values()) <= 2 * len(places) / 3


# -- moves ----------------------------------------------------------------------------------


def test_moves_pairs_each_dropped_replica_with_an_added_one():
    before = {"a": (1, 2, 3), "b": (4, 5), "c": (6,), "d": (7, 8)}
    after = {"a": (1, 2, 9), "b": (4, 5, 10), "c": (), "e": (11,), "d": (12, 13)}
    assert moves(before, after) == [
        Move("a", 3, 9),
        Move("b", -1, 10),
        Move("c", 6, -1),
        Move("d", 7, 12), Move("d", 8, 13),
        Move("e", -1, 11),
    ]
    assert moves(after, after) == []


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.sampled_from("abcdef"), st.sets(st.integers(0, 9), max_size=4)),
       st.dictionaries(st.sampled_from("abcdef"), st.sets(st.integers(0, 9), max_size=4)))
def test_applying_the_moves_turns_one_map_into_the_other(before, after):
    held = {s: set(ts) for s, ts in before.items()}
    for m in moves({s: sorted(ts) for s, ts in before.items()},
                   {s: sorted(ts) for s, ts in after.items()}):
        assert (m.source, m.target) != (-1, -1)
        mine = held.setdefault(m.shard, set())
        if m.target != -1:
            assert m.target not in mine
            mine.add(m.target)
        if m.source != -1:
            assert m.source in mine
            mine.discard(m.source)
    assert {s: ts for s, ts in held.items() if ts} == {s: ts for s, ts in after.items() if ts}


# -- why updates are fast -------------------------------------------------------------------


def test_a_whole_replica_group_can_go_down_at_once(big):
    batch = safe_batch(big.groups, big.replicas, set())
    largest = max(Counter(big.groups.values()).values())
    assert len(batch) >= 0.9 * largest
    for tasks in big.replicas.values():
        assert len(set(tasks) & set(batch)) <= 1


def test_the_layout_shards_of_lists_every_task():
    layout = Layout({"a": (0, 1), "b": (1,)}, {0: 0, 1: 1, 2: 0})
    assert layout.shards_of() == {0: ["a"], 1: ["a", "b"], 2: []}
