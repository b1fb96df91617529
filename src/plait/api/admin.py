"""The region's administration: limits per owner (``/v1/owners``), and a scheduler
shard's part in moving an entitlement between shards (``/v1/shard``, called by the
front end, ``plait.frontend``)."""

from typing import Annotated, Any

from fastapi import Body

from plait.api.auth import Admin, User
from plait.api.bodies import ShardMove, ShardReload
from plait.api.common import Plane, resource
from plait.client import types as t
from plait.errors import NotFound
from plait.server.auth import may_touch
from plait.server.controlplane.facade import LimitsBody

router = resource()


@router.post("/v1/shard/entitlements/{name}/handoff", response_model=t.ShardHandoff,
             tags=["shards"])
def handoff(name: str, body: ShardMove, who: Admin, api: Plane) -> dict[str, Any]:
    """Hand an entitlement's records to another scheduler shard and stop managing them
    (its tasks are untouched)."""
    jobs = api.handoff(name, body.shard)
    return {"entitlement": name, "shard": body.shard, "jobs": jobs}


@router.post("/v1/shard/reload", response_model=t.ShardReload, tags=["shards"])
def reload(who: Admin, api: Plane,
           body: Annotated[ShardReload | None, Body()] = None) -> dict[str, Any]:
    """Read this shard's records again (an entitlement was handed to it: 503 until its
    records are seen here)."""
    api.reload(body.entitlement if body else None)
    return {"shard": api.shard(), "entitlements": api.entitlement_count()}


@router.get("/v1/owners/limits", response_model=t.OwnerLimitsList, tags=["owners"])
def list_owner_limits(who: Admin, api: Plane) -> dict[str, Any]:
    """The default limits per owner and each owner's (with an entitlement or a limit
    set): at most so many jobs and tasks in all its entitlements."""
    return api.owner_limits()


@router.get("/v1/owners/{owner}/limits", response_model=t.OwnerLimitsView, tags=["owners"])
def get_owner_limits(owner: str, who: User, api: Plane) -> dict[str, Any]:
    """An owner's limits and what it holds: an admin's view of any owner, an owner's
    of its own (another's is a 404)."""
    if not may_touch(who, owner):
        raise NotFound("owner", owner)
    return api.owner_limits_of(owner)


@router.put("/v1/owners/{owner}/limits", response_model=t.OwnerLimitsView, tags=["owners"])
def set_owner_limits(owner: str, body: LimitsBody, who: Admin, api: Plane) -> dict[str, Any]:
    """Set an owner's limits (null: the region's default). A lower limit takes nothing
    away: the owner's jobs stay, and it cannot grow until under it."""
    return api.set_owner_limits(owner, body)
