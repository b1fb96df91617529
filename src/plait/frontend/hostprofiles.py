"""``/v1/hostprofiles``: host profiles (paper section 2.6). Admins write them; admins
and owners read them (an owner's entitlements name them)."""

from typing import TYPE_CHECKING, Annotated, Any

from fastapi import FastAPI, Query, Response

from plait.client import types as t
from plait.errors import ValidationError
from plait.model.hostprofile import HostProfile, HostProfileSpec
from plait.server.auth import Principal, Role
from plait.sidekick.store import wire

if TYPE_CHECKING:
    from plait.server.controlplane.core import ControlPlane

Version = Annotated[int | None, Query(ge=1, description="a kept version (default: "
                                      "the current one)")]


def add_routes(app: FastAPI, cp: "ControlPlane", admin: Any, user: Any) -> None:
    """The routes; ``admin`` and ``user`` are the app's token dependencies (types
    given to FastAPI: this module does not postpone its annotations)."""

    def view(p: HostProfile, who: Principal | None = None) -> dict[str, Any]:
        """A version; with ``who``, the entitlements naming it that the caller may see
        (an owner sees only its own) and their machines."""
        out = wire(p)
        if who is not None:
            ents = [ent for ent, owner in cp.profiles.naming(p.name)
                    if who.role is Role.ADMIN or owner == who.name]
            out["entitlements"] = ents
            with cp.lock:  # (the machines of this control plane's, in a sharded region)
                out["machines"] = sum(len(cp.region.machines_of(e)) for e in ents)
        return out

    @app.put("/v1/hostprofiles/{name}", response_model=t.HostProfileView,
             tags=["hostprofiles"], status_code=201,
             responses={200: {"model": t.HostProfileView,
                              "description": "The same settings as the current version"}})
    def put_profile(name: str, spec: HostProfileSpec, who: admin,
                    response: Response) -> dict[str, Any]:
        """Create a host profile, or store its next version (admin). The same settings
        again make no new version. Refused (409) while machines that would switch to
        it have tasks running."""
        if spec.name != name:
            raise ValidationError("name", f"the body names {spec.name!r}, the path {name!r}")
        made, new = cp.profiles.put(spec)
        if not new:
            response.status_code = 200
        return view(made, who)

    @app.get("/v1/hostprofiles", response_model=t.HostProfileList, tags=["hostprofiles"])
    def list_profiles(who: user) -> dict[str, Any]:
        """Every host profile's current version, by name."""
        return {"profiles": [view(p) for p in cp.profiles.current()]}

    @app.get("/v1/hostprofiles/{name}", response_model=t.HostProfileView,
             tags=["hostprofiles"])
    def get_profile(name: str, who: user, version: Version = None) -> dict[str, Any]:
        """A host profile (its current version, or a kept one), with the entitlements
        that name it and their machines."""
        return view(cp.profiles.get(name, version), who)

    @app.get("/v1/hostprofiles/{name}/versions", response_model=t.HostProfileVersions,
             tags=["hostprofiles"])
    def profile_versions(name: str, who: user) -> dict[str, Any]:
        """Every kept version of a host profile, oldest first."""
        return {"name": name, "versions": [view(p) for p in cp.profiles.versions(name)]}

    @app.get("/v1/hostprofiles/{name}/diff", response_model=t.HostProfileDiff,
             tags=["hostprofiles"])
    def diff_profiles(name: str, who: user,
                      to: Annotated[str | None, Query(max_length=64, description=(
                          "the profile to compare with (default: the same one)"))] = None,
                      version: Version = None, to_version: Version = None) -> dict[str, Any]:
        """What changes, setting by setting, from one profile (or version) to another.
        Without ``to`` and versions: the previous version against the current one."""
        other = name if to is None else to
        if to is None and version is None and to_version is None:
            kept = cp.profiles.versions(name)
            version = kept[-2].version if len(kept) > 1 else kept[-1].version
        return cp.profiles.diff(name, other, version, to_version)

    @app.delete("/v1/hostprofiles/{name}", response_model=t.HostProfileDeleted,
                tags=["hostprofiles"])
    def delete_profile(name: str, who: admin) -> dict[str, Any]:
        """Delete a host profile no entitlement names (admin); ``default`` stays."""
        cp.profiles.delete(name)
        return {"name": name, "deleted": True}
