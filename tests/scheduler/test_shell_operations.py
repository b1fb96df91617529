"""The operations a shell changes a job's records through during a pass (an agent's
endpoints, the cause of the operation being applied, another TaskController, a
version's stored revision, the machines whose desired sets changed): each changes
what it says, marks the job when something changed, and nothing else."""

from plait.scheduler import SchedulerConfig
from plait.sim.scenarios import job_spec, world
from plait.taskcontrol import RemoteController, TaskControlResponse
from plait.taskcontrol.protocol import ControllerAnswer


def _running(tasks: int = 2):
    sim = world(machines=4)
    sched = sim.scheduler
    sched.create_job(job_spec("job", tasks), sim.now)
    assert sim.run_until(lambda: len(sched.discovery("job")) == tasks, 60)
    return sim, sched


def test_an_endpoint_is_taken_only_for_a_task_placed_on_the_reporting_machine():
    _, sched = _running()
    job = sched.job("job")
    t0, t1 = job.tasks[0], job.tasks[1]
    m = t0.machine
    assert m is not None and t1.machine is not None
    other = next(i for i in range(len(sched.fleet)) if i != t1.machine)
    sched.dirty_jobs.clear()
    sched.changed_jobs = set()
    sched.report_endpoints(m, {("job", 0): "h0:80", ("ghost", 0): "x:1"})
    assert t0.endpoint == "h0:80"
    assert sched.dirty_jobs == {"job"} and sched.changed_jobs == {"job"}
    # the same again changes nothing; a machine the task is not on is not believed
    sched.dirty_jobs.clear()
    sched.changed_jobs = set()
    sched.report_endpoints(m, {("job", 0): "h0:80"})
    sched.report_endpoints(other, {("job", 1): "elsewhere:1"})
    assert t1.endpoint is None
    assert sched.dirty_jobs == set() and sched.changed_jobs == set()


def test_the_cause_marks_the_job_only_when_it_changes():
    _, sched = _running()
    sched.dirty_jobs.clear()
    sched.set_cause("job", "req-1")
    assert sched.job("job").cause == "req-1" and "job" in sched.dirty_jobs
    sched.dirty_jobs.clear()
    sched.set_cause("job", "req-1")
    sched.set_cause("no-such-job", "req-2")  # (a job gone since: nothing to remember)
    assert sched.dirty_jobs == set()


def test_another_controller_forgets_the_request_in_flight_and_its_answer():
    sim = world(machines=4, config=SchedulerConfig(controller_lost_after=1000))
    sim.carry_calls = False  # this test is the shell
    sched = sim.scheduler
    spec = job_spec("job", 2)
    sched.create_job(spec, sim.now, controller=RemoteController("http://old"))
    sim.step()
    [call] = sched.take_calls()
    job = sched.job("job")
    assert job.in_flight is not None
    job.recheck = 5.0
    # the old controller's answer arrives, then the job is given another controller
    sched.answer(ControllerAnswer("job", call.request.sequence_number,
                                  TaskControlResponse(tuple(
                                      op.op_id for op in call.request.request))))
    sched.set_controller("job", RemoteController("http://new"))
    assert job.in_flight is None and job.recheck is None
    assert job.controller == RemoteController("http://new")
    sim.step()
    assert job.acked == {} and all(t.op is None for t in job.tasks.values())
    [again] = sched.take_calls()
    assert again.url == "http://new"


def test_a_version_takes_the_revision_a_store_kept_for_it():
    sim, sched = _running()
    job = sched.job("job")
    v2 = job_spec("job", 2, args=("--v2",))
    # (computed, version 2 would be its own revision: it runs another way than 1)
    assert sched.append_version(v2, sim.now, "version 2", revision=1) == 2
    assert job.revision(2) == 1
    assert sched.add_version(job_spec("job", 2, args=("--v3",)), sim.now, 3) == 3
    assert job.revision(3) == 3 and job.target == 2
    assert sched.add_version(job_spec("job", 2, args=("--v4",)), sim.now) == 4
    assert job.revision(4) == 4


def test_take_touched_hands_over_the_machines_and_starts_afresh():
    sim = world(machines=4)
    sched = sim.scheduler
    sched.create_job(job_spec("job", 2), sim.now)
    sched.tick(sim.now + 1)
    touched = sched.take_touched()
    assert touched and touched == {t.machine for t in sched.job("job").tasks.values()}
    assert sched.take_touched() == set()
