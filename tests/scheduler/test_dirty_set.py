"""A pass reconciles the jobs that changed since the last one (the dirty set), and
every job on the periodic full pass.

Each kind of input (a job operation, an agent's report, a machine event, a timer or
deadline due, a TaskControl answer) puts its job in the dirty set, so the next pass
looks at it although no full pass runs (here the full pass is off unless a test
turns it on); a settled job nobody touched is not looked at. The full pass runs
every ``full_pass_every`` passes or ``full_pass_interval`` seconds, and catches a
change no input reported.
"""

from __future__ import annotations

import pytest

from plait.model import UpdatePolicy
from plait.model.task import TaskState
from plait.scheduler import Phase, Scheduler, SchedulerConfig, TaskStatus, settled
from plait.scheduler.records import JobRecord
from plait.sim.harness import Simulation
from plait.sim.scenarios import job_spec, world
from plait.taskcontrol import RemoteController, TaskControlResponse
from plait.taskcontrol.controllers import PacingController
from plait.taskcontrol.protocol import ControllerAnswer, TaskControlRequest, TaskOp

NO_FULL_PASS = {"full_pass_every": 0, "full_pass_interval": 0.0}


@pytest.fixture
def looked_at(monkeypatch):
    """The jobs each pass looked at (every job a pass takes goes through
    ``settled.no_op`` first), as a list the test clears."""
    seen: list[str] = []
    real = settled.no_op

    def spy(job, notice):
        seen.append(job.name)
        return real(job, notice)

    monkeypatch.setattr(settled, "no_op", spy)
    return seen


def settled_world(looked_at, controller=None, **config):
    """A world with jobs ``web`` (3 tasks) and ``db`` (2), both settled: running,
    serving, nothing left to do, out of the dirty set."""
    sim = world(machines=12, config=SchedulerConfig(**{**NO_FULL_PASS, **config}))
    s = sim.scheduler
    s.create_job(job_spec("web", 3, update=UpdatePolicy(max_unavailable=1)), sim.now,
                 controller=controller)
    s.create_job(job_spec("db", 2), sim.now)
    assert sim.run_until(lambda: len(s.discovery("web")) == 3 and len(s.discovery("db"))
                         == 2, 300)
    assert sim.run_until(lambda: not s.dirty_jobs, 120)
    sim.step()
    looked_at.clear()
    return sim, s


def test_settled_jobs_are_not_looked_at_without_an_input(looked_at):
    sim, s = settled_world(looked_at)
    sim.run(30)
    assert looked_at == []
    assert s.full_passes == 0


@pytest.mark.parametrize("operation", ["update", "resize", "restart", "delete"])
def test_a_job_operation_is_seen_by_the_next_pass(looked_at, operation):
    sim, s = settled_world(looked_at)
    spec = s.job("web").spec
    if operation == "update":
        s.update_job(spec.model_copy(update={"args": ("--v2",)}), sim.now)
    elif operation == "resize":
        s.resize("web", 5, sim.now)
    elif operation == "restart":
        s.restart("web", sim.now, index=1)
    else:
        s.delete_job("web", sim.now)
    assert "web" in s.dirty_jobs and "db" not in s.dirty_jobs
    s.tick(sim.now + 1)
    assert looked_at == ["web"]
    job = s.jobs.get("web")
    if operation == "resize":
        assert job is not None and sum(r.machine is not None for r in job.tasks.values()) == 5
    elif operation == "delete":
        assert job is not None and all(r.state is TaskState.STOPPING
                                       for r in job.tasks.values())
    else:
        assert job is not None and len(job.in_progress) == 1  # the first one under way


def test_an_agent_report_that_changes_a_task_is_seen_and_one_that_does_not_is_not(looked_at):
    sim, s = settled_world(looked_at)
    rec = s.job("web").tasks[0]
    revision = s.job("web").revision(rec.spec_version)
    machine = s.fleet.name(rec.machine)
    s.report(machine, [TaskStatus("web", 0, revision, Phase.RUNNING)], sim.now)
    assert "web" not in s.dirty_jobs  # a heartbeat that changes nothing
    s.report(machine, [TaskStatus("web", 0, revision, Phase.RUNNING, healthy=False)],
             sim.now)
    assert "web" in s.dirty_jobs
    s.tick(sim.now + 1)
    assert looked_at == ["web"]
    assert not rec.serving


def test_a_machine_failure_is_seen_by_the_next_pass(looked_at):
    sim, s = settled_world(looked_at)
    victim = s.job("db").tasks[0].machine
    sim.fail([s.fleet.name(victim)])
    sim.step()
    assert "db" in looked_at
    assert s.job("db").tasks[0].state in (TaskState.LOST, TaskState.PENDING,
                                          TaskState.ALLOCATED)
    assert s.counters["tasks_lost"] >= 1


def test_a_maintenance_notice_and_its_deadline_are_seen(looked_at):
    sim, s = settled_world(looked_at)
    machine = s.job("db").tasks[1].machine
    sim.maintenance([s.fleet.name(machine)], sim.now + 5, sim.now + 60)
    sim.step()
    assert "db" in looked_at  # under notice: offered a move or a stop
    assert s.job("db").offers or s.job("db").acked or s.job("db").in_progress


class AckNothing:
    """A controller that acks nothing (the job's operations wait, offered)."""

    def __init__(self) -> None:
        self.calls = 0

    def process(self, request):
        self.calls += 1
        return TaskControlResponse(())


def test_a_controller_recheck_timer_due_is_seen_by_the_pass(looked_at):
    sim, s = settled_world(looked_at, controller=RemoteController("http://never"),
                           recheck_interval=10)
    ctl = sim.remotes["http://never"] = (AckNothing(), 0.0)
    spec = s.job("web").spec
    s.update_job(spec.model_copy(update={"args": ("--v2",)}), sim.now)
    sim.run(3)  # offered, asked, acked nothing: waiting for the re-check
    assert s.job("web").offers and "web" not in s.dirty_jobs and "web" in s.driver.wake_at
    calls = ctl[0].calls
    looked_at.clear()
    sim.run(5)
    assert "web" not in looked_at  # not due yet
    sim.run(6)  # the re-check is due 10 s after the last call
    assert "web" in looked_at
    assert ctl[0].calls == calls + 1


def test_a_taskcontrol_answer_is_seen_by_the_next_pass(looked_at):
    sim, s = settled_world(looked_at, controller=RemoteController("http://c"))
    sim.carry_calls = False
    s.take_calls()
    s.job("web").in_flight = None
    spec = s.job("web").spec
    s.update_job(spec.model_copy(update={"args": ("--v2",)}), sim.now)
    sim.step()
    [call] = s.take_calls()
    sim.step()
    looked_at.clear()
    s.dirty_jobs.discard("web")  # (only the answer may bring it back)
    s.answer(ControllerAnswer("web", call.request.sequence_number,
                              TaskControlResponse((call.request.request[0].op_id,))))
    assert "web" in s.dirty_jobs
    s.tick(sim.now + 1)
    assert "web" in looked_at
    assert len(s.job("web").in_progress) == 1


def test_the_full_pass_runs_every_n_passes_and_catches_an_unreported_change(looked_at):
    sim, s = settled_world(looked_at, full_pass_every=5)
    full = s.full_passes
    seen_at = []
    for _ in range(10):
        looked_at.clear()
        s.tick(sim.now)
        if looked_at:
            seen_at.append((s.passes, sorted(looked_at)))
    # only the full passes look at the settled jobs: each of them once
    assert seen_at == [(p, ["db", "web"]) for p in range(s.passes - 9, s.passes + 1)
                       if p % 5 == 0]
    # a change no input reported (as if an input forgot to mark its job)
    s.job("web").tasks[2].restart = True
    while s.passes % 5 != 4:
        s.tick(sim.now)
        assert s.job("web").tasks[2].op is None  # not seen before the full pass
    s.tick(sim.now)
    assert s.job("web").tasks[2].op is not None  # the restart it caught is under way
    assert s.full_passes == full + 3


def test_the_full_pass_runs_every_interval_seconds(looked_at):
    _sim, s = settled_world(looked_at, full_pass_interval=30.0)
    full = s.full_passes
    start = s.full_pass_at
    times = []
    for k in range(1, 91):
        looked_at.clear()
        s.tick(start + k)
        if looked_at:
            times.append(k)
    assert times == [30, 60, 90]
    assert s.full_passes == full + 3


def test_a_job_waiting_for_room_is_not_reconciled_each_pass_until_room_appears(looked_at):
    """A job whose only work is placing tasks no machine has room for leaves the dirty
    set: its timer (backoff up to 8 s) asks the allocator about one of its tasks, and
    only room found brings its reconcile back. Once another job's tasks are gone, it
    places into the room they left. (A job of 100,000 tasks that could never be placed
    was reconciled, stored and shown every pass: 0.6 s each, for everyone.)"""
    sim, s = settled_world(looked_at)
    region_cpu = int(s.fleet.cpu.sum()) // 1000
    huge = int(region_cpu) + 500  # (1 cpu each: never all placed)
    s.create_job(job_spec("huge", huge, memory_gb=0.1), sim.now)
    assert sim.run_until(lambda: s.job("huge").unplaced_reason is not None
                         and "huge" in s.driver.rooms.waits, 120)
    placed = sum(1 for r in s.job("huge").tasks.values() if r.machine is not None)
    assert 0 < placed < huge
    # (the placed tasks' starts are the job's own inputs: looked at for those)
    assert sim.run_until(lambda: all(r.state is TaskState.RUNNING
                                     for r in s.job("huge").tasks.values()
                                     if r.machine is not None), 120)
    sim.run(5)
    looked_at.clear()
    passes = s.passes
    sim.run(60)
    assert s.passes - passes >= 30  # (passes went on; the job was not among them)
    assert looked_at.count("huge") <= 1, looked_at.count("huge")
    # the room the other jobs hold, given back: the waiting job takes it
    s.delete_job("web", sim.now)
    s.delete_job("db", sim.now)
    assert sim.run_until(lambda: "web" not in s.jobs and "db" not in s.jobs, 300)
    assert sim.run_until(lambda: sum(1 for r in s.job("huge").tasks.values()
                                     if r.machine is not None) >= placed + 5, 60)


class _AckAll(PacingController):
    """A TaskController that acks every operation at once."""

    def choose(self, ops: list[TaskOp], down: set[int],
               request: TaskControlRequest) -> list[TaskOp]:
        return ops


@pytest.mark.parametrize("acked_by", ["the built-in policy", "its TaskController"])
def test_a_rollout_whose_new_tasks_find_no_room_waits_for_room_out_of_the_passes(looked_at,
                                                                                  acked_by):
    """An update whose new version has no room: its pending task holds the job's
    max_unavailable, the other tasks' operations wait for it, and the job is not
    reconciled each pass (a 100,000-task job in that state cost every pass its whole
    reconcile, save and view) until room appears; then the rollout finishes. With a
    TaskController that acks every operation, the acked ones wait for max_unavailable
    (20,000 tasks cost every pass 161 ms)."""
    controller = _AckAll() if acked_by == "its TaskController" else None
    sim, s, big = _stuck_rollout(4, controller=controller)
    sim.run(5)
    assert big.in_progress and big.unplaced_reason is not None
    if controller is None:
        assert big.offers and not big.acked
    else:
        assert len(big.acked) == 3 and not big.offers
    looked_at.clear()
    passes = s.passes
    sim.run(60)
    assert s.passes - passes >= 30
    assert looked_at.count("big") <= 1, looked_at.count("big")
    _room_then_done(sim, s, big)  # (without another input)


def _stuck_rollout(tasks: int, controller: object = None, **config: object
                   ) -> tuple[Simulation, Scheduler, JobRecord]:
    """A job ``big`` updated to a version no machine has room for (a hog holds
    every machine's): one new task pending, holding max_unavailable (1)."""
    sim = world(machines=12, config=SchedulerConfig(**{**NO_FULL_PASS, **config}))
    s = sim.scheduler
    s.create_job(job_spec("hog", 12, cpu=10, memory_gb=0.1), sim.now)  # (6 cpu left each)
    s.create_job(job_spec("big", tasks, cpu=1, memory_gb=0.1,
                          update=UpdatePolicy(max_unavailable=1)), sim.now,
                 controller=controller)
    assert sim.run_until(lambda: len(s.discovery("hog")) == 12
                         and len(s.discovery("big")) == tasks, 300)
    s.update_job(job_spec("big", tasks, cpu=8, memory_gb=0.1,
                          update=UpdatePolicy(max_unavailable=1)), sim.now)
    big = s.job("big")
    assert sim.run_until(lambda: big.unplaced_reason is not None and any(
        r.state is TaskState.PENDING for r in big.tasks.values()), 120)
    return sim, s, big


def _room_then_done(sim: Simulation, s: Scheduler, big: JobRecord) -> None:
    """Room appears (the hog goes): the rollout finishes, every task serving."""
    s.delete_job("hog", sim.now)
    assert sim.run_until(lambda: all(r.state is TaskState.RUNNING and r.spec_version == 2
                                     for r in big.tasks.values())
                         and not big.offers and not big.acked, 600)
    assert sim.run_until(lambda: all(r.serving for r in big.tasks.values()), 60)


class _AckOne(PacingController):
    """A TaskController that acks one operation a call."""

    def choose(self, ops: list[TaskOp], down: set[int],
               request: TaskControlRequest) -> list[TaskOp]:
        return ops[:1]


def test_a_rollout_whose_controller_is_asked_again_waits_for_room_between_its_calls(
        looked_at):
    """Operations offered to the job's TaskController, one acked a call, the acked
    ones held by max_unavailable: the job waits for room out of the passes, and its
    controller is still asked again at each re-check."""
    ctl = _AckOne()
    sim, s, big = _stuck_rollout(8, controller=ctl, recheck_interval=10)
    assert sim.run_until(lambda: bool(big.acked), 120)
    looked_at.clear()
    passes, calls, acked = s.passes, len(ctl.calls), len(big.acked)
    sim.run(60)
    assert s.passes - passes >= 30
    asked = len(ctl.calls) - calls
    assert asked >= 5, asked  # asked again every 10 s, as when it was looked at each pass
    assert len(big.acked) >= acked + 5
    assert looked_at.count("big") <= asked + 2, (looked_at.count("big"), asked)
    _room_then_done(sim, s, big)


def test_a_task_waiting_for_room_at_a_version_an_update_replaced_is_placed_at_the_new_one():
    """A version that never fitted, then an update that fits: its pending task ran
    nowhere, so it goes to the new version at once (it waited for room at the old
    one, in vain, for ever); and the probe of a waiting job asks about what its
    placement would ask, so room freed for it is found."""
    sim = world(machines=12, quota=1, config=SchedulerConfig(**NO_FULL_PASS))
    s = sim.scheduler
    s.create_job(job_spec("hog", 1, cpu=13, memory_gb=0.1), sim.now)
    sim.run(20)
    s.create_job(job_spec("x", 1, cpu=8, memory_gb=0.1), sim.now)  # (3 cpu left)
    sim.run(20)
    x = s.job("x")
    assert x.unplaced_reason is not None and "x" in s.driver.rooms.waits
    s.update_job(job_spec("x", 1, cpu=2, memory_gb=0.1), sim.now)
    assert sim.run_until(lambda: all(r.state is TaskState.RUNNING and r.spec_version == 2
                                     for r in x.tasks.values()), 120)
    # another job with no room, then room for it: placed without any input of its own
    s.create_job(job_spec("y", 1, cpu=8, memory_gb=0.1), sim.now)
    assert sim.run_until(lambda: "y" in s.driver.rooms.waits, 120)
    s.delete_job("hog", sim.now)
    assert sim.run_until(lambda: all(r.state is TaskState.RUNNING
                                     for r in s.job("y").tasks.values()), 120)
