"""Health probes and pacing: max_unavailable is a hard cap on tasks that were
serving; a version that runs but never passes its probe halts its rollout; liveness
restarts; spec changes that do not touch the process restart nothing; advance
notices carry the window's end.

The scheduler is driven directly (no simulated agents): ``Agents`` reports every task
in its machine's desired set as running, healthy unless the test says otherwise.
"""

from __future__ import annotations

from plait.model import HealthProbe, UpdatePolicy
from plait.model.events import EventKind, UnavailabilityEvent
from plait.model.task import TaskState
from plait.scheduler import Phase, Scheduler, TaskStatus
from plait.sim.scenarios import job_spec, world
from plait.taskcontrol.protocol import TaskControlRequest, TaskControlResponse

PROBE = HealthProbe(http="/health")


class Agents:
    def __init__(self, s: Scheduler) -> None:
        self.s = s
        #: (job, index) reported failing its probe
        self.unhealthy: set[tuple[str, int]] = set()
        #: (job, index) reported exited once, next heartbeat: killed from outside or not
        self.exits: dict[tuple[str, int], bool] = {}
        self.now = 0.0

    def step(self, seconds: float = 1.0) -> None:
        """One heartbeat from every machine, then a pass."""
        self.now += seconds
        s = self.s
        for m in sorted(set(s.desired) | set(s.placed)):
            statuses = [TaskStatus(a.job, a.index, a.revision, Phase.EXITED, False, -9,
                                   killed=self.exits.pop((a.job, a.index)))
                        if (a.job, a.index) in self.exits else
                        TaskStatus(a.job, a.index, a.revision, Phase.RUNNING,
                                   healthy=(a.job, a.index) not in self.unhealthy)
                        for a in s.desired.get(m, {}).values()]
            s.report(s.fleet.name(m), statuses, self.now)
        s.tick(self.now)

    def run(self, seconds: float, watch=None) -> None:
        for _ in range(int(seconds)):
            self.step()
            if watch is not None:
                watch()


def taken_down(s: Scheduler, job: str) -> set[int]:
    """Tasks with a planned operation under way (stopped or restarting for it)."""
    return {i for i, r in s.job(job).tasks.items() if r.op is not None}


def settled(s: Scheduler, name: str, count: int, spec_version: int = 1) -> bool:
    job = s.job(name)
    return len(job.tasks) == count and all(
        r.state is TaskState.RUNNING and r.serving and r.spec_version == spec_version
        for r in job.tasks.values())


def start(count: int = 5, **update) -> tuple[Scheduler, Agents]:
    sim = world(machines=24)
    s = sim.scheduler
    s.create_job(job_spec("zk", count, health=PROBE,
                          update=UpdatePolicy(max_unavailable=1, **update)), 0)
    agents = Agents(s)
    agents.run(10)
    assert settled(s, "zk", count)
    return s, agents


def test_tasks_that_just_failed_their_probe_are_not_restarted_past_the_cap():
    """A leader election: every follower fails its probe for a few seconds. A
    rollout must not restart them all at once (they were serving a moment ago)."""
    s, agents = start(5)
    worst = [0]

    def watch() -> None:
        worst[0] = max(worst[0], len(taken_down(s, "zk")))

    agents.unhealthy = {("zk", 1), ("zk", 2), ("zk", 3)}
    agents.step()
    s.update_job(s.job("zk").spec.model_copy(update={"args": ("v2",)}), agents.now)
    agents.run(10, watch)
    assert taken_down(s, "zk") == set() and worst[0] == 0  # 3 down > cap of 1: nothing
    assert all(r.spec_version == 1 for r in s.job("zk").tasks.values())
    agents.unhealthy = set()  # the election is over
    agents.run(60, watch)
    assert settled(s, "zk", 5, spec_version=2)
    assert worst[0] == 1


def test_one_task_failing_its_probe_within_the_cap_is_updated():
    s, agents = start(3)
    agents.unhealthy = {("zk", 0)}
    agents.step()
    s.update_job(s.job("zk").spec.model_copy(update={"args": ("v2",)}), agents.now)
    agents.step()
    agents.step()
    assert taken_down(s, "zk") == {0}  # the unhealthy one first: it takes no one else down
    assert all(not s.job("zk").tasks[i].op for i in (1, 2))


def test_a_task_unhealthy_past_the_grace_is_free_to_replace():
    s, agents = start(3, serving_grace_seconds=5)
    agents.unhealthy = {("zk", 0), ("zk", 1)}
    agents.run(3)
    s.update_job(s.job("zk").spec.model_copy(update={"args": ("v2",)}), agents.now)
    agents.step()
    assert taken_down(s, "zk") == set()  # two were serving 3 s ago: past the cap of 1
    agents.run(5)
    # long unhealthy: replacing them costs nothing; the healthy one waits its turn
    assert {0, 1} <= {i for i, r in s.job("zk").tasks.items()
                      if r.op is not None or r.spec_version == 2}
    assert s.job("zk").tasks[2].spec_version == 1 and s.job("zk").tasks[2].op is None


def test_a_version_that_runs_but_never_passes_its_probe_halts_the_rollout():
    s, agents = start(4, ready_timeout_seconds=10, halt_after_failures=2)
    s.update_job(s.job("zk").spec.model_copy(update={"args": ("broken",)}), agents.now)
    job = s.job("zk")
    for _ in range(120):
        agents.unhealthy = {("zk", i) for i, r in job.tasks.items() if r.spec_version == 2}
        agents.step()
        if job.halted is not None:
            break
    assert job.halted is not None and "failed to become healthy" in job.halted
    assert "without passing its health probe" in job.halted
    assert [e.kind for e in s.events].count("task_not_ready") == 1  # the cap is 1
    on_new = {i for i, r in job.tasks.items() if r.spec_version == 2}
    agents.run(30)
    assert {i for i, r in job.tasks.items() if r.spec_version == 2} == on_new  # halted


def test_liveness_restarts_a_task_failing_its_probe_within_the_budget():
    sim = world(machines=24)
    s = sim.scheduler
    probe = HealthProbe(http="/health", restart_after_seconds=5)
    s.create_job(job_spec("web", 3, health=probe,
                          update=UpdatePolicy(serving_grace_seconds=20)), 0)
    agents = Agents(s)
    agents.run(10)
    assert settled(s, "web", 3)
    agents.unhealthy = {("web", 0)}
    seen: list[set[int]] = []
    for _ in range(8):
        agents.step()
        seen.append(taken_down(s, "web"))
    assert seen[:3] == [set()] * 3  # not failing long enough yet
    assert {0} in seen  # restarted: the only one down, within max_unavailable 1
    assert any(e.kind == "liveness_restart" for e in s.events)
    agents.unhealthy = set()
    agents.run(10)
    assert settled(s, "web", 3)
    # two failing at once: restarting either would take a second serving task down,
    # so both wait out the serving grace; then they are free to restart
    agents.unhealthy = {("web", 1), ("web", 2)}
    seen = []
    for _ in range(30):
        agents.step()
        seen.append(taken_down(s, "web"))
    first = next(k for k, down in enumerate(seen) if down)
    assert first >= 19, seen  # not before the grace (20 s) is over
    assert {1, 2} <= set().union(*seen[first:])


def test_a_change_of_pacing_or_controller_only_restarts_nothing():
    s, agents = start(3)
    spec = s.job("zk").spec
    for change in ({"update": UpdatePolicy(max_unavailable=2, min_ready_seconds=3)},
                   {"task_controller": "http://127.0.0.1:9/tc"}):
        version = s.update_job(spec.model_copy(update=change), agents.now)
        agents.run(3)
        job = s.job("zk")
        assert all(r.spec_version == version and r.serving and r.op is None
                   for r in job.tasks.values())
        assert not job.rollout_active and taken_down(s, "zk") == set()
        spec = job.spec


def test_advance_notices_carry_the_maintenance_window_end():
    sim = world(machines=24)
    s = sim.scheduler
    seen: list[TaskControlRequest] = []

    class Quiet:
        def process(self, request: TaskControlRequest) -> TaskControlResponse:
            seen.append(request)
            return TaskControlResponse()

    s.create_job(job_spec("web", 2), 0, controller=Quiet())
    sim.run_until(lambda: settled(s, "web", 2), 120)
    machine = s.fleet.name(s.job("web").tasks[0].machine)
    s.region.add_event(UnavailabilityEvent("mx-1", EventKind.MAINTENANCE, (machine,),
                                           sim.now + 600, sim.now + 4200, "kernel"), sim.now)
    sim.run(5)
    notices = [n for r in seen for n in r.advance_notices]
    assert notices and notices[-1].deadline == notices[-1].start
    assert notices[-1].end == notices[-1].start + 3600


def test_a_task_killed_from_outside_does_not_count_against_its_version():
    """A SIGKILL neither the agent nor the out-of-memory killer sent (an operator's
    kill -9, a chaos monkey) is not the new version failing: the task is restarted and
    the rollout goes on. The same exit not known to be from outside halts it."""
    for killed, halts in ((True, False), (False, True)):
        s, agents = start(3, halt_after_failures=1)
        s.update_job(s.job("zk").spec.model_copy(update={"args": ("v2",)}), agents.now)
        job = s.job("zk")
        hit: set[int] = set()
        for _ in range(120):
            fresh = {i for i, r in job.tasks.items() if r.spec_version == 2
                     and r.state is TaskState.RUNNING and i not in hit}
            if fresh:  # every task of the new version, killed once as it comes up
                i = min(fresh)
                hit.add(i)
                agents.exits[("zk", i)] = killed
            agents.step()
            if job.halted is not None or (len(hit) == 3 and not agents.exits
                                          and settled(s, "zk", 3, spec_version=2)):
                break
        assert (job.halted is not None) is halts, job.halted
        kinds = [e.kind for e in s.events]
        assert ("task_killed" in kinds) is killed
        if not halts:
            assert settled(s, "zk", 3, spec_version=2) and len(hit) == 3



def test_a_pushed_task_that_never_passes_its_probe_goes_back_when_its_pin_is_dropped():
    # a push's pinned task that ran unhealthy halted the rollout; the push was rolled
    # back (the rollout resumed, the pin dropped), but the task's update to the pushed
    # version stayed open, waiting for a health that never came: it ran the pushed
    # version for good, and the job never settled. The halt named the job's version
    # (1), not the one that failed (2)
    s, agents = start(4, ready_timeout_seconds=10, halt_after_failures=2)
    job = s.job("zk")
    pushed = s.add_version(job.spec.model_copy(update={"args": ("broken",)}), agents.now)
    s.pin("zk", {0: pushed, 1: pushed}, agents.now)
    for _ in range(120):
        agents.unhealthy = {("zk", i) for i, r in job.tasks.items() if r.spec_version == 2}
        agents.step()
        if job.halted is not None:
            break
    assert job.halted is not None and job.halted.startswith("1 task of version 2 failed")
    assert next(e.message for e in s.events if e.kind == "task_not_ready").startswith(
        "task 0 of version 2 ")
    # the push rolls back: the rollout resumes, no task is pinned any more
    s.resume("zk", agents.now)
    s.pin("zk", {}, agents.now)
    for _ in range(60):
        agents.unhealthy = {("zk", i) for i, r in job.tasks.items() if r.spec_version == 2}
        agents.step()
    assert settled(s, "zk", 4), {i: (r.spec_version, r.op) for i, r in job.tasks.items()}
    assert job.halted is None


def test_a_task_waiting_for_a_machine_for_its_pin_starts_at_its_goal_once_unpinned():
    # stopped for its update to a pushed version no machine can hold, it waited for a
    # machine; the push rolled back, and it was placed at the pushed version still
    from plait.model import Resources

    s, agents = start(4)
    job = s.job("zk")
    huge = job.spec.model_copy(update={"resources": Resources(cpu=1000)})
    pushed = s.add_version(huge, agents.now)
    s.pin("zk", {0: pushed}, agents.now)
    for _ in range(30):
        agents.step()
        if job.tasks[0].state is TaskState.PENDING:
            break
    assert job.tasks[0].state is TaskState.PENDING and job.tasks[0].spec_version == pushed
    s.pin("zk", {}, agents.now)
    assert job.tasks[0].spec_version == 1
    agents.run(30)
    assert settled(s, "zk", 4), {i: (r.state, r.spec_version) for i, r in job.tasks.items()}


class _AckAll:
    """A TaskController that acks every operation offered."""

    def process(self, request: TaskControlRequest) -> TaskControlResponse:
        return TaskControlResponse(tuple(op.op_id for op in request.request))


def test_an_acked_update_held_by_a_task_in_its_grace_starts_when_the_grace_ends():
    """A rollout whose new task found no room waits for room out of the passes, with
    its acked operations held by max_unavailable; but a task that fails its probe is
    held only for its grace, which ends by time alone: its update starts when it ends,
    not at the room timer's next try (up to a minute later)."""
    sim = world(machines=12)
    s = sim.scheduler
    s.create_job(job_spec("hog", 12, cpu=10, memory_gb=0.1), 0)
    update = UpdatePolicy(max_unavailable=1, serving_grace_seconds=20)
    s.create_job(job_spec("zk", 4, cpu=1, memory_gb=0.1, health=PROBE, update=update), 0,
                 controller=_AckAll())
    agents = Agents(s)
    agents.run(10)
    assert settled(s, "zk", 4)
    s.update_job(job_spec("zk", 4, cpu=8, memory_gb=0.1, health=PROBE, update=update),
                 agents.now)
    agents.run(10)
    job = s.job("zk")
    assert job.unplaced_reason is not None and len(job.acked) == 3 and "zk" in s.driver.rooms.waits
    failing = max(op.task.index for op in job.acked.values())
    agents.unhealthy = {("zk", failing)}
    began = agents.now
    agents.run(40, watch=lambda: None)
    rec = job.tasks[failing]
    assert rec.op is not None or rec.spec_version == 2, "its update never started"
    started = [e.time for e in s.events if e.kind == "op_started" and e.task == failing]
    assert started and started[0] - began <= 20 + 3, started
