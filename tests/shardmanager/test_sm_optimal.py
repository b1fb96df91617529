"""The exact largest safe batch (CP-SAT) against a brute force on small maps, and the
greedy batch rule against it: never larger, always feasible."""

from itertools import combinations

from hypothesis import given, settings
from hypothesis import strategies as st

from plait.shardmanager.batch import missing, safe_batch
from plait.shardmanager.optimal import largest_safe_batch


def feasible(batch, replicas, down, max_down, replication):
    """Does taking ``batch`` (none of it down yet) leave every shard within its room?"""
    before = missing(replicas, down, replication)
    for shard, tasks in replicas.items():
        taken = len(set(tasks) & set(batch))
        if taken > max(0, max_down - before[shard]):
            return False
    return True


def brute_force(candidates, replicas, down, max_down, replication):
    pending = sorted(set(candidates) - set(down))
    for size in range(len(pending), -1, -1):
        for batch in combinations(pending, size):
            if feasible(batch, replicas, down, max_down, replication):
                return size
    raise AssertionError("the empty batch is always feasible")


@st.composite
def small_maps(draw):
    n = draw(st.integers(1, 12))
    tasks = st.integers(0, n - 1)
    shards = draw(st.lists(st.lists(tasks, min_size=1, max_size=4, unique=True),
                           max_size=12))
    replicas = {f"s{k}": tuple(ts) for k, ts in enumerate(shards)}
    down = draw(st.sets(tasks, max_size=3))
    candidates = draw(st.sets(tasks, min_size=1))
    return (candidates, replicas, down, draw(st.sampled_from([1, 2])),
            draw(st.none() | st.integers(1, 4)))


@settings(max_examples=40, deadline=None)
@given(small_maps())
def test_the_solver_finds_the_proven_maximum_and_the_greedy_never_beats_it(instance):
    candidates, replicas, down, max_down, replication = instance
    best = largest_safe_batch(candidates, replicas, down, max_down, replication,
                              seconds=10, workers=1)
    assert best.proven
    assert len(best.batch) == best.bound == brute_force(*instance)
    assert set(best.batch) <= set(candidates) - down
    assert feasible(best.batch, replicas, down, max_down, replication)

    greedy = set(safe_batch(candidates, replicas, down, max_down, replication)) - down
    assert len(greedy) <= len(best.batch)
    assert feasible(greedy, replicas, down, max_down, replication)


def test_figure2_the_most_is_three_and_both_find_it():
    # paper Figure 2 with everything up: three tasks is the most, and both find it
    figure = {"A": (0, 2), "B": (1, 4, 5), "C": (0, 3, 6), "D": (1, 2, 4)}
    best = largest_safe_batch(range(7), figure, set())
    assert best.proven and len(best.batch) == 3
    assert len(safe_batch(range(7), figure, set())) == 3


def test_tasks_already_down_are_not_counted_and_a_full_shard_blocks_its_tasks():
    replicas = {"s": (0, 1, 2), "t": (3, 4)}
    best = largest_safe_batch(range(5), replicas, {0, 1}, max_down=2)
    assert best.proven
    assert 2 not in best.batch and not {0, 1} & set(best.batch)
    assert sorted(best.batch) == [3, 4]
