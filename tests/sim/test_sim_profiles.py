"""Host profiles in the simulator: machines join and leave entitlements with their
own profiles as jobs grow, shrink, update and lose machines, and some switches fail.

Profiles get new versions too, rolled over their entitlements' busy machines. The
simulated agents' own guard is off, so what is tested is the scheduler's gate:
at every simulated second no task has started on a machine whose profile differed
from its entitlement's, and no planned operation started with its job at its
max_unavailable; once the failures end, every job runs at full strength on machines
carrying its entitlement's profile.
"""

from hypothesis import example, given, settings
from hypothesis import strategies as st

from plait.model import Entitlement, Quota, UpdatePolicy
from plait.model.hostprofile import HostProfile, HostProfileSpec
from plait.scheduler import SchedulerConfig
from plait.sidekick.book import ProfileBook
from plait.sim.scenarios import job_spec, world

PROFILES = {"web": HostProfileSpec(name="web", sysctls={"net.core.somaxconn": "4096"},
                                   turbo=True),
            "batch": HostProfileSpec(name="batch", hugepages_2m=512)}
# job -> (entitlement, max_unavailable); entitlement -> profile
JOBS = {"a": ("web", 1), "b": ("batch", 2), "c": ("plain", 1)}
ENTS = {"web": "web", "batch": "batch", "plain": "default"}
MACHINES = 30

actions = st.lists(st.one_of(
    st.tuples(st.just("update"), st.sampled_from(sorted(JOBS))),
    st.tuples(st.just("resize"), st.sampled_from(sorted(JOBS)), st.integers(0, 8)),
    st.tuples(st.just("fail"), st.integers(0, MACHINES - 1)),
    st.tuples(st.just("repair")),
    st.tuples(st.just("break"), st.integers(0, MACHINES - 1), st.sampled_from(sorted(PROFILES))),
    st.tuples(st.just("mend")),
    st.tuples(st.just("reprofile"), st.sampled_from(sorted(PROFILES))),
    st.tuples(st.just("wait"), st.integers(1, 60)),
), min_size=1, max_size=12)


def build():
    sim = world(machines=MACHINES, entitlements=(), config=SchedulerConfig(
        rate=2.0, burst=4.0, failure_deadline=60))
    s = sim.scheduler
    for spec in PROFILES.values():
        s.define_profile(HostProfile(spec=spec, version=1))
    for ent, profile in ENTS.items():
        sim.allocator.define(Entitlement(name=ent, owner="o", quota=Quota(machines=12),
                                         host_profile=profile))
    for m in range(MACHINES):
        sim.agent(m).guard = False  # the scheduler's gate alone
    return sim


def watch_starts(sim, forced=lambda op: False):
    """When a planned operation starts on an available task, its job is below its cap
    (``forced``: operations that are not planned, which the check leaves out)."""
    s = sim.scheduler
    original = s.start_ops

    def start(job, steps, now):
        for op, costly in steps:
            rec = job.tasks[op.task.index]
            count = job.spec.task_count
            if (not forced(op) and rec.state.value == "running" and rec.healthy and rec.serving
                    and rec.index < count and not job.deleting):
                cap = job.spec.update.resolve(count)
                assert cap is None or s.disrupted(job) < cap, f"{job.name}: at its cap"
            original(job, [(op, costly)], now)
    s.start_ops = start


def check(sim):
    assert sum(a.mismatched_starts for a in sim.agents.values()) == 0


def check_settled(sim):
    """Once settled (no roll left): every serving task runs on its entitlement's
    profile."""
    s = sim.scheduler
    for name, job in s.jobs.items():
        for rec in job.tasks.values():
            if rec.serving:  # serving where it runs, on its entitlement's profile
                agent = sim.agents[rec.machine]
                target = s.profile_target(rec.machine)
                assert target is not None
                assert agent.profile == (target.name, target.version), (name, rec.index)


@settings(max_examples=40, deadline=None)
@given(actions=actions)
# (a new version of a profile made its machines pending only at the next pass: an
# agent that asked for its tasks first started one placed there by an update)
@example(actions=[("reprofile", "web"), ("update", "a"), ("repair",), ("reprofile", "web")])
def test_no_task_starts_on_a_machine_without_its_entitlements_profile(actions):
    sim = build()
    s = sim.scheduler
    specs = {}
    for name, (ent, cap) in JOBS.items():
        specs[name] = job_spec(name, 4, entitlement=ent, cpu=4,
                               update=UpdatePolicy(max_unavailable=cap))
        s.create_job(specs[name], 0)
    sim.observers.append(check)
    watch_starts(sim)
    sim.run(300)  # batch's machines take 244 s to get their hugepages
    failures: list[str] = []
    broken: list[int] = []
    version = 1
    for action in actions:
        kind = action[0]
        if kind == "update":
            version += 1
            specs[action[1]] = specs[action[1]].model_copy(update={"args": (f"v{version}",)})
            s.update_job(specs[action[1]], sim.now)
        elif kind == "resize":
            specs[action[1]] = specs[action[1]].model_copy(update={"task_count": action[2]})
            s.update_job(specs[action[1]], sim.now)
        elif kind == "fail":
            failures.append(sim.fail([sim.fleet.name(action[1])]))
        elif kind == "repair" and failures:
            sim.repair(failures.pop(0))
        elif kind == "break":
            bad = action[2]
            sim.agent(action[1]).switch_error = (
                lambda p, bad=bad: "firmware refused" if p.name == bad else None)
            broken.append(action[1])
        elif kind == "mend" and broken:
            sim.agent(broken.pop(0)).switch_error = lambda p: None
        elif kind == "reprofile":  # a new version: rolled over its busy machines
            have = s.profiles.target(action[1])
            assert have is not None
            s.define_profile(HostProfile(spec=have.spec.model_copy(update={
                "description": f"v{have.version + 1}"}), version=have.version + 1))
        sim.run(action[1] if kind == "wait" else 10)
    for event_id in failures:
        sim.repair(event_id)
    for m in broken:
        sim.agent(m).switch_error = lambda p: None
    assert sim.run_until(lambda: all(
        len(s.discovery(n)) == specs[n].task_count
        and all(r.spec_version == s.job(n).target for r in s.job(n).tasks.values())
        for n in JOBS) and not s.stale and not s.rolling, 20_000)
    check(sim)
    check_settled(sim)


def test_a_failed_switch_takes_the_machine_out_and_it_comes_back_when_a_retry_succeeds():
    sim = build()
    s = sim.scheduler
    for m in range(MACHINES):
        sim.agent(m).switch_error = lambda p: "no turbo here" if p.name == "web" else None
    s.create_job(job_spec("a", 2, entitlement="web", cpu=4), 0)
    sim.run(5)
    failed = [t for t in s.profile_transitions if t.kind == "profile_switch_failed"]
    assert failed and all(t.reason == "no turbo here" and t.profile == "web" for t in failed)
    down = {sim.fleet.name(t.machine) for t in failed}
    assert all(sim.region.record(sim.fleet.index_of(m)).state.value == "failed" for m in down)
    assert not s.discovery("a")
    for m in range(MACHINES):
        sim.agent(m).switch_error = lambda p: None
    assert sim.run_until(lambda: len(s.discovery("a")) == 2, 5000)
    assert sum(a.mismatched_starts for a in sim.agents.values()) == 0
    on = {r.machine for r in s.job("a").tasks.values()}
    assert all(sim.agents[m].profile == ("web", 1) for m in on)


def test_a_profile_change_rolls_over_a_100_machine_entitlement_within_every_jobs_budget():
    """A new version of the profile of an entitlement whose 100 machines all run tasks:
    its busy machines are drained one at a time through the jobs' paced moves, each
    job stays within its max_unavailable, no task starts on the old profile after the
    change, and every machine it holds ends on the new version."""
    sim = world(machines=120, entitlements=(), config=SchedulerConfig(rate=20, burst=40))
    s = sim.scheduler
    web1 = HostProfile(spec=PROFILES["web"], version=1)
    s.define_profile(web1)
    sim.allocator.define(Entitlement(name="web", owner="o", quota=Quota(machines=100),
                                     host_profile="web"))
    for m in range(120):
        sim.agent(m).guard = False
    caps = {"a": 1, "b": 2, "c": "10%"}
    for name, cap in caps.items():  # one task of each job on every one of 100 machines
        s.create_job(job_spec(name, 100, entitlement="web", cpu=1,
                              update=UpdatePolicy(max_unavailable=cap),
                              policy={"requirements": {"max_tasks_per_machine": 1}}), 0)
    assert sim.run_until(lambda: all(len(s.discovery(n)) == 100 for n in caps), 2000)
    held = {int(m) for m in sim.region.machines_of("web")}
    assert len(held) == 100
    watch_starts(sim)
    web2 = HostProfile(spec=PROFILES["web"].model_copy(update={"turbo": False}), version=2)
    draining: list[int] = []
    starts_before = {m: a.switches for m, a in sim.agents.items()}

    def observe(sm):
        draining.append(sum(1 for _, ent in s.rolling.values() if ent == "web"))
        for job in s.jobs.values():  # planned operations aside, a job is never below
            down = s.unavailable(job)  # its strength by more than its cap
            cap = job.spec.update.resolve(job.spec.task_count)
            assert down <= cap, (job.name, down, cap)
        # a task that started after the change started on v2
        for m, agent in sm.agents.items():
            for p in agent.processes.values():
                if p.started_at > changed_at and not p.stopping:
                    assert agent.profile == ("web", 2), (m, agent.profile)
    changed_at = sim.now
    s.define_profile(web2)
    sim.observers.append(observe)
    sim.step()
    assert len(s.rolling) == 1 and len(s.stale["web"]) == 99  # every machine is busy
    assert sim.run_until(lambda: not s.stale and not s.rolling and all(
        len(s.discovery(n)) == 100 for n in caps), 20_000)
    assert max(draining) == 1  # machine by machine
    assert sum(1 for n in draining if n) > 50  # (and it took many passes)
    now_held = {int(m) for m in sim.region.machines_of("web")}
    assert now_held and all(sim.agents[m].profile == ("web", 2) for m in now_held)
    assert sum(a.mismatched_starts for a in sim.agents.values()) == 0
    assert sum(a.switches - starts_before[m] for m, a in sim.agents.items()) >= 100
    kinds = [t.kind for t in s.profile_transitions]
    assert kinds.count("profile_roll_started") == 1 and kinds.count("profile_roll_drained") >= 90


def test_figure_7_with_profiles_a_machine_entering_an_entitlement_gets_its_profile_first():
    """Figure 7 of the paper, with a host profile: the entitlement starts with no
    machine; job D brings one in, job E stacks a task there and brings another; when
    E stops, its machine goes back to the free pool. Every machine that enters carries
    the entitlement's profile before any task runs there, and one that leaves goes
    back to ``default``."""
    sim = world(machines=12, entitlements=())
    s = sim.scheduler
    s.define_profile(HostProfile(spec=PROFILES["web"], version=1))
    sim.allocator.define(Entitlement(name="e1", owner="o", quota=Quota(machines=3),
                                     host_profile="web"))
    for m in range(12):
        sim.agent(m).guard = False  # the scheduler's gate alone
    seen: list[tuple[float, int, tuple[str, int], int]] = []

    def observe(sm):
        for m, agent in sm.agents.items():
            if agent.processes:  # whatever runs there runs on web
                seen.append((sm.now, m, agent.profile, len(agent.processes)))
                assert agent.profile == ("web", 1), (sm.now, m, agent.profile)
    sim.observers.append(observe)
    assert len(sim.region.machines_of("e1")) == 0
    spec_d = job_spec("d", 1, entitlement="e1", cpu=8)
    s.create_job(spec_d, sim.now)
    assert sim.run_until(lambda: len(s.discovery("d")) == 1, 200)
    (m7,) = {int(m) for m in sim.region.machines_of("e1")}
    assert sim.agents[m7].switches == 1
    spec_e = job_spec("e", 2, entitlement="e1", cpu=8)
    s.create_job(spec_e, sim.now)
    assert sim.run_until(lambda: len(s.discovery("e")) == 2, 200)
    machines = {int(m) for m in sim.region.machines_of("e1")}
    assert m7 in machines and len(machines) == 2  # one of E's tasks stacked on M7
    (m8,) = machines - {m7}
    assert sim.agents[m8].switches == 1 and sim.agents[m8].profile == ("web", 1)
    s.delete_job("e", sim.now)
    assert sim.run_until(lambda: {int(m) for m in sim.region.machines_of("e1")} == {m7}, 200)
    # back in the free pool, M8 keeps web (decision 95): no switch until an entitlement
    # with another profile claims it
    sim.run(60)
    assert sim.agents[m8].profile == ("web", 1) and sim.agents[m8].switches == 1
    assert sim.agents[m7].profile == ("web", 1) and sum(
        a.mismatched_starts for a in sim.agents.values()) == 0
    assert {m for _, m, _, _ in seen} == {m7, m8}
    # a control plane that starts anew (a restart, a takeover) has heard from no agent
    # yet, and a free machine without a report is not taken to carry default: M8
    # keeps web all the same
    fresh = ProfileBook()
    fresh.define(HostProfile(spec=PROFILES["web"], version=1))
    s.profiles = fresh
    assert s.profile_hold(m8) and s.profile_wire(m8)["switch"] is False
    sim.wake(m8)  # its agent steps (and is told to hold) before it reports
    sim.step()
    sim.agents[m8].profile_changed = True  # (a real agent's every heartbeat tells it)
    sim.wake(m8)
    sim.run(60)
    assert sim.agents[m8].profile == ("web", 1) and sim.agents[m8].switches == 1
    assert fresh.heard(m8) and s.profile_hold(m8)
    # an entitlement on default claims M8 among the free machines: switched first
    sim.observers.remove(observe)  # (its tasks run on default)
    sim.allocator.define(Entitlement(name="e2", owner="o", quota=Quota(machines=12)))
    s.create_job(job_spec("f", 10, entitlement="e2", cpu=16), sim.now)
    assert sim.run_until(lambda: m8 in {int(m) for m in sim.region.machines_of("e2")}
                         and sim.agents[m8].profile == ("default", 1), 400)
    assert sim.agents[m8].switches == 2
    assert sum(a.mismatched_starts for a in sim.agents.values()) == 0


def test_a_profile_roll_with_no_spare_machine_in_the_region_completes():
    # the moved task waited (pending) for a machine, and its old machine, freed and
    # cordoned for the roll, waited for that task to leave it: both machines cordoned,
    # one task down for good
    sim = world(machines=2, entitlements=(), config=SchedulerConfig(rate=20, burst=40))
    s = sim.scheduler
    s.define_profile(HostProfile(spec=PROFILES["web"], version=1))
    sim.allocator.define(Entitlement(name="front", owner="o", quota=Quota(machines=2),
                                     host_profile="web"))
    for m in range(2):
        sim.agent(m).guard = False
    s.create_job(job_spec("front", 2, entitlement="front", cpu=1,
                          update=UpdatePolicy(max_unavailable=1),
                          policy={"requirements": {"max_tasks_per_machine": 1}}), 0)
    assert sim.run_until(lambda: len(s.discovery("front")) == 2, 600)
    s.define_profile(HostProfile(spec=PROFILES["web"].model_copy(update={"turbo": False}),
                                 version=2))
    sim.step()
    assert len(s.rolling) == 1  # (both machines busy: one drains at a time)
    assert sim.run_until(lambda: not s.stale and not s.rolling and len(
        s.discovery("front")) == 2, 3600), (
        {i: (r.state, r.machine) for i, r in s.job("front").tasks.items()}, s.rolling)
    assert all(sim.agents[m].profile == ("web", 2) for m in range(2)), (
        {m: sim.agents[m].profile for m in range(2)}, sim.region.machines_of("front"))
    assert not any(sim.region.record(m).cordoned for m in range(2))
    check(sim)


def test_a_new_profile_version_makes_its_machines_pending_at_once_but_no_roll_at_start():
    """A profile's new version makes its machines pending when it is defined (not at
    the next pass). A control plane that starts defines its stored profiles one by
    one after its entitlements: none of that is a roll."""
    sim = world(machines=MACHINES, entitlements=())
    s = sim.scheduler
    for ent, profile in ENTS.items():  # (as a restart: entitlements first)
        sim.allocator.define(Entitlement(name=ent, owner="o", quota=Quota(machines=12),
                                         host_profile=profile))
    for spec in PROFILES.values():
        s.define_profile(HostProfile(spec=spec, version=1))
    s.create_job(job_spec("a", 4, entitlement="web", cpu=4), 0)
    sim.run(300)
    assert len(s.discovery("a")) == 4
    assert [t.kind for t in s.profile_transitions].count("profile_roll_started") == 0
    assert not s.stale and not s.roll_cordoned
    machines = {r.machine for r in s.job("a").tasks.values()}
    s.define_profile(HostProfile(spec=PROFILES["web"].model_copy(
        update={"description": "v2"}), version=2))
    assert machines <= s.profiles.pending  # before any pass


def test_a_roll_on_a_full_region_says_why_a_moved_task_waits_and_goes_machine_by_machine():
    """Three machines, all the entitlement's, two tasks of a job of max_unavailable 1 on
    each: a task moved off the draining machine has nowhere to go but that machine,
    once it switched. Its job's event says it waits for room and when the drain's
    deadline moves the other; the next machine is drained only once the moved tasks
    are placed again (one machine at a time), and the roll completes."""
    sim = world(machines=3, entitlements=(), config=SchedulerConfig(
        rate=20, burst=40, profile_roll_deadline=300))
    s = sim.scheduler
    s.define_profile(HostProfile(spec=PROFILES["web"], version=1))
    sim.allocator.define(Entitlement(name="front", owner="o", quota=Quota(machines=3),
                                     host_profile="web"))
    for m in range(3):
        sim.agent(m).guard = False
    s.create_job(job_spec("front", 6, entitlement="front", cpu=8,
                          update=UpdatePolicy(max_unavailable=1)), 0)
    assert sim.run_until(lambda: len(s.discovery("front")) == 6, 600)
    s.define_profile(HostProfile(spec=PROFILES["web"].model_copy(update={"turbo": False}),
                                 version=2))
    def observe(sm):
        job = s.job("front")
        assert len(s.rolling) <= 1
        # the tasks down (pending, stopping, starting) came off one machine at a time:
        # its two, the second moved at the deadline
        down = {r.index for r in job.tasks.values() if not r.serving}
        assert len(down) <= 2, down
        assert len({m for moved in s.roll_moved.values() for m, _ in moved.values()}) <= 1
    sim.observers += [observe, check]
    assert sim.run_until(lambda: not s.stale and not s.rolling and len(
        s.discovery("front")) == 6, 3600)
    assert all(sim.agents[m].profile == ("web", 2) for m in range(3))
    waits = [e for e in s.events if e.kind == "profile_roll_waiting"]
    assert waits and all(e.job == "front" and "waits for room" in e.message for e in waits)
    assert any("moved at the drain's deadline, in" in e.message for e in waits)
    assert any(t.kind == "profile_roll_waiting_room" and "the next machine waits" in (
        t.reason or "")
               for t in s.profile_transitions)
    assert not s.roll_moved and not s.roll_landing
