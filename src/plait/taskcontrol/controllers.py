"""Built-in TaskControllers. Each is a plain object that speaks only the protocol:
it learns what is in flight from its own acks and the ``completed`` list, and what
is down from ``all_unhealthy_tasks``.

* ``DefaultController(max_unavailable)``: pacing only;
* ``OneAtATime``: one task unavailable at a time;
* ``LeaderLast``: followers first, the leader last (ZooKeeper style);
* ``ReplicaAware``: never more than ``max_down`` replicas of any shard down
  (the Shard Manager case of paper Figures 2 and 14).

Rules shared by all: at most one op per task per answer (of the ``move`` and
``stop`` offered for maintenance, ``move`` is preferred); an op on a task that is
already down costs nothing (moving a lost task cannot make things worse).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping

from plait.taskcontrol.protocol import (
    OpKind,
    TaskControlRequest,
    TaskControlResponse,
    TaskOp,
)

_PREFERENCE = {OpKind.MOVE: 0, OpKind.UPDATE: 1, OpKind.RESTART: 1, OpKind.STOP: 2}


class PacingController:
    """Base: tracks its acked, not yet completed ops; subclasses pick what to ack."""

    def __init__(self) -> None:
        self.in_flight: dict[str, TaskOp] = {}
        self.calls: list[TaskControlRequest] = []

    def process(self, request: TaskControlRequest) -> TaskControlResponse:
        self.calls.append(request)
        for op in request.completed:
            self.in_flight.pop(op.op_id, None)
        down = {t.index for t in request.all_unhealthy_tasks}
        down |= {op.task.index for op in self.in_flight.values()}
        chosen = self.choose(_one_per_task(request.request), down, request)
        for op in chosen:
            self.in_flight[op.op_id] = op
        return TaskControlResponse(tuple(op.op_id for op in chosen))

    def choose(self, ops: list[TaskOp], down: set[int],
               request: TaskControlRequest) -> list[TaskOp]:
        raise NotImplementedError


def _one_per_task(ops: tuple[TaskOp, ...]) -> list[TaskOp]:
    best: dict[int, TaskOp] = {}
    for op in ops:
        cur = best.get(op.task.index)
        if cur is None or _PREFERENCE[op.kind] < _PREFERENCE[cur.kind]:
            best[op.task.index] = op
    return sorted(best.values(), key=lambda o: o.task.index)


class DefaultController(PacingController):
    """Keeps at most ``max_unavailable`` tasks down, whatever the reason."""

    def __init__(self, max_unavailable: int) -> None:
        super().__init__()
        self.max_unavailable = max_unavailable

    def choose(self, ops: list[TaskOp], down: set[int],
               request: TaskControlRequest) -> list[TaskOp]:
        budget = self.max_unavailable - len(down)
        out = []
        for op in ops:
            if op.task.index in down:
                out.append(op)  # already down: free
            elif budget > 0:
                out.append(op)
                budget -= 1
        return out


class OneAtATime(DefaultController):
    def __init__(self) -> None:
        super().__init__(1)


class LeaderLast(PacingController):
    """One task at a time, followers first; the leader only when nothing else is
    pending or down. ``leader()`` names the leader's task index (None: unknown,
    then every op waits)."""

    def __init__(self, leader: Callable[[], int | None]) -> None:
        super().__init__()
        self.leader = leader

    def choose(self, ops: list[TaskOp], down: set[int],
               request: TaskControlRequest) -> list[TaskOp]:
        leader = self.leader()
        if leader is None:
            return []
        already_down = [op for op in ops if op.task.index in down]
        if already_down:
            return already_down  # moving a task that is down costs nothing, leader too
        followers = [op for op in ops if op.task.index != leader]
        if down:
            return []
        if followers:
            return followers[:1]
        return [op for op in ops if op.task.index == leader][:1]


class ReplicaAware(PacingController):
    """``shards`` maps a shard to the task indices holding its replicas; an op is
    acked only if no shard of that task would have more than ``max_down`` replicas
    down."""

    def __init__(self, shards: Mapping[str, Collection[int]], max_down: int = 1) -> None:
        super().__init__()
        self.max_down = max_down
        self.shards_of: dict[int, list[frozenset[int]]] = {}
        for replicas in shards.values():
            group = frozenset(replicas)
            for t in group:
                self.shards_of.setdefault(t, []).append(group)

    def choose(self, ops: list[TaskOp], down: set[int],
               request: TaskControlRequest) -> list[TaskOp]:
        out = []
        down = set(down)
        for op in ops:
            t = op.task.index
            if t in down:
                out.append(op)
                continue
            if all(len(group & down) + 1 <= self.max_down for group in self.shards_of.get(t, [])):
                out.append(op)
                down.add(t)
        return out
