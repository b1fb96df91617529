"""Batch jobs: tasks that finish. Restart policies on-failure and never, the job's
completion or failure, resources given back, and reruns."""

from plait.model import TaskState
from plait.sim.scenarios import job_spec, world


def batch(name, tasks, command="finish", policy="on-failure", retries=2, **fields):
    return job_spec(name, tasks, command=command,
                    restart={"policy": policy, "max_retries": retries}, **fields)


def states(s, name):
    return sorted(r.state.value for r in s.job(name).tasks.values())


def test_a_batch_job_completes_and_gives_its_machines_back():
    sim = world(machines=12)
    s = sim.scheduler
    s.create_job(batch("b", 4, cpu=8), sim.now)
    assert sim.run_until(lambda: states(s, "b") == ["succeeded"] * 4, 600)
    job = s.job("b")
    assert all(r.machine is None and r.exit_code == 0 for r in job.tasks.values())
    assert not any(s.desired.get(m) for m in range(len(s.fleet)))  # nothing to run
    assert "b" not in s.allocator.jobs  # its resources given back
    assert [e.kind for e in s.events if e.job == "b"][-1] == "job_completed"
    assert s.unavailable(job) == 0  # finished tasks are not counted as down
    ticks = s.counters["ops_started"]
    sim.run(60)
    assert states(s, "b") == ["succeeded"] * 4  # finished for good: never rerun
    assert s.counters["ops_started"] == ticks
    assert "b" not in s.dirty_jobs  # a finished job costs nothing per tick


def test_a_task_that_keeps_failing_exhausts_its_retries_and_fails_the_job():
    sim = world(machines=12)
    sim.output = []
    s = sim.scheduler
    s.create_job(batch("b", 2, command="fail", retries=2), sim.now)
    assert sim.run_until(lambda: states(s, "b") == ["dead", "dead"], 600)
    for rec in s.job("b").tasks.values():
        assert rec.exit_code == 1 and rec.machine is None
    kinds = [e.kind for e in s.events if e.job == "b"]
    assert kinds.count("task_failed") == 2 and kinds.count("job_failed") == 1
    # each task ran 1 + max_retries times on its machine
    exits = [ref.index for ref, _, line in sim.output if line == "exited with code 1"]
    assert sorted(exits) == [0, 0, 0, 1, 1, 1]


def test_restart_policy_never_finishes_at_the_first_exit():
    sim = world(machines=12)
    s = sim.scheduler
    s.create_job(batch("b", 3, command="fail", policy="never"), sim.now)
    assert sim.run_until(lambda: states(s, "b") == ["dead"] * 3, 600)
    lines = [e for e in s.events if e.kind == "task_failed"]
    assert len(lines) == 3 and "restart policy never" in lines[0].message


def test_a_service_restarts_whatever_its_exit_code():
    sim = world(machines=12)
    s = sim.scheduler
    s.create_job(job_spec("svc", 2, command="finish"), sim.now)  # policy always
    sim.run(120)
    assert not {TaskState.SUCCEEDED, TaskState.DEAD} & {r.state for r in
                                                        s.job("svc").tasks.values()}
    assert all(r.machine is not None for r in s.job("svc").tasks.values())


def test_restart_and_update_run_finished_tasks_again_resize_removes_them():
    sim = world(machines=12)
    s = sim.scheduler
    s.create_job(batch("b", 4), sim.now)
    assert sim.run_until(lambda: states(s, "b") == ["succeeded"] * 4, 600)
    s.restart("b", sim.now, index=2)
    sim.step()
    assert s.job("b").tasks[2].state is not TaskState.SUCCEEDED  # running again
    assert sim.run_until(lambda: states(s, "b") == ["succeeded"] * 4, 600)
    # a resize changes nothing that ran; a new runtime runs every task again
    s.resize("b", 2, sim.now)
    sim.step()
    assert sorted(s.job("b").tasks) == [0, 1] and states(s, "b") == ["succeeded"] * 2
    s.update_job(batch("b", 2, command="fail", retries=0), sim.now)
    assert sim.run_until(lambda: states(s, "b") == ["dead", "dead"], 600)
    assert all(r.spec_version == s.job("b").target for r in s.job("b").tasks.values())


def test_finished_tasks_do_not_hold_back_a_paced_rollout():
    sim = world(machines=12)
    s = sim.scheduler
    # two tasks finish at once, two keep failing and are retried many times
    s.create_job(batch("b", 2, retries=1000), sim.now)
    assert sim.run_until(lambda: states(s, "b") == ["succeeded"] * 2, 600)
    s.resize("b", 4, sim.now)  # the two new tasks run and finish too, max_unavailable 1
    assert sim.run_until(lambda: states(s, "b") == ["succeeded"] * 4, 600)


def test_a_task_that_finished_while_its_machine_was_unreachable_is_done():
    from plait.scheduler.records import Phase, TaskStatus
    from plait.taskcontrol import TaskControlResponse

    class Never:  # acks nothing: the lost task waits for its move
        def process(self, request):
            return TaskControlResponse(())

    sim = world(machines=12)
    s = sim.scheduler
    s.create_job(batch("b", 1, command="serve"), sim.now, controller=Never())
    assert sim.run_until(lambda: states(s, "b") == ["running"], 600)
    rec = s.job("b").tasks[0]
    machine = s.fleet.name(rec.machine)
    sim.fail([machine])
    sim.step()
    assert rec.state is TaskState.LOST
    # its agent's final report arrives (the partition healed, or it came in late)
    s.report(machine, [TaskStatus("b", 0, 1, Phase.EXITED, False, 0, final=True)], sim.now)
    assert (rec.state, rec.exit_code, rec.machine) == (TaskState.SUCCEEDED, 0, None)
    sim.run(30)
    assert states(s, "b") == ["succeeded"]  # not placed and run again


def test_a_final_exit_its_restart_policy_could_not_give_is_not_believed():
    # a machine's credential says a service's task exited for good: a service's policy
    # (always) never ends a task, so it exited and is to be started again (believed,
    # the job would be complete and its task gone for good)
    from plait.scheduler.records import Phase, TaskStatus

    sim = world(machines=12)
    s = sim.scheduler
    s.create_job(job_spec("svc", 1, command="serve"), sim.now)
    s.create_job(batch("b", 1, command="serve"), sim.now)
    assert sim.run_until(lambda: states(s, "svc") == ["running"]
                         and states(s, "b") == ["running"], 600)
    for name in ("svc", "b"):
        rec = s.job(name).tasks[0]
        s.report(s.fleet.name(rec.machine), [TaskStatus(name, 0, 1, Phase.EXITED, False, 0,
                                                        final=True)], sim.now)
    svc = s.job("svc").tasks[0]
    assert svc.state is not TaskState.SUCCEEDED and svc.machine is not None
    assert "job_completed" not in [e.kind for e in s.events if e.job == "svc"]
    # a batch task's exit 0 under on-failure is the end its policy gives: believed
    assert states(s, "b") == ["succeeded"]
    assert sim.run_until(lambda: states(s, "svc") == ["running"], 600)


def test_a_task_whose_process_could_not_start_has_failed_and_a_delete_still_finishes():
    # an agent that cannot start a task's command (it does not exist) reports it
    # exited 127 without ever reporting it started: that was ignored, the task stayed
    # allocated, a rollout never counted it, and a delete of the job never finished
    from plait.scheduler.records import Phase, TaskStatus

    sim = world(machines=12)
    s = sim.scheduler
    now = sim.now
    s.create_job(job_spec("svc", 1, command="/nonexistent/binary"), now)
    s.tick(now)  # placed; no agent has run it
    rec = s.job("svc").tasks[0]
    assert rec.state is TaskState.ALLOCATED
    machine = s.fleet.name(rec.machine)
    revision = s.job("svc").revision(rec.spec_version)
    s.report(machine, [TaskStatus("svc", 0, revision, Phase.EXITED, healthy=False,
                                  exit_code=127)], now + 1)
    s.tick(now + 1)
    assert rec.state is TaskState.FAILED
    assert "task_exited" in [e.kind for e in s.events if e.job == "svc"]
    s.delete_job("svc", now + 2)
    for t in range(3, 30):  # the agent stops reporting the task once it is not wanted
        s.report(machine, [], now + t)
        s.tick(now + t)
        if "svc" not in s.jobs:
            break
    assert "svc" not in s.jobs


def test_a_job_whose_rollout_halted_on_a_task_that_never_started_is_deleted_all_the_same():
    # the new version's task never started (exit 127 at each try): it kept its update
    # operation once the rollout halted, a task with an operation under way is offered
    # nothing else, and the job stayed deleting for good
    from plait.scheduler.records import Phase, TaskStatus

    sim = world(machines=12)
    s = sim.scheduler
    now = [sim.now]
    policy = {"max_unavailable": 1, "halt_after_failures": 1}
    s.create_job(job_spec("svc", 1, update=policy), now[0])

    def agent(said):  # one pass, the task's machine reporting what ``said`` gives
        now[0] += 1
        rec = s.job("svc").tasks.get(0) if "svc" in s.jobs else None
        if rec is not None and rec.machine is not None:
            job = s.job("svc")
            st = said(rec, job.revision(rec.spec_version))
            s.report(s.fleet.name(rec.machine), [st] if st else [], now[0])
        s.tick(now[0])

    for _ in range(3):
        agent(lambda rec, rev: TaskStatus("svc", 0, rev, Phase.RUNNING))
    assert states(s, "svc") == ["running"]
    s.update_job(job_spec("svc", 1, command="/nonexistent/binary", update=policy), now[0])
    for _ in range(20):
        agent(lambda rec, rev: None if rec.state is TaskState.STOPPING else TaskStatus(
            "svc", 0, rev, Phase.RUNNING) if rec.spec_version == 1 else TaskStatus(
            "svc", 0, rev, Phase.EXITED, healthy=False, exit_code=127))
        if s.job("svc").halted is not None:
            break
    rec = s.job("svc").tasks[0]
    assert s.job("svc").halted is not None and rec.state is TaskState.FAILED
    assert rec.op is not None  # (the update, under way when it halted)
    s.delete_job("svc", now[0])
    for _ in range(20):  # the agent stops it, then no longer reports it
        agent(lambda rec, rev: None)
        if "svc" not in s.jobs:
            break
    assert "svc" not in s.jobs

