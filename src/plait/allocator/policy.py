"""An allocation policy compiled against the index: the hard requirements become
masks over shapes and domains, the soft preferences a list of key components.

This is done once per distinct (policy, entitlement, task resources) and cached by
the allocator, so the per-request cost is a dictionary lookup.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from plait.allocator.index import MachineIndex
from plait.errors import NotFound, ValidationError
from plait.model.entitlement import Entitlement
from plait.model.policy import AllocationPolicy, Property, Strategy
from plait.model.resources import Resources
from plait.model.topology import DOMAIN_LEVELS

#: fault-domain levels from coarse to fine
_DEPTH = {lvl: k for k, lvl in enumerate(DOMAIN_LEVELS)}
STACK_KEY = "stack"
TYPE_KEY = "type"


@dataclass(frozen=True, slots=True)
class CompiledPolicy:
    ent_code: int
    #: per-task need and the floor the machine must keep, in index units
    need: tuple[int, int, int]
    floor: tuple[int, int, int]
    #: per shape: allowed type, matching attributes, and a whole machine fits a task
    shape_ok: npt.NDArray[np.bool_]
    #: the indices of the allowed shapes
    shapes: npt.NDArray[np.int64]
    #: pinned DC code, or None
    dc: int | None
    #: preference keys in order: a domain level ("msb"), "type", or "stack"; ends
    #: with "stack" (implicit when the policy does not list it)
    keys: tuple[str, ...]
    #: finest fault-domain level among the spread preferences, or None
    finest: str | None
    by_type: bool
    max_per_machine: int | None
    #: a reason when nothing can ever fit (e.g. conflicting DC pins)
    impossible: str | None = None


def compile_policy(
    index: MachineIndex, entitlement: Entitlement, ent_code: int, policy: AllocationPolicy,
    resources: Resources,
) -> CompiledPolicy:
    fleet = index.fleet
    req = policy.requirements
    need = resources.to_units()
    floor = req.min_free.to_units() if req.min_free is not None else (0, 0, 0)
    impossible: str | None = None

    # -- hard requirements over shapes: type, attributes, a whole machine fits ----------
    ok = np.ones(index.shape_type.size, np.bool_)
    types = set(req.machine_types)
    attrs = dict(req.attributes)
    if "type" in attrs:
        types = types & {attrs["type"]} if types else {attrs.pop("type")}
        attrs.pop("type", None)
    if types:
        known = set(fleet.type_names)
        allowed = [fleet.type_names.index(t) for t in types if t in known]
        ok &= np.isin(index.shape_type, np.asarray(allowed, np.int16))
    dc_names = {d for d in (entitlement.pin_dc, req.dc, attrs.pop("dc", None)) if d is not None}
    for key in ("msb", "row", "rack"):
        if key in attrs:
            raise ValidationError(f"policy.requirements.attributes.{key}",
                                  "only dc and type can be required among the fault-domain "
                                  "properties; use spread preferences below a DC")
    for key, value in attrs.items():
        ok &= np.array([a.get(key) == value for a in index.shape_attrs], np.bool_)
    units = index.shape_units
    for r in range(3):
        ok &= units[:, r] - floor[r] >= need[r]

    dc: int | None = None
    if len(dc_names) > 1:
        impossible = f"conflicting data center pins {sorted(dc_names)}"
    elif dc_names:
        name = dc_names.pop()
        try:
            dc = fleet.dc_code(name)
        except NotFound:
            impossible = f"data center {name!r} does not exist in region {fleet.region}"

    # -- soft preferences -----------------------------------------------------------------
    prefs = policy.preferences
    if prefs is None:
        prefs = entitlement.default_preferences
    keys: list[str] = []
    for pref in prefs:
        if pref.strategy is Strategy.STACK:
            keys.append(STACK_KEY)
        elif pref.property is Property.TYPE:
            keys.append(TYPE_KEY)
        else:
            keys.append(pref.property.value)
    if STACK_KEY not in keys:
        keys.append(STACK_KEY)
    domain_keys = [k for k in keys if k in _DEPTH]
    finest = max(domain_keys, key=_DEPTH.__getitem__) if domain_keys else None
    return CompiledPolicy(
        ent_code=ent_code, need=need, floor=floor, shape_ok=ok, shapes=np.flatnonzero(ok), dc=dc,
        keys=tuple(keys),
        finest=finest, by_type=TYPE_KEY in keys, max_per_machine=req.max_tasks_per_machine,
        impossible=impossible,
    )


def ancestor(index: MachineIndex, level: str, code: int, up_to: str) -> int:
    """The code of the ``up_to`` domain that contains domain ``code`` of ``level``."""
    parent = index.fleet.parent
    depth = _DEPTH[level]
    while depth > _DEPTH[up_to]:
        code = int(parent[DOMAIN_LEVELS[depth]][code])
        depth -= 1
    return code
