"""Edge cases of pacing and TaskControl: completions are never lost, caps hold
under a rate limit and under a controller that acks everything, the halt counts
tasks and survives a resize, move wins a maintenance pair, deadline stops ignore
the rate limit, a lost leader is moved at once."""

from plait.model import Fleet, UpdatePolicy
from plait.scheduler import SchedulerConfig
from plait.sim.scenarios import job_spec, world
from plait.taskcontrol import LeaderLast, OneAtATime, OpKind, TaskControlResponse
from plait.testing import machine


def out_of_discovery(sim, name, n):
    return n - len(sim.scheduler.discovery(name))


def test_completions_survive_a_failed_controller_call():
    class Flaky(OneAtATime):
        failed = False

        def process(self, req):
            if req.completed and not self.failed:
                self.failed = True
                raise TimeoutError("timed out")
            return super().process(req)

    sim = world(machines=8)
    s = sim.scheduler
    spec = job_spec("web", 3, update=UpdatePolicy(max_unavailable=None))
    ctl = Flaky()
    s.create_job(spec, 0, controller=ctl)
    assert sim.run_until(lambda: len(s.discovery("web")) == 3, 60)
    s.update_job(spec.model_copy(update={"args": ("--v2",)}), sim.now)
    assert sim.run_until(lambda: not s.job("web").rollout_active, 600)
    reported = [o.op_id for c in ctl.calls for o in c.completed]
    assert len(reported) == len(set(reported)) == 3 and not ctl.in_flight


def test_pacing_holds_under_a_tight_rate_limit_while_tasks_start():
    sim = world(machines=24, config=SchedulerConfig(rate=0.5, burst=1))
    s = sim.scheduler
    spec = job_spec("web", 12, update=UpdatePolicy(max_unavailable=1))
    s.create_job(spec, 0)
    sim.run(2)  # placed, still starting
    s.update_job(spec.model_copy(update={"args": ("--v2",)}), sim.now)
    worst = [0]

    def observe(sm):
        if sm.now > 10:  # once the first start is over
            worst[0] = max(worst[0], out_of_discovery(sm, "web", 12))

    sim.observers.append(observe)
    assert sim.run_until(lambda: not s.job("web").rollout_active
                         and len(s.discovery("web")) == 12, 900)
    assert worst[0] == 1


def test_max_unavailable_caps_a_controller_that_acks_everything():
    class Yes:
        def process(self, req):
            return TaskControlResponse(tuple(op.op_id for op in req.request))

    sim = world(machines=24)
    s = sim.scheduler
    spec = job_spec("web", 10, update=UpdatePolicy(max_unavailable=2))
    s.create_job(spec, 0, controller=Yes())
    assert sim.run_until(lambda: len(s.discovery("web")) == 10, 60)
    worst = [0]
    sim.observers.append(lambda sm: worst.__setitem__(
        0, max(worst[0], out_of_discovery(sm, "web", 10))))
    s.update_job(spec.model_copy(update={"args": ("--v2",)}), sim.now)
    assert sim.run_until(lambda: not s.job("web").rollout_active, 600)
    assert worst[0] == 2


def test_the_halt_counts_tasks_and_a_resize_does_not_lift_it():
    sim = world(machines=24)
    s = sim.scheduler
    spec = job_spec("web", 8, update=UpdatePolicy(max_unavailable=2, halt_after_failures=3,
                                                  min_ready_seconds=5))
    s.create_job(spec, 0)
    assert sim.run_until(lambda: len(s.discovery("web")) == 8, 60)
    s.update_job(spec.model_copy(update={"command": "crash"}), sim.now)
    job = s.job("web")
    # at most 2 tasks are down at once, so the halt comes at 2 failed tasks (not 3)
    assert sim.run_until(lambda: job.halted is not None, 300)
    sim.run(120)  # the two tasks crash again and again: still two failed tasks
    assert job.rollout_failures == 2 and job.halted.startswith("2 tasks")
    s.resize("web", 9, sim.now)
    sim.run(30)
    assert job.halted is not None  # only resume or rollback lift a halt


def test_move_wins_when_a_controller_acks_both_maintenance_offers():
    class Both:
        def process(self, req):
            stops = [o.op_id for o in req.request if o.kind is OpKind.STOP]
            moves = [o.op_id for o in req.request if o.kind is OpKind.MOVE]
            return TaskControlResponse(tuple(stops + moves))

    fleet = Fleet.from_machines([machine("a", msb="1"), machine("b", msb="2")])
    sim = world(fleet=fleet)
    s = sim.scheduler
    s.create_job(job_spec("db", 1, cpu=8), 0, controller=Both())
    assert sim.run_until(lambda: len(s.discovery("db")) == 1, 60)
    (_, where), = s.discovery("db")
    sim.maintenance([where], sim.now + 60, sim.now + 120)
    assert sim.run_until(lambda: s.discovery("db") and s.discovery("db")[0][1] != where, 60)


def test_deadline_stops_ignore_an_empty_bucket_and_are_counted():
    fleet = Fleet.from_machines([machine("a", msb="1")])
    sim = world(fleet=fleet, config=SchedulerConfig(rate=0.001, burst=1))
    s = sim.scheduler
    s.create_job(job_spec("db", 2, cpu=4), 0, controller=OneAtATime())
    assert sim.run_until(lambda: len(s.discovery("db")) == 2, 60)
    s.bucket.tokens = 0  # nothing left for destructive operations
    sim.maintenance(["a"], sim.now + 10, sim.now + 40)
    sim.run(15)
    assert s.discovery("db") == [] and s.counters["deadline_stops"] == 2


def test_leader_last_moves_a_lost_leader_at_once():
    sim = world(machines=12)
    s = sim.scheduler
    s.create_job(job_spec("zk", 3, cpu=8), 0, controller=LeaderLast(lambda: 0))
    assert sim.run_until(lambda: len(s.discovery("zk")) == 3, 60)
    leader_machine = dict(s.discovery("zk"))[0]
    sim.fail([leader_machine])
    start = sim.now
    assert sim.run_until(lambda: 0 in dict(s.discovery("zk")), 60)
    assert sim.now - start < 30 and s.counters["failure_deadline_moves"] == 0
