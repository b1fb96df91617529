"""Skipping idle jobs never changes what the scheduler does, and every change to a
job's records is reported in ``changed_jobs`` (what the persisting shell writes).

Seeded random workloads (creates, updates, resizes, restarts, deletes, failures and
repairs, maintenance, cordons, quota changes, resumes) run twice, with the skip on
(the dirty set, and settled jobs told apart by ``settled.no_op``) and off (every job's
stages run on every pass), and the job records are compared after every step.
"""

from __future__ import annotations

import random

import pytest

from plait.model import Entitlement, Quota
from plait.scheduler import SchedulerConfig, settled
from plait.sim.agents import Behaviour
from plait.sim.scenarios import job_spec, world


def _behaviour(a):
    return Behaviour(crash=a.spec.command == "crash", start_seconds=2, stop_seconds=1)


def _record(job, sched):
    tasks = tuple(
        (i, r.spec_version, r.state.value, r.machine,
         r.machine is not None and job.ref(i) in sched.desired.get(r.machine, {}),
         r.serving, r.healthy, None if r.op is None else r.op.op_id, r.restart, r.parked,
         r.lost_since)
        for i, r in sorted(job.tasks.items()))
    return (len(job.versions), job.target, job.deleting, job.halted, job.rollout_active,
            job.rollout_failures, tuple(sorted(job.failed_tasks)), job.op_counter, tasks)


def _run(seed: int, skip: bool, steps: int = 250):
    rng = random.Random(seed)
    # the skip turned off: every pass is a full pass
    sim = world(machines=24, behaviour=_behaviour,
                config=SchedulerConfig(failure_deadline=20, recheck_interval=10,
                                       full_pass_every=0 if skip else 1,
                                       full_pass_interval=0))
    sched = sim.scheduler
    sched.changed_jobs = set()
    saved: dict[str, object] = {}
    names: list[str] = []
    failures: list[str] = []
    trace, unreported = [], []
    for step in range(steps):
        r, now = rng.random(), sim.now
        live = [n for n in names if n in sched.jobs and not sched.jobs[n].deleting]
        try:
            if r < 0.05 and len(names) < 8:
                names.append(f"j{len(names)}")
                sched.create_job(job_spec(
                    names[-1], rng.choice([1, 3, 6, 40]), cpu=rng.choice([1, 8]),
                    command=rng.choice(["serve", "serve", "crash"]),
                    update={"max_unavailable": rng.choice([1, 2]),
                            "min_ready_seconds": rng.choice([0, 5])}), now)
            elif r < 0.09 and live:
                spec = sched.jobs[rng.choice(live)].spec
                sched.update_job(spec.model_copy(update={
                    "args": (str(rng.random()),),
                    "command": rng.choice(["serve", "crash", "serve"])}), now)
            elif r < 0.12 and live:
                sched.resize(rng.choice(live), rng.choice([0, 2, 5, 30]), now)
            elif r < 0.14 and live:
                sched.restart(rng.choice(live), now)
            elif r < 0.15 and live:
                sched.delete_job(rng.choice(live), now)
            elif r < 0.17:
                failures.append(sim.fail([sim.fleet.name(rng.randrange(len(sim.fleet)))]))
            elif r < 0.20 and failures:
                sim.repair(failures.pop(rng.randrange(len(failures))))
            elif r < 0.22:
                machines = sorted({sim.fleet.name(rng.randrange(len(sim.fleet)))
                                   for _ in range(2)})
                start = now + rng.choice([0, 5, 20])
                sim.maintenance(machines, start, start + rng.choice([5, 30]))
            elif r < 0.25:
                sim.region.set_cordon(rng.randrange(len(sim.fleet)), rng.random() < 0.6)
            elif r < 0.26:
                sim.allocator.define(Entitlement(name="ent", owner="owner", quota=Quota(
                    machines=rng.choice([6, 12, 24]))))
            elif r < 0.27 and live:
                n = rng.choice(live)
                if sched.jobs[n].halted:
                    sched.resume(n, now)
        except Exception as exc:  # the same refusal happens in both runs
            trace.append((step, type(exc).__name__, str(exc)))
        sim.step()
        changed, sched.changed_jobs = sched.changed_jobs, set()
        for n, job in sched.jobs.items():
            now_record = _record(job, sched)
            if n in changed:
                saved[n] = now_record
            elif saved.get(n) != now_record:
                unreported.append((step, n))
                saved[n] = now_record
        trace.append((step, {n: _record(j, sched) for n, j in sorted(sched.jobs.items())}))
    return trace, unreported


@pytest.mark.parametrize("seed", range(6))
def test_skipping_idle_jobs_changes_nothing_and_every_change_is_reported(seed, monkeypatch):
    with_skip, unreported = _run(seed, skip=True)
    # without the skip, and without telling settled jobs apart: every job's four
    # stages run on every pass
    monkeypatch.setattr(settled, "no_op", lambda job, notice: False)
    without_skip, _ = _run(seed, skip=False)
    assert unreported == []
    for a, b in zip(with_skip, without_skip, strict=True):
        assert a == b, f"seed {seed}: the runs part at step {a[0]}"
