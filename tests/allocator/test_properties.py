"""Property tests: the invariants hold whatever the sequence of requests."""

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from plait.allocator import AllocationRequest
from plait.model import EventKind, Quota, Resources, UnavailabilityEvent
from plait.testing import Cluster, check_invariants

ops = st.lists(
    st.one_of(
        st.tuples(st.just("allocate"), st.integers(0, 5), st.integers(0, 2),
                  st.lists(st.integers(0, 11), min_size=1, max_size=12),
                  st.sampled_from([1, 2, 4, 8]), st.sampled_from([2, 8, 16])),
        st.tuples(st.just("free"), st.integers(0, 5), st.lists(st.integers(0, 11), max_size=6)),
        st.tuples(st.just("fail"), st.integers(0, 23)),
        st.tuples(st.just("repair"), st.integers(0, 23)),
    ),
    min_size=1, max_size=25,
)


@given(ops=ops, quotas=st.lists(st.one_of(st.integers(0, 10).map(lambda n: Quota(machines=n)),
                                           st.sampled_from([16, 40, 100]).map(
                                               lambda r: Quota(rru=r))),
                                 min_size=3, max_size=3))
def test_invariants_hold_under_any_request_sequence(ops, quotas):
    c = Cluster.generated(dcs=2, msbs_per_dc=2, rows_per_msb=1, racks_per_row=2,
                          machines_per_rack=3)
    for k, quota in enumerate(quotas):
        c.entitlement(f"e{k}", machines=quota.machines, rru=quota.rru)
    job_ent: dict[str, str] = {}
    failures: set[int] = set()
    for step, op in enumerate(ops):
        if op[0] == "allocate":
            _, j, e, tasks, cpu, mem = op
            job = f"j{j}"
            ent = job_ent.setdefault(job, f"e{e}")
            c.allocator.allocate(AllocationRequest.of(
                job, ent, Resources(cpu=cpu, memory_gb=mem), allocate=sorted(set(tasks))))
        elif op[0] == "free":
            _, j, tasks = op
            job = f"j{j}"
            if job in job_ent:
                c.allocator.allocate(AllocationRequest.of(
                    job, job_ent[job], Resources(cpu=1), free=sorted(set(tasks))))
        elif op[0] == "fail" and op[1] not in failures:
            failures.add(op[1])
            c.region.add_event(UnavailabilityEvent(f"f{op[1]}", EventKind.FAILURE,
                                                   (c.fleet.name(op[1]),), start=step), step)
        elif op[0] == "repair" and op[1] in failures:
            failures.discard(op[1])
            c.region.end_event(f"f{op[1]}", step)
        check_invariants(c)


@given(dcs=st.integers(1, 3), msbs=st.integers(1, 6), first=st.integers(1, 40),
       more=st.integers(0, 40))
def test_spread_is_never_more_than_one_above_even_when_capacity_allows(dcs, msbs, first, more):
    c = Cluster.generated(dcs=dcs, msbs_per_dc=msbs, rows_per_msb=1, racks_per_row=2,
                          machines_per_rack=4)
    c.entitlement("e", machines=10_000)
    n_msb = dcs * msbs
    task = Resources(cpu=1, memory_gb=1)
    c.allocator.allocate(AllocationRequest.of("j", "e", task, allocate=range(first)))
    r = c.allocator.allocate(AllocationRequest.of("j", "e", task, allocate=range(first + more)))
    assert r.complete
    per_msb = np.bincount(c.index.loc["msb"][np.asarray(r.machines)], minlength=n_msb)
    assert per_msb.max() - per_msb.min() <= 1
    check_invariants(c)
