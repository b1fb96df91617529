"""Shard Manager's TaskController, driven by hand-made TaskControl requests: updates are
acked in safe batches and count as down until completed; unhealthy tasks and missing
replicas count too; advance notices let an empty task go at once, leave a short
maintenance alone when every shard is served elsewhere, and otherwise ask for the task
to be emptied before its move is acked."""

from plait.model.task import TaskRef
from plait.shardmanager.controller import EVACUATING_ASK_AGAIN, ShardController, ShardView
from plait.taskcontrol.protocol import (
    AdvanceNotice,
    NoticeKind,
    OpKind,
    TaskControlRequest,
    new_op,
)

JOB = "cache"


def op(index, kind=OpKind.UPDATE, serial=1):
    return new_op(f"{JOB}/{index}/{kind.value}/{serial}", JOB, index, kind, "test",
                  f"machine{index}")


def ref(index):
    return TaskRef(JOB, index)


def request(ops=(), completed=(), notices=(), unhealthy=(), seq=1):
    return TaskControlRequest(JOB, tuple(ops), tuple(completed), tuple(notices),
                              tuple(ref(i) for i in unhealthy), seq)


def notice(tasks, *, start=100.0, end=None, kind=NoticeKind.MAINTENANCE, nid="mnt-1"):
    return AdvanceNotice(nid, kind, tuple(f"machine{i}" for i in tasks),
                         tuple(ref(i) for i in tasks), start, start, end)


def maintenance_ops(index):
    """What the scheduler offers for a task under a notice: a move and a stop."""
    return [op(index, OpKind.MOVE), op(index, OpKind.STOP)]


def acked_tasks(response, ops):
    by_id = {o.op_id: o.task.index for o in ops}
    assert set(response.ack) <= set(by_id)
    return sorted(by_id[a] for a in response.ack)


class Map:
    """A mutable shard map the controller reads through its view."""

    def __init__(self, ready, replication=3):
        self.ready = {s: list(ts) for s, ts in ready.items()}
        self.replication = replication

    def view(self):
        return ShardView({s: tuple(ts) for s, ts in self.ready.items()}, self.replication)


#: 3 replica groups of 3 tasks: group g is tasks 3g..3g+2; shard (i, j) has replica r on
#: task 3r + (i + r * j) % 3, so every task of a group shares shards with every task of
#: the other groups
GROUPED = {f"s{i}{j}": tuple(3 * r + (i + r * j) % 3 for r in range(3))
           for i in range(3) for j in range(3)}


def replicas_down(ready, down):
    return {s: len(set(ts) & set(down)) for s, ts in ready.items()}


# -- updates --------------------------------------------------------------------------------


def test_an_update_is_acked_in_safe_batches_and_acked_tasks_count_until_completed():
    shards = Map(GROUPED)
    ctl = ShardController(shards.view)
    ops = [op(i) for i in range(9)]

    first = acked_tasks(ctl.process(request(ops, seq=1)), ops)
    assert first == [0, 1, 2]  # a whole replica group: no shard loses two
    assert all(n <= 1 for n in replicas_down(GROUPED, first).values())

    # asked again before anything completed: nothing new (0-2 count as down)
    pending = [o for o in ops if o.task.index not in first]
    assert ctl.process(request(pending, seq=2)).ack == ()
    assert ctl.process(request(pending, seq=3)).ack == ()

    # half the batch completes: still nothing, the other half still holds every shard
    done = [o for o in ops if o.task.index in (0, 1)]
    assert ctl.process(request(pending, completed=done, seq=4)).ack == ()
    assert set(ctl.in_flight) == {ops[2].op_id}

    # all of it completes: the next group goes
    rest = [o for o in ops if o.task.index == 2]
    second = acked_tasks(ctl.process(request(pending, completed=rest, seq=5)), pending)
    assert second == [3, 4, 5]
    assert ctl.last_batch == (3, 4, 5)


def test_an_acked_op_is_acked_again_if_offered_again_before_it_completes():
    ctl = ShardController(Map(GROUPED).view)
    ops = [op(i) for i in range(9)]
    ctl.process(request(ops))
    again = ctl.process(request(ops, seq=2))
    assert acked_tasks(again, ops) == [0, 1, 2]  # already down: costs nothing


def test_unhealthy_tasks_count_as_down():
    ctl = ShardController(Map(GROUPED).view)
    ops = [op(i) for i in range(9)]
    # task 4 (group 1) is unhealthy: no task sharing a shard with it may go, so
    # nothing of groups 0 and 2 goes; its own op and its group-mates' may
    got = acked_tasks(ctl.process(request(ops, unhealthy=[4])), ops)
    assert got == [3, 4, 5]
    for s, tasks in GROUPED.items():
        assert len(set(tasks) & ({4} | set(got))) <= 1, s


def test_a_task_hosting_a_shard_missing_a_replica_is_never_acked():
    # shard x has only 2 of its 3 replicas ready (on 0 and 3): neither may go
    ready = {"x": (0, 3), "y": (1, 4, 6), "z": (2, 5, 7)}
    ctl = ShardController(Map(ready).view)
    ops = [op(i) for i in range(8)]
    got = acked_tasks(ctl.process(request(ops)), ops)
    assert 0 not in got and 3 not in got
    assert got == [1, 2]  # one each of y and z (the lowest on a tie)
    # nor later, however often it is asked, while x stays short
    ctl.process(request(completed=[o for o in ops if o.task.index in got], seq=2))
    left = [o for o in ops if o.task.index not in got]
    got = acked_tasks(ctl.process(request(left, seq=3)), left)
    assert 0 not in got and 3 not in got


def test_a_down_task_no_longer_ready_is_counted_once():
    # 0 is unhealthy and its replica of x is no longer ready: x is one down (the
    # missing replica), not two, so with max_down 2 one of 3 and 6 may still go
    ctl = ShardController(Map({"x": (3, 6)}).view, max_down=2)
    ops = [op(i) for i in (0, 3, 6)]
    assert acked_tasks(ctl.process(request(ops, unhealthy=[0])), ops) == [0, 3]


def test_max_down_two_lets_two_replicas_of_a_shard_go():
    ctl = ShardController(Map(GROUPED).view, max_down=2)
    ops = [op(i) for i in range(9)]
    got = acked_tasks(ctl.process(request(ops)), ops)
    assert len(got) == 6
    assert all(n <= 2 for n in replicas_down(GROUPED, got).values())


def test_of_several_ops_for_a_task_the_move_is_taken():
    ctl = ShardController(Map({}).view)
    ops = [op(0, OpKind.STOP), op(0, OpKind.MOVE), op(1, OpKind.RESTART)]
    assert ctl.process(request(ops)).ack == (ops[1].op_id, ops[2].op_id)


# -- advance notices ------------------------------------------------------------------------


def test_a_noticed_task_with_no_shard_is_let_go_at_once():
    ctl = ShardController(Map({"x": (1, 2, 3)}).view)
    ops = maintenance_ops(0)
    response = ctl.process(request(ops, notices=[notice([0], end=100.0 + 3600)]))
    assert response.ack == (ops[0].op_id,)  # the move, not the stop
    assert 0 not in ctl.evacuate and response.ask_again_after is None


def test_a_short_maintenance_with_every_shard_served_elsewhere_is_sat_out():
    ctl = ShardController(Map(GROUPED).view, short_maintenance=600)
    ops = maintenance_ops(0)
    response = ctl.process(request(ops, notices=[notice([0], end=100.0 + 600)]))
    assert response.ack == ()
    assert ctl.evacuate == {}
    assert response.ask_again_after is None
    assert "short" in ctl.waiting[0]


def test_a_long_maintenance_empties_the_task_then_lets_it_go():
    shards = Map(GROUPED)
    ctl = ShardController(shards.view, short_maintenance=600)
    ops = maintenance_ops(0)
    long = notice([0], end=100.0 + 601)
    response = ctl.process(request(ops, notices=[long]))
    assert response.ack == ()
    assert ctl.evacuate == {0: "mnt-1"}
    assert response.ask_again_after == EVACUATING_ASK_AGAIN

    # the shell migrates the shards away (add first, drop second): while the task
    # still holds one, nothing changes
    on_zero = [s for s, ts in shards.ready.items() if 0 in ts]
    for s in on_zero[:-1]:
        shards.ready[s] = [t for t in shards.ready[s] if t != 0] + [1]
    response = ctl.process(request(ops, notices=[long], seq=2))
    assert response.ack == () and 0 in ctl.evacuate

    # once it holds none, its move is acked; it stays out of the map (in
    # ``evacuate``: nothing is loaded onto it) until the move completes
    shards.ready[on_zero[-1]] = [t for t in shards.ready[on_zero[-1]] if t != 0] + [2]
    response = ctl.process(request(ops, notices=[long], seq=3))
    assert response.ack == (ops[0].op_id,)
    assert response.ask_again_after is None
    assert ctl.evacuate == {0: "mnt-1"}
    response = ctl.process(request(notices=[long], seq=4))
    assert response.ack == () and ctl.evacuate == {0: "mnt-1"}
    response = ctl.process(request(completed=[ops[0]], seq=5))
    assert response.ack == () and ctl.evacuate == {}


def test_a_maintenance_with_no_end_is_long():
    ctl = ShardController(Map(GROUPED).view)
    response = ctl.process(request(maintenance_ops(0), notices=[notice([0], end=None)]))
    assert response.ack == () and ctl.evacuate == {0: "mnt-1"}


def test_a_loan_revoke_empties_the_task_even_if_short():
    ctl = ShardController(Map(GROUPED).view, short_maintenance=600)
    revoke = notice([0], end=101.0, kind=NoticeKind.LOAN_REVOKE, nid="loan-revoke-1")
    response = ctl.process(request(maintenance_ops(0), notices=[revoke]))
    assert response.ack == ()
    assert ctl.evacuate == {0: "loan-revoke-1"}


def test_a_short_maintenance_empties_a_task_whose_shard_has_no_other_ready_replica():
    # shard x lives on 0 and 3, both under the notice: neither is served elsewhere
    ready = {"x": (0, 3, 6), "y": (0, 4, 7), "z": (3, 5, 8)}
    ctl = ShardController(Map(ready).view, short_maintenance=600)
    ops = maintenance_ops(0) + maintenance_ops(3)
    # 6 is down: x's only replica outside the notice is not up
    response = ctl.process(request(ops, notices=[notice([0, 3], end=200.0)],
                                   unhealthy=[6]))
    assert response.ack == ()
    assert ctl.evacuate == {0: "mnt-1", 3: "mnt-1"}
    # with 6 up, each is served elsewhere, but not both at once: x would lose two
    # replicas, so 0 sits the maintenance out and 3 is emptied
    response = ctl.process(request(ops, notices=[notice([0, 3], end=200.0)], seq=2))
    assert response.ack == () and ctl.evacuate == {3: "mnt-1"}
    assert "short" in ctl.waiting[0]


def test_a_noticed_task_already_down_is_let_go_at_once():
    ctl = ShardController(Map(GROUPED).view)
    ops = maintenance_ops(0)
    response = ctl.process(request(ops, notices=[notice([0], end=None)], unhealthy=[0]))
    assert response.ack == (ops[0].op_id,)
    assert ctl.evacuate == {}


def test_an_update_of_a_noticed_task_is_paced_like_any_other():
    ctl = ShardController(Map(GROUPED).view)
    ops = [op(i) for i in range(9)]
    got = acked_tasks(ctl.process(request(ops, notices=[notice([0], end=None)])), ops)
    assert got == [0, 1, 2] and ctl.evacuate == {}


def test_ops_of_a_noticed_task_being_emptied_do_not_free_its_shards_for_others():
    # 0 is being emptied (still up, still serving): an update elsewhere is paced as
    # if 0 were up, so x may lose one of 3 or 6, not both
    ready = {"x": (0, 3, 6)}
    ctl = ShardController(Map(ready).view)
    ops = [*maintenance_ops(0), op(3), op(6)]
    got = acked_tasks(ctl.process(request(ops, notices=[notice([0], end=None)])), ops)
    assert got == [3] and ctl.evacuate == {0: "mnt-1"}

