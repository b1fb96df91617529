"""Host profiles (paper section 2.6): a named, versioned set of host settings that
every machine of an entitlement carries, switched by Sidekick when a machine joins.

``HostProfileSpec`` is what an admin writes; the store gives each distinct spec of a
name the next version (``HostProfile``). ``default`` always exists: version 1 of it
sets nothing (a free machine carries it), and an admin may give it settings like any
other profile. ``diff`` says what changes between two specs, setting by setting, and
``kinds_changed`` which kinds of setting (what a switch costs depends on them:
turbo is quick, hugepages are slow).
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal

import pydantic

from plait.model.base import Value
from plait.model.entitlement import check_name

#: the profile a machine carries while free, and an entitlement's unless it names one
DEFAULT_PROFILE = "default"

#: a kernel parameter as sysctl names it (``net.core.somaxconn``, ``vm.nr_hugepages``)
SYSCTL_RE = re.compile(r"^[a-z0-9_]+(\.[A-Za-z0-9_-]+)+\Z")
#: a NIC setting's name (``mtu``, ``rx_ring``, ``gro``) and a filesystem label
KEY_RE = re.compile(r"^[a-z][a-z0-9_.-]{0,63}\Z")
FS_LABEL_RE = re.compile(r"^[A-Za-z0-9_.-]{1,16}\Z")
#: the cgroup v2 controllers a profile may ask enabled for tasks
CgroupController = Literal["cpu", "cpuset", "io", "memory", "pids", "hugetlb", "rdma",
                           "misc"]

MAX_SETTINGS = 256  # sysctls, and NIC settings
MAX_VALUE = 256  # characters of one setting's value
MAX_USER_BYTES = 16 * 1024  # the user settings, as JSON
MAX_USER_DEPTH = 32  # lists and objects within each other


def _depth(value: Any) -> int:
    """How deep lists and objects nest in ``value`` (0 for a scalar), without
    recursion: a body the API takes can nest thousands deep."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            item = list(item.values())
        if isinstance(item, list):
            deepest = max(deepest, depth + 1)
            if deepest > MAX_USER_DEPTH:
                return deepest
            stack.extend((v, depth + 1) for v in item)
    return deepest

#: the kinds of setting, in the order ``kinds_changed`` lists them
KINDS = ("sysctls", "cgroup_controllers", "turbo", "hugepages", "fs_label", "nic", "user")


def _check_settings(values: dict[str, str], name_re: re.Pattern[str],
                    what: str) -> dict[str, str]:
    if len(values) > MAX_SETTINGS:
        raise ValueError(f"at most {MAX_SETTINGS} {what}, not {len(values)}")
    for key, value in values.items():
        if not name_re.match(key):
            raise ValueError(f"{key!r} is not a valid {what[:-1]} name")
        if len(value) > MAX_VALUE or "\n" in value:
            raise ValueError(f"{key}: a value is one line of at most {MAX_VALUE} characters")
    return dict(sorted(values.items()))


class HostProfileSpec(Value):
    """The settings of one host profile, as an admin writes them. Unset settings are
    left as the machine has them."""

    #: the profile's name (the rules of an entitlement's)
    name: str
    #: what the profile is for
    description: str = pydantic.Field(default="", max_length=256)
    #: kernel parameters written under /proc/sys (``vm.swappiness: "10"``)
    sysctls: dict[str, str] = pydantic.Field(default_factory=dict)
    #: cgroup v2 controllers enabled for the machine's tasks
    cgroup_controllers: tuple[CgroupController, ...] = ()
    #: CPU turbo on or off (None: as the machine has it)
    turbo: bool | None = None
    #: 2 MB and 1 GB hugepages reserved
    hugepages_2m: int = pydantic.Field(default=0, ge=0, le=10_000_000)
    hugepages_1g: int = pydantic.Field(default=0, ge=0, le=100_000)
    #: the label of the filesystem tasks' data lives on (None: as it is)
    fs_label: str | None = None
    #: NIC settings (``mtu: "9000"``, ``gro: "off"``)
    nic: dict[str, str] = pydantic.Field(default_factory=dict)
    #: free-form settings for a user's applier (the ``script`` applier gets them)
    user: dict[str, Any] = pydantic.Field(default_factory=dict)

    _name = pydantic.field_validator("name")(check_name)

    @pydantic.field_validator("sysctls")
    @classmethod
    def _sysctls(cls, values: dict[str, str]) -> dict[str, str]:
        return _check_settings(values, SYSCTL_RE, "sysctls")

    @pydantic.field_validator("nic")
    @classmethod
    def _nic(cls, values: dict[str, str]) -> dict[str, str]:
        return _check_settings(values, KEY_RE, "nic settings")

    @pydantic.field_validator("cgroup_controllers")
    @classmethod
    def _controllers(cls, values: tuple[str, ...]) -> tuple[str, ...]:
        if len(set(values)) != len(values):
            raise ValueError("a controller is listed twice")
        return tuple(sorted(values))

    @pydantic.field_validator("fs_label")
    @classmethod
    def _label(cls, value: str | None) -> str | None:
        if value is not None and not FS_LABEL_RE.match(value):
            raise ValueError(f"{value!r} is not a filesystem label (1-16 of A-Z a-z 0-9 . _ -)")
        return value

    @pydantic.field_validator("user")
    @classmethod
    def _user(cls, values: dict[str, Any]) -> dict[str, Any]:
        if _depth(values) > MAX_USER_DEPTH:
            raise ValueError(f"user settings are nested more than {MAX_USER_DEPTH} deep")
        size = len(json.dumps(values, sort_keys=True))
        if size > MAX_USER_BYTES:
            raise ValueError(f"user settings are {size:,} bytes of JSON; at most "
                             f"{MAX_USER_BYTES:,}")
        return values

    def __hash__(self) -> int:  # (dict fields: hashed by their JSON)
        return hash(self.model_dump_json())

    def settings(self) -> dict[str, Any]:
        """The settings alone (no name or description), as JSON data: what an applier
        gets and what a version compares."""
        data = self.model_dump(mode="json")
        del data["name"], data["description"]
        return data


class HostProfile(Value):
    """One version of a profile."""

    spec: HostProfileSpec
    #: 1 for the first spec of a name, +1 for each different one after
    version: int = pydantic.Field(ge=1)
    #: when the version was written (control-plane clock)
    created: float = 0.0

    @property
    def name(self) -> str:
        return self.spec.name

    def wire(self) -> dict[str, Any]:
        """What an agent gets with its desired set."""
        return {"name": self.spec.name, "version": self.version,
                "settings": self.spec.settings()}


def default_profile() -> HostProfile:
    """Version 1 of ``default``: it sets nothing."""
    return HostProfile(spec=HostProfileSpec(name=DEFAULT_PROFILE), version=1)


class Change(Value):
    """One setting that differs between two profiles (None: not set on that side)."""

    setting: str
    old: Any = None
    new: Any = None


def _flat(spec: HostProfileSpec) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in spec.settings().items():
        if isinstance(value, dict):
            for k, v in value.items():
                out[f"{key}.{k}"] = v
        else:
            out[key] = value
    return out


def diff(old: HostProfileSpec, new: HostProfileSpec) -> list[Change]:
    """Every setting that differs, by name (``sysctls.vm.swappiness``, ``turbo``,
    ``user.tier``), in name order. Unset and empty are the same."""
    a, b = _flat(old), _flat(new)
    empty: tuple[Any, ...] = (None, 0, (), [], {})
    changes = []
    for key in sorted(set(a) | set(b)):
        x, y = a.get(key), b.get(key)
        if x != y and not (x in empty and y in empty):
            changes.append(Change(setting=key, old=x, new=y))
    return changes


def kinds_changed(old: HostProfileSpec | None, new: HostProfileSpec) -> list[str]:
    """The kinds of setting (``KINDS``) a switch from ``old`` to ``new`` changes; every
    kind ``new`` sets when ``old`` is unknown (None)."""
    changes = diff(HostProfileSpec(name=new.name) if old is None else old, new)
    seen = set()
    for c in changes:
        head = c.setting.split(".", 1)[0]
        seen.add("hugepages" if head.startswith("hugepages") else head)
    return [k for k in KINDS if k in seen]
