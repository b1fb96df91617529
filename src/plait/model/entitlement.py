"""Entitlements: a quota plus a pseudo-cluster (paper section 2.2).

Jobs are bound to an entitlement, never to a physical cluster. The machines
assigned to an entitlement vary between 0 and its quota as its jobs need them; all
of them carry the entitlement's host profile.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Mapping

import pydantic

from plait.model.base import Value
from plait.model.policy import DEFAULT_PREFERENCES, Preference

#: (``\Z``, not ``$``: ``$`` also matches before a trailing newline)
NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9._-]{0,62}[a-z0-9])?\Z")


def check_name(value: str) -> str:
    if not NAME_RE.match(value):
        raise ValueError(
            f"{value!r} is not a valid name: 1-64 of a-z 0-9 . _ -, starting and ending "
            "with a letter or digit"
        )
    return value


class Quota(Value):
    """A count of machines, or an amount of RRU; exactly one of the two."""

    #: whole machines (a region holds at most a million, and so does a quota)
    machines: int | None = pydantic.Field(default=None, ge=0, le=1_000_000)
    #: or an amount of RRU on shared machines (bounded so that the allocator's
    #: milli-RRU stay inside 64-bit integers)
    rru: float | None = pydantic.Field(default=None, ge=0, le=1e12)

    @pydantic.model_validator(mode="after")
    def _exactly_one(self) -> Quota:
        if (self.machines is None) == (self.rru is None):
            raise ValueError("give exactly one of machines or rru")
        return self

    def __str__(self) -> str:
        if self.machines is not None:
            return f"{self.machines} machine{'s' if self.machines != 1 else ''}"
        return f"{self.rru:.15g} RRU"  # 2500000 RRU, not 2.5e+06


def shard_weight(quota: Quota, machine_milli_rru: int) -> int:
    """An entitlement's load on the scheduler shard that manages it: its quota in
    machines; an RRU quota counts as the machines of the region's mean size
    (``machine_milli_rru``) it could fill, rounded up. The front end and the simulated
    region both weigh entitlements with this, and place a new one with
    ``least_loaded``."""
    if quota.machines is not None:
        return quota.machines
    assert quota.rru is not None
    return math.ceil(round(quota.rru * 1000) / max(1, machine_milli_rru))


def least_loaded(loads: Mapping[int, int]) -> int:
    """The shard with the least load (the lowest number on a tie)."""
    return min(loads, key=lambda s: (loads[s], s))


def place_on_shard(loads: Mapping[int, int], loans: bool = False,
                   loan_shards: Mapping[str, int] | None = None) -> int:
    """The scheduler shard a new entitlement goes to, given each live shard's load
    (``shard_weight`` summed over its entitlements): the least-loaded one
    (``least_loaded``). One that lends or borrows (``loans``) goes where the region's
    other lenders and borrowers are (``loan_shards``: each such entitlement's shard;
    the first by name whose shard is live): loans are counted per scheduler shard
    (decision 94), so they must share one. The front end's shard map and the
    simulated region both place entitlements with this."""
    if loans and loan_shards:
        for name in sorted(loan_shards):
            if loan_shards[name] in loads:
                return loan_shards[name]
    return least_loaded(loads)


class ElasticTerms(Value):
    """The terms an elastic entitlement's loans are made on (decision 94): published
    with the entitlement and enforced by the scheduler when it revokes loans. A
    borrower's tasks hear of a revoke (a ``loan_revoke`` advance notice through
    TaskControl) at least ``min_notice_seconds`` before they are stopped, and at most
    ``max_reclaim_fraction_per_minute`` of its loaned machines (at least one) are
    revoked in any minute."""

    #: seconds between a revoke's notice and its deadline (the tasks' stop)
    min_notice_seconds: float = pydantic.Field(default=120.0, ge=0, le=86_400)
    #: the most of the borrower's loaned machines revoked in any 60 seconds
    max_reclaim_fraction_per_minute: float = pydantic.Field(default=0.1, gt=0, le=1)


class Entitlement(Value):
    """A quota and a pseudo-cluster (paper section 3): jobs are bound to it, and
    machines join it from the region's free pool when its jobs need room (never above
    its quota) and go back when empty."""

    #: the entitlement's name (the same rules as a job's)
    name: str
    #: who owns it: the name of the owner tokens that may use it and its jobs
    owner: str
    #: how much of the region it may hold
    quota: Quota
    #: the host profile its machines are switched to
    host_profile: str = pydantic.Field(default="default", min_length=1, max_length=64)
    #: soft preferences for jobs that do not set their own.
    default_preferences: tuple[Preference, ...] = pydantic.Field(
        default=DEFAULT_PREFERENCES, max_length=16)
    #: pin the entitlement's machines and jobs to one data center.
    pin_dc: str | None = pydantic.Field(default=None, min_length=1, max_length=64)

    #: a lender: the machines of its quota it does not use are loaned to elastic
    #: entitlements, and revoked when it needs them (a whole-machine quota only)
    lends: bool = False
    #: an elastic entitlement: every machine it holds is on loan from the lenders'
    #: unused quota, on these terms; its quota caps how many it may borrow
    elastic: ElasticTerms | None = None
    #: the shared surge buffer: how many surge tasks (``update.surge``) the
    #: entitlement's jobs may run at once; the room for them is the quota its jobs do
    #: not use (decision 102)
    surge_buffer: int = pydantic.Field(default=0, ge=0, le=100_000)
    #: a canary entitlement (decision 103): made by the Job Control Plane for a code +
    #: config + host-profile canary of a job of entitlement ``canary_of``; its
    #: machines carry the canary's host profile and count against that entitlement's
    #: machine quota too
    canary_of: str | None = None
    #: the host profiles its owner's host-profile canaries may switch machines to
    #: (set by an admin; none by default: a canary that changes the host needs one
    #: listed here, or the entitlement's own ``host_profile``)
    canary_host_profiles: tuple[str, ...] = pydantic.Field(default=(), max_length=64)

    _name = pydantic.field_validator("name", "owner")(check_name)

    @pydantic.field_validator("canary_of")
    @classmethod
    def _parent(cls, value: str | None) -> str | None:
        return None if value is None else check_name(value)

    @pydantic.field_validator("canary_host_profiles")
    @classmethod
    def _profiles(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for name in value:
            check_name(name)  # (a host profile's name has an entitlement's rules)
        if len(set(value)) != len(value):
            raise ValueError("a host profile is listed twice")
        return value

    def may_canary(self, host_profile: str) -> bool:
        """May this entitlement's owner run a canary on machines of ``host_profile``?"""
        return host_profile == self.host_profile or host_profile in self.canary_host_profiles

    @pydantic.model_validator(mode="after")
    def _loans(self) -> Entitlement:
        if self.lends and self.elastic is not None:
            raise ValueError("an entitlement either lends (lends: true) or borrows "
                             "(elastic: terms), not both")
        if (self.lends or self.elastic is not None) and self.quota.machines is None:
            raise ValueError("loans are of whole machines: a lender's or an elastic "
                             "entitlement's quota must be in machines")
        if self.canary_of is not None and (self.lends or self.elastic is not None
                                           or self.quota.machines is None):
            raise ValueError("a canary entitlement neither lends nor borrows, and its "
                             "quota is in machines")
        if self.canary_of is not None and self.canary_host_profiles:
            raise ValueError("canary_host_profiles: a canary entitlement runs no canary of "
                             "its own")
        return self

    @pydantic.field_validator("default_preferences")
    @classmethod
    def _unique(cls, prefs: tuple[Preference, ...]) -> tuple[Preference, ...]:
        if len(set(prefs)) != len(prefs):
            raise ValueError("a preference is listed twice")
        return prefs


def lends_or_borrows(entitlement: Entitlement) -> bool:
    """Whether the entitlement takes part in loans: a lender or an elastic borrower
    (``place_on_shard`` puts it with the others)."""
    return entitlement.lends or entitlement.elastic is not None


def canary_entitlement(entitlement: str, job: str, canary: str) -> str:
    """The name of the canary entitlement of a host-profile canary (decision 103): the
    job's entitlement's name (its first 46 characters), ``.canary-`` and a digest of
    the three names, a valid entitlement name of at most 64 characters."""
    digest = hashlib.sha256(f"{entitlement}/{job}/{canary}".encode()).hexdigest()[:10]
    return f"{entitlement[:46].rstrip('._-')}.canary-{digest}"


#: a canary entitlement's name: its entitlement's (as far as it was kept) and a digest
CANARY_NAME = re.compile(r"^(?P<parent>.+)\.canary-[0-9a-f]{10}\Z")
