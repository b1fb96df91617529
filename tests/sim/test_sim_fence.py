"""At most one copy (``JobSpec.fence``) on the simulated clock: the scheduler's
replacement delay and the simulated agent's self-fencing, by the same pure rule as
the real ones (``plait.model.fence``)."""

from plait.model.fence import FENCE_KILL_GRACE, FENCE_MARGIN
from plait.scheduler import Phase
from plait.sim import Behaviour
from plait.sim.scenarios import job_spec, world
from plait.taskcontrol import TaskControlResponse

FENCE = 10.0


def live_copies(sim, ref):
    """Machines where a process of the task is alive: starting, running or still
    being stopped (a copy that winds down still answers)."""
    return [a.machine for a in sim.agents.values() if a.up and (p := a.processes.get(ref))
            is not None and p.final is None and p.backoff_until is None
            and p.phase in (Phase.STARTING, Phase.RUNNING)]


def fenced_world(fence=FENCE, tasks=1):
    sim = world(machines=6, behaviour=lambda a: Behaviour(start_seconds=1, stop_seconds=5))
    s = sim.scheduler
    fields = {} if fence is None else {"fence": {"seconds": fence}}
    s.create_job(job_spec("zk", tasks, cpu=16, **fields), 0)
    assert sim.run_until(lambda: len(s.discovery("zk")) == tasks, 60)
    return sim, s


def moved(sim, s, ref, where):
    """The task serves from another machine."""
    return any(i == ref.index and m != where for i, m in s.discovery(ref.job))


def watch(sim, ref):
    """Every step: the machines with a live copy, by time."""
    seen = []
    sim.observers.append(lambda sim: seen.append((sim.now, live_copies(sim, ref))))
    return seen


def test_a_cut_off_machine_stops_its_task_and_it_moves_only_after_the_fence():
    sim, s = fenced_world()
    ref = s.job("zk").ref(0)
    where = s.discovery("zk")[0][1]
    seen = watch(sim, ref)
    cut = sim.now
    event = sim.cut_off([where])
    sim.step()
    # lost: out of its machine's desired set at once (an agent that hears the control
    # plane again stops it), while it waits for the fence to move
    m = sim.fleet.index_of(where)
    assert ref.index in s.job("zk").lost
    assert [a.index for a in s.desired_of(m)] == []
    assert sim.run_until(lambda: moved(sim, s, ref, where), 120)
    assert all(len(copies) <= 1 for _, copies in seen), seen  # never two at once
    # the copy on the cut machine ran until its lease ran out, then stopped by itself
    there = [t for t, copies in seen if copies == [where]]
    assert there and cut + FENCE - 1 <= max(there) < cut + FENCE + FENCE_KILL_GRACE
    # the replacement started only after the fence, its grace and the margin
    elsewhere = [t for t, copies in seen if copies and copies != [where]]
    assert min(elsewhere) >= cut + FENCE + FENCE_KILL_GRACE + FENCE_MARGIN
    assert "fenced" in [e for e in s.events if e.kind == "task_lost"][-1].message
    sim.repair(event)
    sim.run(20)
    assert len(live_copies(sim, ref)) == 1  # the machine back: still one copy


def test_without_a_fence_the_copies_overlap_as_documented():
    # what the fence is for: a cut-off machine's copy runs on beside its replacement
    sim, s = fenced_world(fence=None)
    ref = s.job("zk").ref(0)
    seen = watch(sim, ref)
    where = s.discovery("zk")[0][1]
    sim.cut_off([where])
    assert sim.run_until(lambda: moved(sim, s, ref, where), 60)
    assert any(len(copies) == 2 for _, copies in seen)


def test_back_before_the_deadline_the_task_starts_again_where_it_was():
    sim, s = fenced_world()
    ref = s.job("zk").ref(0)
    where = s.discovery("zk")[0][1]
    seen = watch(sim, ref)
    event = sim.cut_off([where])
    sim.run(FENCE + 1)  # stopped by its fence, not replaced yet
    assert live_copies(sim, ref) == []
    sim.repair(event)
    assert sim.run_until(lambda: live_copies(sim, ref) == [where], 30)
    sim.run(FENCE + 5)
    assert all(len(copies) <= 1 for _, copies in seen)
    assert [m for _, m in s.discovery("zk")] == [where]


def test_a_controller_that_acks_at_once_still_waits_for_the_fence():
    class AlwaysAck:
        def process(self, request):
            return TaskControlResponse(tuple(op.op_id for op in request.request))

    sim = world(machines=6, behaviour=lambda a: Behaviour(start_seconds=1, stop_seconds=5))
    s = sim.scheduler
    s.create_job(job_spec("zk", 3, cpu=16, fence={"seconds": FENCE}), 0,
                 controller=AlwaysAck())
    assert sim.run_until(lambda: len(s.discovery("zk")) == 3, 60)
    job = s.job("zk")
    index, where = s.discovery("zk")[0]
    ref = job.ref(index)
    seen = watch(sim, ref)
    cut = sim.now
    sim.cut_off([where])
    assert sim.run_until(lambda: moved(sim, s, ref, where), 120)
    assert all(len(copies) <= 1 for _, copies in seen), seen
    elsewhere = [t for t, copies in seen if copies and copies != [where]]
    assert min(elsewhere) >= cut + FENCE + FENCE_KILL_GRACE + FENCE_MARGIN
