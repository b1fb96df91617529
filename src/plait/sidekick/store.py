"""Host profiles in the store, with their versions (shell)::

    /hostprofiles/{name}   {"schema": 1, "name", "versions": [{"version", "created",
                                                              "spec"}, ...]}

Writing a profile whose settings differ from its current version's stores the next
version (the same spec again changes nothing: a write is idempotent); the last
``KEEP_VERSIONS`` versions are kept, for ``show --version`` and ``diff``. ``default``
exists without a record (version 1 sets nothing) until an admin writes it.
"""

from __future__ import annotations

import json
from typing import Any

from plait.errors import Conflict, NotFound, ValidationError
from plait.model.base import parse
from plait.model.entitlement import NAME_RE
from plait.model.hostprofile import DEFAULT_PROFILE, HostProfile, HostProfileSpec, default_profile
from plait.store.protocol import Namespace, Store

SCHEMA = 1
#: versions kept per profile
KEEP_VERSIONS = 20
_ATTEMPTS = 20


def _load(value: bytes) -> list[HostProfile]:
    data = json.loads(value)
    return [HostProfile(spec=parse(HostProfileSpec, v["spec"]), version=v["version"],
                        created=v.get("created", 0.0)) for v in data["versions"]]


def _dump(name: str, versions: list[HostProfile]) -> bytes:
    return json.dumps({"schema": SCHEMA, "name": name, "versions": [
        {"version": p.version, "created": p.created, "spec": p.spec.model_dump(mode="json")}
        for p in versions]}, sort_keys=True).encode()


class ProfileStore:
    def __init__(self, store: Store) -> None:
        self.ns = Namespace(store, "/hostprofiles")

    def _read(self, name: str) -> tuple[list[HostProfile], int | None]:
        """The stored versions of ``name``, oldest first, and the record's version
        (None: no record)."""
        if not NAME_RE.match(name):
            raise NotFound("host profile", name)  # no stored profile has such a name
        try:
            value, version = self.ns.get(f"/{name}")
        except NotFound:
            if name == DEFAULT_PROFILE:
                return [default_profile()], None
            raise NotFound("host profile", name) from None
        return _load(value), version

    def versions(self, name: str) -> list[HostProfile]:
        """Every kept version of a profile, oldest first."""
        return self._read(name)[0]

    def get(self, name: str, version: int | None = None) -> HostProfile:
        """The current version of a profile, or the one asked for."""
        kept = self.versions(name)
        if version is None:
            return kept[-1]
        for p in kept:
            if p.version == version:
                return p
        raise NotFound(f"host profile {name} version", str(version),
                       f"host profile {name!r} has no version {version} (kept: "
                       f"{', '.join(str(p.version) for p in kept)})")

    def names(self) -> list[str]:
        return sorted({*self.ns.children("/"), DEFAULT_PROFILE})

    def current(self) -> list[HostProfile]:
        """The current version of every profile, by name."""
        out = []
        for name in self.names():
            try:
                out.append(self.get(name))
            except NotFound:
                continue  # (deleted meanwhile)
        return out

    def put(self, spec: HostProfileSpec, now: float) -> tuple[HostProfile, bool]:
        """Store ``spec`` as its name's next version, unless its current version has
        the same settings. Returns the current version and whether it is new."""
        for _ in range(_ATTEMPTS):
            try:
                kept, record = self._read(spec.name)
            except NotFound:
                kept, record = [], None
            if kept and kept[-1].spec == spec:
                return kept[-1], False
            made = HostProfile(spec=spec, version=kept[-1].version + 1 if kept else 1,
                               created=now)
            value = _dump(spec.name, [*kept, made][-KEEP_VERSIONS:])
            try:
                if record is None:
                    self.ns.create(f"/{spec.name}", value)
                else:
                    self.ns.set(f"/{spec.name}", value, record)
            except Conflict:
                continue
            return made, True
        raise Conflict(f"host profile {spec.name}", "a quiet record",
                       "too many concurrent writers")

    def delete(self, name: str) -> None:
        if name == DEFAULT_PROFILE:
            raise ValidationError("name", "the default profile cannot be deleted")
        _, record = self._read(name)
        if record is not None:
            self.ns.delete(f"/{name}", record)


def wire(profile: HostProfile) -> dict[str, Any]:
    """A profile version as the API answers it."""
    return {"name": profile.name, "version": profile.version, "created": profile.created,
            **profile.spec.model_dump(mode="json", exclude={"name"})}
