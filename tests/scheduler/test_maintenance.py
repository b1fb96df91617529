"""Planned maintenance: advance notices with a deadline; per task the controller
chooses move now, stop and restart after, or keep running until the deadline."""

from plait.model import Fleet, UpdatePolicy
from plait.server.controlplane.views import JobState
from plait.sim.scenarios import job_spec, world
from plait.taskcontrol import OpKind, TaskControlResponse
from plait.testing import machine


class Chooser:
    """Task 0: move now; task 1: stop now, restart after; task 2: keep running."""

    def __init__(self):
        self.notices = []

    def process(self, request):
        self.notices.extend(request.advance_notices)
        ack = []
        for op in request.request:
            i = op.task.index
            chosen = (i == 0 and op.kind is OpKind.MOVE) or (i == 1 and op.kind is OpKind.STOP)
            if chosen or not op.reason.startswith("maintenance"):
                ack.append(op.op_id)
        return TaskControlResponse(tuple(ack))


def three_on_three():
    fleet = Fleet.from_machines([machine(n, msb=f"msb{k}") for k, n in enumerate("abcd")])
    sim = world(fleet=fleet)
    return sim, job_spec("db", 3, cpu=8, update=UpdatePolicy(max_unavailable=None))


def test_move_stop_or_keep_running_until_the_deadline():
    sim, spec = three_on_three()
    s = sim.scheduler
    ctl = Chooser()
    s.create_job(spec, 0, controller=ctl)
    assert sim.run_until(lambda: len(s.discovery("db")) == 3, 60)
    before = dict(s.discovery("db"))
    assert set(before.values()) == {"a", "b", "c"}
    start, end = sim.now + 60, sim.now + 120
    event_id = sim.maintenance(["a", "b", "c"], start, end)
    sim.run(30)
    # notice given, with the deadline, naming every task on those machines
    notice = ctl.notices[0]
    assert notice.notice_id == event_id and notice.deadline == start
    assert sorted(t.index for t in notice.tasks) == [0, 1, 2]
    assert sorted(notice.machines) == ["a", "b", "c"]
    # task 0 moved to the machine without maintenance, task 1 stopped, task 2 runs
    now = dict(s.discovery("db"))
    assert now.get(0) == "d"
    assert 1 not in now and s.job("db").tasks[1].parked == event_id
    assert now.get(2) == before[2]
    # its view says which maintenance it waits out; the others' views have no such key
    view = {t["index"]: t for t in JobState.of(s, s.job("db"), s.fleet, 0).task_views()}
    assert view[1]["state"] == "stopped" and view[1]["parked"] == event_id
    assert "parked" not in view[0] and "parked" not in view[2]
    assert s.counters["deadline_stops"] == 0
    sim.run(start - sim.now + 5)
    # at the deadline what still ran was stopped, and counted
    assert 2 not in dict(s.discovery("db"))
    assert s.counters["deadline_stops"] == 1
    assert any(e.kind == "deadline_stop" for e in s.events)
    assert sim.run_until(lambda: len(s.discovery("db")) == 3, end - sim.now + 60)
    assert sim.now >= end  # the stopped tasks came back after the maintenance
    after = dict(s.discovery("db"))
    assert after[1] == before[1] and after[2] == before[2]  # back on their machines
    assert after[0] == "d"


def test_without_a_controller_tasks_move_off_before_the_deadline():
    sim, spec = three_on_three()
    spec = spec.model_copy(update={"task_count": 1,
                                   "update": UpdatePolicy(max_unavailable=1)})
    s = sim.scheduler
    s.create_job(spec, 0)
    assert sim.run_until(lambda: len(s.discovery("db")) == 1, 60)
    (_, where), = s.discovery("db")
    sim.maintenance([where], sim.now + 60, sim.now + 120)
    sim.run(50)
    (_, now), = s.discovery("db")
    assert now != where
    sim.run(100)
    assert s.counters["deadline_stops"] == 0
