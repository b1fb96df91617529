"""Paper section 5.1, Figure 14, in small: a rolling update of a sharded service paced
by Shard Manager's TaskController on the real scheduler, with one MSB failing in the
middle of it. No shard ever has two replicas down except those the failure explains
(one replica on a failed machine, the other's update acked before the failure
began); while the MSB is down no task sharing a shard with it is updated; after the
repair the rollout completes."""

from plait.model import Fleet, UpdatePolicy
from plait.scheduler import SchedulerConfig
from plait.shardmanager.batch import safe_batch
from plait.shardmanager.controller import ShardController, ShardView
from plait.shardmanager.layout import TaskPlace, assign
from plait.sim.agents import Behaviour
from plait.sim.scenarios import job_spec, world
from plait.testing import machine

JOB = "cache"
MSBS, PER_MSB, PER_RACK = 6, 10, 5
REPLICATION = 3
SHARDS = [f"shard{i:03d}" for i in range(240)]
#: a task takes 20 s to start: an update batch is in flight long enough to fail an MSB
#: under it
SLOW = Behaviour(start_seconds=20.0)


def domains(k):
    """Machine k's fault domains: (msb, rack, machine)."""
    return (f"msb{k // PER_MSB}", f"rack{k // PER_RACK}", f"m{k}")


class Recorder:
    """The job's controller: Shard Manager's, with the time of every ack kept."""

    def __init__(self, inner, clock):
        self.inner = inner
        self.clock = clock
        #: task -> when its last op was acked
        self.acked_at = {}

    def process(self, request):
        response = self.inner.process(request)
        by_id = {op.op_id: op.task.index for op in request.request}
        for op_id in response.ack:
            self.acked_at[by_id[op_id]] = self.clock()
        return response


def test_an_msb_failing_during_a_shard_aware_update_takes_no_second_replica_down():
    fleet = Fleet.from_machines([machine(f"m{k}", msb=domains(k)[0], rack=domains(k)[1])
                                 for k in range(MSBS * PER_MSB)])
    sim = world(fleet=fleet, behaviour=lambda assignment: SLOW,
                config=SchedulerConfig(rate=1000, burst=1000))
    s = sim.scheduler
    spec = job_spec(JOB, MSBS * PER_MSB, cpu=16, update=UpdatePolicy(max_unavailable=None))

    layout = None

    def serving():
        job = s.job(JOB)
        return {i for i, _ in s.discovery(JOB) if job.tasks[i].healthy}

    def view():
        if layout is None:
            return ShardView({}, REPLICATION)
        up = serving()
        return ShardView({shard: tuple(t for t in tasks if t in up)
                          for shard, tasks in layout.replicas.items()}, REPLICATION)

    ctl = Recorder(ShardController(view), lambda: sim.now)
    s.create_job(spec, 0, controller=ctl)
    assert sim.run_until(lambda: len(serving()) == MSBS * PER_MSB, 300)
    job = s.job(JOB)

    # the shard map, from where the tasks landed (one per machine)
    where = dict(s.discovery(JOB))
    places = [TaskPlace(i, domains(fleet.index_of(m))) for i, m in sorted(where.items())]
    layout = assign(SHARDS, REPLICATION, places)
    msb_of = {i: domains(fleet.index_of(m))[0] for i, m in where.items()}
    for tasks in layout.replicas.values():
        assert len({msb_of[t] for t in tasks}) == REPLICATION

    failure = {"machines": set(), "tasks": set(), "start": None}
    worst = {"explained": 0}
    log = []

    def observe(sm):
        if layout is None:
            return
        down = set(range(MSBS * PER_MSB)) - serving()
        two_down = 0
        for shard, tasks in layout.replicas.items():
            gone = set(tasks) & down
            if len(gone) < 2:
                continue
            two_down += 1
            # explained only by the failure: exactly two down, one of them on a failed
            # machine, the other acked before the failure began
            assert len(gone) == 2, (sm.now, shard, gone)
            failed = gone & failure["tasks"]
            assert len(failed) == 1, (sm.now, shard, gone)
            (other,) = gone - failed
            assert failure["start"] is not None
            assert ctl.acked_at.get(other, float("inf")) < failure["start"], (
                sm.now, shard, gone, ctl.acked_at.get(other))
        worst["explained"] = max(worst["explained"], two_down)
        log.append((sm.now, len(down), two_down))

    sim.observers.append(observe)
    started = sim.now
    s.update_job(spec.model_copy(update={"args": ("--v2",)}), sim.now)
    assert sim.run_until(lambda: ctl.acked_at, 30)
    first = {t for t, at in ctl.acked_at.items() if at >= started}
    # the first batch is about a whole replica group (one third of the tasks)
    assert len(first) >= 0.9 * (MSBS * PER_MSB // REPLICATION)
    assert len(first) == len(safe_batch(range(MSBS * PER_MSB), layout.replicas, set()))

    # mid-rollout, an MSB with no task of the first batch fails
    sim.run(5)
    assert job.rollout_active and not set(serving()) >= first
    victim = next(m for m in sorted(set(msb_of.values()))
                  if not any(msb_of[t] == m for t in first))
    failed_tasks = {t for t, m in msb_of.items() if m == victim}
    failure.update(machines={where[t] for t in failed_tasks}, tasks=failed_tasks,
                   start=sim.now)
    event = sim.fail(sorted(failure["machines"]))

    # the first batch comes back; shards sharing a replica with the failed MSB stay
    # one down: none of their other tasks is updated while it is down
    sim.run(120)
    assert worst["explained"] > 0  # the failure did take second replicas (Figure 14b)
    assert log[-1][2] == 0  # ...until the first batch came back
    exposed = {t for tasks in layout.replicas.values() if set(tasks) & failed_tasks
               for t in tasks} - failed_tasks
    acked_during = {t for t, at in ctl.acked_at.items() if at >= failure["start"]}
    assert not acked_during & exposed
    assert acked_during - failed_tasks  # ...yet the rollout went on elsewhere
    assert job.rollout_active
    assert any(job.tasks[t].spec_version == 1 for t in exposed)

    sim.repair(event)
    assert sim.run_until(lambda: not job.rollout_active, 600)
    assert all(rec.spec_version == 2 for rec in job.tasks.values())
    assert sim.run_until(lambda: len(serving()) == MSBS * PER_MSB, 120)
    assert log[-1][2] == 0
