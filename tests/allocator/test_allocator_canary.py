"""A canary entitlement (a code + config + host-profile canary's machines, decision
103) and the entitlement it is a canary of share the latter's machine quota: each
claims only what the other leaves."""

import pytest

from plait.errors import ValidationError
from plait.model import Entitlement, Quota, Resources, parse
from plait.testing import Cluster, machine

WHOLE = Resources(cpu=16, memory_gb=64)


def test_a_canary_entitlement_and_its_entitlement_share_one_machine_quota():
    c = Cluster.machines(*[machine(f"m{i}", msb=f"msb{i % 5}") for i in range(10)])
    c.entitlement("web", machines=6)
    c.allocator.define(Entitlement(name="web.canary-0123456789", owner="o",
                                   quota=Quota(machines=3), canary_of="web"))
    assert len(c.allocate("w", "web", WHOLE, allocate=range(4)).claimed) == 4
    r = c.allocate("w", "web.canary-0123456789", WHOLE, allocate=range(4, 7))
    assert len(r.claimed) == 2 and "quota" in r.unplaced[0][1]  # min(3, 6 - 4)
    r = c.allocate("w", "web", WHOLE, allocate=range(8, 10))
    assert not r.claimed and "quota" in r.unplaced[0][1]  # 4 + 2 of 6
    # the canary's tasks leave: its machines go back, and web may claim them again
    c.allocate("w", "web.canary-0123456789", WHOLE, free=range(4, 6))
    assert len(c.allocate("w", "web", WHOLE, allocate=range(8, 10)).claimed) == 2


def test_a_canary_entitlement_neither_lends_nor_borrows():
    with pytest.raises(ValidationError, match="neither lends nor borrows"):
        parse(Entitlement, {"name": "x", "owner": "o", "quota": {"machines": 1},
                            "canary_of": "web", "lends": True})
