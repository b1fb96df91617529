"""Elastic loans in the simulator: an elastic entitlement borrows the machines a
lender does not use, and gives them back when the lender needs them, on its terms
(notice, reclaim rate), with every machine back by its deadline, no task running
twice, no task starting on another entitlement's host profile, and every job within
its max_unavailable.
"""

import test_sim_profiles as profiles
from hypothesis import given, settings
from hypothesis import strategies as st

from plait.allocator.loans import count
from plait.model import ElasticTerms, Entitlement, Quota, UpdatePolicy
from plait.model.hostprofile import HostProfile, HostProfileSpec
from plait.scheduler import SchedulerConfig
from plait.sim.scenarios import job_spec, world
from plait.taskcontrol.protocol import NoticeKind, TaskControlResponse

PROFILES = {"web": HostProfileSpec(name="web", turbo=True),
            "batch": HostProfileSpec(name="batch", sysctls={"vm.swappiness": "1"})}


class Holdout:
    """A TaskController that acks nothing and keeps the advance notices it hears."""

    def __init__(self):
        self.notices = []

    def process(self, request):
        self.notices.extend(request.advance_notices)
        return TaskControlResponse()


def build(machines, terms, web_quota=None, config=None):
    sim = world(machines=machines, entitlements=(), config=config or SchedulerConfig(
        failure_deadline=60))
    for spec in PROFILES.values():
        sim.scheduler.define_profile(HostProfile(spec=spec, version=1))
    sim.allocator.define(Entitlement(name="web", owner="o", lends=True, host_profile="web",
                                     quota=Quota(machines=web_quota or machines)))
    sim.allocator.define(Entitlement(name="batch", owner="o", host_profile="batch",
                                     quota=Quota(machines=machines), elastic=terms))
    for m in range(machines):
        sim.agent(m).guard = False  # the scheduler's gate alone
    return sim


def watch_starts(sim):
    """Planned operations keep to max_unavailable (a move forced at a revoke's deadline
    is not planned: the loan's terms said when the machine goes back, as a maintenance
    deadline does)."""
    profiles.watch_starts(sim, forced=lambda op: "/drain-" in op.op_id)


def no_task_twice(sim):
    for job in sim.scheduler.jobs.values():
        for index in job.tasks:
            ref = job.ref(index)
            assert len(sim.running_copies(ref)) <= 1, ref


def no_mismatched_start(sim):
    assert sum(a.mismatched_starts for a in sim.agents.values()) == 0


def serving(sim, name):
    return len(sim.scheduler.discovery(name))


def held(sim, ent):
    return len(sim.region.machines_of(ent))


def test_a_revoke_gives_notice_and_the_machine_is_back_by_its_deadline():
    """A lender that needs its machines while the free pool is empty takes them back:
    the borrower's controller (which acks nothing) hears a ``loan_revoke`` notice
    ``min_notice_seconds`` ahead, its tasks run until the deadline, and each machine
    is back in the free pool by then plus the grace, then joins the lender with the
    lender's profile."""
    sim = build(16, ElasticTerms(min_notice_seconds=90, max_reclaim_fraction_per_minute=1.0))
    s = sim.scheduler
    holdout = Holdout()
    s.create_job(job_spec("w", 2, "web", cpu=8), 0)
    s.create_job(job_spec("b", 40, "batch", cpu=8), 0, controller=holdout)
    sim.observers += [no_task_twice, no_mismatched_start]
    assert sim.run_until(lambda: serving(sim, "b") == 30 and serving(sim, "w") == 2, 600)
    assert held(sim, "batch") == 15 and len(sim.region.free_machines()) == 0
    s.loan_events.clear()
    holdout.notices.clear()

    s.resize("w", 14, sim.now)  # 7 machines: 6 come back from the borrower
    asked = sim.now
    assert sim.run_until(lambda: serving(sim, "w") == 14, 900)
    revoked = [e for e in s.loan_events if e.kind == "loan_revoked"]
    returned = [e for e in s.loan_events if e.kind == "loan_returned"]
    assert len(revoked) == 6 and {e.machine for e in returned} == {e.machine for e in revoked}
    for e in revoked:
        assert e.deadline == e.at + 90
    deadline = {e.machine: e.deadline for e in revoked}
    for e in returned:  # nothing acked: back at the deadline, not before, and on time
        assert deadline[e.machine] <= e.at <= deadline[e.machine] + s.config.loan_return_grace
        assert e.late == 0
    assert s.counters["loan_revokes_late"] == 0
    notices = [n for n in holdout.notices if n.kind is NoticeKind.LOAN_REVOKE]
    assert {m for n in notices for m in n.machines} == {
        sim.fleet.name(e.machine) for e in revoked}
    assert all(n.deadline - asked >= 90 for n in notices)
    # the machines came back with the lender's profile
    web = s.profiles.target("web")
    for rec in s.jobs["w"].tasks.values():
        assert sim.agents[rec.machine].profile == (web.name, web.version)
    assert held(sim, "batch") == 9 and not s.revokes


def test_reclaims_keep_to_the_borrowers_rate():
    """``max_reclaim_fraction_per_minute``: 0.1 of at most 24 loaned machines is 2
    revokes in any minute, however many the lender needs at once."""
    sim = build(24, ElasticTerms(min_notice_seconds=30, max_reclaim_fraction_per_minute=0.1),
                web_quota=24)
    s = sim.scheduler
    s.create_job(job_spec("w", 4, "web", cpu=8), 0)
    s.create_job(job_spec("b", 40, "batch", cpu=8), 0)
    assert sim.run_until(lambda: serving(sim, "b") == 40 and serving(sim, "w") == 4, 600)
    assert held(sim, "batch") >= 20
    s.resize("w", 40, sim.now)  # 20 machines: the borrower keeps at most the other 4
    assert sim.run_until(lambda: serving(sim, "w") == 40, 2 * 3600)
    times = sorted(e.at for e in s.loan_events if e.kind == "loan_revoked")
    assert len(times) >= 16
    for k, t in enumerate(times):
        in_window = [u for u in times[k:] if u < t + 60]
        assert len(in_window) <= 2, (t, in_window)
    assert s.counters["loan_revokes_late"] == 0
    assert held(sim, "web") == 20 and held(sim, "batch") <= 4


def test_loan_revoke_under_load_returns_every_machine_by_its_deadline():
    """100 machines, most on loan to two busy borrower jobs (one with built-in pacing,
    one whose controller acks nothing); the lender's load jumps to 80 machines at
    once. Every revoked machine is back by its deadline, no task runs twice or
    starts on another entitlement's profile, and every job keeps to its
    max_unavailable."""
    sim = build(100, ElasticTerms(min_notice_seconds=120,
                                  max_reclaim_fraction_per_minute=0.25))
    s = sim.scheduler
    watch_starts(sim)
    sim.observers += [no_task_twice, no_mismatched_start]
    s.create_job(job_spec("w", 20, "web", cpu=8,
                          update=UpdatePolicy(max_unavailable=2)), 0)
    s.create_job(job_spec("b1", 90, "batch", cpu=8,
                          update=UpdatePolicy(max_unavailable=10)), 0)
    s.create_job(job_spec("b2", 90, "batch", cpu=8), 0, controller=Holdout())
    assert sim.run_until(lambda: serving(sim, "w") == 20 and
                         serving(sim, "b1") + serving(sim, "b2") == 180, 900)
    assert held(sim, "batch") == 90
    s.resize("w", 160, sim.now)
    assert sim.run_until(lambda: serving(sim, "w") == 160 and not s.revokes, 4 * 3600)
    returned = [e for e in s.loan_events if e.kind == "loan_returned" and e.reason != "idle"]
    assert len(returned) >= 70
    assert all(e.late == 0 for e in returned)
    assert s.counters["loan_revokes_late"] == 0
    assert held(sim, "web") == 80 and held(sim, "batch") == 20
    alloc = sim.allocator
    assert count(alloc.index, alloc.entitlements, alloc.loans).room >= 0


actions = st.lists(st.one_of(
    st.tuples(st.just("web"), st.integers(0, 36)),
    st.tuples(st.just("batch"), st.integers(0, 40)),
    st.tuples(st.just("update"), st.sampled_from(["w", "b"])),
    st.tuples(st.just("fail"), st.integers(0, 19)),
    st.tuples(st.just("repair")),
    st.tuples(st.just("wait"), st.integers(1, 200)),
), min_size=1, max_size=10)


@settings(max_examples=30, deadline=None)
@given(actions=actions, notice=st.sampled_from([0.0, 20.0, 90.0]),
       fraction=st.sampled_from([0.05, 0.3, 1.0]))
def test_random_joins_leaves_loans_and_revokes(actions, notice, fraction):
    """Random growth and shrinking of a lender and an elastic borrower, updates and
    machine failures: no task starts on a mismatched profile, none runs twice, no
    planned operation starts with its job at its max_unavailable, and once things
    settle, every task runs and no more machines are on loan than the lender spares."""
    sim = build(20, ElasticTerms(min_notice_seconds=notice,
                                 max_reclaim_fraction_per_minute=fraction))
    s = sim.scheduler
    watch_starts(sim)
    sim.observers += [no_task_twice, no_mismatched_start]
    # the borrower takes what the lender leaves; the lender's growth takes it back
    specs = {"w": job_spec("w", 4, "web", cpu=8, update=UpdatePolicy(max_unavailable=1)),
             "b": job_spec("b", 34, "batch", cpu=8, update=UpdatePolicy(max_unavailable=3))}
    for spec in specs.values():
        s.create_job(spec, 0)
    sim.run(60)
    failures: list[str] = []
    version = 1
    for action in actions:
        kind = action[0]
        if kind in ("web", "batch"):
            name = kind[0]
            specs[name] = specs[name].model_copy(update={"task_count": action[1]})
            s.update_job(specs[name], sim.now)
        elif kind == "update":
            version += 1
            specs[action[1]] = specs[action[1]].model_copy(update={"args": (f"v{version}",)})
            s.update_job(specs[action[1]], sim.now)
        elif kind == "fail":
            failures.append(sim.fail([sim.fleet.name(action[1])]))
        elif kind == "repair" and failures:
            sim.repair(failures.pop(0))
        sim.run(action[1] if kind == "wait" else 15)
    for event_id in failures:
        sim.repair(event_id)
    alloc = sim.allocator
    # the lender's tasks all run; the borrower runs what the loans allow
    assert sim.run_until(lambda: serving(sim, "w") == specs["w"].task_count
                         and not s.revokes
                         and count(alloc.index, alloc.entitlements, alloc.loans).room >= 0,
                         4 * 3600)
    # the borrower runs every task, or is held back by the loans (none left to lend,
    # or no free machine: a lender holds its unused quota's machines)
    assert sim.run_until(lambda: serving(sim, "b") == specs["b"].task_count
                         or count(alloc.index, alloc.entitlements, alloc.loans).room <= 0
                         or not len(sim.region.free_machines()), 3600)
    no_mismatched_start(sim)



def test_a_lender_short_of_machines_takes_its_loans_back_when_quotas_exceed_the_region():
    """Quotas are promises, not machines: another entitlement holds six of the eight
    machines, so the lender's unused quota (6) stands for machines it cannot have,
    and the pooled count (lendable 6 - short, on loan 2) owed nothing back while the
    lender's tasks waited with its machines lent out. Its waiting tasks revoke every
    loan, on the borrower's terms (the notice), and it runs on what comes back."""
    sim = build(8, ElasticTerms(min_notice_seconds=30, max_reclaim_fraction_per_minute=1.0),
                web_quota=6)
    s = sim.scheduler
    sim.allocator.define(Entitlement(name="plain", owner="o", quota=Quota(machines=8)))
    s.create_job(job_spec("p", 6, "plain", cpu=16), 0)
    assert sim.run_until(lambda: serving(sim, "p") == 6, 600)
    s.create_job(job_spec("b", 40, "batch", cpu=8), 0)
    assert sim.run_until(lambda: held(sim, "batch") == 2, 600)
    sim.observers += [no_task_twice, no_mismatched_start]
    s.loan_events.clear()
    s.create_job(job_spec("w", 10, "web", cpu=8), sim.now)
    assert sim.run_until(lambda: serving(sim, "w") == 4 and held(sim, "batch") == 0, 900), (
        serving(sim, "w"), held(sim, "batch"), sim.allocator.loans.short)
    revoked = [e for e in s.loan_events if e.kind == "loan_revoked"]
    returned = [e for e in s.loan_events if e.kind == "loan_returned"]
    assert len(revoked) + sum(1 for e in returned if e.reason == "idle") == 2
    assert all(e.deadline == e.at + 30 for e in revoked)
    assert s.counters["loan_revokes_late"] == 0
    # the rest waits for room, said once; nothing more is owed
    assert s.job("w").unplaced_reason is not None
    sim.run(300)
    assert held(sim, "batch") == 0 and serving(sim, "w") == 4
