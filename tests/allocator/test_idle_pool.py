"""A large entitlement's idle members are pooled and counted, not scanned: the pool
stays in step with bindings, health and tasks, and placement is as good as the scan's."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from plait.allocator import AllocationRequest, Allocator, MachineIndex
from plait.broker import Region
from plait.model import (
    EventKind,
    Preference,
    Property,
    RegionSpec,
    Resources,
    Strategy,
    UnavailabilityEvent,
    generate,
)
from plait.model.policy import AllocationPolicy
from plait.testing import Cluster, check_invariants

SPEC = RegionSpec(dcs=2, msbs_per_dc=2, rows_per_msb=1, racks_per_row=2, machines_per_rack=4)


def cluster(idle_pool_min: int, given_machines: int = 16, quota: int = 32) -> Cluster:
    fleet = generate(SPEC, seed=0)
    region = Region(fleet)
    index = MachineIndex(fleet, region, idle_pool_min=idle_pool_min)
    c = Cluster(fleet, region, index, Allocator(index))
    c.entitlement("big", machines=quota)
    c.entitlement("small", machines=8)
    c.give("big", *fleet.names(range(0, 2 * given_machines, 2)))  # 4 per MSB at most
    return c


def test_an_entitlement_that_grows_past_the_threshold_gets_a_pool():
    c = cluster(idle_pool_min=10, given_machines=9)
    code = c.region.entitlements.code("big")
    assert code not in c.index.idle
    c.give("big", c.fleet.name(1))
    assert code in c.index.idle and len(c.index.busy[code]) == 0
    check_invariants(c)


def test_a_new_job_stacks_onto_idle_members_without_claiming():
    c = cluster(idle_pool_min=4)
    code = c.region.entitlements.code("big")
    r = c.allocator.allocate(AllocationRequest.of("j", "big", Resources(cpu=4, memory_gb=4),
                                                  allocate=range(8)))
    assert r.complete and r.claimed == ()
    # default policy: spread over the 4 MSBs, then stack: 2 tasks on one machine per MSB
    assert len(set(r.machines)) == 4
    assert len(c.index.busy[code]) == 4
    check_invariants(c)
    # freeing every task empties the machines: they go back to the free pool
    c.allocator.allocate(AllocationRequest.of("j", "big", Resources(cpu=4, memory_gb=4),
                                              free=range(8)))
    assert len(c.index.busy[code]) == 0 and len(c.index.members[code]) == 12
    check_invariants(c)


def test_a_failed_idle_member_leaves_the_pool_and_comes_back_when_repaired():
    c = cluster(idle_pool_min=4)
    c.region.add_event(UnavailabilityEvent("f", EventKind.FAILURE, (c.fleet.name(0),), start=0),
                       0)
    assert not c.index.is_idle(0)
    check_invariants(c)
    c.region.end_event("f", 1)
    assert c.index.is_idle(0)
    check_invariants(c)


def _quality(c: Cluster) -> tuple[int, list[list[int]]]:
    """Machines hosting a task, and each job's tasks per MSB (sorted counts)."""
    msb = c.index.loc["msb"]
    per_job = [sorted(n for n in np.bincount(msb[np.asarray(list(s.placement.values()))])
                      .tolist() if n)
               for _, s in sorted(c.allocator.jobs.items())]
    return int(np.count_nonzero(c.index.tasks)), per_job


requests = [
    st.tuples(st.just("allocate"), st.integers(0, 4), st.integers(1, 12),
              st.sampled_from([1, 2, 4, 8]), st.booleans()),
    st.tuples(st.just("free"), st.integers(0, 4), st.integers(1, 6)),
]
failures = [st.tuples(st.just("fail"), st.integers(0, 31)),
            st.tuples(st.just("repair"), st.integers(0, 31))]


@settings(max_examples=60, deadline=None)
@given(ops=st.lists(st.tuples(st.just("allocate"), st.integers(0, 4), st.integers(1, 12),
                              st.just(0)), min_size=1, max_size=20), by_rack=st.booleans())
def test_pooled_and_scanned_entitlements_place_alike(ops, by_rack):
    """The same growing jobs against an index that pools the entitlement's idle members
    and one that scans them: same number of machines used, same spread of every job.
    Machines with the same room in one bin are equally good and the two may pick
    different ones, so this compares jobs that only grow (one task size per job) under
    one policy: which of two equal machines took a task then never matters later."""
    ops = [(*op, by_rack) for op in ops]
    _replay(ops, cluster(idle_pool_min=1), cluster(idle_pool_min=10**9), compare=True)


@settings(max_examples=60, deadline=None)
@given(ops=st.lists(st.one_of(*requests, *failures), min_size=1, max_size=20))
def test_the_pool_stays_in_step_through_failures_and_repairs(ops):
    _replay(ops, cluster(idle_pool_min=1), cluster(idle_pool_min=10**9), compare=False)


def _replay(ops: list[tuple[object, ...]], pooled: Cluster, scanned: Cluster,
            compare: bool) -> None:
    """Every invariant (the pool in step) after each step, and with ``compare`` the
    same quality figures."""
    assert pooled.index.idle and not scanned.index.idle
    rack = AllocationPolicy(preferences=(Preference(strategy=Strategy.SPREAD,
                                                    property=Property.RACK),
                                         Preference(strategy=Strategy.STACK)))
    failed: set[int] = set()
    for step, op in enumerate(ops):
        for c in (pooled, scanned):
            if op[0] == "allocate":
                _, j, n, cpu, by_rack = op
                cpu = cpu or (1, 2, 4, 8)[j % 4]
                c.allocator.allocate(AllocationRequest.of(
                    f"j{j}", "big", Resources(cpu=cpu, memory_gb=cpu), allocate=range(n),
                    **({"policy": rack} if by_rack else {})))
            elif op[0] == "free":
                c.allocator.allocate(AllocationRequest.of(
                    f"j{op[1]}", "big", Resources(cpu=1), free=range(op[2])))
            elif op[0] == "fail" and op[1] not in failed:
                c.region.add_event(UnavailabilityEvent(
                    f"f{op[1]}", EventKind.FAILURE, (c.fleet.name(op[1]),), start=step), step)
            elif op[0] == "repair" and op[1] in failed:
                c.region.end_event(f"f{op[1]}", step)
            check_invariants(c)
        if op[0] == "fail":
            failed.add(op[1])
        elif op[0] == "repair":
            failed.discard(op[1])
        if compare:
            assert _quality(pooled) == _quality(scanned)


def test_full_busy_members_are_not_read_for_a_task_that_needs_cpu():
    c = cluster(idle_pool_min=4)
    code = c.region.entitlements.code("big")
    # one task of the whole machine (16 RRU) in each MSB: four full machines
    r = c.allocator.allocate(AllocationRequest.of("full", "big", Resources(cpu=16),
                                                  allocate=range(4)))
    assert r.complete and r.claimed == ()
    busy = c.index.busy[code]
    full = set(r.machines)
    assert set(busy.ids.tolist()) == full
    assert not full & set(busy.with_room(1000).tolist())  # 1 RRU: none of them can take it
    assert set(busy.with_room(0).tolist()) == full  # a task of no cpu might still fit
    # a job of cpu-less tasks may still stack onto them
    r = c.allocator.allocate(AllocationRequest.of("tiny", "big", Resources(cpu=0, memory_gb=1),
                                                  allocate=range(4)))
    assert set(r.machines) == full
    check_invariants(c)
