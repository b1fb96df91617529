"""Elastic loans as the allocator counts them: an elastic entitlement claims only
against the lenders' unused quota, lenders are never limited by loans, and machines
being revoked do not count as lent (nor may a borrower claim one in their place)."""

import pytest

from plait.allocator.loans import count
from plait.errors import ValidationError
from plait.model import ElasticTerms, Entitlement, Resources, parse
from plait.testing import Cluster, machine

WHOLE = Resources(cpu=16, memory_gb=64)


def ten(lender: str = "web", quota: int = 6, lends: bool = True):
    """Ten machines, a lender (or a plain entitlement) and an elastic ``batch``."""
    c = Cluster.machines(*[machine(f"m{i}", msb=f"msb{i % 5}") for i in range(10)])
    c.entitlement(lender, machines=quota, lends=lends)
    c.entitlement("batch", machines=10, elastic=ElasticTerms())
    return c


def loans(c):
    return count(c.allocator.index, c.allocator.entitlements, c.allocator.loans)


def test_a_borrower_claims_only_what_lenders_do_not_use():
    c = ten()
    c.allocate("w", "web", WHOLE, allocate=range(2))
    r = c.allocate("b", "batch", WHOLE, allocate=range(8))
    assert len(r.claimed) == 4  # web's quota 6, 2 used
    assert "quota" in r.unplaced[0][1]
    assert loans(c).room == 0
    # the lender is not limited by what it lent: the pool still has machines
    r = c.allocate("w", "web", WHOLE, allocate=range(4))
    assert len(r.machines) == 4
    assert loans(c).room == -2  # two loans owed back


def test_a_lenders_waiting_tasks_take_its_unused_quota_back():
    c = ten()
    c.allocator.loans.short["web"] = 5
    assert loans(c).lendable == 1
    r = c.allocate("b", "batch", WHOLE, allocate=range(3))
    assert len(r.claimed) == 1


def test_machines_being_revoked_are_not_lent_and_not_replaced():
    c = ten(quota=4)
    r = c.allocate("b", "batch", WHOLE, allocate=range(4))
    assert len(r.claimed) == 4
    c.allocator.loans.revoking[r.claimed[0]] = "batch"
    assert loans(c) == type(loans(c))(lendable=4, on_loan=3, revoking=1)
    # the lender waits for one: nothing left to lend, and no claim in the revoked
    # machine's place
    c.allocator.loans.short["web"] = 1
    assert loans(c).room == 0
    r = c.allocate("b", "batch", WHOLE, allocate=range(5))
    assert len(r.claimed) == 0


def test_without_a_lender_nothing_is_lent():
    c = ten("plain", lends=False)
    r = c.allocate("b", "batch", WHOLE, allocate=range(2))
    assert r.machines == () and len(r.unplaced) == 2


@pytest.mark.parametrize(("fields", "message"), [
    ({"lends": True, "elastic": {}}, "not both"),
    ({"lends": True, "quota": {"rru": 10}}, "whole machines"),
    ({"elastic": {"max_reclaim_fraction_per_minute": 0}}, "greater than 0"),
    ({"elastic": {"min_notice_seconds": -1}}, "greater than or equal to 0"),
    ({"elastic": {"min_notice_seconds": 5, "surprise": 1}}, "surprise"),
])
def test_loan_terms_are_checked(fields, message):
    raw = {"name": "e", "owner": "o", "quota": {"machines": 4}, **fields}
    with pytest.raises(ValidationError, match=message):
        parse(Entitlement, raw)
