"""The allocator's in-memory machine index (paper section 2.3).

A write-through cache of every machine of the region, kept current by the Resource
Brokers' change notifications, plus what only the allocator knows: the resources
its placements have taken. Columnar (NumPy, one entry per machine), never a Python
object per machine, and partitioned so that one allocation does not scan the region:

* per entitlement, the set of its machines (``members``): a request scans only the
  machines of its own entitlement;
* the free pool, bucketed by (rack, shape): a *shape* is a machine type plus its
  exact resources and attributes, so every free machine of a bucket is as good as
  any other. Per fault-domain level there is a count matrix ``free_count[level]``
  of shape (domains, shapes): "which MSBs still have a free Skylake" is one slice,
  whatever the size of the region. Buckets are intrusive linked lists over two
  per-machine arrays, so adding and removing a machine is O(1).

A large entitlement (``IDLE_POOL_MIN`` machines or more) keeps its own pool of the
same kind: its *idle* members (available, no task) bucketed by (rack, shape) with
per-level counts, and the rest of its members (``busy``) in dense sets by free CPU
class (``BusySet``). Stacking reads the counts and scans only the busy members that
can still have room for the task, not the whole entitlement; both are kept up to
date on every binding, health and task change.

Only healthy machines are in the free pool. Each machine carries a generation that
changes whenever a property the allocator relies on changes (binding, health);
the job-level allocation cache compares generations to stay correct.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import numpy as np
import numpy.typing as npt

from plait.broker import FREE, BrokerChange, Region
from plait.errors import ValidationError
from plait.model.machine import MachineState
from plait.model.topology import DOMAIN_LEVELS, Fleet

I32 = npt.NDArray[np.int32]
I64 = npt.NDArray[np.int64]

HEALTHY, FAILED, MAINTENANCE = 0, 1, 2
STATE_CODES = {MachineState.HEALTHY: HEALTHY, MachineState.FAILED: FAILED,
               MachineState.MAINTENANCE: MAINTENANCE}
NONE = -1
#: an entitlement with at least this many machines keeps a pool of its idle members
IDLE_POOL_MIN = 4096


class MemberSet:
    """The machines of one entitlement: a dense array plus a position per machine."""

    __slots__ = ("_ids", "_pos", "machines_rru", "size")

    def __init__(self, pos: I32) -> None:
        self._ids = np.empty(16, np.int32)
        self._pos = pos  # region-wide, shared by every MemberSet
        self.size = 0
        #: total cpu (milli-RRU) of the member machines, for RRU quotas
        self.machines_rru = 0

    def add(self, machine: int, cpu: int) -> None:
        if self.size == self._ids.size:
            self._ids = np.concatenate((self._ids, np.empty(self._ids.size, np.int32)))
        self._ids[self.size] = machine
        self._pos[machine] = self.size
        self.size += 1
        self.machines_rru += cpu

    def remove(self, machine: int, cpu: int) -> None:
        p = int(self._pos[machine])
        last = int(self._ids[self.size - 1])
        self._ids[p] = last
        self._pos[last] = p
        self._pos[machine] = NONE
        self.size -= 1
        self.machines_rru -= cpu

    @property
    def ids(self) -> I32:
        return self._ids[: self.size]

    def __len__(self) -> int:
        return self.size

    def nbytes(self) -> int:
        return int(self._ids.nbytes)


class Pool:
    """Interchangeable machines by (rack, shape) bucket (``rack * n_shapes + shape``):
    the head of each bucket's list (the lists themselves are the index's shared
    ``_next`` / ``_prev`` arrays: a machine is in one pool at most) and, per
    fault-domain level, a (domains, shapes) count matrix."""

    __slots__ = ("count", "count_loc", "head")

    def __init__(self, n_buckets: int, shapes: dict[str, tuple[int, int]],
                 loc: dict[str, I32]) -> None:
        self.head = np.full(n_buckets, NONE, np.int32)
        self.count = {lvl: np.zeros(shape, np.int32) for lvl, shape in shapes.items()}
        #: (counts, domain code per machine) per level: per-machine updates without
        #: dictionary lookups
        self.count_loc = [(self.count[lvl], loc[lvl]) for lvl in shapes]

    def nbytes(self) -> int:
        return int(self.head.nbytes) + sum(int(c.nbytes) for c in self.count.values())


def cpu_class(free_cpu: int) -> int:
    """A busy machine's class: its free cpu's bit length (class ``c`` holds free cpu
    below ``2**c``), so the machines that may fit a task are whole classes."""
    return min(int(free_cpu).bit_length(), BusySet.CLASSES - 1)


class BusySet:
    """The busy members of a large entitlement (not idle: a task, or unavailable), in
    dense sets by ``cpu_class``; ``klass`` (the index's, shared) holds each machine's
    class, -1 outside every busy set."""

    CLASSES = 32

    __slots__ = ("_pos", "_sets", "klass")

    def __init__(self, pos: I32, klass: npt.NDArray[np.int8]) -> None:
        self._pos = pos
        self.klass = klass
        self._sets: list[MemberSet | None] = [None] * self.CLASSES

    def add(self, m: int, free_cpu: int) -> None:
        c = cpu_class(free_cpu)
        ms = self._sets[c]
        if ms is None:
            ms = self._sets[c] = MemberSet(self._pos)
        ms.add(m, 0)
        self.klass[m] = c

    def remove(self, m: int) -> None:
        ms = self._sets[int(self.klass[m])]
        assert ms is not None
        ms.remove(m, 0)
        self.klass[m] = -1

    def with_room(self, cpu: int) -> I32:
        """The machines that may have ``cpu`` free (their class reaches it)."""
        parts = [ms.ids for c, ms in enumerate(self._sets)
                 if ms is not None and ms.size and (1 << c) > cpu]
        if not parts:
            return np.empty(0, np.int32)
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    @property
    def ids(self) -> I32:
        return self.with_room(-1)

    def __len__(self) -> int:
        return sum(ms.size for ms in self._sets if ms is not None)

    def nbytes(self) -> int:
        return sum(ms.nbytes() for ms in self._sets if ms is not None)


class MachineIndex:
    """Columnar index of a region's machines; see the module docstring."""

    def __init__(self, fleet: Fleet, region: Region, idle_pool_min: int = IDLE_POOL_MIN) -> None:
        self.fleet = fleet
        #: the size from which an entitlement keeps a pool of its idle members
        self.idle_pool_min = idle_pool_min
        self.region = region
        n = len(fleet)
        # -- static columns (shared with the fleet table, not copied)
        self.total_cpu, self.total_mem, self.total_disk = fleet.cpu, fleet.memory, fleet.disk
        self.loc = fleet.codes  # level -> region-wide domain code per machine
        # -- shapes: machines that are interchangeable when free
        self.shape, self.shape_type, self.shape_units, self.shape_attrs = _shapes(fleet)
        n_shapes = self.shape_type.size
        self.n_types = len(fleet.type_names)
        # -- allocator-owned usage
        self.free_cpu = fleet.cpu.copy()
        self.free_mem = fleet.memory.copy()
        self.free_disk = fleet.disk.copy()
        self.tasks = np.zeros(n, np.int32)
        # -- write-through copy of the brokers' records
        self.ent = np.full(n, FREE, np.int32)
        self.version = np.zeros(n, np.int32)
        self.state = np.zeros(n, np.int8)
        #: maintenance announced and not started: no new work goes there
        self.cordoned = np.zeros(n, np.bool_)
        #: the host profile each machine carries (Sidekick switches it)
        self.profile = fleet.profile_code.copy()
        self.gen = np.zeros(n, np.uint32)
        #: the shape of an available machine (healthy, not cordoned), ``n_shapes`` for
        #: any other: "available and an allowed shape" is one lookup
        #: (``CompiledPolicy.usable``)
        self.hshape = np.zeros(n, np.int16)
        # -- partitions
        self._member_pos = np.full(n, NONE, np.int32)
        self.members: dict[int, MemberSet] = {}
        self.racks_of = _racks_of(fleet)
        #: per level, the DC that contains each domain
        self.dc_of = _dc_of(fleet)
        #: per level, a rank of each domain that alternates DCs (first domain of every
        #: DC, then the second of every DC, ...): placement's last tie-breaker
        self.interleave = {lvl: _interleave(fleet, lvl) for lvl in DOMAIN_LEVELS}
        self._pool_shapes = {lvl: (len(fleet.level_names[lvl]), n_shapes)
                             for lvl in DOMAIN_LEVELS}
        self._n_buckets = len(fleet.level_names["rack"]) * n_shapes
        self.free_pool = Pool(self._n_buckets, self._pool_shapes, self.loc)
        self.free_count = self.free_pool.count
        self._rack, self._n_shapes = self.loc["rack"], n_shapes
        self._head = self.free_pool.head
        self._next = np.full(n, NONE, np.int32)
        self._prev = np.full(n, NONE, np.int32)
        self._in_free = np.zeros(n, np.bool_)
        # -- large entitlements: idle members pooled, the others in a dense set
        #: entitlement code -> the pool of its idle members (large entitlements only)
        self.idle: dict[int, Pool] = {}
        #: entitlement code -> its members that are not idle (same entitlements)
        self.busy: dict[int, BusySet] = {}
        self._busy_pos = np.full(n, NONE, np.int32)
        self._busy_class = np.full(n, -1, np.int8)
        self._in_idle = np.zeros(n, np.bool_)
        #: static bins/cells per policy shape, built on first use (``policy.layout_of``)
        self.layouts: dict[tuple[object, ...], object] = {}
        #: bumped by every change a plan's commit would have to verify (binding,
        #: health, usage): a plan made since the last change cannot conflict
        self.changes = 0
        self._load(region)
        region.subscribe(self.on_change)

    # -- building ------------------------------------------------------------------------
    def _load(self, region: Region) -> None:
        fleet = self.fleet
        for broker in region.brokers.values():
            idx = broker.machines
            self.ent[idx] = broker.entitlement_codes()
            self.version[idx] = broker.versions()
            self.state[idx] = broker.state_codes()
            self.cordoned[idx] = broker.cordon_flags()
            for i in idx[self.ent[idx] != FREE].tolist():
                self._member(int(self.ent[i])).add(i, int(fleet.cpu[i]))
        available = (self.state == HEALTHY) & ~self.cordoned
        self.hshape[:] = np.where(available, self.shape, self._n_shapes)
        free = np.flatnonzero((self.ent == FREE) & available)
        self._bulk_add(self.free_pool, free)
        self._in_free[free] = True
        for code, members in list(self.members.items()):
            if members.size >= self.idle_pool_min:
                self._make_idle_pool(code)

    def _bulk_add(self, pool: Pool, machines: I64) -> None:
        """Put many machines in an empty pool at once (vectorised build)."""
        if machines.size == 0:
            return
        if not (machines[1:] > machines[:-1]).all():
            machines = np.sort(machines)
        n_shapes = self.shape_type.size
        s = self.shape[machines].astype(np.int64)
        bucket = self.loc["rack"][machines].astype(np.int64) * n_shapes + s
        # machines ascending, so a stable sort by bucket alone is the order of
        # lexsort((machines, bucket)); bucket numbers that fit 16 bits sort in O(n)
        order = np.argsort(bucket.astype(np.uint16) if self._head.size <= 2**16 else bucket,
                           kind="stable")
        m_sorted, b_sorted = machines[order].astype(np.int32), bucket[order]
        same = np.concatenate((b_sorted[1:] == b_sorted[:-1], [False]))
        self._next[m_sorted] = np.where(same, np.roll(m_sorted, -1), NONE)
        first = np.concatenate(([True], b_sorted[1:] != b_sorted[:-1]))
        self._prev[m_sorted] = np.where(first, NONE, np.roll(m_sorted, 1))
        pool.head[b_sorted[first]] = m_sorted[first]
        for lvl in DOMAIN_LEVELS:  # np.bincount: np.add.at is slow on a million machines
            counts = pool.count[lvl]
            cell = self.loc[lvl][machines].astype(np.int64) * n_shapes + s
            counts += np.bincount(cell, minlength=counts.size).reshape(counts.shape).astype(
                np.int32)

    def _member(self, code: int) -> MemberSet:
        members = self.members.get(code)
        if members is None:
            members = self.members[code] = MemberSet(self._member_pos)
        return members

    # -- pools --------------------------------------------------------------------------------
    def _pool_add(self, pool: Pool, m: int) -> None:
        s = int(self.shape[m])
        b = int(self._rack[m]) * self._n_shapes + s
        head = int(pool.head[b])
        self._next[m] = head
        self._prev[m] = NONE
        if head != NONE:
            self._prev[head] = m
        pool.head[b] = m
        for counts, loc in pool.count_loc:
            counts[loc[m], s] += 1

    def _pool_remove(self, pool: Pool, m: int) -> None:
        s = int(self.shape[m])
        b = int(self._rack[m]) * self._n_shapes + s
        prv, nxt = int(self._prev[m]), int(self._next[m])
        if prv != NONE:
            self._next[prv] = nxt
        else:
            pool.head[b] = nxt
        if nxt != NONE:
            self._prev[nxt] = prv
        self._next[m] = self._prev[m] = NONE
        for counts, loc in pool.count_loc:
            counts[loc[m], s] -= 1

    def _free_add(self, m: int) -> None:
        if self._in_free[m]:
            return
        self._pool_add(self.free_pool, m)
        self._in_free[m] = True

    def _free_remove(self, m: int) -> None:
        if not self._in_free[m]:
            return
        self._pool_remove(self.free_pool, m)
        self._in_free[m] = False

    def _make_idle_pool(self, code: int) -> None:
        """Split a large entitlement's members into its idle pool and busy set."""
        pool = self.idle[code] = Pool(self._n_buckets, self._pool_shapes, self.loc)
        busy = self.busy[code] = BusySet(self._busy_pos, self._busy_class)
        ids = self.members[code].ids
        idle = (self.tasks[ids] == 0) & (self.hshape[ids] != self._n_shapes)
        machines = np.sort(ids[idle]).astype(np.int64)
        self._bulk_add(pool, machines)
        self._in_idle[machines] = True
        for m in ids[~idle].tolist():
            busy.add(m, int(self.free_cpu[m]))

    def _sync_idle(self, m: int) -> None:
        """Move a member of a pooled entitlement between its idle pool and busy set as
        its task count and availability say."""
        code = int(self.ent[m])
        pool = self.idle.get(code)
        if pool is None:
            return
        idle = self.tasks[m] == 0 and self.hshape[m] != self._n_shapes
        if idle and not self._in_idle[m]:
            self.busy[code].remove(m)
            self._pool_add(pool, m)
            self._in_idle[m] = True
        elif not idle and self._in_idle[m]:
            self._pool_remove(pool, m)
            self._in_idle[m] = False
            self.busy[code].add(m, int(self.free_cpu[m]))
        elif not idle and self._busy_class[m] != cpu_class(int(self.free_cpu[m])):
            busy = self.busy[code]
            busy.remove(m)
            busy.add(m, int(self.free_cpu[m]))

    def _leave(self, code: int, m: int) -> None:
        """Machine ``m`` leaves entitlement ``code``."""
        cpu = int(self.total_cpu[m])
        self.members[code].remove(m, cpu)
        pool = self.idle.get(code)
        if pool is not None:
            if self._in_idle[m]:
                self._pool_remove(pool, m)
                self._in_idle[m] = False
            else:
                self.busy[code].remove(m)

    def _join(self, code: int, m: int) -> None:
        """Machine ``m`` joins entitlement ``code`` (as busy until ``_sync_idle``)."""
        members = self._member(code)
        members.add(m, int(self.total_cpu[m]))
        if code in self.busy:
            self.busy[code].add(m, int(self.free_cpu[m]))
        elif members.size >= self.idle_pool_min:
            self.ent[m] = code
            self._make_idle_pool(code)

    # -- task counts (the allocator's commits and loads go through these) ------------------
    # A pooled entitlement's member moves when its task count or free cpu changes: the
    # caller changes ``free_*`` first, then calls one of these.
    def add_tasks(self, machines: npt.NDArray[np.int64], counts: npt.NDArray[np.int64]) -> None:
        """``counts[k]`` more tasks on ``machines[k]`` (distinct machines)."""
        self.tasks[machines] += counts
        if self.idle:
            klass = self._busy_class[machines]
            fc = self.free_cpu[machines]
            # the class each machine should be in now (bit length of its free cpu)
            now = np.minimum(np.where(fc > 0, np.frexp(fc)[1], 0), BusySet.CLASSES - 1)
            moving = self._in_idle[machines] | ((klass >= 0) & (klass != now))
            for m in machines[moving].tolist():
                self._sync_idle(m)

    def add_task(self, m: int) -> None:
        self.tasks[m] += 1
        if self.idle:
            self._sync_idle(m)

    def remove_task(self, m: int) -> None:
        self.tasks[m] -= 1
        if self.idle:
            self._sync_idle(m)

    def is_idle(self, m: int) -> bool:
        """Is ``m`` in its (large) entitlement's idle pool?"""
        return bool(self._in_idle[m])

    def is_free(self, m: int) -> bool:
        return bool(self._in_free[m])

    def first_free(self, buckets: I64, skip: set[int], pool: Pool | None = None) -> int | None:
        """The first machine of ``pool`` (the free pool by default) not in ``skip``,
        walking the (rack, shape) buckets (``rack * n_shapes + shape``) in the given
        order, each most recently added first."""
        heads = (self._head if pool is None else pool.head)[buckets]
        heads = heads[heads != NONE]
        for at in range(0, heads.size, 16):  # usually the first bucket will do
            for m in heads[at:at + 16].tolist():
                while m != NONE:
                    if m not in skip:
                        return int(m)
                    m = int(self._next[m])
        return None

    def free_in_rack(self, rack: int, shape: int) -> Iterator[int]:
        """The free machines of one (rack, shape) bucket, most recently freed first."""
        m = int(self._head[rack * self.shape_type.size + shape])
        while m != NONE:
            yield m
            m = int(self._next[m])

    # -- broker notifications -----------------------------------------------------------------
    def on_change(self, change: BrokerChange) -> None:
        self.changes += 1
        m = change.machine
        code = FREE if change.entitlement is None else self.region.entitlements.code(
            change.entitlement)
        old = int(self.ent[m])
        if old != code:
            if old != FREE:
                self._leave(old, m)
            self.ent[m] = FREE
            if code != FREE:
                # out of the free pool before any other pool takes it (they share the
                # per-machine list arrays)
                self._free_remove(m)
                self._join(code, m)
            self.ent[m] = code
        state = STATE_CODES[change.state]
        self.state[m] = state
        self.cordoned[m] = change.cordoned
        available = state == HEALTHY and not change.cordoned
        self.hshape[m] = self.shape[m] if available else self._n_shapes
        self.version[m] = change.version
        self.gen[m] += 1
        if code == FREE and available and self.tasks[m] == 0:
            self._free_add(m)
        else:
            self._free_remove(m)
            if self.idle:
                self._sync_idle(m)

    # -- reading ------------------------------------------------------------------------------
    def machines_of(self, ent_code: int) -> I32:
        members = self.members.get(ent_code)
        return members.ids if members is not None else np.empty(0, np.int32)

    def nbytes(self) -> int:
        """Bytes held per the index: its own columns and partitions plus the fleet
        columns it reads (totals, domain codes)."""
        own: list[npt.NDArray[Any]] = [
            self.free_cpu, self.free_mem, self.free_disk, self.tasks, self.ent, self.version,
            self.state, self.cordoned, self.profile, self.gen, self.shape, self.hshape,
            self._member_pos, self._head, self._next, self._prev, self._in_free,
            self._busy_pos, self._busy_class, self._in_idle,
            *self.free_count.values(), *self.racks_of.values(),
            *self.dc_of.values(), *self.interleave.values(),
        ]
        read: list[npt.NDArray[Any]] = [
            self.total_cpu, self.total_mem, self.total_disk, *self.loc.values(),
        ]
        return (sum(int(a.nbytes) for a in own) + sum(int(a.nbytes) for a in read)
                + sum(ms.nbytes() for ms in self.members.values())
                + sum(ms.nbytes() for ms in self.busy.values())
                + sum(pool.nbytes() for pool in self.idle.values()))


def _shapes(fleet: Fleet) -> tuple[npt.NDArray[np.int16], npt.NDArray[np.int16],
                                   I64, list[dict[str, str]]]:
    """Group machines into shapes: same type, same resources, same attributes.

    Shapes are numbered in the lexicographic order of (type, cpu, memory, disk,
    attributes...), as ``np.unique(table, axis=0)`` would, but each column is
    factorised on its own and the codes combined into one integer key: no sort of
    a million table rows."""
    cols = [fleet.type_code.astype(np.int64), fleet.cpu.astype(np.int64),
            fleet.memory.astype(np.int64), fleet.disk.astype(np.int64)]
    keys = list(fleet.attributes)
    cols += [fleet.attributes[k][0].astype(np.int64) for k in keys]
    key, size = _factorize(cols[0])
    for col in cols[1:]:
        codes, card = _factorize(col)
        if size * card >= 2**62:  # keep the combined key in range: renumber it densely
            key, size = _factorize(key)
        key, size = key * card + codes, size * card
    inverse, n_shapes = _factorize(key)
    if n_shapes >= 2**15:
        raise ValidationError("machines", "too many distinct machine shapes (type, resources "
                              "and attributes) for the index: at most 32,767")
    first = np.empty(n_shapes, np.int64)
    first[inverse] = np.arange(inverse.size)  # any machine of a shape stands for it
    uniq = np.stack([c[first] for c in cols], axis=1)
    attrs: list[dict[str, str]] = []
    for row in uniq:
        a: dict[str, str] = {}
        for j, k in enumerate(keys):
            v = int(row[4 + j])
            if v >= 0:
                a[k] = fleet.attributes[k][1][v]
        attrs.append(a)
    return (inverse.astype(np.int16), uniq[:, 0].astype(np.int16),
            uniq[:, 1:4].astype(np.int64), attrs)


def _factorize(values: I64) -> tuple[I64, int]:
    """Dense codes of ``values`` in value order, and how many distinct values. A
    presence table when the values span a small range (no sort), else ``np.unique``."""
    if values.size == 0:
        return values, 0
    lo, hi = int(values.min()), int(values.max())
    if hi - lo <= 4 * values.size + 1024:
        present = np.zeros(hi - lo + 1, np.bool_)
        present[values - lo] = True
        code = np.cumsum(present, dtype=np.int64) - 1
        return code[values - lo], int(code[-1]) + 1
    uniq, inverse = np.unique(values, return_inverse=True)
    return inverse.reshape(-1).astype(np.int64), int(uniq.size)


def _racks_of(fleet: Fleet) -> dict[str, I32]:
    """Per level, the racks of each domain as a CSR pair: ``racks_of[lvl]`` holds rack
    codes grouped by domain, ``racks_of[lvl + '_start']`` the offsets."""
    n_rack = len(fleet.level_names["rack"])
    rack = np.arange(n_rack, dtype=np.int32)
    anc = {"rack": rack}
    anc["row"] = fleet.parent["rack"][rack]
    anc["msb"] = fleet.parent["row"][anc["row"]]
    anc["dc"] = fleet.parent["msb"][anc["msb"]]
    out: dict[str, I32] = {}
    for lvl in DOMAIN_LEVELS:
        order = np.argsort(anc[lvl], kind="stable").astype(np.int32)
        counts = np.bincount(anc[lvl], minlength=len(fleet.level_names[lvl]))
        out[lvl] = rack[order]
        out[lvl + "_start"] = np.concatenate(([0], np.cumsum(counts))).astype(np.int32)
    return out


def _dc_of(fleet: Fleet) -> dict[str, I32]:
    out = {"dc": np.arange(len(fleet.level_names["dc"]), dtype=np.int32)}
    for upper, lvl in itertools.pairwise(DOMAIN_LEVELS):
        out[lvl] = out[upper][fleet.parent[lvl]]
    return out


def _interleave(fleet: Fleet, level: str) -> I32:
    """A rank of each domain of ``level`` that alternates over every level above it:
    the first domain of every DC, then of every other MSB of each DC, ... (sorted by
    the domain's position under its parent, then its parent's under its own, ..., then
    its DC). At the MSB level, the first MSB of every DC, then the second of every DC;
    at the rack level, consecutive ranks are racks of different DCs, then MSBs, then
    rows: a spread over racks whose ties go by rank touches every MSB before it takes
    a second rack in one."""
    levels = DOMAIN_LEVELS[: DOMAIN_LEVELS.index(level) + 1]
    # per level down to ``level``: each domain's position among its parent's children
    local: dict[str, I64] = {"dc": np.arange(len(fleet.level_names["dc"]), dtype=np.int64)}
    for lvl in levels[1:]:
        parent = fleet.parent[lvl]
        order = np.argsort(parent, kind="stable")
        above = DOMAIN_LEVELS[DOMAIN_LEVELS.index(lvl) - 1]
        counts = np.bincount(parent, minlength=len(fleet.level_names[above]))
        starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
        pos = np.empty(parent.size, np.int64)
        pos[order] = np.arange(parent.size) - np.repeat(starts, counts)
        local[lvl] = pos
    # each domain of ``level``: its ancestors' positions, coarse to fine
    keys: list[I64] = []
    codes = np.arange(len(fleet.level_names[level]), dtype=np.int64)
    for lvl in reversed(levels):
        keys.append(local[lvl][codes])  # finest first: the primary key is the last
        if lvl != "dc":
            codes = fleet.parent[lvl][codes].astype(np.int64)
    # np.lexsort's last key is its primary one: the finest level's position first, the
    # DC last
    order = np.lexsort(list(reversed(keys)))
    rank = np.empty(codes.size, np.int32)
    rank[order] = np.arange(codes.size, dtype=np.int32)
    return rank
