"""The cache keeps a request and its result as one array: a repeat of exactly the
same request is a hit that reports the same placement; any other request misses."""

from plait.model import Resources
from plait.testing import Cluster

ONE = Resources(cpu=1, memory_gb=2)
TWO = Resources(cpu=2, memory_gb=2)


def placed_cluster():
    c = Cluster.generated(dcs=1, msbs_per_dc=2, rows_per_msb=1, racks_per_row=2,
                          machines_per_rack=3)
    c.entitlement("e", machines=12)
    return c


def test_a_repeat_with_frees_hits_and_reports_the_same_placement():
    c = placed_cluster()
    c.allocate("j", "e", ONE, allocate=range(6))
    first = c.allocate("j", "e", ONE, allocate=[0, 1, 3, 5], free=[2, 4])
    assert first.complete and not first.cached and first.freed == (2, 4)
    again = c.allocate("j", "e", ONE, allocate=[0, 1, 3, 5], free=[2, 4])
    assert again.cached and c.allocator.cache.hits == 1
    assert (again.job, again.entitlement, again.tasks, again.machines) == (
        first.job, first.entitlement, first.tasks, first.machines)
    assert again.placements == first.placements
    assert again.freed == again.claimed == again.unplaced == () and again.attempts == 0


def test_any_other_request_misses():
    c = placed_cluster()
    c.allocate("j", "e", ONE, allocate=range(4))
    cache = c.allocator.cache
    for other in ({"allocate": range(3)},                       # fewer tasks
                  {"allocate": [0, 1, 2], "free": [3]},         # an operation differs
                  {"allocate": [0, 1, 2, 4]}):                  # an index differs
        misses = cache.misses
        r = c.allocate("j", "e", ONE, **other)
        assert not r.cached and cache.misses == misses + 1
    misses = cache.misses
    assert not c.allocate("j", "e", TWO, allocate=range(4)).cached  # other resources
    assert cache.misses == misses + 1
    hit = c.allocate("j", "e", TWO, allocate=range(4))
    assert hit.cached and len(hit.tasks) == 4


def test_an_entry_holds_its_tasks_machines_generations_and_request_whatever_its_size():
    import numpy as np

    from plait.allocator.cache import _FEW

    c = Cluster.generated(dcs=1, msbs_per_dc=2, rows_per_msb=1, racks_per_row=2,
                          machines_per_rack=6)
    c.entitlement("e", machines=24)
    gen = c.allocator.index.version
    c.allocate("few", "e", ONE, allocate=[0, 2, 5])
    for job, allocate, free in (("one", [0], []),                    # made from one list
                                ("few", [0, 2], [5]),
                                ("many", list(range(_FEW)), [])):    # made from arrays
        result = c.allocate(job, "e", ONE, allocate=allocate, free=free)
        entry = c.allocator.cache._entries[job]
        n = entry.placed
        assert entry.data.dtype == np.uint32 and n == len(allocate)
        assert entry.data[:n].tolist() == list(result.tasks) == allocate
        assert entry.data[n:2 * n].tolist() == list(result.machines)
        assert entry.data[2 * n:3 * n].tolist() == [int(gen[m]) for m in result.machines]
        asked = sorted([(t, 0) for t in allocate] + [(t, 1) for t in free])
        assert entry.data[3 * n:].tolist() == [2 * t + f for t, f in asked]
        assert c.allocate(job, "e", ONE, allocate=allocate, free=free).cached
