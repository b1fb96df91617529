"""Elastic loans of whole machines, as the allocator counts them (decision 94).

A *lender* (``Entitlement.lends``) has machines of its quota it does not use; an
*elastic* entitlement (``Entitlement.elastic``) holds only machines on loan, claimed
from the free pool against that unused quota. The accounting is pooled over the
entitlements one allocator manages:

* ``lendable`` = the sum over lenders of ``quota - machines held - machines its
  waiting tasks need`` (``short``: what the lender would claim now if the free pool
  had it, reported by the scheduler), never below zero per lender;
* ``on_loan`` = the machines elastic entitlements hold, less those being revoked
  (``revoking``: already promised back);
* an elastic entitlement may claim while ``on_loan < lendable`` (and its own quota
  allows), and only free machines beyond those the lenders wait for (``short``): the
  allocator gives it a quota of what it holds plus that room.

When ``on_loan`` exceeds ``lendable`` (a lender grew, or waits for machines the pool
does not have), or a lender's waiting tasks need more machines than the free pool
has while machines are on loan (``owed``: quotas may add up to more than the
region), the scheduler revokes loans (``plait.scheduler.loans``). Pure: reads
the index and the entitlements, writes nothing but its two tables, which the
scheduler keeps.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from plait.allocator.index import MachineIndex
from plait.model.entitlement import Entitlement, Quota


@dataclass
class LoanLedger:
    #: lender -> machines its tasks wait for (unplaced for want of a machine)
    short: dict[str, int] = field(default_factory=dict)
    #: machine -> the elastic entitlement it is being revoked from
    revoking: dict[int, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class LoanCount:
    """The pooled figures at one instant."""

    lendable: int
    on_loan: int
    revoking: int

    @property
    def room(self) -> int:
        """Machines elastic entitlements may still borrow (negative: owed back)."""
        return self.lendable - self.on_loan


def held(index: MachineIndex, name: str) -> int:
    """The machines bound to entitlement ``name`` now."""
    code = index.region.entitlements.find(name)
    members = index.members.get(code) if code is not None else None
    return members.size if members else 0


def count(index: MachineIndex, entitlements: Mapping[str, Entitlement],
          ledger: LoanLedger) -> LoanCount:
    lendable = on_loan = 0
    for name, ent in entitlements.items():
        if ent.lends:
            assert ent.quota.machines is not None
            lendable += max(0, ent.quota.machines - held(index, name)
                            - ledger.short.get(name, 0))
        elif ent.elastic is not None:
            on_loan += held(index, name)
    revoking = 0
    if ledger.revoking:
        ent_of, codes = index.ent, index.region.entitlements
        for m, borrower in ledger.revoking.items():
            code = codes.find(borrower)
            if code is not None and int(ent_of[m]) == code:
                revoking += 1
    return LoanCount(lendable, on_loan - revoking, revoking)


def owed(index: MachineIndex, entitlements: Mapping[str, Entitlement],
         ledger: LoanLedger) -> int:
    """How many loans to revoke now: those beyond what the lenders can spare
    (``-count(...).room``), and at least the machines the lenders' waiting tasks need
    (``short``) beyond the free pool's available machines and the revokes under way,
    as long as any machine is on loan. Quotas are promises, not machines: a lender's
    unused quota may stand for machines another entitlement holds (quotas add up to
    more than the region), and then the pooled count owes nothing while the lender
    waits with its own machines lent out."""
    c = count(index, entitlements, ledger)
    due = -c.room
    need = sum(ledger.short.values())
    if need and c.on_loan:
        free = int(index.free_count["dc"].sum())
        due = max(due, min(c.on_loan, need - c.revoking - free))
    return max(0, due)


def borrowing_quota(index: MachineIndex, entitlements: Mapping[str, Entitlement],
                    ledger: LoanLedger, ent: Entitlement) -> Quota:
    """The quota an elastic entitlement may claim up to now: what it holds, less what
    is being revoked from it (a plan that empties such a machine may not claim
    another in its place), plus the pool's room, within its own quota."""
    assert ent.quota.machines is not None
    room = count(index, entitlements, ledger).room
    need = sum(ledger.short.values())
    if need:  # the free pool's machines the lenders wait for are theirs, not lent
        room = min(room, int(index.free_count["dc"].sum()) - need)
    room = max(0, room)
    have = held(index, ent.name)
    if ledger.revoking:
        code = index.region.entitlements.find(ent.name)
        have -= sum(1 for m, b in ledger.revoking.items()
                    if b == ent.name and int(index.ent[m]) == code)
    return Quota(machines=min(ent.quota.machines, have + room))
