"""``/v1/entitlements``: admins create, change and delete them; owners see their own."""

from typing import Any

from fastapi import Request, Response

from plait import paging
from plait.api.auth import Admin, Guard, User
from plait.api.common import Continue, Limit, Plane, resource
from plait.client import types as t
from plait.errors import NotFound
from plait.model import Entitlement

router = resource(["entitlements"])


@router.post("/v1/entitlements", response_model=t.EntitlementView, status_code=201,
             responses={200: {"model": t.EntitlementView,
                              "description": "An existing entitlement, changed or the same"}})
def create_entitlement(ent: Entitlement, who: Admin, response: Response,
                       api: Plane) -> dict[str, Any]:
    """Create an entitlement, or change its quota and settings (admin). A quota the
    region cannot give is accepted (capacity grows) and said in ``warnings`` and in
    the event."""
    if not api.define_entitlement(ent):
        response.status_code = 200
    view = api.entitlement_view(ent.name)
    warnings = api.quota_warnings(ent)
    if warnings:
        view["warnings"] = warnings
    return view


@router.get("/v1/entitlements", response_model=t.EntitlementList)
def list_entitlements(who: User, api: Plane, guard: Guard, limit: Limit = None,
                      cont: Continue = None) -> dict[str, Any]:
    """The entitlements the caller may see, by name; in pages with ``limit`` and
    ``continue`` (then the answer carries ``continue``)."""
    win = paging.window(limit, cont, paging.scope_of("entitlements"))
    mine = guard.owned(who)
    names = sorted(n for n in api.entitlement_names() if mine is None or n in mine)

    def view(name: str | int) -> dict[str, Any] | None:
        try:
            return api.entitlement_view(str(name))
        except NotFound:
            return None  # (gone meanwhile)
    found, nxt = paging.page(names, win, view)
    return {"entitlements": found, **({"continue": nxt} if win.paged else {})}


@router.get("/v1/entitlements/{name}", response_model=t.EntitlementView)
def get_entitlement(name: str, who: User, request: Request, api: Plane,
                    guard: Guard) -> dict[str, Any]:
    if api.entitlement_owner(name) is None:
        raise NotFound("entitlement", name)
    guard.may_entitlement(request, who, name)
    return api.entitlement_view(name)


@router.delete("/v1/entitlements/{name}", response_model=t.EntitlementView)
def delete_entitlement(name: str, who: Admin, api: Plane) -> dict[str, Any]:
    """Delete an entitlement that no job uses (a 409 names the jobs that do): the
    machines it holds go back to the region's free pool, and its canary entitlements
    go with it (admin, as its creation)."""
    return api.delete_entitlement(name)
