"""A remote TaskController is never called by the pass: its request waits in the
scheduler's outbox, the shell (here the simulator, with an answer latency) carries
it, and a later pass applies the answer. No sockets, threads or sleeps."""

from test_figure8 import Figure8Controller

from plait.model import UpdatePolicy
from plait.scheduler import SchedulerConfig
from plait.sim.scenarios import job_spec, world
from plait.taskcontrol import (
    OneAtATime,
    RemoteController,
    TaskControlRequest,
    TaskControlResponse,
)
from plait.taskcontrol.protocol import ControllerAnswer


def test_figure8_sequence_is_verbatim_through_a_remote_controller_that_takes_its_time():
    sim = world(machines=4)
    controller = Figure8Controller()
    sim.remotes["http://fig8"] = (controller, 2.5)  # each answer 2.5 simulated seconds late
    spec = job_spec("job", 2, update=UpdatePolicy(max_unavailable=None))
    sched = sim.scheduler
    sched.create_job(spec, sim.now, controller=RemoteController("http://fig8"))
    assert sim.run_until(lambda: len(sched.discovery("job")) == 2, 60)
    controller.calls.clear()
    sched.update_job(spec.model_copy(update={"args": ("--v2",)}), sim.now)
    assert sim.run_until(lambda: not sched.job("job").rollout_active, 600)
    sim.run(60)

    def idx(ops):
        return [op.task.index for op in ops]

    seen = [(idx(req.request), idx(req.completed), idx(
        op for op in req.request if op.op_id in resp.ack)) for req, resp in controller.calls]
    assert seen == [([0, 1], [], [1]), ([0], [1], [0]), ([], [0], [])]
    seqs = [req.sequence_number for req, _ in controller.calls]
    assert seqs == sorted(seqs) and len(set(seqs)) == 3
    assert [t.spec_version for t in sched.job("job").tasks.values()] == [2, 2]


def test_the_pass_leaves_the_request_and_applies_the_answer_at_a_later_pass():
    sim = world(machines=4)
    sim.carry_calls = False  # this test is the shell
    sched = sim.scheduler
    spec = job_spec("job", 2, update=UpdatePolicy(max_unavailable=None))
    sched.create_job(spec, sim.now, controller=RemoteController("http://c"))
    assert sim.run_until(lambda: len(sched.discovery("job")) == 2, 60)
    sched.take_calls()
    sched.job("job").in_flight = None
    sched.update_job(spec.model_copy(update={"args": ("--v2",)}), sim.now)
    sim.step()
    [call] = sched.take_calls()
    assert call.url == "http://c" and len(call.request.request) == 2
    sim.run(10)  # no answer yet: nothing moves, and no second call is made
    assert sched.take_calls() == []
    assert all(t.spec_version == 1 for t in sched.job("job").tasks.values())
    # an answer to an older request is dropped; the current one is applied next pass
    sched.answer(ControllerAnswer("job", call.request.sequence_number - 1,
                                  TaskControlResponse((call.request.request[0].op_id,))))
    sim.step()
    assert sched.job("job").in_flight is not None
    sched.answer(ControllerAnswer("job", call.request.sequence_number,
                                  TaskControlResponse((call.request.request[1].op_id,))))
    assert sched.job("job").acked == {}  # not before the next pass
    sim.step()
    assert [r.op is not None for r in sched.job("job").tasks.values()] == [False, True]


def test_an_answer_that_never_comes_is_given_up_after_controller_lost_after():
    sim = world(machines=4, config=SchedulerConfig(controller_lost_after=20))
    sim.carry_calls = False
    sched = sim.scheduler
    sched.create_job(job_spec("job", 2), sim.now, controller=RemoteController("http://c"))
    sim.step()
    assert len(sched.take_calls()) == 1  # sent, and never answered
    assert sim.run_until(lambda: len(sched.discovery("job")) == 2, 60)
    sched.update_job(job_spec("job", 2, args=("--v2",)), sim.now)
    sim.run(5)
    assert sched.take_calls() == []  # one call at a time: still waiting for the first
    assert sched.job("job").controller_error is None
    sim.run(30)
    assert sched.counters["controller_errors"] == 1
    # what the job waits on is the job's to say (its view's error), not only an event
    assert sched.job("job").controller_error == "no answer came back from the shell"
    [again] = sched.take_calls()  # given up, and asked again about the update
    assert len(again.request.request) == 2
    sched.answer(ControllerAnswer("job", again.request.sequence_number,
                                  TaskControlResponse((again.request.request[0].op_id,))))
    sim.step()
    assert sched.job("job").controller_error is None  # answered: cleared


class Later:
    """Declines the first ``n`` calls, asking to be asked again after 1 s."""

    def __init__(self, n=3):
        self.n = n
        self.times: list[int] = []

    def process(self, request: TaskControlRequest) -> TaskControlResponse:
        self.times.append(request.sequence_number)
        if len(self.times) <= self.n:
            return TaskControlResponse((), ask_again_after=1.0)
        return OneAtATime().process(request)


def test_ask_again_after_replaces_the_30s_recheck():
    sim = world(machines=4)
    later = Later()
    sim.remotes["http://later"] = (later, 0.0)
    sched = sim.scheduler
    sched.create_job(job_spec("job", 2), sim.now, controller=RemoteController("http://later"))
    assert sim.run_until(lambda: len(sched.discovery("job")) == 2, 60)
    later.times.clear()
    later.n = len(later.times) + 3
    start = sim.now
    sched.update_job(job_spec("job", 2, args=("--v2",)), sim.now)
    assert sim.run_until(lambda: not sched.job("job").rollout_active, 120)
    # three declines a second or two apart, then the rollout: far from 3 x 30 s
    assert sim.now - start < 30
    assert len(later.times) >= 4
