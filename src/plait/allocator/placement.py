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
   bin's best machine; free machines are claimed only within the quota. A new job
   under a (spread, stack) policy with no more tasks than bins needs no heap: one
   task per bin, in key order (``_Placer._one_per_bin``).

Nothing is written: the result is a ``Plan`` that the allocator commits with
optimistic concurrency.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from operator import itemgetter

import numpy as np

from plait.allocator.candidates import (
    BIG,
    EMPTY,
    Candidates,
    Lazy,
    QuotaRoom,
    Slots,
    one_on_a_member,
    why_unplaced,
)
from plait.allocator.index import MachineIndex
from plait.allocator.policy import STACK_KEY, TYPE_KEY, CompiledPolicy
from plait.allocator.request import AllocationRequest, TaskOp
from plait.allocator.taskmap import CodedMap, MachineMap
from plait.model.entitlement import Quota

NO_MACHINE = "no machine satisfies the hard requirements with room for the task"
QUOTA_REACHED = "entitlement quota reached"


@dataclass(slots=True)
class JobState:
    """The allocator's record of one job: where each task sits and what it holds."""

    #: the entitlement of the latest request (a job moving between entitlements
    #: has tasks in both until every task has moved)
    entitlement: int
    #: per task (arrays indexed by task: ``taskmap``): its machine, the units it
    #: holds there, and the entitlement its machine was taken in
    placement: MachineMap = field(default_factory=MachineMap)
    units: CodedMap[tuple[int, int, int]] = field(default_factory=CodedMap)
    ents: CodedMap[int] = field(default_factory=CodedMap)


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
    #: the index the plan was decided on and its ``changes`` count then
    snapshot: tuple[MachineIndex, int] | None = field(default=None, repr=False, compare=False)


def usable(index: MachineIndex, cp: CompiledPolicy, m: int) -> bool:
    """Can a task already on machine ``m`` stay there under this policy?"""
    return bool(
        cp.impossible is None and index.ent[m] == cp.ent_code
        and cp.usable[index.hshape[m]]  # healthy, not cordoned, an allowed shape
        and (cp.dc is None or index.loc["dc"][m] == cp.dc)
    )


def propose(
    index: MachineIndex, cp: CompiledPolicy, quota: Quota, job: JobState | None,
    request: AllocationRequest,
) -> Plan:
    """Decide a placement for ``request``. Pure: reads the index, writes nothing."""
    plan = Plan(request, cp, cp.ent_code, snapshot=(index, index.changes))
    placement: Mapping[int, int] = {}
    to_place: list[int] = []
    if job is None:  # a new job: nothing to keep, free or move
        allocate = TaskOp.ALLOCATE
        to_place = [t for t, op in request.tasks if op is allocate]
    else:
        placement = job.placement
        for t, op in request.tasks:
            m = placement.get(t)
            if op is TaskOp.FREE:
                if m is not None:
                    plan.frees.append((t, m))
            elif m is None:
                to_place.append(t)
            elif job.units[t] == cp.need and usable(index, cp, m):
                plan.keep.append((t, m))
            else:
                plan.frees.append((t, m))
                plan.moved.append(t)
                to_place.append(t)
    if cp.max_per_machine is not None and plan.keep:
        _enforce_max_per_machine(cp.max_per_machine, placement, plan, to_place)
    if not to_place:
        return plan
    if cp.impossible:
        plan.unplaced = [(t, cp.impossible) for t in to_place]
        return plan
    if job is None and len(to_place) == 1:
        # a new job's one task (most creates): a machine of the entitlement with room,
        # found with a few array operations rather than the bins' keys and heap
        m = one_on_a_member(index, cp)
        if m is not None:
            plan.assign.append((to_place[0], m))
            return plan
    _Placer(index, cp, quota, placement, plan).run(to_place)
    return plan


def _enforce_max_per_machine(cap: int, placement: Mapping[int, int], plan: Plan,
                             to_place: list[int]) -> None:
    """Tasks kept on a machine that holds more of the job than the policy's cap
    (the policy changed) are moved, the highest indices first."""
    leaving = {t for t, _ in plan.frees}
    keeping = {t for t, _ in plan.keep}
    per_machine: dict[int, int] = {}
    for t, m in placement.items():
        if t not in leaving:
            per_machine[m] = per_machine.get(m, 0) + 1
    moved = []
    for t, m in sorted(plan.keep, reverse=True):
        if per_machine[m] > cap and t in keeping:
            per_machine[m] -= 1
            moved.append((t, m))
    for t, m in moved:
        plan.keep.remove((t, m))
        plan.frees.append((t, m))
        plan.moved.append(t)
        to_place.append(t)
    to_place.sort()


def releasing(index: MachineIndex, frees: list[tuple[int, int]], ent_code: int) -> list[int]:
    """Machines of the entitlement that this plan certainly returns to the free pool:
    every task on them leaves and they cannot take new ones (failed, in maintenance
    or cordoned). Their places in the quota are free for this plan's claims."""
    if not frees:
        return []
    leaving: dict[int, int] = {}
    for _, m in frees:
        leaving[m] = leaving.get(m, 0) + 1
    return [m for m, n in leaving.items()
            if index.ent[m] == ent_code and int(index.tasks[m]) == n
            and int(index.hshape[m]) == index.shape_type.size]


class _Placer:
    """One proposal's working state. Bins are numbered 0..B-1 by the policy's
    ``Layout``; per bin the candidates are slices of flat lists (entitlement machines
    in stack order, then free-pool cells in best-fit order), built with NumPy for all
    bins at once.

    A heap entry is the bin's key flattened, followed by the epoch it was computed
    in: ``(spread counts before stack..., kind, cpu left, memory left, spread counts
    after stack..., p, epoch)``. The stack part is the bin's head: kind 0 for a
    machine of the entitlement (or one claimed by this proposal), 1 for a free-pool
    cell, then the room left once the task is on it. Heads all have three parts, so
    the flat tuple orders exactly as (counts, head, p) would; ``p`` is unique, so the
    epoch is never compared.
    """

    def __init__(self, index: MachineIndex, cp: CompiledPolicy, quota: Quota,
                 placement: Mapping[int, int], plan: Plan) -> None:
        self.ix, self.cp, self.plan = index, cp, plan
        self.layout = cp.layout
        if placement:
            leaving = {t for t, _ in plan.frees}
            self.remaining = np.asarray(
                [m for t, m in placement.items() if t not in leaving], np.int64)
        else:
            self.remaining = EMPTY
        members = index.members.get(cp.ent_code)
        #: a large entitlement's idle members, counted per cell (``MachineIndex.idle``)
        idle = index.idle.get(cp.ent_code)
        gone = releasing(index, plan.frees, cp.ent_code)
        self.quota = QuotaRoom(
            index, quota, (members.size if members else 0) - len(gone),
            (members.machines_rru if members else 0) - sum(
                int(index.total_cpu[m]) for m in gone))
        self.cands = Candidates(index, cp, self.remaining, idle)
        #: why nothing could take a task (``why_unplaced``), once worked out
        self._why: str | None = None
        self.taken: set[int] = set()
        #: how many tasks this proposal places (set by ``run``)
        self.n_place = 0
        self.spread = [k for k in cp.keys if k != STACK_KEY]
        self.stack_at = cp.keys.index(STACK_KEY)
        self.n_types = index.n_types
        self.counts: list[dict[int, int]] = [self.cands.count(k) for k in self.spread]
        self.anc = [self.layout.anc[k] for k in self.spread]
        #: (spread one property, stack), the default policy's shape: its bins never
        #: share a count (one domain or type each), which the inlined paths rely on
        self.simple = len(self.spread) == 1 and self.stack_at == 1
        #: bumped whenever a change can alter the key of a bin other than the one
        #: just placed into (shared ancestors, quota); heap entries of an older
        #: epoch are re-keyed before use
        self.epoch = 0
        self.shared_counts = len(self.spread) > 1 or (
            len(self.spread) == 1 and self.spread[0] == TYPE_KEY and cp.finest is not None)
        assert not (self.simple and self.shared_counts)

    # -- stage 2: candidates grouped into bins ----------------------------------------------




    def _start(self) -> list[tuple[int, ...]]:
        """Build the per-bin slices and every live bin's first key (heap entry), all
        bins at once: the keys ``_key`` computes one at a time, without a Python call
        per bin. A NumPy call costs a microsecond or more whatever its size, so this
        makes few of them, on the request's own few hundred values."""
        L, cp = self.layout, self.cp
        nc, nm, _ = cp.need
        # free pool: the count of every cell of the layout; per bin, its first cell with
        # a free machine (the cells before it are empty: _head would skip them)
        avail, sptr = self.cands.free_cells()
        # per-bin and per-cell state: lists when the bins are few, else dictionaries
        # filled on first use (a request touches a few of the bins, not every rack)
        many = L.n_bins > MANY_BINS
        self.cell_avail: Slots = Lazy(avail) if many else avail.tolist()
        self.sptr: Slots = Lazy(sptr) if many else sptr.tolist()
        self.send = L.cell_end
        cands = self.cands
        ent_bins, fc, fm = cands.entitlement_candidates(self.n_place)
        self.m, self.cap, self.fc, self.fm = cands.m, cands.cap, cands.fc, cands.fm
        # each bin with candidates: its slice [ptr, end) of the candidate lists
        self.ptr: Slots
        self.end: Slots
        self.ptr, self.end, cell, present, starts = cands.bin_slices(ent_bins, many)
        self.used = [0] * len(self.m)
        #: machines claimed during this proposal, per bin: [machine, cap, used, fc, fm]
        #: (a free machine claimed, or an idle machine of the entitlement taken)
        self.claimed: dict[int, list[int]] = {}
        # heads: a machine of the entitlement (kind 0) before a free-pool cell (kind 1)
        lc, lm = L.cell_cpu_pad[sptr], L.cell_mem_pad[sptr]
        lc[present] = fc[starts]
        lm[present] = fm[starts]
        #: bins with idle machines of the entitlement (their heads are not inlined)
        self.idle_bins: set[int] = set()
        idle = self.cands.idle_heads(cell, lc, lm)
        if idle is not None:
            cell, lc, lm, has, self.iavail, iptr = idle
            self.idle_bins = set(has.nonzero()[0].tolist())
            self.iptr: Slots = Lazy(iptr) if many else iptr.tolist()
        if sptr is L.cell_lo:
            live = L.edges[:-1]  # all of them have a head
        else:
            live = (~cell | (sptr < L.cell_hi)).nonzero()[0]
            cell, lc, lm = cell[live], lc[live], lm[live]
        self.reserve: list[tuple[int, ...]] = []
        self.rows: np.ndarray = _NO_ROWS
        limited = self.quota.rru is not None or (
            self.quota.machines is not None and self.quota.ent_machines >= self.quota.machines)
        if limited and many:
            cell, lc, lm, live = self.quota.limit_claims(L, avail, sptr, cell, lc, lm, live)
            limited = False
        if limited or not many:
            # every bin's key, a tuple each (few bins, or claims limited by the quota:
            # then _head checks each free cell against it)
            bins: list[int] = L.bins if sptr is L.cell_lo else live.tolist()
            kinds: list[int] = cell.view(np.int8).tolist()
            lcs: list[int] = (lc - nc).tolist()
            lms: list[int] = (lm - nm).tolist()
            if limited:
                heads = [(p, (kinds[k], lcs[k], lms[k]) if kinds[k] == 0 else self._head(p))
                         for k, p in enumerate(bins)]
                kept = [(p, head) for p, head in heads if head is not None]
                bins = [p for p, _ in kept]
                kinds, lcs, lms = ([head[x] for _, head in kept] for x in range(3))
            columns: list[Iterable[int]] = [
                itertools.repeat(0) if not c else [c.get(a[p], 0) for p in bins]
                for c, a in zip(self.counts, self.anc, strict=True)
            ]
            columns[self.stack_at:self.stack_at] = [kinds, lcs, lms]
            entries = list(zip(*columns, bins, itertools.repeat(0)))
            entries.sort()
            return entries
        # every live bin's key as a column of one matrix, sorted at once; only the
        # ``n_place`` least become heap entries, the others wait in ``rows`` in key
        # order (their keys only grow while they wait: ``_greedy`` takes them in
        # when the heap's least key is above theirs). A policy that spreads over
        # thousands of racks so never builds a Python tuple per rack.
        p_col = live
        cols = [self.cands.count_column(c, k, p_col) for c, k in zip(self.counts, self.spread,
                                                                 strict=True)]
        cols[self.stack_at:self.stack_at] = [cell.astype(np.int64), lc - nc, lm - nm]
        cols.append(p_col)
        keys = np.stack(cols)
        order = np.lexsort(keys[::-1])
        k = min(self.n_place, order.size)
        entries = [(*r, 0) for r in keys[:, order[:k]].T.tolist()]
        self.rows = keys[:, order[k:]].T
        return entries



    def _next_reserved(self) -> tuple[int, ...] | None:
        """The least waiting bin's key as it was when the proposal started (a lower
        bound of its key now), or ``None`` when none waits."""
        if not self.reserve:
            if self.rows.shape[0] == 0:
                return None
            # a chunk at a time, least last (popped from the end)
            chunk, self.rows = self.rows[:64], self.rows[64:]
            self.reserve = [tuple(r) for r in reversed(chunk.tolist())]
        return self.reserve[-1]

    # -- stage 3: keys ------------------------------------------------------------------------
    def _head(self, p: int) -> tuple[int, int, int] | None:
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
                break
            i += 1
        self.ptr[p] = i
        L = self.layout
        j = self._idle_cell(p) if p in self.idle_bins else None
        if j is not None and (i >= end or (L.cell_cpu[j], L.cell_mem[j]) < (
                self.fc[i] - self.used[i] * nc, self.fm[i] - self.used[i] * nm)):
            return (0, L.cell_cpu[j] - nc, L.cell_mem[j] - nm)
        if i < end:
            u = self.used[i] + 1
            return (0, self.fc[i] - u * nc, self.fm[i] - u * nm)
        j, send = self.sptr[p], self.send[p]
        while j < send:
            if self.cell_avail[j] > 0:
                if self.quota.can_claim(L.cell_shape[j], len(self.plan.claims)):
                    self.sptr[p] = j
                    return (1, L.cell_cpu[j] - nc, L.cell_mem[j] - nm)
                self.quota.blocked = True
            j += 1
        self.sptr[p] = j
        return None

    def _idle_cell(self, p: int) -> int | None:
        """Bin ``p``'s best cell that still has an idle machine of the entitlement."""
        j, send, avail = self.iptr[p], self.send[p], self.iavail
        while j < send and avail[j] <= 0:
            j += 1
        self.iptr[p] = j
        if j < send:
            return j
        self.idle_bins.discard(p)
        return None


    def _key(self, p: int) -> tuple[int, ...] | None:
        """The bin's heap entry: per preference, the job's count in the bin's domain
        (spread) or the bin's head (stack); then the bin number and the epoch."""
        head = self._head(p)
        return None if head is None else self._entry(p, head)

    def _entry(self, p: int, head: tuple[int, int, int]) -> tuple[int, ...]:
        if self.simple:  # (spread one property, stack): the default policy's shape
            return (self.counts[0].get(self.anc[0][p], 0), *head, p, self.epoch)
        parts = [c.get(a[p], 0) for c, a in zip(self.counts, self.anc, strict=True)]
        parts[self.stack_at:self.stack_at] = head
        parts.append(p)
        parts.append(self.epoch)
        return tuple(parts)

    # -- stage 4: greedy assignment --------------------------------------------------------------
    def _place(self, p: int) -> int | None:
        """Put one task in bin ``p`` on its head machine; claim a free one if needed."""
        ix, cp = self.ix, self.cp
        claimed = self.claimed.get(p)
        L = self.layout
        i = self.ptr[p]
        j = self._idle_cell(p) if claimed is None and p in self.idle_bins else None
        if j is not None and i < self.end[p] and (L.cell_cpu[j], L.cell_mem[j]) >= (
                self.fc[i] - self.used[i] * cp.need[0], self.fm[i] - self.used[i] * cp.need[1]):
            j = None  # the busy machine is as good a fit
        if claimed is not None:
            claimed[2] += 1
            m = claimed[0]
        elif j is None and i < self.end[p]:
            self.used[i] += 1
            m = self.m[i]
        else:
            if j is not None:  # an idle machine of the entitlement: no claim
                idle = self.cands.idle
                assert idle is not None
                found = ix.first_free(L.buckets(j), self.taken, idle)
                if found is None:
                    self.iavail[j] = 0
                    return None
                self.iavail[j] -= 1
            else:
                j = self.sptr[p]
                found = ix.first_free(L.buckets(j), self.taken)
                if found is None:
                    self.cell_avail[j] = 0
                    return None
                self.cell_avail[j] -= 1
                self.plan.claims.append((found, int(ix.version[found])))
                self.quota.claimed_rru += L.cell_cpu[j]
                if self.quota.machines is not None or self.quota.rru is not None:
                    self.epoch += 1  # the quota may now stop other bins from claiming
            m = found
            self.taken.add(m)
            # an idle or free machine's totals are its shape's, which the cell has
            total_cpu, total_mem = L.cell_cpu[j], L.cell_mem[j]
            cap = BIG
            for total, need, floor in zip((total_cpu, total_mem, L.cell_disk[j]), cp.need,
                                          cp.floor, strict=True):
                if need > 0:
                    cap = min(cap, (total - floor) // need)
            if cp.max_per_machine is not None:
                cap = min(cap, cp.max_per_machine)
            self.claimed[p] = [m, cap, 1, total_cpu, total_mem]
        self._count_task(p)
        return m

    def _count_task(self, p: int) -> None:
        for c, a in zip(self.counts, self.anc, strict=True):
            c[a[p]] = c.get(a[p], 0) + 1
        if self.shared_counts:
            self.epoch += 1

    def run(self, to_place: list[int]) -> None:
        self.n_place = len(to_place)
        entries = self._start()  # sorted
        if (self.simple and not self.counts[0] and len(to_place) <= len(entries)
                and self.quota.rru is None and self.quota.machines is not None):
            claims = sum(map(itemgetter(1), entries[:len(to_place)]))  # kind 1: a free cell
            if self.quota.ent_machines + claims <= self.quota.machines:
                placed = self._one_per_bin(to_place, entries)
                if placed == len(to_place):
                    return
                # a claim found no machine: go on with the heap, keys as they are now
                to_place = to_place[placed:]
                entries = [k for k in (self._key(e[-2]) for e in entries) if k is not None]
        heapq.heapify(entries)
        self._greedy(to_place, entries)

    def _one_per_bin(self, to_place: list[int], entries: list[tuple[int, ...]]) -> int:
        """Place the tasks of a new job under a (spread, stack) policy that has no more
        tasks than bins; ``entries`` are the bins' first keys, sorted. Every key is
        (0, head, p) and a task makes its bin's (1, ...), above every untouched bin's,
        so the heap would pop the bins in this order, one task each: no other bin's
        key moves (counts are per bin, and the caller checked that the quota allows
        every claim on the way). Returns how many tasks were placed: all of them
        unless a claim found no free machine."""
        assign, ptr, end, used, machines = self.plan.assign, self.ptr, self.end, self.used, self.m
        count0, anc0, idle_bins = self.counts[0], self.anc[0], self.idle_bins
        for k, t in enumerate(to_place):
            p = entries[k][-2]
            i = ptr[p]
            if i < end[p] and p not in idle_bins:  # a busy machine of the entitlement
                # (_place, inlined)
                used[i] += 1
                assign.append((t, machines[i]))
                a = anc0[p]
                count0[a] = count0.get(a, 0) + 1
                continue
            m = self._place(p)
            if m is None:
                return k
            assign.append((t, m))
        return len(to_place)

    def _greedy(self, to_place: list[int], heap: list[tuple[int, ...]]) -> None:
        """Each task to the bin with the least key (a lazy heap: see ``epoch``)."""
        assign = self.plan.assign
        claimed, ptr, end, used, cap = self.claimed, self.ptr, self.end, self.used, self.cap
        machines, fc, fm = self.m, self.fc, self.fm
        nc, nm, _ = self.cp.need
        simple, idle_bins = self.simple, self.idle_bins
        if simple:
            count0, anc0 = self.counts[0], self.anc[0]
        waiting = self._next_reserved()
        for t in to_place:
            while True:
                if waiting is not None and (not heap or waiting < heap[0]):
                    # a waiting bin's key may now be the least: take it in (re-keyed)
                    self.reserve.pop()
                    cur = self._key(waiting[-1])
                    if cur is not None:
                        heapq.heappush(heap, cur)
                    waiting = self._next_reserved()
                    continue
                if not heap:
                    self.plan.unplaced.append((t, self._reason()))
                    break
                entry = heap[0]
                p = entry[-2]
                if entry[-1] != self.epoch:
                    cur = self._key(p)
                    if cur is None:
                        heapq.heappop(heap)
                        continue
                    if cur[:-1] != entry[:-1]:
                        heapq.heapreplace(heap, cur)
                        continue
                i = ptr[p]
                if i < end[p] and p not in claimed and p not in idle_bins:
                    # the common case, inlined: the head is a machine of the entitlement
                    # (what _place then _key would do)
                    u = used[i] = used[i] + 1
                    m: int | None = machines[i]
                    if simple:
                        a = anc0[p]
                        n = count0[a] = count0.get(a, 0) + 1
                        # simple policies never share counts between bins: no epoch
                        nk: tuple[int, ...] | None = (
                            (n, 0, fc[i] - (u + 1) * nc, fm[i] - (u + 1) * nm, p, self.epoch)
                            if u < cap[i] else self._key(p))
                    else:
                        self._count_task(p)
                        nk = (self._entry(p, (0, fc[i] - (u + 1) * nc, fm[i] - (u + 1) * nm))
                              if u < cap[i] else self._key(p))
                else:
                    m = self._place(p)
                    nk = self._key(p)
                if nk is None:
                    heapq.heappop(heap)
                else:
                    heapq.heapreplace(heap, nk)
                if m is not None:
                    assign.append((t, m))
                    break

    def _reason(self) -> str:
        if self.quota.blocked:
            return (f"{QUOTA_REACHED} and its machines have no room left "
                    f"({NO_MACHINE} inside the entitlement)")
        if self._why is None:
            self._why = why_unplaced(self.ix, self.cp, len(self.plan.claims))
        return NO_MACHINE + self._why



#: from this many bins on (a spread over racks), per-bin state is built lazily and only
#: the least keys become tuples
MANY_BINS = 256


_NO_ROWS = np.empty((0, 0), np.int64)
