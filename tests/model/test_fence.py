"""The fence rule (``plait.model.fence``): when a machine stops a fenced task, when
the control plane may place it elsewhere, and that the two never overlap."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from plait.errors import ValidationError
from plait.model import Fence
from plait.model.fence import (
    FENCE_KILL_GRACE,
    FENCE_MARGIN,
    Verdict,
    may_replace,
    may_start,
    replace_at,
    verdict,
)
from plait.scheduler.records import same_runtime
from plait.sim.scenarios import job_spec


@pytest.mark.parametrize(("age", "said"), [
    (0.0, Verdict.RUN), (9.99, Verdict.RUN),  # the lease holds
    (10.0, Verdict.TERM), (10.5, Verdict.TERM),  # ran out: SIGTERM
    (10.0 + FENCE_KILL_GRACE, Verdict.KILL), (500.0, Verdict.KILL),  # then SIGKILL
])
def test_the_agent_stops_a_task_once_its_lease_is_fence_seconds_old(age, said):
    assert verdict(10.0, 100.0, 100.0 + age) is said
    assert may_start(10.0, 100.0, 100.0 + age) is (said is Verdict.RUN)


def test_without_a_lease_a_fenced_task_neither_runs_nor_starts():
    # an agent that has not reached the control plane since it started
    assert verdict(10.0, None, 5.0) is Verdict.KILL
    assert not may_start(10.0, None, 5.0)


def test_the_control_plane_replaces_after_fence_grace_and_margin_from_the_last_heartbeat():
    assert replace_at(10.0, 50.0) == 50.0 + 10.0 + FENCE_KILL_GRACE + FENCE_MARGIN
    lost = 56.0  # found failed 6 s after its last heartbeat
    assert not may_replace(10.0, 50.0, lost, 0.0, 60.0)
    assert not may_replace(10.0, 50.0, lost, 0.0, replace_at(10.0, 50.0) - 0.01)
    assert may_replace(10.0, 50.0, lost, 0.0, replace_at(10.0, 50.0))


def test_never_in_the_pass_that_found_the_loss():
    # found failed long after the deadline (a hold of the health check, a takeover):
    # a heartbeat taken during that pass is read by the next one only
    assert not may_replace(10.0, 0.0, 100.0, 0.0, 100.0)
    assert may_replace(10.0, 0.0, 100.0, 0.0, 100.5)


def test_no_heartbeat_heard_counts_from_the_later_of_the_loss_and_the_start():
    # a scheduler that took over at 80 heard nothing of the machine: the old leader
    # may have taken a heartbeat until then
    assert not may_replace(10.0, None, 70.0, 80.0, 70.0 + 13.5)
    assert not may_replace(10.0, None, 70.0, 80.0, replace_at(10.0, 80.0) - 0.01)
    assert may_replace(10.0, None, 70.0, 80.0, replace_at(10.0, 80.0))
    assert may_replace(10.0, None, 90.0, 80.0, replace_at(10.0, 90.0))


@given(seconds=st.floats(3, 3600), sent=st.floats(0, 1e6), delay=st.floats(0, 30),
       lost_after=st.floats(0, 100), now=st.floats(0, 2e6))
def test_the_two_copies_never_overlap(seconds, sent, delay, lost_after, now):
    """A heartbeat sent at ``sent`` is taken ``delay`` later. Whenever the control
    plane may place the task elsewhere, the machine has killed it (SIGKILL sent) at
    least FENCE_MARGIN before."""
    heard = sent + delay
    if may_replace(seconds, heard, heard + lost_after, 0.0, now):
        assert verdict(seconds, sent, now - FENCE_MARGIN) is Verdict.KILL


def test_the_spec_field():
    spec = job_spec("zk", 3, fence={"seconds": 10})
    assert spec.fence == Fence(seconds=10)
    assert job_spec("web", 1).fence is None
    with pytest.raises(ValidationError, match=r"fence\.seconds"):
        job_spec("zk", 3, fence={"seconds": 1})
    # a change of the fence is a new runtime (the tasks restart with it): the agent
    # must know the fence a task runs under
    assert not same_runtime(spec, job_spec("zk", 3, fence={"seconds": 20}))


def test_the_example_quorum_spec_asks_for_a_fence():
    from pathlib import Path

    from plait.cli.specfile import parse_yaml
    from plait.model import JobSpec, parse

    path = Path(__file__).resolve().parents[2] / "examples" / "quorum.yaml"
    [doc] = parse_yaml(path.read_text(), path)
    spec = parse(JobSpec, doc)
    assert spec.fence == Fence(seconds=10)
    assert replace_at(spec.fence.seconds, 0.0) == 13.0  # (as its comment says)
