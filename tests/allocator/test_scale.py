"""A whole region: correctness at scale (the speed is the benchmark's business).

The 100,000-machine version runs in every test run; the 1,000,000-machine one (a
full Twine region) is marked slow: `make test-slow`.
"""

import numpy as np
import pytest

from plait.allocator import AllocationRequest
from plait.model import Resources
from plait.testing import Cluster, check_invariants


@pytest.mark.parametrize("machines", [
    100_000,
    pytest.param(1_000_000, marks=pytest.mark.slow),
])
def test_region_scale_allocations_keep_every_invariant(machines):
    from plait.model import RegionSpec, generate

    c = Cluster.of(generate(RegionSpec.sized(machines)))
    assert c.index.nbytes() / machines <= 300
    for k in range(20):
        c.entitlement(f"e{k}", machines=machines // 20)
    task = Resources(cpu=1, memory_gb=2)
    msb = c.index.loc["msb"]
    for j in range(400):
        r = c.allocator.allocate(AllocationRequest.of(f"j{j}", f"e{j % 20}", task,
                                                      allocate=range(36)))
        assert r.complete
        # 36 tasks over 60 MSBs: never two in one MSB
        assert np.bincount(msb[np.asarray(r.machines)]).max() == 1
    check_invariants(c)
