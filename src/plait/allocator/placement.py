"""Placement: decide where a request's tasks go. A pure function of the index.

The pipeline, one concern per stage:

1. **sort the request** into tasks to keep (already on a usable machine), to free,
   and to place (new, or moved off a machine they can no longer use);
2. **hard requirements** rule machines out: over the entitlement's own machines a
   vectorised mask (health, shape, DC pin, room for one more task), over the free
   pool a mask over (domain, shape) count cells; what is left is grouped into
   *bins*, one per value of the finest spread property;
3. **soft preferences** rank the bins: the key of a bin is, in preference order,
   the job's task count in the bin's domain for each ``spread``, and the bin's best
   machine for ``stack`` (a machine already in the entitlement before a free one,
   then best fit: least room left after the task). Stack is always the last
   tie-breaker, so an allocation never claims a machine it does not need;
4. **greedy assignment**: each task goes to the bin with the least key (a lazy
   heap: keys only grow, except the popped bin's, which is re-pushed), onto that
   bin's best machine; free machines are claimed only within the quota.

Nothing is written: the result is a ``Plan`` that the allocator commits with
optimistic concurrency.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field

import numpy as np

from plait.allocator.index import HEALTHY, MachineIndex
from plait.allocator.policy import STACK_KEY, TYPE_KEY, CompiledPolicy
from plait.allocator.request import AllocationRequest, TaskOp
from plait.model.entitlement import Quota
from plait.model.topology import DOMAIN_LEVELS

NO_MACHINE = "no machine satisfies the hard requirements with room for the task"
BIG = 1 << 30


@dataclass(slots=True)
class JobState:
    """The allocator's record of one job: where each task sits and what it holds."""

    entitlement: int
    placement: dict[int, int] = field(default_factory=dict)
    units: dict[int, tuple[int, int, int]] = field(default_factory=dict)


@dataclass(slots=True)
class Plan:
    request: AllocationRequest
    policy: CompiledPolicy
    ent_code: int
    keep: list[tuple[int, int]] = field(default_factory=list)
    assign: list[tuple[int, int]] = field(default_factory=list)
    frees: list[tuple[int, int]] = field(default_factory=list)
    moved: list[int] = field(default_factory=list)
    #: (machine, broker record version seen) for machines to claim from the free pool
    claims: list[tuple[int, int]] = field(default_factory=list)
    unplaced: list[tuple[int, str]] = field(default_factory=list)


def usable(index: MachineIndex, cp: CompiledPolicy, m: int) -> bool:
    """Can a task already on machine ``m`` stay there under this policy?"""
    return bool(
        index.state[m] == HEALTHY and index.ent[m] == cp.ent_code
        and cp.shape_ok[index.shape[m]]
        and (cp.dc is None or index.loc["dc"][m] == cp.dc)
    )


def propose(
    index: MachineIndex, cp: CompiledPolicy, quota: Quota, job: JobState | None,
    request: AllocationRequest,
) -> Plan:
    """Decide a placement for ``request``. Pure: reads the index, writes nothing."""
    plan = Plan(request, cp, cp.ent_code)
    placement = job.placement if job is not None else {}
    to_place: list[int] = []
    for t, op in request.tasks:
        m = placement.get(t)
        if op is TaskOp.FREE:
            if m is not None:
                plan.frees.append((t, m))
        elif m is None:
            to_place.append(t)
        elif job is not None and job.units[t] == cp.need and usable(index, cp, m):
            plan.keep.append((t, m))
        else:
            plan.frees.append((t, m))
            plan.moved.append(t)
            to_place.append(t)
    if not to_place:
        return plan
    if cp.impossible:
        plan.unplaced = [(t, cp.impossible) for t in to_place]
        return plan
    _Placer(index, cp, quota, placement, plan).run(to_place)
    return plan


class _Placer:
    """One proposal's working state. Bins are numbered 0..B-1; per bin the
    candidates are slices of flat lists (entitlement machines in stack order, then
    free-pool cells in best-fit order), built with NumPy for all bins at once."""

    def __init__(self, index: MachineIndex, cp: CompiledPolicy, quota: Quota,
                 placement: dict[int, int], plan: Plan) -> None:
        self.ix, self.cp, self.plan = index, cp, plan
        leaving = {t for t, _ in plan.frees}
        if leaving:
            remaining = [m for t, m in placement.items() if t not in leaving]
        else:
            remaining = list(placement.values())
        self.remaining = np.asarray(remaining, np.int64)
        members = index.members.get(cp.ent_code)
        self.ent_machines = members.size if members else 0
        self.ent_rru = members.machines_rru if members else 0
        self.quota_machines = quota.machines
        self.quota_rru = None if quota.rru is None else round(quota.rru * 1000)
        self.claimed_rru = 0
        self.quota_blocked = False
        self.taken: set[int] = set()
        self.spread = [k for k in cp.keys if k != STACK_KEY]
        self.stack_at = cp.keys.index(STACK_KEY)
        self.n_types = index.n_types
        self.counts: list[dict[int, int]] = [self._count(k) for k in self.spread]
        self.simple = len(self.spread) == 1 and self.stack_at == 1
        #: bumped whenever a change can alter the key of a bin other than the one
        #: just placed into (shared ancestors, quota); heap entries of an older
        #: epoch are re-keyed before use
        self.epoch = 0
        self.shared_counts = len(self.spread) > 1 or (
            len(self.spread) == 1 and self.spread[0] == TYPE_KEY and cp.finest is not None)

    # -- stage 2: candidates grouped into bins ----------------------------------------------
    def _count(self, key: str) -> dict[int, int]:
        """The job's remaining tasks per domain (or type) of one spread property."""
        if self.remaining.size == 0:
            return {}
        codes: np.ndarray
        if key == TYPE_KEY:
            codes = self.ix.shape_type[self.ix.shape[self.remaining]]
        else:
            codes = self.ix.loc[key][self.remaining]
        uniq, cnt = count_sorted(codes)
        return dict(zip(uniq.tolist(), cnt.tolist(), strict=True))

    def _entitlement_candidates(self) -> np.ndarray:
        """Bin per candidate; fills the flat candidate lists (stack order per bin)."""
        ix, cp = self.ix, self.cp
        nc, nm, nd = cp.need
        E = ix.machines_of(cp.ent_code)
        self.m: list[int] = []
        self.cap: list[int] = []
        self.fc: list[int] = []
        self.fm: list[int] = []
        if E.size == 0:
            return np.empty(0, np.int64)
        ok = (ix.state[E] == HEALTHY) & cp.shape_ok[ix.shape[E]]
        if cp.dc is not None:
            ok &= ix.loc["dc"][E] == cp.dc
        cap = np.full(E.size, BIG, np.int64)
        for free, need, floor in ((ix.free_cpu, nc, cp.floor[0]), (ix.free_mem, nm, cp.floor[1]),
                                  (ix.free_disk, nd, cp.floor[2])):
            if need > 0:
                np.minimum(cap, (free[E].astype(np.int64) - floor) // need, out=cap)
            elif floor > 0:
                cap[free[E] < floor] = 0
        if cp.max_per_machine is not None:
            np.minimum(cap, cp.max_per_machine - self._on_machine(E), out=cap)
        ok &= cap > 0
        C = E[ok].astype(np.int64)
        if C.size == 0:
            return np.empty(0, np.int64)
        cap = cap[ok]
        fc = ix.free_cpu[C].astype(np.int64)
        fm = ix.free_mem[C].astype(np.int64)
        b = self._bin_of_machines(C)
        order = np.lexsort((C, fm, fc, b))
        self.m, self.cap = C[order].tolist(), cap[order].tolist()
        self.fc, self.fm = fc[order].tolist(), fm[order].tolist()
        return b[order]

    def _free_cells(self) -> np.ndarray:
        """Bin per free-pool cell; fills the flat cell lists (best fit per bin)."""
        ix, cp = self.ix, self.cp
        self.cell_dom: list[int] = []
        self.cell_shape: list[int] = []
        self.cell_avail: list[int] = []
        self.cell_head: list[tuple[int, ...]] = []
        empty = np.empty(0, np.int64)
        level = cp.finest or "dc"
        shapes = cp.shapes
        if shapes.size == 0:
            return empty
        cells = ix.free_count[level][:, shapes]
        if cp.dc is not None:
            cells = cells * (ix.dc_of[level] == cp.dc)[:, None]
        dom, col = np.nonzero(cells)
        if dom.size == 0:
            return empty
        shape = shapes[col]
        avail = cells[dom, col]
        nc, nm, _ = cp.need
        lc = ix.shape_units[shape, 0] - nc
        lm = ix.shape_units[shape, 1] - nm
        b = dom.astype(np.int64) if cp.finest else np.zeros(dom.size, np.int64)
        if cp.by_type:
            b = b * self.n_types + ix.shape_type[shape]
        order = np.lexsort((shape, dom, lm, lc, b))
        self.cell_dom, self.cell_shape = dom[order].tolist(), shape[order].tolist()
        self.cell_avail = avail[order].tolist()
        self.cell_head = list(zip(itertools.repeat(1), lc[order].tolist(), lm[order].tolist(),
                                  strict=False))
        return b[order]

    def _on_machine(self, machines: np.ndarray) -> np.ndarray:
        """How many of the job's remaining tasks sit on each of ``machines``."""
        if self.remaining.size == 0:
            return np.zeros(machines.size, np.int64)
        uniq, cnt = count_sorted(self.remaining)
        pos = np.minimum(np.searchsorted(uniq, machines), uniq.size - 1)
        return np.where(uniq[pos] == machines, cnt[pos], 0)

    def _bin_of_machines(self, machines: np.ndarray) -> np.ndarray:
        cp, ix = self.cp, self.ix
        b = (ix.loc[cp.finest][machines].astype(np.int64) if cp.finest
             else np.zeros(machines.size, np.int64))
        if cp.by_type:
            b = b * self.n_types + ix.shape_type[ix.shape[machines]]
        return b

    def _interleave_rank(self, bins: np.ndarray) -> np.ndarray:
        cp = self.cp
        if cp.finest is None:
            return bins
        if cp.by_type:
            loc, typ = np.divmod(bins, self.n_types)
            ranked: np.ndarray = self.ix.interleave[cp.finest][loc].astype(np.int64)
            return ranked * self.n_types + typ
        rank: np.ndarray = self.ix.interleave[cp.finest][bins]
        return rank

    def _build(self) -> None:
        ent_bins = self._entitlement_candidates()
        cell_bins = self._free_cells()
        bins = _sorted_union(ent_bins, cell_bins)
        # bins are numbered in interleaved order (the first MSB of every DC, then the
        # second of every DC, ...): the last tie-breaker spreads over DCs too
        bins = bins[np.argsort(self._interleave_rank(bins), kind="stable")]
        self.bin_ids: list[int] = bins.tolist()
        nb = bins.size
        # per bin: [start, end) into the candidate lists and into the cell lists
        e_lo = np.searchsorted(ent_bins, bins, "left")
        e_hi = np.searchsorted(ent_bins, bins, "right")
        c_lo = np.searchsorted(cell_bins, bins, "left")
        c_hi = np.searchsorted(cell_bins, bins, "right")
        self.ptr: list[int] = e_lo.tolist()
        self.end: list[int] = e_hi.tolist()
        self.sptr: list[int] = c_lo.tolist()
        self.send: list[int] = c_hi.tolist()
        self.used = [0] * len(self.m)
        #: machines claimed during this proposal, per bin: [machine, cap, used, fc, fm]
        self.claimed: dict[int, list[int]] = {}
        # ancestors of every bin for each spread key
        cp = self.cp
        if cp.by_type:
            loc, typ = np.divmod(bins, self.n_types)
        else:
            loc, typ = bins, np.zeros(nb, np.int64)
        self.anc: list[list[int]] = []
        for k in self.spread:
            if k == TYPE_KEY:
                self.anc.append(typ.tolist())
            else:
                assert cp.finest is not None
                self.anc.append(_ancestors(self.ix, cp.finest, loc, k).tolist())

    # -- stage 3: keys ------------------------------------------------------------------------
    def _head(self, p: int) -> tuple[int, ...] | None:
        nc, nm, _ = self.cp.need
        claimed = self.claimed.get(p)
        if claimed is not None:
            _, cap, used, fc, fm = claimed
            if used < cap:
                u = used + 1
                return (0, fc - u * nc, fm - u * nm)
            del self.claimed[p]
        i, end = self.ptr[p], self.end[p]
        while i < end:
            if self.used[i] < self.cap[i]:
                self.ptr[p] = i
                u = self.used[i] + 1
                return (0, self.fc[i] - u * nc, self.fm[i] - u * nm)
            i += 1
        self.ptr[p] = i
        j, send = self.sptr[p], self.send[p]
        while j < send:
            if self.cell_avail[j] > 0:
                if self._can_claim(self.cell_shape[j]):
                    self.sptr[p] = j
                    return self.cell_head[j]
                self.quota_blocked = True
            j += 1
        self.sptr[p] = j
        return None

    def _can_claim(self, shape: int) -> bool:
        n = len(self.plan.claims)
        if self.quota_machines is not None:
            return self.ent_machines + n < self.quota_machines
        assert self.quota_rru is not None
        cpu = int(self.ix.shape_units[shape, 0])
        return self.ent_rru + self.claimed_rru + cpu <= self.quota_rru

    def _key(self, p: int) -> tuple[object, ...] | None:
        """The bin's key: per preference, the job's count in the bin's domain
        (spread) or the bin's best machine (stack); then the bin number."""
        head = self._head(p)
        if head is None:
            return None
        if self.simple:  # (spread one property, stack): the default policy's shape
            return (self.counts[0].get(self.anc[0][p], 0), head, p)
        parts: list[object] = [c.get(a[p], 0) for c, a in zip(self.counts, self.anc,
                                                                strict=True)]
        parts.insert(self.stack_at, head)
        parts.append(p)
        return tuple(parts)

    # -- stage 4: greedy assignment --------------------------------------------------------------
    def _place(self, p: int) -> int | None:
        """Put one task in bin ``p`` on its head machine; claim a free one if needed."""
        ix, cp = self.ix, self.cp
        claimed = self.claimed.get(p)
        if claimed is not None:
            claimed[2] += 1
            m = claimed[0]
        elif self.ptr[p] < self.end[p]:
            i = self.ptr[p]
            self.used[i] += 1
            m = self.m[i]
        else:
            j = self.sptr[p]
            found = self._pick_free(self.cell_dom[j], self.cell_shape[j])
            if found is None:
                self.cell_avail[j] = 0
                return None
            m = found
            self.cell_avail[j] -= 1
            self.taken.add(m)
            self.plan.claims.append((m, int(ix.version[m])))
            self.claimed_rru += int(ix.total_cpu[m])
            if self.quota_machines is not None or self.quota_rru is not None:
                self.epoch += 1  # the quota may now stop other bins from claiming
            cap = BIG
            for total, need, floor in zip((ix.total_cpu, ix.total_mem, ix.total_disk), cp.need,
                                          cp.floor, strict=True):
                if need > 0:
                    cap = min(cap, (int(total[m]) - floor) // need)
            if cp.max_per_machine is not None:
                cap = min(cap, cp.max_per_machine)
            self.claimed[p] = [m, cap, 1, int(ix.total_cpu[m]), int(ix.total_mem[m])]
        for c, a in zip(self.counts, self.anc, strict=True):
            c[a[p]] = c.get(a[p], 0) + 1
        if self.shared_counts:
            self.epoch += 1
        return m

    def _pick_free(self, domain: int, shape: int) -> int | None:
        ix = self.ix
        level = self.cp.finest or "dc"
        start = ix.racks_of[level + "_start"]
        racks = ix.racks_of[level][start[domain]:start[domain + 1]]
        racks = racks[ix.free_count["rack"][racks, shape] > 0]
        for rack in racks.tolist():
            for m in ix.free_in_rack(rack, shape):
                if m not in self.taken:
                    return m
        return None

    def run(self, to_place: list[int]) -> None:
        self._build()
        heap = self._initial_heap()
        plan = self.plan
        for t in to_place:
            placed = False
            while heap:
                k, epoch = heap[0]
                p: int = k[-1]  # type: ignore[assignment]
                if epoch != self.epoch:
                    cur = self._key(p)
                    if cur is None:
                        heapq.heappop(heap)
                        continue
                    if cur != k:
                        heapq.heapreplace(heap, (cur, self.epoch))
                        continue
                m = self._place(p)
                nk = self._key(p)
                if nk is None:
                    heapq.heappop(heap)
                else:
                    heapq.heapreplace(heap, (nk, self.epoch))
                if m is not None:
                    plan.assign.append((t, m))
                    placed = True
                    break
            if not placed:
                plan.unplaced.append((t, self._reason()))

    def _initial_heap(self) -> list[tuple[tuple[object, ...], int]]:
        """Every bin's first key, built column by column (the same keys ``_key``
        computes one at a time, without a Python call per bin)."""
        nc, nm, _ = self.cp.need
        fc, fm, cell_head = self.fc, self.fm, self.cell_head
        heads: list[tuple[int, ...] | None] = [
            (0, fc[i] - nc, fm[i] - nm) if i < e
            else cell_head[j] if j < se and self.cell_avail[j] > 0 else None
            for i, e, j, se in zip(self.ptr, self.end, self.sptr, self.send, strict=True)
        ]
        if self.quota_rru is not None or (
                self.quota_machines is not None and self.ent_machines >= self.quota_machines):
            # claims are limited: let _head check each free cell against the quota
            for p, head in enumerate(heads):
                if head is not None and head[0] == 1:
                    heads[p] = self._head(p)
        columns: list[list[object]] = [
            [c.get(x, 0) for x in a] for c, a in zip(self.counts, self.anc, strict=True)
        ]
        columns.insert(self.stack_at, heads)  # type: ignore[arg-type]
        columns.append(list(range(len(heads))))
        heap = [(k, 0) for k in zip(*columns, strict=True) if k[self.stack_at] is not None]
        heapq.heapify(heap)
        return heap

    def _reason(self) -> str:
        if self.quota_blocked:
            return ("entitlement quota reached and its machines have no room left "
                    f"({NO_MACHINE} inside the entitlement)")
        return NO_MACHINE


def _ancestors(index: MachineIndex, level: str, codes: np.ndarray,
               up_to: str) -> np.ndarray:
    """Vectorised ``ancestor``: the ``up_to`` domain of each domain of ``level``."""
    parent = index.fleet.parent
    depth, target = DOMAIN_LEVELS.index(level), DOMAIN_LEVELS.index(up_to)
    while depth > target:
        codes = parent[DOMAIN_LEVELS[depth]][codes]
        depth -= 1
    return codes


def _sorted_union(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Sorted distinct values of two arrays (``np.union1d`` without its overhead
    on the small arrays a proposal handles)."""
    x = np.concatenate((a, b))
    x.sort()
    if x.size < 2:
        return x
    keep = np.empty(x.size, np.bool_)
    keep[0] = True
    np.not_equal(x[1:], x[:-1], out=keep[1:])
    return x[keep]


def count_sorted(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(distinct values, counts) of an array, like ``np.unique(return_counts=True)``
    but cheap on small arrays."""
    x = np.sort(x)
    if x.size == 0:
        return x, np.empty(0, np.int64)
    starts = np.flatnonzero(np.concatenate(([True], x[1:] != x[:-1])))
    counts = np.diff(np.append(starts, x.size))
    return x[starts], counts
