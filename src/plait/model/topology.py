"""Fleet topology: a region's static machine table, and a generator for it.

A region holds up to a million machines, so the table is columnar (NumPy arrays, one
entry per machine), never a Python object per machine. ``Machine`` objects are
views built on demand. Fault-domain codes are region-wide integers: a rack code
names one rack of the region, and ``parent`` arrays map rack -> row -> msb -> dc.

``RegionSpec`` is the compact description a test, the simulator or a benchmark
writes (DCs, MSBs per DC, rows, racks, machines per rack, a mix of machine types);
``generate`` turns it into a ``Fleet`` in well under a second per 100K machines.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
import pydantic

from plait.errors import NotFound, ValidationError
from plait.model.base import Value
from plait.model.machine import FaultDomain, Machine, MachineState
from plait.model.resources import Resources

I32 = npt.NDArray[np.int32]
I16 = npt.NDArray[np.int16]

#: fault-domain levels below the region, outermost first.
DOMAIN_LEVELS = ("dc", "msb", "row", "rack")


class MachineType(Value):
    """A machine type (SKU) and its share of the fleet."""

    name: str
    resources: Resources
    weight: float = pydantic.Field(default=1.0, gt=0)


#: The paper's small machine (one CPU, 64 GB) in two generations.
DEFAULT_TYPES: tuple[MachineType, ...] = (
    MachineType(name="skylake", resources=Resources(cpu=16, memory_gb=64, disk_gb=1024)),
    MachineType(name="cooperlake", resources=Resources(cpu=16, memory_gb=64, disk_gb=1024)),
)


class RegionSpec(Value):
    name: str = "region1"
    dcs: int = pydantic.Field(default=2, ge=1, le=64)
    msbs_per_dc: int = pydantic.Field(default=4, ge=1, le=256)
    rows_per_msb: int = pydantic.Field(default=2, ge=1, le=256)
    racks_per_row: int = pydantic.Field(default=4, ge=1, le=1024)
    machines_per_rack: int = pydantic.Field(default=4, ge=1, le=1024)
    #: exact machine count; ``None`` = dcs * msbs * rows * racks * machines_per_rack.
    #: With a count, machines are dealt as evenly as possible over the racks.
    machines: int | None = pydantic.Field(default=None, ge=1, le=10_000_000)
    types: tuple[MachineType, ...] = DEFAULT_TYPES
    host_profile: str = "default"

    @pydantic.field_validator("types")
    @classmethod
    def _types(cls, value: tuple[MachineType, ...]) -> tuple[MachineType, ...]:
        if not value:
            raise ValueError("at least one machine type")
        if len({t.name for t in value}) != len(value):
            raise ValueError("machine type names must be unique")
        return value

    @property
    def racks(self) -> int:
        return self.dcs * self.msbs_per_dc * self.rows_per_msb * self.racks_per_row

    @property
    def machine_count(self) -> int:
        return self.machines if self.machines is not None else self.racks * self.machines_per_rack

    @classmethod
    def sized(cls, machines: int, dcs: int = 5, msbs_per_dc: int = 12, **kw: object) -> RegionSpec:
        """A region of exactly ``machines`` machines, about 40 per rack by default."""
        per_msb = max(1, machines // (dcs * msbs_per_dc))
        # about 40 machines a rack; more rows when a row would pass 1,024 racks
        rows = int(kw.pop("rows_per_msb", max(4, math.ceil(per_msb / 40 / 1024))))  # type: ignore[call-overload]
        racks_per_row = int(kw.pop("racks_per_row", max(1, round(per_msb / rows / 40))))  # type: ignore[call-overload]
        data: dict[str, object] = dict(
            dcs=dcs, msbs_per_dc=msbs_per_dc, rows_per_msb=rows, racks_per_row=racks_per_row,
            machines=machines, **kw,
        )
        from plait.model.base import parse

        return parse(cls, data)


@dataclass(eq=False)
class Fleet:
    """The static table of a region's machines (resources in index units)."""

    region: str
    type_names: list[str]
    type_code: I16
    cpu: I32  # milli-RRU
    memory: I32  # MB
    disk: I32  # MB
    #: per level: region-wide codes per machine, the code's name, and the parent code.
    codes: dict[str, I32]
    level_names: dict[str, list[str]]
    parent: dict[str, I32]
    profile_names: list[str]
    profile_code: I16
    #: attribute key -> (code per machine, -1 when absent; value names)
    attributes: dict[str, tuple[I32, list[str]]] = field(default_factory=dict)
    #: explicit machine ids; ``None`` means generated ids ``m0000000``...
    ids: list[str] | None = None
    _id_index: dict[str, int] | None = None

    def __len__(self) -> int:
        return int(self.cpu.shape[0])

    # -- ids ---------------------------------------------------------------------------
    def name(self, i: int) -> str:
        return self.ids[i] if self.ids is not None else f"m{i:07d}"

    def names(self, idx: Iterable[int]) -> list[str]:
        if self.ids is not None:
            ids = self.ids
            return [ids[i] for i in idx]
        return [f"m{i:07d}" for i in idx]

    def index_of(self, machine_id: str) -> int:
        if self.ids is not None:
            if self._id_index is None:
                self._id_index = {m: i for i, m in enumerate(self.ids)}
            found = self._id_index.get(machine_id)
        else:
            m = re.fullmatch(r"m(\d{7,})", machine_id)
            found = int(m.group(1)) if m and int(m.group(1)) < len(self) else None
            if found is not None and self.name(found) != machine_id:
                found = None  # "m00000001" is not another name of m0000001
        if found is None:
            raise NotFound("machine", machine_id)
        return found

    # -- views -------------------------------------------------------------------------
    def resources(self, i: int) -> Resources:
        return Resources(
            cpu=int(self.cpu[i]) / 1000, memory_gb=int(self.memory[i]) / 1024,
            disk_gb=int(self.disk[i]) / 1024,
        )

    def fault_domain(self, i: int) -> FaultDomain:
        parts = [self.level_names[lvl][int(self.codes[lvl][i])].rsplit("/", 1)[-1]
                 for lvl in DOMAIN_LEVELS]
        return FaultDomain(self.region, *parts)

    def machine(
        self, i: int, state: MachineState = MachineState.HEALTHY, entitlement: str | None = None,
        host_profile: str | None = None,
    ) -> Machine:
        attrs = {k: names[int(codes[i])] for k, (codes, names) in self.attributes.items()
                 if codes[i] >= 0}
        return Machine(
            id=self.name(i), type=self.type_names[int(self.type_code[i])],
            resources=self.resources(i), fault_domain=self.fault_domain(i), state=state,
            host_profile=host_profile or self.profile_names[int(self.profile_code[i])],
            entitlement=entitlement, attributes=attrs,
        )

    def level_code(self, level: str, name: str) -> int:
        """Code of a dc/msb/row/rack by its full path below the region ("dc1/msb2")."""
        try:
            return self.level_names[level].index(name)
        except ValueError:
            raise NotFound(level, name) from None

    def dc_code(self, dc: str) -> int:
        return self.level_code("dc", dc)

    # -- builders ----------------------------------------------------------------------
    @classmethod
    def from_machines(cls, machines: Sequence[Machine]) -> Fleet:
        """A fleet of explicit machines (tests, small real clusters)."""
        if not machines:
            raise ValidationError("machines", "a fleet needs at least one machine")
        regions = {m.fault_domain.region for m in machines}
        if len(regions) != 1:
            raise ValidationError("machines", f"machines of one region only, got {sorted(regions)}")
        ids = [m.id for m in machines]
        if len(set(ids)) != len(ids):
            raise ValidationError("machines", "machine ids must be unique")
        n = len(machines)
        type_names: list[str] = []
        profile_names: list[str] = []
        codes = {lvl: np.empty(n, np.int32) for lvl in DOMAIN_LEVELS}
        level_names: dict[str, list[str]] = {lvl: [] for lvl in DOMAIN_LEVELS}
        lookup: dict[str, dict[str, int]] = {lvl: {} for lvl in DOMAIN_LEVELS}
        parents: dict[str, list[int]] = {lvl: [] for lvl in DOMAIN_LEVELS}
        tcode = np.empty(n, np.int16)
        pcode = np.empty(n, np.int16)
        units = np.empty((n, 3), np.int64)
        attr_vals: dict[str, dict[str, int]] = {}
        attr_codes: dict[str, I32] = {}
        for i, m in enumerate(machines):
            fd = m.fault_domain
            path = ""
            parent = 0
            for lvl in DOMAIN_LEVELS:
                path = f"{path}/{getattr(fd, lvl)}" if path else getattr(fd, lvl)
                code = lookup[lvl].get(path)
                if code is None:
                    code = lookup[lvl][path] = len(level_names[lvl])
                    level_names[lvl].append(path)
                    parents[lvl].append(parent)
                codes[lvl][i] = code
                parent = code
            if m.type not in type_names:
                type_names.append(m.type)
            tcode[i] = type_names.index(m.type)
            if m.host_profile not in profile_names:
                profile_names.append(m.host_profile)
            pcode[i] = profile_names.index(m.host_profile)
            units[i] = m.resources.to_units()
            for key, val in m.attributes.items():
                vals = attr_vals.setdefault(key, {})
                if key not in attr_codes:
                    attr_codes[key] = np.full(n, -1, np.int32)
                attr_codes[key][i] = vals.setdefault(val, len(vals))
        if units.max() >= 2**31:
            raise ValidationError("resources", "a machine's resources exceed the index's range")
        return cls(
            region=regions.pop(), type_names=type_names, type_code=tcode,
            cpu=units[:, 0].astype(np.int32), memory=units[:, 1].astype(np.int32),
            disk=units[:, 2].astype(np.int32), codes=codes, level_names=level_names,
            parent={lvl: np.asarray(p, np.int32) for lvl, p in parents.items()},
            profile_names=profile_names, profile_code=pcode,
            attributes={k: (attr_codes[k], list(v)) for k, v in attr_vals.items()},
            ids=ids,
        )


def generate(spec: RegionSpec, seed: int = 0) -> Fleet:
    """Build a region from its compact description; deterministic for a seed.

    Racks are homogeneous (one machine type per rack, drawn by the types' weights),
    as they are in real data centers; every MSB still mixes types once it has more
    than a few racks.
    """
    rng = np.random.default_rng(seed)
    n_dc, n_msb = spec.dcs, spec.dcs * spec.msbs_per_dc
    n_row = n_msb * spec.rows_per_msb
    n_rack = n_row * spec.racks_per_row
    n = spec.machine_count
    # machines per rack, dealt as evenly as possible; the remainder goes round-robin
    # over the MSBs rather than piling up in the first ones
    base, extra = divmod(n, n_rack)
    per_rack = np.full(n_rack, base, np.int64)
    order = np.arange(n_rack).reshape(n_msb, -1).T.ravel()
    per_rack[order[:extra]] += 1
    rack = np.repeat(np.arange(n_rack, dtype=np.int32), per_rack)
    row = rack // spec.racks_per_row
    msb = row // spec.rows_per_msb
    dc = msb // spec.msbs_per_dc

    weights = np.array([t.weight for t in spec.types], float)
    rack_type = rng.choice(len(spec.types), size=n_rack, p=weights / weights.sum()).astype(np.int16)
    type_code = rack_type[rack]
    units = np.array([t.resources.to_units() for t in spec.types], np.int64)
    if units.max() >= 2**31:
        raise ValidationError("types", "a machine type's resources exceed the index's range")

    w_msb, w_row, w_rack = (len(str(x)) for x in
                            (spec.msbs_per_dc, spec.rows_per_msb, spec.racks_per_row))
    dc_names = [f"dc{d + 1}" for d in range(n_dc)]
    msb_names = [f"{dc_names[m // spec.msbs_per_dc]}/msb{m % spec.msbs_per_dc + 1:0{w_msb}d}"
                 for m in range(n_msb)]
    row_names = [f"{msb_names[r // spec.rows_per_msb]}/row{r % spec.rows_per_msb + 1:0{w_row}d}"
                 for r in range(n_row)]
    rack_names = [
        f"{row_names[k // spec.racks_per_row]}/rack{k % spec.racks_per_row + 1:0{w_rack}d}"
        for k in range(n_rack)
    ]
    return Fleet(
        region=spec.name,
        type_names=[t.name for t in spec.types],
        type_code=type_code,
        cpu=units[type_code, 0].astype(np.int32),
        memory=units[type_code, 1].astype(np.int32),
        disk=units[type_code, 2].astype(np.int32),
        codes={"dc": dc.astype(np.int32), "msb": msb.astype(np.int32),
               "row": row.astype(np.int32), "rack": rack},
        level_names={"dc": dc_names, "msb": msb_names, "row": row_names, "rack": rack_names},
        parent={
            "dc": np.zeros(n_dc, np.int32),
            "msb": (np.arange(n_msb) // spec.msbs_per_dc).astype(np.int32),
            "row": (np.arange(n_row) // spec.rows_per_msb).astype(np.int32),
            "rack": (np.arange(n_rack) // spec.racks_per_row).astype(np.int32),
        },
        profile_names=[spec.host_profile],
        profile_code=np.zeros(n, np.int16),
    )


def describe(fleet: Fleet) -> Mapping[str, object]:
    """A small summary for people: counts per level and per type."""
    counts = np.bincount(fleet.type_code, minlength=len(fleet.type_names))
    return {
        "region": fleet.region,
        "machines": len(fleet),
        **{f"{lvl}s": len(fleet.level_names[lvl]) for lvl in DOMAIN_LEVELS},
        "types": {name: int(c) for name, c in zip(fleet.type_names, counts, strict=True)},
        "rru": float(fleet.cpu.sum(dtype=np.int64)) / 1000,
    }
