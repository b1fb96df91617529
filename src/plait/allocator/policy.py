"""An allocation policy compiled against the index: the hard requirements become
masks over shapes and domains, the soft preferences a list of key components.

This is done once per distinct (policy, entitlement, task resources) and cached by
the allocator, so the per-request cost is a dictionary lookup. What depends only on
the fleet (the bins, their tie-break order, the free-pool cells of each bin in
best-fit order) is a ``Layout``, built once per index and shared by every compiled
policy with the same finest level, type split, DC pin and allowed shapes.
"""

from __future__ import annotations

from collections.abc import Mapping
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

I64 = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True, eq=False)
class Layout:
    """The bins of a policy and the free-pool cells of each bin; static.

    Bins are every (domain of the finest spread level [, machine type]) the policy
    can use, numbered ``p = 0..n_bins-1`` in tie-break order (interleaved over the
    DCs, see ``MachineIndex.interleave``); a bin without candidates at request time
    simply never enters the heap, so numbering all of them does not change the
    order of those that do. The cells of a bin are its (domain of ``level``, shape)
    count cells of ``free_count[level]``, in best-fit order (least cpu, then least
    memory, then domain, then shape: the order of the room left after a task of any
    size), so a request only reads their counts.
    """

    #: the level of ``free_count`` the cells read
    level: str
    n_bins: int
    #: ``list(range(n_bins))``
    bins: list[int]
    #: bin id (domain [* n_types + type]) -> p, -1 for a bin the policy cannot use
    pos: I64
    #: ``np.arange(n_bins + 1)``, to find each bin's slice of a sorted array at once
    edges: I64
    #: per spread key (a level up to the finest, or "type"): its code for each bin
    anc: dict[str, list[int]]
    #: the same as arrays
    anc_np: dict[str, I64]
    #: per cell, in (bin, best fit) order: flat index into ``free_count[level]``
    cell_flat: I64
    #: each bin's cells are ``[cell_lo[p], cell_hi[p])``
    cell_lo: I64
    cell_hi: I64
    cell_end: list[int]
    cell_dom: list[int]
    cell_shape: list[int]
    #: whole-machine cpu and memory of each cell's shape, as lists and as arrays
    #: with one trailing pad entry (so "no cell" indices stay in range)
    cell_cpu: list[int]
    cell_mem: list[int]
    #: whole-machine disk of each cell's shape
    cell_disk: list[int]
    cell_cpu_pad: I64
    cell_mem_pad: I64
    #: the racks of each domain of ``level`` (``MachineIndex.racks_of``), and the
    #: number of shapes: a cell's free-pool buckets are ``rack * n_shapes + shape``
    racks: npt.NDArray[np.int32]
    rack_start: npt.NDArray[np.int32]
    n_shapes: int
    #: cell -> its buckets, for the cells claimed from so far
    _buckets: dict[int, I64]

    def buckets(self, j: int) -> I64:
        """Cell ``j``'s free-pool buckets (``MachineIndex.first_free``): its domain's
        racks in rack order, for its shape."""
        found = self._buckets.get(j)
        if found is None:
            d = self.cell_dom[j]
            racks = self.racks[self.rack_start[d]:self.rack_start[d + 1]].astype(np.int64)
            found = self._buckets[j] = racks * self.n_shapes + self.cell_shape[j]
        return found


def layout_of(index: MachineIndex, finest: str | None, by_type: bool, dc: int | None,
              shapes: I64) -> Layout:
    """The shared ``Layout`` for these four, built on first use."""
    key = (finest, by_type, dc, shapes.tobytes())
    layout = index.layouts.get(key)
    if layout is None:
        layout = index.layouts[key] = _build_layout(index, finest, by_type, dc, shapes)
    assert isinstance(layout, Layout)
    return layout


def _build_layout(index: MachineIndex, finest: str | None, by_type: bool, dc: int | None,
                  shapes: I64) -> Layout:
    level = finest or "dc"
    n_types = index.n_types
    doms = np.arange(len(index.fleet.level_names[level]), dtype=np.int64)
    if dc is not None:
        doms = doms[index.dc_of[level] == dc]
    types = np.flatnonzero(np.bincount(index.shape_type[shapes], minlength=n_types))
    # -- bins: ids as placement numbers them, then the tie-break order ----------------
    bin_dom = doms if finest else np.zeros(1, np.int64)
    n_ids = (len(index.fleet.level_names[level]) if finest else 1) * (n_types if by_type else 1)
    if by_type:
        ids = (bin_dom[:, None] * n_types + types[None, :]).ravel()
        rank = index.interleave[finest][ids // n_types].astype(np.int64) * n_types + (
            ids % n_types) if finest else ids
    else:
        ids = bin_dom
        rank = index.interleave[finest][ids].astype(np.int64) if finest else ids
    ids = ids[np.argsort(rank, kind="stable")]
    n_bins = ids.size
    pos = np.full(n_ids, -1, np.int64)
    pos[ids] = np.arange(n_bins)
    loc, typ = (ids // n_types, ids % n_types) if by_type else (ids, np.zeros(n_bins, np.int64))
    anc: dict[str, list[int]] = {TYPE_KEY: typ.tolist()}
    if finest:
        for k in DOMAIN_LEVELS[: _DEPTH[finest] + 1]:
            codes = loc
            for lvl in reversed(DOMAIN_LEVELS[_DEPTH[k] + 1: _DEPTH[finest] + 1]):
                codes = index.fleet.parent[lvl][codes]
            anc[k] = codes.tolist()
    # -- cells: every (domain, allowed shape), grouped by bin, best fit first ------------
    cell_dom = np.repeat(doms, shapes.size)
    cell_shape = np.tile(shapes, doms.size)
    cell_bin = cell_dom if finest else np.zeros(cell_dom.size, np.int64)
    if by_type:
        cell_bin = cell_bin * n_types + index.shape_type[cell_shape]
    cell_p = pos[cell_bin]
    cpu, mem = index.shape_units[cell_shape, 0], index.shape_units[cell_shape, 1]
    order = np.lexsort((cell_shape, cell_dom, mem, cpu, cell_p))
    cell_dom, cell_shape, cell_p = cell_dom[order], cell_shape[order], cell_p[order]
    cpu, mem = cpu[order], mem[order]
    edges = np.arange(n_bins + 1)
    bounds = np.searchsorted(cell_p, edges)
    return Layout(
        level=level, n_bins=n_bins, bins=list(range(n_bins)), pos=pos, edges=edges, anc=anc,
        anc_np={k: np.asarray(v, np.int64) for k, v in anc.items()},
        cell_flat=cell_dom * index.shape_type.size + cell_shape,
        cell_lo=bounds[:-1], cell_hi=bounds[1:], cell_end=bounds[1:].tolist(),
        cell_dom=cell_dom.tolist(), cell_shape=cell_shape.tolist(),
        cell_cpu=cpu.tolist(), cell_mem=mem.tolist(),
        cell_disk=index.shape_units[cell_shape, 2].tolist(),
        cell_cpu_pad=np.append(cpu, 0), cell_mem_pad=np.append(mem, 0),
        racks=index.racks_of[level], rack_start=index.racks_of[level + "_start"],
        n_shapes=index.shape_type.size, _buckets={},
    )


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
    #: ``shape_ok`` indexed by ``MachineIndex.hshape`` (False for unhealthy machines)
    usable: npt.NDArray[np.bool_]
    #: pinned DC code, or None
    dc: int | None
    #: preference keys in order: a domain level ("msb"), "type", or "stack"; ends
    #: with "stack" (implicit when the policy does not list it)
    keys: tuple[str, ...]
    #: finest fault-domain level among the spread preferences, or None
    finest: str | None
    by_type: bool
    max_per_machine: int | None
    layout: Layout
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
        wanted_type = attrs.pop("type")
        if types and wanted_type not in types:
            impossible = (f"attribute type={wanted_type!r} contradicts machine_types "
                          f"{sorted(types)}")
        types = {wanted_type}
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
    matching = ok.copy()
    for r in range(3):
        ok &= units[:, r] - floor[r] >= need[r]
    if impossible is None and not ok.any():
        impossible = _never_fits(units, matching, need, floor, types, attrs)

    dc: int | None = None
    if impossible is not None:
        pass
    elif len(dc_names) > 1:
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
    shapes = np.flatnonzero(ok)
    by_type = TYPE_KEY in keys
    return CompiledPolicy(
        ent_code=ent_code, need=need, floor=floor, shape_ok=ok, shapes=shapes,
        usable=np.append(ok, False), dc=dc,
        keys=tuple(keys),
        finest=finest, by_type=by_type, max_per_machine=req.max_tasks_per_machine,
        layout=layout_of(index, finest, by_type, dc, shapes), impossible=impossible,
    )


#: how the reason starts when no machine of the region could ever take a task
#: (``plait.client.status.NEVER_FITS``: ``plait job deploy --wait`` stops on it)
NEVER_FITS = "no machine of the region "


def _never_fits(units: npt.NDArray[np.int64], matching: npt.NDArray[np.bool_],
                need: tuple[int, int, int], floor: tuple[int, int, int],
                types: set[str], attributes: Mapping[str, object]) -> str:
    """Why no machine of the region could ever take one task (no allowed machine shape
    is big enough, or none matches the requirements): what the task waits for is not
    room, but a machine that does not exist."""
    if not matching.any():
        wanted = ([f"type in {sorted(types)}"] if types else []) + [
            f"{k}={v!r}" for k, v in sorted(attributes.items())]
        return (f"{NEVER_FITS}matches the requirements "
                f"({', '.join(wanted) or 'its shapes'}): the task cannot be placed until "
                "such machines join")
    biggest = units[matching].max(axis=0)
    labels = (("cpu", 1000, ""), ("memory", 1024, " GB"), ("disk", 1024, " GB"))
    short = [f"{name} {(need[r] + floor[r]) / per:g}{unit}"
             + (f" ({need[r] / per:g} + {floor[r] / per:g} kept free)" if floor[r] else "")
             + f" > the largest machine's {int(biggest[r]) / per:g}{unit}"
             for r, (name, per, unit) in enumerate(labels)
             if need[r] + floor[r] > biggest[r]]
    if not short:  # each resource fits some machine, but no one machine has them all
        short = ["no single machine has all of "
                 + ", ".join(f"{name} {(need[r] + floor[r]) / per:g}{unit}"
                             for r, (name, per, unit) in enumerate(labels) if need[r])]
    return f"{NEVER_FITS}is big enough for one task: {'; '.join(short)}"
