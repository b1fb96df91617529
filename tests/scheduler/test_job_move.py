"""Moving a job between entitlements (paper section 3.1): a paced rollout of a new
version bound to the target entitlement, through TaskControl, that ends with every
task on the target's machines and none left in the old entitlement."""

import pytest

from plait.errors import Conflict, NotFound, ValidationError
from plait.model import Entitlement, Quota, UpdatePolicy
from plait.model.task import TaskState
from plait.sim.agents import Behaviour
from plait.sim.scenarios import job_spec, world
from plait.taskcontrol import OneAtATime
from plait.taskcontrol.protocol import OpKind, TaskControlRequest, TaskControlResponse
from plait.testing import Cluster, check_invariants

ONE_PER_MACHINE = {"policy": {"requirements": {"max_tasks_per_machine": 1}}}


def moving_world(**kw):
    return world(machines=24, entitlements=("a", "b", "c"), **kw)


def started(sim, spec, controller=None):
    s = sim.scheduler
    s.create_job(spec, sim.now, controller=controller)
    assert sim.run_until(lambda: len(s.discovery(spec.name)) == spec.task_count, 300)
    return s.job(spec.name)


def moved(sim, name):
    job = sim.scheduler.job(name)
    return job.moving_from is None and len(sim.scheduler.discovery(name)) == job.spec.task_count


def machines_of_tasks(sim, name):
    job = sim.scheduler.job(name)
    return {i: sim.fleet.name(r.machine) for i, r in job.tasks.items()}


def invariants(sim):
    check_invariants(Cluster(sim.fleet, sim.region, sim.index, sim.allocator))


def test_a_move_is_paced_and_ends_with_every_task_on_the_new_entitlement():
    sim = moving_world()
    s = sim.scheduler
    job = started(sim, job_spec("web", 8, entitlement="a", **ONE_PER_MACHINE,
                                update=UpdatePolicy(max_unavailable=2)))
    assert len(sim.allocator.machines_of("a")) == 8
    before = machines_of_tasks(sim, "web")
    worst, in_flight = [0], [0]

    def observe(sm):
        worst[0] = max(worst[0], s.unavailable(job))
        in_flight[0] = max(in_flight[0], len(job.in_progress))
        invariants(sm)
    sim.observers.append(observe)

    assert s.move_job("web", "b", sim.now) == 2
    assert job.entitlement == "b" and job.moving_from == "a" and job.spec.entitlement == "b"
    assert sim.run_until(lambda: moved(sim, "web"), 600)

    assert worst[0] <= 2 and in_flight[0] <= 2  # never more than max_unavailable down
    assert worst[0] == 2  # and it did use the room it had
    on = machines_of_tasks(sim, "web")
    assert sorted(on) == list(range(8))  # the same task indices, the same job
    assert set(on.values()) == set(sim.allocator.machines_of("b"))
    assert all(on[i] != before[i] for i in on)  # each was stopped and placed again
    assert sim.allocator.machines_of("a") == []  # its machines went back to the free pool
    assert all(r.spec_version == 2 and r.state is TaskState.RUNNING for r in job.tasks.values())
    assert s.on_entitlement(job) == 8
    assert not job.rollout_active
    kinds = [e.kind for e in s.events if e.job == "web"]
    assert kinds[-2:] == ["rollout_done", "move_done"]
    # each task was stopped once and started once on the new entitlement
    assert s.counters["ops_started"] == s.counters["ops_completed"] == 8


def test_a_failed_task_counts_against_the_pacing_of_a_move():
    sim = moving_world()
    s = sim.scheduler
    job = started(sim, job_spec("web", 6, entitlement="a", **ONE_PER_MACHINE,
                                update=UpdatePolicy(max_unavailable=2)))
    # a machine fails just as the move starts: its task is down for another reason
    victim = sim.fleet.name(job.tasks[5].machine)
    sim.fail([victim])
    worst = [0]
    sim.observers.append(lambda sm: worst.__setitem__(0, max(worst[0], s.unavailable(job))))
    s.move_job("web", "b", sim.now)
    assert sim.run_until(lambda: moved(sim, "web"), 600)
    assert worst[0] <= 2  # the lost task and the moves together, never more
    assert set(machines_of_tasks(sim, "web").values()) == set(sim.allocator.machines_of("b"))
    assert victim not in sim.allocator.machines_of("b")


class Gate:
    """A TaskController that acks nothing until opened, then one at a time."""

    def __init__(self) -> None:
        self.open = False
        self.inner = OneAtATime()
        self.offered: list[tuple[OpKind, str]] = []

    def process(self, request: TaskControlRequest) -> TaskControlResponse:
        self.offered.extend((op.kind, op.reason) for op in request.request)
        if not self.open:
            return TaskControlResponse(())
        return self.inner.process(request)


def test_taskcontrol_approves_every_step_of_a_move_and_can_delay_it():
    sim = moving_world()
    s = sim.scheduler
    gate = Gate()
    job = started(sim, job_spec("web", 4, entitlement="a", **ONE_PER_MACHINE,
                                update=UpdatePolicy(max_unavailable=None)), controller=gate)
    before = machines_of_tasks(sim, "web")
    s.move_job("web", "b", sim.now)
    sim.run(300)  # no ack: nothing moves
    assert machines_of_tasks(sim, "web") == before
    assert len(s.discovery("web")) == 4 and job.moving_from == "a"
    assert set(gate.offered) == {(OpKind.MOVE, "move to entitlement b")}

    gate.open = True
    worst = [0]
    sim.observers.append(lambda sm: worst.__setitem__(0, max(worst[0], s.unavailable(job))))
    assert sim.run_until(lambda: moved(sim, "web"), 600)
    assert worst[0] == 1  # the controller's pace: one at a time
    assert set(machines_of_tasks(sim, "web").values()) == set(sim.allocator.machines_of("b"))
    done = [op for call in gate.inner.calls for op in call.completed]
    assert sorted(op.task.index for op in done) == [0, 1, 2, 3]
    assert all(op.kind is OpKind.MOVE for op in done)


def test_a_move_that_cannot_run_halts_like_an_update_and_moving_back_restores_the_job():
    def behaviour(a):  # tasks crash on entitlement b (a broken host profile, say)
        return Behaviour(crash=a.spec.entitlement == "b")
    sim = moving_world(behaviour=behaviour)
    s = sim.scheduler
    job = started(sim, job_spec("web", 6, entitlement="a", **ONE_PER_MACHINE,
                                update=UpdatePolicy(max_unavailable=2, halt_after_failures=2,
                                                    min_ready_seconds=5)))
    s.move_job("web", "b", sim.now)
    assert sim.run_until(lambda: job.halted is not None, 600)
    sim.run(120)  # halted: no further task leaves a
    on_b = sum(1 for r in job.tasks.values() if r.spec_version == 2)
    assert on_b == 2 and job.moving_from == "a"
    assert sum(1 for r in job.tasks.values() if r.state is TaskState.RUNNING and r.serving) == 4

    # moving back redirects the move: the tasks still on a are not restarted
    stay = {i: r.machine for i, r in job.tasks.items() if r.spec_version == 1}
    s.move_job("web", "a", sim.now)
    assert job.halted is None and job.moving_from == "b"
    assert sim.run_until(lambda: moved(sim, "web"), 600)
    assert sim.allocator.machines_of("b") == []
    assert {i: job.tasks[i].machine for i in stay} == stay
    assert s.counters["ops_started"] - s.counters["ops_completed"] == 0


def test_a_move_can_be_redirected_while_under_way():
    sim = moving_world()
    s = sim.scheduler
    job = started(sim, job_spec("web", 6, entitlement="a", **ONE_PER_MACHINE))
    s.move_job("web", "b", sim.now)
    assert sim.run_until(lambda: s.on_entitlement(job) >= 2, 600)
    s.move_job("web", "c", sim.now)  # redirected before the first move finished
    assert job.entitlement == "c" and job.moving_from == "b"
    assert sim.run_until(lambda: moved(sim, "web"), 900)
    assert set(machines_of_tasks(sim, "web").values()) == set(sim.allocator.machines_of("c"))
    assert sim.allocator.machines_of("a") == sim.allocator.machines_of("b") == []
    invariants(sim)


def test_a_move_claims_within_the_targets_quota_and_finished_batch_tasks_stay_finished():
    sim = moving_world()
    s = sim.scheduler
    sim.allocator.define(Entitlement(name="b", owner="owner", quota=Quota(machines=1)))
    job = started(sim, job_spec("etl", 3, entitlement="a", command="finish",
                                restart={"policy": "on-failure"}))
    assert sim.run_until(lambda: all(r.state is TaskState.SUCCEEDED
                                     for r in job.tasks.values()), 300)
    # finished tasks need no room: a one-machine entitlement takes the job
    s.move_job("etl", "b", sim.now)
    sim.run(30)
    assert job.moving_from is None and job.entitlement == "b"
    assert all(r.state is TaskState.SUCCEEDED and r.spec_version == 2
               for r in job.tasks.values())
    assert sim.allocator.machines_of("b") == []  # nothing ran again


def test_refused_moves_name_the_problem_and_change_nothing():
    sim = moving_world()
    s = sim.scheduler
    sim.allocator.define(Entitlement(name="small", owner="owner", quota=Quota(machines=2)))
    job = started(sim, job_spec("web", 3, entitlement="a", **ONE_PER_MACHINE))
    before = (list(job.versions), job.entitlement, machines_of_tasks(sim, "web"),
              len(s.events))

    with pytest.raises(ValidationError, match="entitlement 'nope' does not exist") as err:
        s.move_job("web", "nope", sim.now)
    assert err.value.field == "entitlement"
    with pytest.raises(ValidationError, match="already runs in entitlement 'a'"):
        s.move_job("web", "a", sim.now)
    with pytest.raises(Conflict, match=r"entitlement small.*room for the 3 tasks of job web"):
        s.move_job("web", "small", sim.now)  # three machines needed, a quota of two
    with pytest.raises(NotFound):
        s.move_job("ghost", "b", sim.now)
    # an update is no way to move a job
    with pytest.raises(ValidationError, match="update cannot move it"):
        s.update_job(job.spec.model_copy(update={"entitlement": "b"}), sim.now)
    sim.run(30)
    assert (list(job.versions), job.entitlement, machines_of_tasks(sim, "web"),
            len(s.events)) == before
    assert job.moving_from is None and sim.allocator.machines_of("small") == []

    s.delete_job("web", sim.now)
    with pytest.raises(Conflict, match="being deleted"):
        s.move_job("web", "b", sim.now)


def test_a_rollback_after_a_move_stays_on_the_new_entitlement():
    sim = moving_world()
    s = sim.scheduler
    job = started(sim, job_spec("web", 3, entitlement="a"))
    s.update_job(job.spec.model_copy(update={"command": "serve-v2"}), sim.now)
    s.move_job("web", "b", sim.now)
    assert sim.run_until(lambda: moved(sim, "web"), 600)
    s.rollback("web", 1, sim.now)
    assert job.spec.entitlement == "b" and job.spec.command == "serve"
    assert sim.run_until(lambda: len(s.discovery("web")) == 3 and not job.rollout_active, 600)
    assert sim.allocator.machines_of("a") == []
    assert set(machines_of_tasks(sim, "web").values()) <= set(sim.allocator.machines_of("b"))
