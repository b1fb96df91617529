"""Placement's stage 2 and its quota: the candidates of an entitlement's own machines
grouped into bins (``Candidates``), what the quota still lets a proposal claim from
the free pool (``QuotaRoom``), and why a task finds no machine (``why_unplaced``).
Pure functions of the index, like ``placement``."""

from __future__ import annotations

import numpy as np

from plait.allocator.index import MachineIndex, Pool
from plait.allocator.policy import TYPE_KEY, CompiledPolicy, Layout
from plait.model.entitlement import Quota

BIG = 1 << 30
EMPTY = np.empty(0, np.int64)


class Lazy(dict[int, int]):
    """An array's values as a dictionary, each read from the array on first use."""

    __slots__ = ("_array",)

    def __init__(self, array: np.ndarray) -> None:
        super().__init__()
        self._array = array

    def __missing__(self, key: int) -> int:
        value = self[key] = int(self._array[key])
        return value


class Zero(dict[int, int]):
    """0 for a key not set."""

    __slots__ = ()

    def __missing__(self, key: int) -> int:
        return 0


#: per-bin or per-cell state, indexed by bin or cell number
Slots = list[int] | dict[int, int]


class Candidates:
    """An entitlement's machines that can take one more of the request's tasks, in
    bin then stack order, as flat lists (``m``, ``cap``: tasks it still takes,
    ``fc``/``fm``: free cpu and memory), and the job's remaining tasks counted per
    domain."""

    def __init__(self, index: MachineIndex, cp: CompiledPolicy, remaining: np.ndarray,
                 idle: Pool | None) -> None:
        self.ix, self.cp, self.layout = index, cp, cp.layout
        #: the machines of the job's tasks that stay (one per task)
        self.remaining = remaining
        self.idle = idle
        self.n_types = index.n_types
        self.m: list[int] = []
        self.cap: list[int] = []
        self.fc: list[int] = []
        self.fm: list[int] = []

    def count(self, key: str) -> dict[int, int]:
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

    def entitlement_candidates(self, limit: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(bin, free cpu, free memory) per candidate, sorted by bin then stack order;
        fills the flat candidate lists in that order."""
        ix, cp = self.ix, self.cp
        nc, nm, nd = cp.need
        floor_c, floor_m, floor_d = cp.floor
        if cp.shapes.size == 0:
            return EMPTY, EMPTY, EMPTY
        E: np.ndarray
        if self.idle is not None:
            # a large entitlement: its idle members are counted (``_start``), and of
            # the busy ones only the classes that may have room are read
            E = ix.busy[cp.ent_code].with_room(nc + floor_c)
        else:
            members = ix.members.get(cp.ent_code)
            E = members.ids if members is not None else EMPTY
        if E.size == 0:
            return EMPTY, EMPTY, EMPTY
        fc = ix.free_cpu[E]
        fm = ix.free_mem[E]
        # room for how many more tasks; int32 arithmetic is safe as a policy with an
        # allowed shape has floor + need below 2**31, and none is skipped
        cap = _room(fc, nc, floor_c, None)
        cap = _room(fm, nm, floor_m, cap)
        if nd or floor_d:
            cap = _room(ix.free_disk[E], nd, floor_d, cap)
        if cap is None:
            cap = np.full(E.size, BIG, np.int64)
        if cp.max_per_machine is not None:
            cap = np.minimum(cap, cp.max_per_machine - self.on_machine(E))
        ok = cap > 0
        ok &= cp.usable[ix.hshape[E]]  # healthy, and an allowed shape
        if cp.dc is not None:
            ok &= ix.loc["dc"][E] == cp.dc
        sel = ok.nonzero()[0]
        if sel.size == 0:
            return EMPTY, EMPTY, EMPTY
        C, cap, fc, fm = E[sel], cap[sel], fc[sel], fm[sel]
        b = self.bin_of_machines(C)
        order = np.lexsort((C, fm, fc, b))
        if limit and order.size > max(2048, 4 * limit):
            # a bin never takes more tasks than the request places, and every
            # candidate has room for one: its first ``limit`` candidates in stack
            # order are all it can use (a large entitlement has thousands)
            sb = b[order]
            first = np.empty(sb.size, np.bool_)
            first[0] = True
            np.not_equal(sb[1:], sb[:-1], out=first[1:])
            pos = np.arange(sb.size)
            rank = pos - np.maximum.accumulate(np.where(first, pos, 0))
            order = order[rank < limit]
        fc, fm = fc[order], fm[order]
        self.m, self.cap = C[order].tolist(), cap[order].tolist()
        self.fc, self.fm = fc.tolist(), fm.tolist()
        return b[order], fc, fm

    def on_machine(self, machines: np.ndarray) -> np.ndarray:
        """How many of the job's remaining tasks sit on each of ``machines``."""
        if self.remaining.size == 0:
            return np.zeros(machines.size, np.int64)
        uniq, cnt = count_sorted(self.remaining)
        pos = np.minimum(np.searchsorted(uniq, machines), uniq.size - 1)
        return np.where(uniq[pos] == machines, cnt[pos], 0)

    def bin_of_machines(self, machines: np.ndarray) -> np.ndarray:
        """The bin number (``p``) of each machine."""
        cp, ix = self.cp, self.ix
        if cp.finest is None:
            if not cp.by_type:
                return np.zeros(machines.size, np.int64)
            b = ix.shape_type[ix.shape[machines]]
        else:
            b = ix.loc[cp.finest][machines]
            if cp.by_type:
                b = b * self.n_types + ix.shape_type[ix.shape[machines]]
        bins: np.ndarray = self.layout.pos[b]
        return bins

    def count_column(self, counts: dict[int, int], key: str, p: np.ndarray) -> np.ndarray:
        """The job's count in each bin's domain (or type) of one spread key."""
        if not counts:
            return np.zeros(p.size, np.int64)
        anc = self.layout.anc_np[key].take(p)
        dense = np.zeros(int(anc.max(initial=0)) + 1, np.int64)
        codes = np.fromiter(counts, np.int64, len(counts))
        ok = codes < dense.size
        dense[codes[ok]] = np.fromiter(counts.values(), np.int64, len(counts))[ok]
        column: np.ndarray = dense.take(anc)
        return column

    def bin_slices(self, ent_bins: np.ndarray, many: bool
                   ) -> tuple[Slots, Slots, np.ndarray, np.ndarray, np.ndarray]:
        """Each bin's slice [ptr, end) of the candidate lists (``ent_bins``: each
        candidate's bin, in order; ``many``: dictionaries, not lists), which bins have
        none (a free-pool cell is their head), the bins with some and where each
        one's slice starts."""
        L = self.layout
        if many:
            if ent_bins.size:
                starts = np.flatnonzero(np.concatenate(([True], ent_bins[1:] != ent_bins[:-1])))
                ends = np.append(starts[1:], ent_bins.size)
            else:
                starts = ends = EMPTY
            present = ent_bins[starts]
            keep = present >= 0
            present, starts, ends = present[keep], starts[keep], ends[keep]
            bins_with = present.tolist()
            ptr: Slots = Zero(zip(bins_with, starts.tolist(), strict=True))
            end: Slots = Zero(zip(bins_with, ends.tolist(), strict=True))
            cell = np.ones(L.n_bins, np.bool_)
            cell[present] = False
        else:
            bounds = ent_bins.searchsorted(L.edges)
            lo, hi = bounds[:-1], bounds[1:]
            ptr, end = lo.tolist(), hi.tolist()
            cell = lo == hi
            present = (~cell).nonzero()[0]
            starts = lo[present]
        return ptr, end, cell, present, starts

    def free_cells(self) -> tuple[np.ndarray, np.ndarray]:
        """The free pool: the count of every cell of the layout, and per bin its first
        cell with a free machine (the cells before it are empty: the heads would skip
        them)."""
        L = self.layout
        avail = self.ix.free_count[L.level].take(L.cell_flat)
        if avail.size and np.count_nonzero(avail.take(L.cell_lo)) == L.n_bins:
            return avail, L.cell_lo  # the usual case: every bin's best cell has one
        nz = avail.nonzero()[0]
        return avail, np.minimum(np.append(nz, avail.size)[nz.searchsorted(L.cell_lo)],
                                 L.cell_hi)

    def idle_heads(self, cell: np.ndarray, lc: np.ndarray, lm: np.ndarray
                   ) -> tuple[np.ndarray, ...] | None:
        """A large entitlement's idle machines: per bin its best cell that has one, as
        good a head as a busy machine with the same room left. Given each bin's head
        (``cell``: a free-pool cell; its cpu and memory ``lc``, ``lm``), the heads with
        the idle cells that are better, which bins have one, the idle count per cell
        and per bin the first such cell; None without idle machines."""
        if self.idle is None:
            return None
        L = self.layout
        iavail = self.idle.count[L.level].take(L.cell_flat)
        nz = iavail.nonzero()[0]
        if not nz.size:
            return None
        iptr = np.append(nz, iavail.size)[nz.searchsorted(L.cell_lo)]
        has = iptr < L.cell_hi
        ic, im = L.cell_cpu_pad[iptr], L.cell_mem_pad[iptr]
        better = has & (cell | (ic < lc) | ((ic == lc) & (im < lm)))
        return (cell & ~has, np.where(better, ic, lc), np.where(better, im, lm), has,
                iavail, np.minimum(iptr, L.cell_hi))


class QuotaRoom:
    """What the entitlement's quota lets one proposal claim from the free pool: its
    machines (and RRU) less those the request frees, and the RRU claimed so far;
    ``blocked``: a free machine was passed over for the quota."""

    def __init__(self, index: MachineIndex, quota: Quota, ent_machines: int,
                 ent_rru: int) -> None:
        self.ix = index
        self.ent_machines = ent_machines
        self.ent_rru = ent_rru
        self.machines = quota.machines
        self.rru = None if quota.rru is None else round(quota.rru * 1000)
        self.claimed_rru = 0
        self.blocked = False

    def can_claim(self, shape: int, claims: int) -> bool:
        n = claims
        if self.machines is not None:
            return self.ent_machines + n < self.machines
        assert self.rru is not None
        cpu = int(self.ix.shape_units[shape, 0])
        return self.ent_rru + self.claimed_rru + cpu <= self.rru

    def limit_claims(self, layout: Layout, avail: np.ndarray, sptr: np.ndarray, cell: np.ndarray,
                      lc: np.ndarray, lm: np.ndarray, live: np.ndarray,
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The live bins' heads when the quota limits claims, as ``_head`` would find
        them before any claim, for all bins at once: a free cell's head is the bin's
        first cell with a free machine the quota allows; a bin with none is dropped.
        Sets ``quota_blocked`` as ``_head`` would."""
        L = layout
        qm = self.machines
        if qm is not None:  # the machine quota decides (``can_claim``)
            if self.ent_machines < qm:
                return cell, lc, lm, live
            if cell.any():
                self.blocked = True
            keep = ~cell
            return cell[keep], lc[keep], lm[keep], live[keep]
        assert self.rru is not None
        allowed = L.cell_cpu_pad[:-1] <= self.rru - self.ent_rru - self.claimed_rru
        free = avail > 0
        nz = (free & allowed).nonzero()[0]
        start, hi = sptr[live], L.cell_hi[live]
        first = np.minimum(np.append(nz, avail.size)[nz.searchsorted(start)], hi)
        blocked = np.concatenate(([0], np.cumsum(free & ~allowed)))
        if np.any(cell & (blocked[first] > blocked[start])):
            self.blocked = True
        lc = np.where(cell, L.cell_cpu_pad[first], lc)
        lm = np.where(cell, L.cell_mem_pad[first], lm)
        keep = ~cell | (first < hi)
        return cell[keep], lc[keep], lm[keep], live[keep]


def one_on_a_member(index: MachineIndex, cp: CompiledPolicy) -> int | None:
    """Where ``_Placer`` puts the one task of a new job when a machine of the
    entitlement has room for it, or None (then ``_Placer`` decides: the free pool, a
    large entitlement's idle members, a per-machine cap). A new job counts no task in
    any domain, so every bin's key is its head's (kind, room left, bin): a member with
    room (kind 0) before any free machine, the least cpu then memory left, then the
    lowest bin, then (the bin's order) the lowest machine."""
    if cp.max_per_machine is not None or cp.shapes.size == 0 or (
            index.idle.get(cp.ent_code) is not None):
        return None
    members = index.members.get(cp.ent_code)
    if members is None or members.size == 0:
        return None
    E = members.ids
    fc, fm = index.free_cpu[E], index.free_mem[E]
    (nc, nm, nd), (floor_c, floor_m, floor_d) = cp.need, cp.floor
    ok = cp.usable[index.hshape[E]]  # healthy, and an allowed shape
    if nc or floor_c:
        ok &= fc >= nc + floor_c
    if nm or floor_m:
        ok &= fm >= nm + floor_m
    if nd or floor_d:
        ok &= index.free_disk[E] >= nd + floor_d
    if cp.dc is not None:
        ok &= index.loc["dc"][E] == cp.dc
    sel = ok.nonzero()[0]
    if sel.size == 0:
        return None
    C = E[sel]
    layout = cp.layout
    code: np.ndarray
    if cp.finest is None:
        code = (index.shape_type[index.shape[C]] if cp.by_type
                else np.zeros(C.size, np.int64))
    else:
        code = index.loc[cp.finest][C]
        if cp.by_type:
            code = code * index.n_types + index.shape_type[index.shape[C]]
    b: np.ndarray = layout.pos[code]
    inside = (b >= 0) & (b < layout.n_bins)  # (a machine in no bin is never a head)
    if not inside.all():
        C, b, sel = C[inside], b[inside], sel[inside]
        if C.size == 0:
            return None
    best = np.lexsort((C, b, fm[sel], fc[sel]))[0]
    return int(C[best])


def why_unplaced(ix: MachineIndex, cp: CompiledPolicy, claims: int) -> str:
    """When the free pool has no machine for the task either, why (a suffix of
    ``NO_MACHINE``): the entitlement's machines, how many of them cannot take tasks.
    ``claims``: the machines the proposal claimed from the pool. Read only when a task
    stays unplaced: the members once, the pool per DC."""
    counts = ix.free_count["dc"]
    pool = int(counts[:, cp.shapes].sum() if cp.dc is None
               else counts[cp.dc, cp.shapes].sum()) - claims
    members = ix.members.get(cp.ent_code)
    ids = members.ids if members is not None else EMPTY
    if pool > 0:
        return ""
    if not ids.size + claims:
        return (" (the entitlement has no machine, and the free pool none that "
                "meets the requirements)")
    out = ids.size - int(np.count_nonzero(cp.usable[ix.hshape[ids]]))
    n = ids.size + claims
    return (f" (the entitlement's {n} machine{'s have' if n > 1 else ' has'} no "
            "room for it"
            + (f", {out} of them down, cordoned or of another type" if out else "")
            + "; the free pool has no machine that meets the requirements)")



def _room(free: np.ndarray, need: int, floor: int, cap: np.ndarray | None) -> np.ndarray | None:
    """Fold one resource into ``cap`` (tasks that still fit per machine; ``None``: no
    limit yet): ``(free - floor) // need``, or 0 where a floor alone is not met."""
    if need > 0:
        room = (free - floor) // need if floor else free // need
        return room if cap is None else np.minimum(cap, room)
    if floor > 0:
        return np.where(free >= floor, BIG if cap is None else cap, 0)
    return cap


def count_sorted(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(distinct values, counts) of an array, like ``np.unique(return_counts=True)``
    but cheap on small arrays."""
    x = np.sort(x)
    if x.size == 0:
        return x, np.empty(0, np.int64)
    starts = np.flatnonzero(np.concatenate(([True], x[1:] != x[:-1])))
    counts = np.diff(np.append(starts, x.size))
    return x[starts], counts
