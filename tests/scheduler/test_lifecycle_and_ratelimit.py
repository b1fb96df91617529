import pytest

from plait.model import TaskState
from plait.scheduler import TRANSITIONS, Event, TokenBucket, advance


def test_every_stop_comes_from_a_state_that_can_be_serving_or_starting():
    sources = {s for (s, e) in TRANSITIONS if e is Event.STOP}
    assert TaskState.RUNNING in sources
    assert TaskState.STOPPED not in sources and TaskState.LOST not in sources


def test_unknown_edges_change_nothing():
    assert advance(TaskState.STOPPED, Event.RUNNING) is None
    assert advance(TaskState.PENDING, Event.STOPPED) is None
    assert advance(TaskState.RUNNING, Event.STOP) is TaskState.STOPPING


def test_every_state_is_reachable_from_pending():
    seen, frontier = {TaskState.PENDING}, [TaskState.PENDING]
    while frontier:
        s = frontier.pop()
        for (a, _), b in TRANSITIONS.items():
            if a is s and b not in seen:
                seen.add(b)
                frontier.append(b)
    assert seen == set(TaskState)


def test_token_bucket_allows_burst_then_rate():
    b = TokenBucket(rate=2, burst=3, now=0)
    assert [b.take(0) for _ in range(4)] == [True, True, True, False]
    assert b.take(0.5) and not b.take(0.5)  # one token per half second
    assert b.take(10) and b.tokens <= 3  # refills to the burst, never beyond
    assert b.taken == 5


def test_token_bucket_rejects_nonsense():
    with pytest.raises(ValueError):
        TokenBucket(rate=0, burst=1)
