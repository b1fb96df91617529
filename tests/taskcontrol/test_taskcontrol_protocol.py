"""The TaskControl protocol: wire format round trip, garbage refused, controllers."""

import pytest

from plait.errors import ValidationError
from plait.model import TaskRef
from plait.taskcontrol import (
    AdvanceNotice,
    DefaultController,
    LeaderLast,
    NoticeKind,
    OneAtATime,
    OpKind,
    ReplicaAware,
    TaskControlRequest,
    TaskOp,
    request_from_wire,
    response_from_wire,
    to_wire,
)


def op(i, kind=OpKind.UPDATE, reason="update to version 2"):
    return TaskOp(f"j/{i}/{kind.value}/1", TaskRef("j", i), kind, reason, f"m{i}")


def req(ops, completed=(), unhealthy=(), seq=1, notices=()):
    return TaskControlRequest("j", tuple(ops), tuple(completed), tuple(notices),
                              tuple(TaskRef("j", i) for i in unhealthy), seq)


def test_wire_round_trip_is_lossless():
    notice = AdvanceNotice("mx-1", NoticeKind.MAINTENANCE, ("m1",), (TaskRef("j", 1),), 10, 10)
    r = req([op(0), op(1, OpKind.MOVE, "maintenance mx-1")], [op(2)], [3], 7, [notice])
    assert request_from_wire(to_wire(r)) == r


@pytest.mark.parametrize("body", [
    None, [], "ack", {"ack": "op"}, {"ack": [1]}, {"ack": [], "extra": 1}, {"acks": []},
])
def test_garbage_answers_are_refused(body):
    with pytest.raises(ValidationError):
        response_from_wire(body)


def test_malformed_requests_name_the_field():
    wire = to_wire(req([op(0)]))
    wire["request"][0]["kind"] = "explode"
    with pytest.raises(ValidationError) as err:
        request_from_wire(wire)
    assert err.value.field == "request[0].kind"


def test_default_controller_keeps_budget_across_calls():
    c = DefaultController(2)
    first = c.process(req([op(0), op(1), op(2)]))
    assert first.ack == ("j/0/update/1", "j/1/update/1")
    assert c.process(req([op(2)], seq=2)).ack == ()  # both still in flight
    assert c.process(req([op(2)], completed=[op(0)], seq=3)).ack == ("j/2/update/1",)


def test_down_tasks_cost_nothing_and_count_against_others():
    c = OneAtATime()
    move = op(4, OpKind.MOVE, "machine failed")
    assert c.process(req([op(0), move], unhealthy=[4])).ack == (move.op_id,)
    assert c.process(req([op(0)], unhealthy=[4], seq=2)).ack == ()


def test_maintenance_pair_gets_at_most_one_ack_and_move_is_preferred():
    c = DefaultController(5)
    move, stop = op(1, OpKind.MOVE, "maintenance e"), op(1, OpKind.STOP, "maintenance e")
    assert c.process(req([stop, move])).ack == (move.op_id,)


def test_leader_last_acks_followers_one_by_one_then_the_leader():
    c = LeaderLast(lambda: 1)
    ops = [op(0), op(1), op(2)]
    assert c.process(req(ops)).ack == (ops[0].op_id,)
    assert c.process(req(ops[1:], [ops[0]], seq=2)).ack == (ops[2].op_id,)
    assert c.process(req(ops[1:2], [ops[2]], seq=3)).ack == (ops[1].op_id,)
    unknown = LeaderLast(lambda: None)
    assert unknown.process(req(ops)).ack == ()


def test_replica_aware_never_takes_two_replicas_of_a_shard():
    c = ReplicaAware({"A": {1, 3}, "C": {1, 4, 7}})
    acked = c.process(req([op(1), op(3), op(7), op(5)], unhealthy=[4])).ack
    assert acked == ("j/3/update/1", "j/5/update/1")  # 1 and 7 share C with 4


def test_new_op_is_the_op_the_constructor_makes():
    from dataclasses import FrozenInstanceError, fields

    from plait.taskcontrol.protocol import new_op

    # every field is written: a field added to TaskOp or TaskRef must be added there
    assert [f.name for f in fields(TaskOp)] == ["op_id", "task", "kind", "reason", "machine"]
    assert [f.name for f in fields(TaskRef)] == ["job", "index"]
    for machine in ("m7", None):
        made = new_op("j/7/move/3", "j", 7, OpKind.MOVE, "machine failed", machine)
        plain = TaskOp("j/7/move/3", TaskRef("j", 7), OpKind.MOVE, "machine failed", machine)
        assert made == plain and hash(made) == hash(plain) and repr(made) == repr(plain)
        assert made.task == TaskRef("j", 7) and str(made.task) == "j/7"
        assert to_wire(req([made])) == to_wire(req([plain]))
        assert made != new_op("j/7/move/4", "j", 7, OpKind.MOVE, "machine failed", machine)
        with pytest.raises(FrozenInstanceError):
            made.reason = "other"  # type: ignore[misc]
