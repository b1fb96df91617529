"""The agent's task state machine (``plait.model.agentmachine``), driven by hand: no
process, no thread, no clock. The real agent and the simulated one both drive it."""

from __future__ import annotations

from plait.model import fence
from plait.model.agentmachine import (
    FENCED_EXIT_CODE,
    SWITCH_RETRY,
    HeldTask,
    Machine,
    Phase,
    Wanted,
)
from plait.model.job import MAX_RESTART_BACKOFF


def machine() -> Machine[str, HeldTask]:
    return Machine(lambda w: HeldTask(w.job, w.index, w.revision))


def want(index: int = 0, revision: int = 1, policy: str = "always", retries: int = 3,
         fence_s: float | None = None, cause: str | None = None) -> Wanted[str]:
    return Wanted(f"web.{index}", "web", index, revision, policy, retries, fence_s, cause)


def run(m: Machine[str, HeldTask], now: float = 0.0, fence_now: float = 0.0,
        causes: dict[str, str | None] | None = None) -> list[str]:
    """Start what the machine says to start (as a driver does)."""
    started = []
    for key, _ in m.starts(now, fence_now, causes):
        m.started(key)
        started.append(key)
    return started


def phases(m: Machine[str, HeldTask]) -> dict[str, tuple[Phase, int | None, bool]]:
    return {k: (s.phase, s.exit_code, s.final) for k, s in m.statuses()}


def test_a_new_set_starts_what_it_lists_with_the_request_behind_it() -> None:
    m = machine()
    plan = m.converge([want(0, cause="req-1"), want(1)], pulled_at=0.0)
    assert plan.stops == ()
    assert m.starts(0.0, 0.0, plan.causes) == [("web.0", "req-1"), ("web.1", None)]


def test_what_left_the_set_is_stopped_and_forgotten() -> None:
    m = machine()
    m.converge([want(0), want(1)], 0.0)
    run(m)
    plan = m.converge([want(0)], 1.0)
    assert [(s.key, s.remove, s.had_process) for s in plan.stops] == [("web.1", True, True)]
    assert m.stopping == {"web.1"} and m.running == {"web.0"}
    m.forget("web.1")  # (as the driver does once the stop is under way)
    assert "web.1" not in m.tasks and m.statuses()[0][0] == "web.0"
    m.stopped("web.1")
    assert m.idle() is False and m.stopping == set()


def test_a_new_revision_stops_the_old_copy_and_starts_once_it_is_gone() -> None:
    m = machine()
    m.converge([want(0, revision=1)], 0.0)
    run(m)
    plan = m.converge([want(0, revision=2, cause="req-2")], 1.0)
    assert [(s.key, s.remove, s.cause) for s in plan.stops] == [("web.0", False, "req-2")]
    assert m.tasks["web.0"].revision == 2
    assert run(m, 1.0, causes=dict(plan.causes)) == []  # (its old copy still stops)
    assert m.stopping_statuses([("web", 0, 1)])[0].phase is Phase.STOPPING
    m.stopped("web.0")
    assert [k for k, _ in m.starts(1.5, 1.5)] == ["web.0"]


def test_crashes_back_off_1_2_4_seconds_and_are_reported_with_their_code() -> None:
    m = machine()
    m.converge([want(0)], 0.0)
    run(m)
    m.exited("web.0", 3, now=10.0)
    assert phases(m) == {"web.0": (Phase.EXITED, 3, False)}
    m.supervise(10.5)
    assert run(m, 10.5) == [] and m.next_due() == 11.0
    m.supervise(11.0)
    assert run(m, 11.0) == ["web.0"]
    m.exited("web.0", 3, now=20.0)
    assert m.next_due() == 22.0
    m.tasks["web.0"].restarts = 30
    m.supervise(22.0)
    run(m, 22.0)
    m.exited("web.0", 3, now=30.0)
    assert m.next_due() == 30.0 + MAX_RESTART_BACKOFF


def test_on_failure_ends_after_its_retries_and_a_final_task_is_forgotten_once_reported(
) -> None:
    m = machine()
    m.converge([want(0, policy="on-failure", retries=1)], 0.0)
    run(m)
    m.exited("web.0", 1, now=1.0)  # (retry 1 of 1)
    m.supervise(2.0)
    run(m, 2.0)
    m.exited("web.0", 1, now=3.0)
    assert phases(m) == {"web.0": (Phase.EXITED, 1, True)} and m.next_due() is None
    assert m.finished() == ["web.0"]
    m.forget("web.0")
    assert m.statuses() == []


def test_never_and_a_clean_exit_of_on_failure_are_final() -> None:
    m = machine()
    m.converge([want(0, policy="never"), want(1, policy="on-failure")], 0.0)
    run(m)
    m.exited("web.0", 1, now=1.0)
    m.exited("web.1", 0, now=1.0)
    assert sorted(m.finished()) == ["web.0", "web.1"]


def test_an_adopted_task_is_restarted_only_once_a_desired_set_lists_it() -> None:
    m = machine()
    m.tasks["web.0"] = HeldTask("web", 0, 1, exit_code=1)  # (as loaded from disk)
    m.supervise(100.0)
    assert m.starts(100.0, 100.0) == []
    m.converge([want(0)], 100.0)
    assert m.starts(100.0, 100.0) == [("web.0", None)]


def test_nothing_starts_off_the_machines_host_profile_and_a_switch_waits_for_idle() -> None:
    m = machine()
    m.profile.applied = ("default", 1)
    m.profile.want(("web", 2))
    m.converge([want(0)], 0.0)
    assert m.starts(0.0, 0.0) == [] and m.tasks["web.0"].cause is None
    assert m.profile.begin(0.0, idle=False) is None  # (something runs there)
    assert m.profile.begin(0.0, idle=True) == ("web", 2)
    assert m.profile.begin(0.0, idle=True) is None  # (one under way)
    assert m.profile.done(("web", 2), "no turbo", now=5.0) == SWITCH_RETRY
    assert m.profile.next_due() == 5.0 + SWITCH_RETRY
    assert m.profile.begin(6.0, idle=True) is None  # (the retry waits its backoff)
    assert m.profile.begin(10.0, idle=True) == ("web", 2)
    m.profile.done(("web", 2), None, now=12.0)
    assert m.profile.error is None and m.profile.failures == 0
    assert m.starts(12.0, 12.0) == [("web.0", None)]


def test_a_held_roll_switches_nothing_and_an_unknown_profile_starts_nothing() -> None:
    m = machine()
    m.profile.want(("web", 1), switch=False)
    assert m.profile.begin(0.0, idle=True) is None
    m.profile.want(None, unknown=True)
    m.converge([want(0)], 0.0)
    assert m.starts(0.0, 0.0) == []
    m.profile.want(None)  # (a control plane that knows no profiles)
    assert m.starts(0.0, 0.0) == [("web.0", None)]


def test_the_fence_stops_a_task_and_lifts_only_for_a_set_pulled_after_the_rejoin() -> None:
    m = machine()
    m.heard(sent=0.0, renewed=0.1)
    m.converge([want(0, fence_s=5.0)], 0.0)
    assert run(m, 0.0, fence_now=1.0) == ["web.0"]
    assert m.fence(4.9) == []
    assert m.fence(5.5) == [("web.0", fence.Verdict.TERM)]
    assert m.stopping == {"web.0"} and m.tasks["web.0"].fenced_at == 5.5
    m.stopped("web.0")
    assert phases(m) == {"web.0": (Phase.EXITED, FENCED_EXIT_CODE, False)}
    # the agent reaches the control plane again: a set pulled before the report's
    # answer does not lift the fence, one pulled after it does
    assert m.heard(sent=20.0, renewed=20.2) is True
    m.converge([want(0, fence_s=5.0)], pulled_at=20.1)
    assert m.starts(20.0, 20.3) == []
    m.converge([want(0, fence_s=5.0)], pulled_at=20.3)
    assert m.starts(20.0, 20.3) == [("web.0", None)]


def test_without_a_lease_a_fenced_task_does_not_start() -> None:
    m = machine()
    m.converge([want(0, fence_s=5.0)], 0.0)
    assert m.starts(0.0, 0.0) == []  # (no report taken yet)
    m.heard(sent=10.0, renewed=10.0)
    assert m.starts(0.0, 16.0) == []  # (the lease ran out)
    assert m.starts(0.0, 12.0) == [("web.0", None)]


def test_phases_count_running_exited_and_stopping() -> None:
    m = machine()
    m.converge([want(0), want(1), want(2)], 0.0)
    run(m)
    m.exited("web.1", 1, now=0.0)
    m.stop("web.2", "test", None, remove=False)
    assert m.phases() == {"running": 1, "exited": 1, "stopping": 1}
