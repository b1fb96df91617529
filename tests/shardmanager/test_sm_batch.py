"""The batch rule of Shard Manager's TaskController: which requested tasks may go down
together. Over any shard map, what is down and what is asked, the batch keeps every
shard within ``max_down`` replicas down (or no worse than it already was), is as large
as that allows one task at a time, and depends on nothing but its input."""

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from plait.shardmanager.batch import missing, safe_batch

# -- random layouts -------------------------------------------------------------------------


@st.composite
def situations(draw):
    """A shard map over 1-40 tasks (1-4 replicas per shard, on distinct tasks), what is
    down, what is asked, ``max_down`` and, sometimes, the replication factor."""
    n = draw(st.integers(1, 40))
    tasks = st.integers(0, n - 1)
    shards = draw(st.lists(st.lists(tasks, min_size=1, max_size=4, unique=True),
                           max_size=25))
    replicas = {f"s{k}": tuple(ts) for k, ts in enumerate(shards)}
    down = draw(st.sets(tasks, max_size=n))
    candidates = draw(st.lists(tasks, max_size=n, unique=True))
    max_down = draw(st.sampled_from([1, 2]))
    replication = draw(st.none() | st.integers(1, 4))
    return replicas, down, candidates, max_down, replication


def violations(replicas, down, batch, max_down, replication):
    """The shards the batch makes worse than the rule allows: over ``max_down`` after
    it when they were not before, or worse than they were when they already were."""
    before = missing(replicas, down, replication)
    after = missing(replicas, set(down) | set(batch), replication)
    return [s for s in replicas
            if after[s] > max(max_down, before[s])
            or (before[s] >= max_down and after[s] > before[s])]


@settings(max_examples=200, deadline=None)
@given(situations())
def test_the_batch_rule_holds_for_any_map(situation):
    replicas, down, candidates, max_down, replication = situation
    batch = safe_batch(candidates, replicas, down, max_down, replication)

    # (a) a sorted subset of the candidates, with every candidate already down
    assert batch == sorted(set(batch))
    assert set(batch) <= set(candidates)
    assert set(candidates) & down <= set(batch)

    # (b) no shard ends over max_down unless it already was, and then no worse
    assert violations(replicas, down, batch, max_down, replication) == []

    # (c) with max_down 1, no task that was up and hosts a shard already missing a
    # replica is taken
    before = missing(replicas, down, replication)
    if max_down == 1:
        for shard, tasks in replicas.items():
            if before[shard] >= 1:
                assert not (set(tasks) - down) & set(batch), shard

    # (d) maximal: no up candidate left out could join without breaking (b)
    for t in set(candidates) - set(batch):
        assert t not in down
        assert violations(replicas, down, [*batch, t], max_down, replication), t

    # (e) deterministic, whatever the order the candidates and shards come in
    assert safe_batch(candidates, replicas, down, max_down, replication) == batch
    shuffled = random.Random(len(batch)).sample(candidates, len(candidates))
    reordered = dict(reversed(list(replicas.items())))
    assert safe_batch(shuffled, reordered, set(down), max_down, replication) == batch


# -- examples -------------------------------------------------------------------------------

#: paper Figure 2: replicas of shards A-D on tasks 1-7 (index k - 1 is the figure's task k)
FIGURE = {"A": (1, 3), "B": (2, 5, 6), "C": (1, 4, 7), "D": (2, 3, 5)}
SHARDS = {shard: tuple(k - 1 for k in tasks) for shard, tasks in FIGURE.items()}


def task(k):
    """The index of the figure's task k."""
    return k - 1


def test_figure2_with_task4_down_holds_back_1_and_7_and_takes_the_largest_batch():
    batch = safe_batch(range(7), SHARDS, {task(4)})
    # 4 is down (and taken: it costs nothing); 1 and 7 share shard C with it
    assert task(4) in batch
    assert task(1) not in batch and task(7) not in batch
    # of 2, 3, 5, 6: B allows one of 2, 5, 6; D one of 2, 3, 5: {3, 6} is the largest
    assert batch == [task(3), task(4), task(6)]


def test_figure2_with_everything_up_never_restarts_1_and_3_together():
    batch = safe_batch(range(7), SHARDS, set())
    assert not {task(1), task(3)} <= set(batch)
    for tasks in SHARDS.values():
        assert len(set(tasks) & set(batch)) <= 1
    # the largest there is: four would need one task per shard, each in that shard
    # alone, and only B and C have such tasks
    assert batch == [task(3), task(4), task(6)]


def test_an_empty_map_lets_every_candidate_go():
    assert safe_batch([4, 0, 2], {}, set()) == [0, 2, 4]
    assert safe_batch([], {"s": (0, 1)}, set()) == []


def test_a_shard_already_two_down_keeps_its_last_replica_whatever_max_down():
    replicas = {"s": (0, 1, 2), "t": (3, 4, 5)}
    down = {0, 1}
    for max_down in (1, 2):
        batch = safe_batch(range(6), replicas, down, max_down)
        assert 2 not in batch
        assert {0, 1} <= set(batch)
        # the healthy shard t still loses as many as max_down allows
        assert len({3, 4, 5} & set(batch)) == max_down


def test_a_shard_short_of_its_replication_counts_the_missing_replicas_as_down():
    # s has 2 of its 3 replicas: one is missing, so with max_down 1 neither may go
    replicas = {"s": (0, 1), "t": (2, 3, 4)}
    assert safe_batch(range(5), replicas, set(), 1, replication=3) == [2]
    assert safe_batch(range(5), replicas, set(), 1) == [0, 2]
    # with max_down 2 one of s's two may go
    batch = safe_batch(range(5), replicas, set(), 2, replication=3)
    assert len({0, 1} & set(batch)) == 1 and len({2, 3, 4} & set(batch)) == 2


def test_missing_counts_down_replicas_and_absent_ones():
    replicas = {"a": (0, 1, 2), "b": (3,), "c": ()}
    assert missing(replicas, {1, 3}) == {"a": 1, "b": 1, "c": 0}
    assert missing(replicas, {1, 3}, replication=3) == {"a": 1, "b": 3, "c": 3}
