"""A staged push's progress as a pure function of what the scheduler reports:
rolling until the stage's tasks are ready, soaking, gated, then the next stage; a
failed gate, a halted rollout or a stage past its timeout rolls back; a last stage
below 100 % holds."""

from hypothesis import given
from hypothesis import strategies as st

from plait.jcp.intents import Gate, PushIntent, PushStatus
from plait.jcp.push import StageHealth, advance, percent, verdict
from plait.sim.scenarios import job_spec

SPEC = job_spec("web", 10, command="v2")


def intent(**kw) -> PushIntent:
    return PushIntent(spec=SPEC, **{"stages": (10, 50, 100), "soak_seconds": 30,
                                    "stage_timeout_seconds": 600, **kw})


def test_stages_soak_and_gates():
    p = intent(gate=Gate(external=True))
    s = PushStatus(version=2)
    s = advance(p, s, StageHealth(1, 0), 10)
    assert s.phase == "rolling" and percent(p, s) == 10
    s = advance(p, s, StageHealth(1, 1), 20)
    assert s.phase == "soaking" and s.healthy_since == 20
    s = advance(p, s, StageHealth(1, 0), 30)  # a task fell over: soak again
    assert s.phase == "rolling"
    s = advance(p, s, StageHealth(1, 1), 40)
    s = advance(p, s, StageHealth(1, 1), 69)
    assert s.phase == "soaking"
    s = advance(p, s, StageHealth(1, 1), 70)
    assert s.phase == "gating"
    assert advance(p, s, StageHealth(1, 1), 500).phase == "gating"  # waits for the verdict
    s = verdict(p, s, True, "ok", 80)
    assert (s.phase, s.stage, percent(p, s)) == ("rolling", 1, 50)
    s = verdict(p, s.model_copy(update={"stage": 2, "phase": "gating"}), True, "ok", 90)
    assert s.phase == "completed" and percent(p, s) == 0


def test_a_failed_gate_a_halt_or_a_timeout_rolls_back():
    p = intent(gate=Gate(external=True))
    gating = PushStatus(version=2, phase="gating")
    failed = verdict(p, gating, False, "error rate 9%", 5)
    assert failed.phase == "rolled_back" and "error rate 9%" in failed.message
    assert percent(p, failed) == 0
    halted = advance(p, PushStatus(version=2), StageHealth(1, 0, "3 tasks failed"), 5)
    assert halted.phase == "rolled_back" and "3 tasks failed" in halted.message
    late = advance(p, PushStatus(version=2, since=0), StageHealth(5, 4), 600)
    assert late.phase == "rolled_back" and "4 of 5 tasks healthy after 600s" in late.message


def test_without_a_gate_a_stage_passes_once_soaked_and_a_last_stage_below_100_holds():
    p = intent(stages=(25, 50), soak_seconds=0)
    s = advance(p, PushStatus(version=2), StageHealth(1, 1), 1)
    assert (s.phase, s.stage) == ("rolling", 1)
    s = advance(p, s, StageHealth(2, 2), 2)
    assert s.phase == "holding" and percent(p, s) == 50
    # holding: a task that falls over does not end it
    assert advance(p, s, StageHealth(2, 0, "halted"), 3).phase == "holding"


@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 5), st.booleans(),
                          st.floats(0, 100)), max_size=40))
def test_the_stage_only_moves_forward_and_every_end_is_final(steps):
    p = intent(soak_seconds=5, stage_timeout_seconds=50)
    s, now = PushStatus(version=2), 0.0
    for want, ready, halted, dt in steps:
        now += dt
        before = s
        s = advance(p, s, StageHealth(want, ready, "halt" if halted else None), now)
        assert s.stage >= before.stage
        if before.phase in ("completed", "rolled_back", "aborted", "holding"):
            assert s.phase == before.phase and s.stage == before.stage
        assert 0 <= percent(p, s) <= 100


def test_tasks_waiting_for_room_do_not_hold_a_stage_once_one_runs():
    """A stage of 4 tasks, 1 of which waits for room (the job outgrew the region):
    the 3 that run ready pass it, and the message says why one is missing; none
    ready is not a pass."""
    p = intent(stages=(50, 100), soak_seconds=0)
    s = PushStatus(version=2)
    s = advance(p, s, StageHealth(4, 2, waiting=1), 10)
    assert s.phase == "rolling" and "2 of 4 tasks ready (1 wait for room)" in s.message
    assert advance(p, s, StageHealth(4, 0, waiting=4), 20).phase == "rolling"
    s = advance(p, s, StageHealth(4, 3, waiting=1), 30)
    assert s.phase == "rolling" and s.stage == 1  # (no gate: the next stage)
