"""Paper Figure 8: the TaskControl calling sequence of a two-task job update, verbatim."""

from plait.model import UpdatePolicy
from plait.sim.scenarios import job_spec, world
from plait.taskcontrol import TaskControlRequest, TaskControlResponse


class Figure8Controller:
    """Approves t1 first and delays t0 to keep one task available."""

    def __init__(self):
        self.calls: list[tuple[TaskControlRequest, TaskControlResponse]] = []

    def process(self, request):
        requested = sorted(op.task.index for op in request.request)
        if requested == [0, 1]:
            ack = [op.op_id for op in request.request if op.task.index == 1]
        else:
            ack = [op.op_id for op in request.request]
        response = TaskControlResponse(tuple(ack))
        self.calls.append((request, response))
        return response


def test_figure8_calling_sequence_verbatim():
    sim = world(machines=4)
    spec = job_spec("job", 2, update=UpdatePolicy(max_unavailable=None))
    controller = Figure8Controller()
    sched = sim.scheduler
    sched.create_job(spec, sim.now, controller=controller)
    assert sim.run_until(lambda: len(sched.discovery("job")) == 2, 60)
    controller.calls.clear()

    sched.update_job(spec.model_copy(update={"args": ("--v2",)}), sim.now)  # S0
    assert sim.run_until(lambda: not sched.job("job").rollout_active, 600)
    sim.run(60)  # long enough for any further call (the re-check interval is 30 s)

    def idx(ops):
        return [op.task.index for op in ops]

    seen = [(idx(req.request), idx(req.completed), idx(
        op for op in req.request if op.op_id in resp.ack)) for req, resp in controller.calls]
    assert seen == [
        ([0, 1], [], [1]),  # S1: request=[t0, t1], ack=[t1]
        ([0], [1], [0]),  # S2: completed=[t1], request=[t0], ack=[t0]
        ([], [0], []),  # S3: completed=[t0], request=[], ack=[]
    ]
    seqs = [req.sequence_number for req, _ in controller.calls]
    assert seqs == sorted(seqs) and len(set(seqs)) == 3
    assert all(op.kind == "update" for req, _ in controller.calls for op in req.request)
    assert [t.spec_version for t in sched.job("job").tasks.values()] == [2, 2]
    # never both down at once: the controller kept one available
    assert len(sched.discovery("job")) == 2
