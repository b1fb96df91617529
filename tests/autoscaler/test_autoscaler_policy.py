"""The autoscaler's decision: sized for the target utilization within its bounds,
a prediction from yesterday and last week that leads a ramp but never drags the size
below the live load, and a paced scale-down."""

import pytest

from plait.autoscaler import AutoscalePolicy, History, recommend
from plait.autoscaler.policy import DAY, WEEK
from plait.errors import ValidationError
from plait.model import parse

POLICY = AutoscalePolicy(target_utilization=0.5, min_tasks=2, max_tasks=100,
                         scale_down_fraction=0.1, history_weight=0.5, lookahead_seconds=0)


def test_sized_for_the_target_within_bounds():
    h = History()
    assert recommend(POLICY, h, 0, 10, live_load=10) == 20  # 10 tasks' work at 50 %
    assert recommend(POLICY, h, 0, 0, live_load=0) == 2  # min_tasks
    assert recommend(POLICY, h, 0, 10, live_load=500) == 100  # max_tasks


def test_growth_is_at_once_and_shrinking_is_paced():
    h = History()
    assert recommend(POLICY, h, 0, 20, live_load=40) == 80
    assert recommend(POLICY, h, 0, 80, live_load=1) == 72  # 10 % of 80 at a time
    assert recommend(POLICY, h, 0, 5, live_load=1) == 4  # at least one


def test_yesterday_and_last_week_lead_a_ramp_and_never_drag_below_live():
    h = History()
    h.add(10 * DAY - DAY, 40.0)  # yesterday at this time: 40
    h.add(10 * DAY - WEEK, 60.0)  # a week ago: 60 -> predicted 50
    # live 20: blended (50 + 20) / 2 = 35 -> 70 tasks, ahead of the ramp
    assert recommend(POLICY, h, 10 * DAY, 40, live_load=20) == 70
    # live 80 (above the prediction): the live load wins
    assert recommend(POLICY, h, 10 * DAY, 40, live_load=80) == 100
    assert h.predict(3 * DAY) is None  # nothing known then


def test_a_policy_with_min_above_max_is_refused():
    with pytest.raises(ValidationError, match="min_tasks"):
        parse(AutoscalePolicy, {"min_tasks": 10, "max_tasks": 5})


def test_a_decision_is_cut_to_the_room_there_is_and_says_why():
    from plait.autoscaler import Room, within_room
    quota = "entitlement quota reached and its machines have no room left (...)"
    region = "no machine satisfies the hard requirements with room for the task"
    c = within_room(POLICY, 16, Room(12, quota))
    assert (c.tasks, c.wanted) == (12, 16) and c.why == f"entitlement quota ({quota})"
    c = within_room(POLICY, 16, Room(12, region))
    assert c.tasks == 12 and c.why is not None and c.why.startswith("region capacity")
    assert within_room(POLICY, 8, Room(12)) == within_room(POLICY, 8, Room(8))
    assert within_room(POLICY, 8, Room(12)).why is None
    # never below the owner's floor, whatever the room
    c = within_room(POLICY, 16, Room(0, region))
    assert c.tasks == POLICY.min_tasks and c.why is not None
