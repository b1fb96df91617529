"""``/v1/hostprofiles``: host profiles (paper section 2.6). Admins write them; admins
and owners read them (an owner's entitlements name them)."""

from typing import Annotated, Any

from fastapi import Query, Response

from plait.api.auth import Admin, User
from plait.api.common import Plane, resource
from plait.client import types as t
from plait.errors import ValidationError
from plait.model.hostprofile import HostProfile, HostProfileSpec
from plait.server.auth import Principal, may_touch
from plait.server.controlplane.facade import PlaneApi
from plait.sidekick.store import wire

Version = Annotated[int | None, Query(ge=1, description="a kept version (default: "
                                      "the current one)")]

router = resource(["hostprofiles"])


def view(api: PlaneApi, p: HostProfile, who: Principal | None = None) -> dict[str, Any]:
    """A version; with ``who``, the entitlements naming it that the caller may see
    (an owner sees only its own) and their machines."""
    out = wire(p)
    if who is not None:
        ents = [ent for ent, owner in api.profile_users(p.name) if may_touch(who, owner)]
        out["entitlements"] = ents
        # (the machines of this control plane's, in a sharded region)
        out["machines"] = api.machines_of(ents)
    return out


@router.put("/v1/hostprofiles/{name}", response_model=t.HostProfileView, status_code=201,
            responses={200: {"model": t.HostProfileView,
                             "description": "The same settings as the current version"}})
def put_profile(name: str, spec: HostProfileSpec, who: Admin, response: Response,
                api: Plane) -> dict[str, Any]:
    """Create a host profile, or store its next version (admin). The same settings
    again make no new version. Refused (409) while machines that would switch to it
    have tasks running."""
    if spec.name != name:
        raise ValidationError("name", f"the body names {spec.name!r}, the path {name!r}")
    made, new = api.set_host_profile(spec)
    if not new:
        response.status_code = 200
    return view(api, made, who)


@router.get("/v1/hostprofiles", response_model=t.HostProfileList)
def list_profiles(who: User, api: Plane) -> dict[str, Any]:
    """Every host profile's current version, by name."""
    return {"profiles": [view(api, p) for p in api.profiles()]}


@router.get("/v1/hostprofiles/{name}", response_model=t.HostProfileView)
def get_profile(name: str, who: User, api: Plane, version: Version = None) -> dict[str, Any]:
    """A host profile (its current version, or a kept one), with the entitlements
    that name it and their machines."""
    return view(api, api.profile(name, version), who)


@router.get("/v1/hostprofiles/{name}/versions", response_model=t.HostProfileVersions)
def profile_versions(name: str, who: User, api: Plane) -> dict[str, Any]:
    """Every kept version of a host profile, oldest first."""
    return {"name": name, "versions": [view(api, p) for p in api.profile_versions(name)]}


@router.get("/v1/hostprofiles/{name}/diff", response_model=t.HostProfileDiff)
def diff_profiles(name: str, who: User, api: Plane,
                  to: Annotated[str | None, Query(max_length=64, description=(
                      "the profile to compare with (default: the same one)"))] = None,
                  version: Version = None, to_version: Version = None) -> dict[str, Any]:
    """What changes, setting by setting, from one profile (or version) to another.
    Without ``to`` and versions: the previous version against the current one."""
    other = name if to is None else to
    if to is None and version is None and to_version is None:
        kept = api.profile_versions(name)
        version = kept[-2].version if len(kept) > 1 else kept[-1].version
    return api.profile_diff(name, other, version, to_version)


@router.delete("/v1/hostprofiles/{name}", response_model=t.HostProfileDeleted)
def delete_profile(name: str, who: Admin, api: Plane) -> dict[str, Any]:
    """Delete a host profile no entitlement names (admin); ``default`` stays."""
    api.delete_host_profile(name)
    return {"name": name, "deleted": True}
