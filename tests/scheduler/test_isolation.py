"""A job whose reconcile fails does not stall the others."""

from plait.sim.scenarios import job_spec, world


def test_a_failing_job_is_reported_and_the_others_go_on():
    sim = world(machines=24)
    s = sim.scheduler
    real = s.allocator.allocate

    def allocate(request):
        if request.job == "bad":
            raise OverflowError("units out of range")
        return real(request)

    s.allocator.allocate = allocate
    s.create_job(job_spec("bad", 2), sim.now)
    s.create_job(job_spec("good", 3), sim.now)
    sim.run(20)
    assert len(s.discovery("good")) == 3
    assert s.job("bad").error == "OverflowError: units out of range"
    failed = [e for e in s.events if e.kind == "reconcile_failed"]
    assert len(failed) == 1 and failed[0].job == "bad"  # reported once, not every tick
    assert s.counters["reconcile_errors"] >= 10
    s.allocator.allocate = real  # fixed: it recovers
    sim.run(20)
    assert len(s.discovery("bad")) == 2 and s.job("bad").error is None
