"""Shard Manager's TaskController: the job's operations acked by shard availability.

It speaks only the TaskControl protocol (``plait.taskcontrol.protocol``) and reads
the application's shard map through ``view`` (which replicas are ready on which
tasks); the shell (``plait.shardmanager.service`` for real tasks, the simulator for
Figure 14) serves it over HTTP or calls it in-process.

* **Rolling updates, restarts, moves**: the batch rule (``plait.shardmanager.batch``)
  over every requested task, counting as down the tasks that are unhealthy, failed,
  under maintenance, or under an operation it acked and that has not completed, and
  every replica a shard is missing: no shard ever loses two replicas because of an
  ack, and a task that hosts a shard already missing one is never acked.
* **Advance notices** (maintenance, loan revokes): for each task on the noticed
  machines, a task that hosts no shard is let go at once (its ``move`` acked); when
  the maintenance is short (at most ``short_maintenance`` seconds), every shard of the
  task has a ready replica on a task outside the notice that is up, and none would
  then have more than ``max_down`` replicas down, it does nothing (the task stays
  until the deadline and comes back after; meanwhile it counts as down, so no other
  replica of its shards is acked away); otherwise the
  task is asked to be emptied (``evacuate``: the shell migrates its shards away,
  add first, drop second) and its ``move`` is acked once it holds no shard; it stays
  in ``evacuate`` until the move completes, so nothing is loaded onto it meanwhile.

Like every controller it keeps what it acked until the scheduler reports it
completed. This is a purely computational module with no side effects.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from plait.shardmanager.batch import missing, safe_batch
from plait.taskcontrol.protocol import (
    NoticeKind,
    OpKind,
    TaskControlRequest,
    TaskControlResponse,
    TaskOp,
)

#: of the ops offered for one task, the one taken (a move before a stop)
_PREFERENCE = {OpKind.MOVE: 0, OpKind.UPDATE: 1, OpKind.RESTART: 1, OpKind.STOP: 2}
#: how soon to be asked again while a task is being emptied
EVACUATING_ASK_AGAIN = 2.0
#: how soon to be asked again while operations are held back
HELD_ASK_AGAIN = 1.0


@dataclass(frozen=True)
class ShardView:
    """What the controller reads of the application's map."""

    #: shard -> the tasks with a replica of it ready to serve
    ready: Mapping[str, Sequence[int]]
    #: the replicas each shard should have (fewer ready count as down)
    replication: int

    def shards_on(self, task: int) -> list[str]:
        return [s for s, tasks in self.ready.items() if task in tasks]


class ShardController:
    def __init__(self, view: Callable[[], ShardView], *, max_down: int = 1,
                 short_maintenance: float = 600.0) -> None:
        self.view = view
        self.max_down = max_down
        self.short_maintenance = short_maintenance
        #: acked ops not yet reported completed
        self.in_flight: dict[str, TaskOp] = {}
        #: tasks to empty before they are let go, and emptied ones let go until their
        #: move completes: task -> the notice
        self.evacuate: dict[int, str] = {}
        #: what the last answer decided, for the shell's log and metrics
        self.last_batch: tuple[int, ...] = ()
        self.waiting: dict[int, str] = {}

    def process(self, request: TaskControlRequest) -> TaskControlResponse:
        for op in request.completed:
            self.in_flight.pop(op.op_id, None)
        # an emptied task let go stays out of the map until its move is done (it must
        # not be loaded again while it is being stopped)
        leaving = {op.task.index: self.evacuate.get(op.task.index, "")
                   for op in self.in_flight.values() if op.task.index in self.evacuate}
        view = self.view()
        down = {t.index for t in request.all_unhealthy_tasks}
        down |= {op.task.index for op in self.in_flight.values()}
        ops = _one_per_task(request.request)
        noticed: dict[int, tuple[str, bool]] = {}  # task -> (notice id, short)
        for notice in request.advance_notices:
            length = (notice.end - notice.start) if notice.end is not None else float("inf")
            short = notice.kind is NoticeKind.MAINTENANCE and length <= self.short_maintenance
            for ref in notice.tasks:
                noticed[ref.index] = (notice.notice_id, short)
        acks: list[TaskOp] = []
        self.waiting = {}
        evacuate: dict[int, str] = {}
        planned: dict[int, TaskOp] = {}
        # (only for the tasks under notice: a rolling update alone needs neither)
        shards_on = _shards_on(view) if noticed else {}
        missing_now = missing(view.ready, down, view.replication) if noticed else {}
        #: tasks left in place for a short maintenance: down by its deadline, so they
        #: count as down for everything else acked now
        staying: set[int] = set()
        staying_on: dict[str, int] = {}
        for t, op in ops.items():
            if t not in noticed:
                planned[t] = op
                continue
            notice_id, short = noticed[t]
            mine = shards_on.get(t, [])
            if op.kind is not OpKind.MOVE and op.kind is not OpKind.STOP:
                planned[t] = op  # an update of a noticed task: paced like any other
                continue
            if t in down or not mine:
                acks.append(op)  # empty, or down already: letting it go costs nothing
                if t in self.evacuate:
                    leaving[t] = self.evacuate[t]
                continue
            if short and all(_elsewhere(view, s, t, down, noticed) for s in mine) and all(
                    missing_now.get(s, 0) + staying_on.get(s, 0) + 1 <= self.max_down
                    for s in mine):
                self.waiting[t] = f"{notice_id}: short, every shard served elsewhere"
                staying.add(t)
                for s in mine:  # (two overlapping notices may not both stay on a shard)
                    staying_on[s] = staying_on.get(s, 0) + 1
                continue  # nothing to do: back after the maintenance
            evacuate[t] = notice_id
            self.waiting[t] = f"{notice_id}: its {len(mine)} shards are being moved away"
        self.evacuate = {**leaving, **evacuate}
        batch = set(safe_batch(planned, view.ready, down | staying, self.max_down,
                               view.replication))
        acks += [op for t, op in sorted(planned.items()) if t in batch]
        self.last_batch = tuple(sorted(t for t in batch if t not in down))
        for op in acks:
            self.in_flight[op.op_id] = op
        # (held back: a replica being loaded or a task coming back frees room soon,
        # which plait would otherwise look at only at its next re-check)
        held = any(t not in batch for t in planned)
        again = EVACUATING_ASK_AGAIN if evacuate else HELD_ASK_AGAIN if held else None
        return TaskControlResponse(tuple(op.op_id for op in acks), again)


def _one_per_task(ops: Sequence[TaskOp]) -> dict[int, TaskOp]:
    best: dict[int, TaskOp] = {}
    for op in ops:
        cur = best.get(op.task.index)
        if cur is None or _PREFERENCE[op.kind] < _PREFERENCE[cur.kind]:
            best[op.task.index] = op
    return best


def _shards_on(view: ShardView) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for shard, tasks in view.ready.items():
        for t in tasks:
            out.setdefault(t, []).append(shard)
    return out


def _elsewhere(view: ShardView, shard: str, task: int, down: set[int],
               noticed: Mapping[int, object]) -> bool:
    """Does ``shard`` have a ready replica on a task other than ``task`` that is up
    and under no notice?"""
    return any(t != task and t not in down and t not in noticed
               for t in view.ready.get(shard, ()))
