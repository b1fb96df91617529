"""The largest safe batch, solved exactly (CP-SAT, from OR-Tools): what the greedy
batch rule (``plait.shardmanager.batch``) is judged against.

One boolean per task that may go down; per shard, at most its room (``max_down``
less its replicas down already) of its tasks; maximise how many go. Time-limited: it
answers the best batch found and whether it was proven optimal. OR-Tools is the
``solver`` extra (the dev install has it); nothing else in plait imports it.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from plait.shardmanager.batch import missing


@dataclass(frozen=True, slots=True)
class Optimum:
    #: the largest batch found (tasks already down are not counted)
    batch: tuple[int, ...]
    #: whether the solver proved no batch is larger
    proven: bool
    #: the solver's upper bound on the batch's size
    bound: int


def largest_safe_batch(candidates: Iterable[int], replicas: Mapping[str, Sequence[int]],
                       down: Collection[int], max_down: int = 1,
                       replication: int | None = None, seconds: float = 20.0,
                       workers: int = 2) -> Optimum:
    """The largest set of ``candidates`` (not already down) that may go down together
    under the batch rule, within ``seconds`` of solving."""
    from ortools.sat.python import cp_model

    pending = sorted(set(candidates) - set(down))
    model = cp_model.CpModel()
    x = {t: model.new_bool_var(f"t{t}") for t in pending}
    degree: dict[int, int] = dict.fromkeys(x, 0)
    total = 0
    for shard, n in missing(replicas, down, replication).items():
        mine = [t for t in set(replicas[shard]) if t in x]
        if mine:
            room = max(0, max_down - n)
            model.add(sum(x[t] for t in mine) <= room)
            for t in mine:
                degree[t] += 1
            total += min(room, len(mine))
    # (the shards' constraints summed: implied, but it gives the solver the bound that
    # proves a whole replica group optimal at once)
    model.add(sum(degree[t] * x[t] for t in x) <= total)
    model.maximize(sum(x.values()))
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = seconds
    solver.parameters.num_workers = workers
    status = solver.solve(model)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return Optimum((), False, len(pending))
    batch = tuple(t for t in pending if solver.value(x[t]))
    return Optimum(batch, status == cp_model.OPTIMAL, int(solver.best_objective_bound))
