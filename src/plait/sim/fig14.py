"""The paper's Figure 14: a rolling update of a sharded cache and a failed MSB at once,
paced by Shard Manager's TaskController: ``plait sim run examples/scenarios/fig14.yaml``.

The real scheduler runs on the simulated clock with the production Shard Manager
core (``plait.shardmanager``): ``tasks`` machines over ``msbs`` MSBs, one task of the
cache on each (a task whose machine fails has nowhere to go until it is repaired);
``assign`` lays ``shards`` shards of ``replication`` replicas over the tasks by fault
domain, and the job's ``ShardController`` reads which replicas are ready from the
scheduler's records (a task serves its shards while it serves; an updated task
serves them again as soon as it is back: instantaneous here). The update's pace is
the controller's alone (no ``max_unavailable``, a rate limit it never meets).

At T0 the job is updated; from ``failure_start`` to ``failure_end`` (seconds after
T0) ``failed_msbs`` MSBs are down. They are the worst for the update: the MSBs whose
failure leaves the most shards with two replicas down, given the tasks updating at
``failure_start`` (ties drawn with ``seed``), so the failure takes second replicas as
the paper's did.

What is measured, every tick: a replica is *down* when its task is not serving; down
*by failure* when its task's machine is failed or it has not served since its
machine failed (it is coming back from the failure), else *by update*. A shard with
two or more replicas down is *caused by update* when two of them are down by update,
or when its update-down replica's operation was acked at or after another of its
replicas went down (the controller acked into a shard already missing a replica);
otherwise the failure caused it (it hit a shard with one replica updating: the spike
of the paper's Figure 14b). With ``max_down`` 1 the controller must keep the first
kind at zero.
``optimal_first_batch`` is the largest safe batch of the T0 layout found by CP-SAT
(``plait.shardmanager.optimal``), what the controller's greedy first batch is judged
against.

The figures: ``first_batch``, the tasks the controller's first answer let go down;
``second_batch``, those of its first answer to let tasks go down once the first
batch completed (every task of it serving at the new version, or down by the
failure); ``max_shards_two_down_caused_by_update`` and
``shards_two_down_by_failure_peak``, the most shards at once with two replicas down
of each kind; ``rollout_seconds``, T0 to every task serving at the new version;
``shards_one_down_at_t0``, the shards the first batch hosts (each loses a replica);
``optimal_bound``, no safe first batch is larger (CP-SAT's bound or ``load_bound``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import pydantic

from plait.model import UpdatePolicy
from plait.model.base import Value
from plait.model.task import TaskState
from plait.model.topology import Fleet, RegionSpec, generate
from plait.scheduler import SchedulerConfig
from plait.scheduler.records import JobRecord
from plait.shardmanager import Layout, ShardController, ShardView, TaskPlace, assign
from plait.sim.agents import Behaviour
from plait.sim.harness import Simulation
from plait.sim.scenarios import job_spec, world
from plait.taskcontrol.protocol import OpKind, TaskControlRequest, TaskControlResponse

JOB = "cache"
#: a task's outage, as the figures count it
UP, BY_UPDATE, BY_FAILURE = 0, 1, 2
#: machines per rack in the generated region (racks are the layout's second level)
PER_RACK = 10


class Fig14(Value):
    """The scenario's parameters (``examples/scenarios/fig14.yaml``): the paper's by
    default."""

    scenario: Literal["fig14"]
    #: draws which of the equally bad MSBs fail (and the region's machine types)
    seed: int = 14
    shards: int = pydantic.Field(default=15_000, ge=1, le=1_000_000)
    replication: int = pydantic.Field(default=3, ge=2, le=5)
    #: the cache's tasks, one per machine: the region has exactly this many machines
    tasks: int = pydantic.Field(default=1_000, ge=2, le=20_000)
    #: MSBs the machines are spread over evenly
    msbs: int = pydantic.Field(default=20, ge=1, le=256)
    #: the failure's window, in seconds after the update starts (T0)
    failure_start: float = pydantic.Field(default=120.0, ge=0, le=86_400)
    failure_end: float = pydantic.Field(default=415.0, gt=0, le=86_400)
    #: MSBs that fail (each takes tasks / msbs tasks with it); 0: no failure
    failed_msbs: int = pydantic.Field(default=1, ge=0, le=255)
    #: how long a task takes to start and become healthy (an update's downtime)
    start_seconds: float = pydantic.Field(default=230.0, ge=0, le=3600)
    stop_seconds: float = pydantic.Field(default=1.0, ge=0, le=3600)
    tick_seconds: float = pydantic.Field(default=1.0, gt=0, le=60)
    #: simulated seconds after T0 at most
    max_seconds: float = pydantic.Field(default=7200.0, gt=0, le=7 * 86_400)
    #: the replicas of a shard Shard Manager lets be down at once (1: two of three
    #: always serve; more lets the update itself take a second replica)
    max_down: int = pydantic.Field(default=1, ge=1, le=4)
    #: CP-SAT's time limit for the optimal first batch
    optimal_seconds: float = pydantic.Field(default=20.0, gt=0, le=600)

    @pydantic.model_validator(mode="after")
    def _consistent(self) -> Fig14:
        if self.tasks < self.replication:
            raise ValueError(f"tasks ({self.tasks}) must be at least replication "
                             f"({self.replication}): replicas of a shard go on distinct tasks")
        if self.msbs > self.tasks:
            raise ValueError(f"msbs ({self.msbs}) must be at most tasks ({self.tasks})")
        if self.max_down >= self.replication:
            raise ValueError(f"max_down ({self.max_down}) must be below replication "
                             f"({self.replication})")
        if self.failed_msbs >= self.msbs:
            raise ValueError(f"failed_msbs ({self.failed_msbs}) must be below msbs "
                             f"({self.msbs})")
        if not self.failure_start < self.failure_end <= self.max_seconds:
            raise ValueError("failure_start < failure_end <= max_seconds must hold")
        return self


@dataclass(frozen=True)
class Series:
    """The figure's curves, one point per tick, in seconds after T0."""

    seconds: tuple[float, ...]
    #: 14a: acked and not yet serving at the new version (outside the failure)
    updating: tuple[int, ...]
    #: 14a: not acked yet
    waiting: tuple[int, ...]
    #: tasks down by the failure
    failed: tuple[int, ...]
    #: 14b: shards with at least one, at least two replicas down; two caused by update
    one_down: tuple[int, ...]
    two_down: tuple[int, ...]
    two_down_by_update: tuple[int, ...]


@dataclass(frozen=True)
class Fig14Result:
    figures: dict[str, Any]
    series: Series
    #: the failure's window (seconds after T0), None without one
    failure: tuple[float, float] | None
    #: each answer that acked tasks to go down: (seconds after T0, how many)
    batches: tuple[tuple[float, int], ...]


@dataclass(frozen=True)
class ShardCounts:
    one_down: int
    two_down: int
    two_down_by_update: int


# -- the pure part: what the figures count ---------------------------------------------------
def count_down(replicas: npt.NDArray[np.int64], cause: npt.NDArray[np.int8],
               since: npt.NDArray[np.float64]) -> ShardCounts:
    """Shards with replicas down, and those of them the update caused.

    ``replicas``: shards x replication, each replica's task; ``cause`` per task
    (``UP``, ``BY_UPDATE``, ``BY_FAILURE``); ``since`` per task, when its outage
    began for the controller: its op's ack (by update) or its machine's failure.
    A purely computational function with no side effects."""
    kind = cause[replicas]
    start = since[replicas]
    down = kind != UP
    update = kind == BY_UPDATE
    n_down = down.sum(axis=1)
    n_update = update.sum(axis=1)
    two = n_down >= 2
    # with one update-down replica: was it acked at or after another went down?
    acked = np.where(update, start, -np.inf).max(axis=1)
    other = np.where(down & ~update, start, np.inf).min(axis=1)
    by_update = two & ((n_update >= 2) | ((n_update == 1) & (other <= acked)))
    return ShardCounts(int((n_down >= 1).sum()), int(two.sum()), int(by_update.sum()))


def worst_msbs(msb_of: Mapping[int, str], replicas: Mapping[str, Sequence[int]],
               updating: set[int], count: int, rng: np.random.Generator) -> list[str]:
    """The ``count`` MSBs whose failure alone would leave the most shards with two
    replicas down, given the ``updating`` tasks are down (ties in ``rng``'s order).
    A purely computational function with no side effects (but for ``rng``)."""
    names = sorted(set(msb_of.values()))
    damage = dict.fromkeys(names, 0)
    for tasks in replicas.values():
        down = sum(1 for t in tasks if t in updating)
        up_on: dict[str, int] = {}
        for t in tasks:
            if t not in updating and t in msb_of:
                up_on[msb_of[t]] = up_on.get(msb_of[t], 0) + 1
        for m, n in up_on.items():
            if down + n >= 2:
                damage[m] += 1
    draw = {m: float(r) for m, r in zip(names, rng.permutation(len(names)), strict=True)}
    return sorted(names, key=lambda m: (-damage[m], draw[m]))[:count]


def load_bound(replicas: Mapping[str, Sequence[int]], tasks: int, max_down: int) -> int:
    """An upper bound on any safe batch with nothing down: each shard lets at most
    ``max_down`` of its replicas go, so a batch's tasks hold at most that many replicas
    in all; no batch is larger than the most tasks whose replicas fit, the least
    loaded first. (CP-SAT's own bound is far looser on a layout this regular.)
    A purely computational function with no side effects."""
    load = [0] * tasks
    for holders in replicas.values():
        for t in holders:
            load[t] += 1
    room = sum(min(max_down, len(holders)) for holders in replicas.values())
    taken = 0
    for n in sorted(load):
        if n > room:
            break
        room -= n
        taken += 1
    return taken


# -- the shell: the simulation ------------------------------------------------------------
class _Recorded:
    """The job's TaskController: Shard Manager's, with each answer kept (when, the
    tasks it acked, the tasks it let go down) for the figures."""

    def __init__(self, inner: ShardController, clock: Callable[[], float]) -> None:
        self.inner = inner
        self.clock = clock
        #: task -> when an operation on it was last acked; when its update was
        self.acked_at: dict[int, float] = {}
        self.update_acked: dict[int, float] = {}
        #: (when, the tasks the answer let go down that were up)
        self.answers: list[tuple[float, tuple[int, ...]]] = []

    def process(self, request: TaskControlRequest) -> TaskControlResponse:
        response = self.inner.process(request)
        now = self.clock()
        acked = set(response.ack)
        for op in request.request:
            if op.op_id in acked:
                self.acked_at[op.task.index] = now
                if op.kind is OpKind.UPDATE:
                    self.update_acked[op.task.index] = now
        self.answers.append((now, self.inner.last_batch))
        return response


@dataclass
class _Trace:
    """What the run observes, tick by tick."""

    seconds: list[float] = field(default_factory=list)
    updating: list[int] = field(default_factory=list)
    waiting: list[int] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)
    one_down: list[int] = field(default_factory=list)
    two_down: list[int] = field(default_factory=list)
    two_down_by_update: list[int] = field(default_factory=list)

    def add(self, now: float, updating: int, waiting: int, failed: int,
            counts: ShardCounts) -> None:
        self.seconds.append(now)
        self.updating.append(updating)
        self.waiting.append(waiting)
        self.failed.append(failed)
        self.one_down.append(counts.one_down)
        self.two_down.append(counts.two_down)
        self.two_down_by_update.append(counts.two_down_by_update)

    def series(self) -> Series:
        return Series(tuple(self.seconds), tuple(self.updating), tuple(self.waiting),
                      tuple(self.failed), tuple(self.one_down), tuple(self.two_down),
                      tuple(self.two_down_by_update))


def _region(scn: Fig14) -> Fleet:
    racks = max(1, scn.tasks // (scn.msbs * PER_RACK))
    return generate(RegionSpec(dcs=1, msbs_per_dc=scn.msbs, rows_per_msb=1,
                               racks_per_row=racks, machines=scn.tasks), seed=scn.seed)


def _msb(fleet: Fleet, machine: int) -> str:
    return fleet.level_names["msb"][int(fleet.codes["msb"][machine])]


def _place(fleet: Fleet, job: JobRecord) -> list[TaskPlace]:
    """Each task's fault domains, coarsest first: (MSB, rack, machine)."""
    out = []
    for i, rec in sorted(job.tasks.items()):
        m = rec.machine
        if m is None:
            out.append(TaskPlace(i))
            continue
        out.append(TaskPlace(i, (_msb(fleet, m),
                                 fleet.level_names["rack"][int(fleet.codes["rack"][m])],
                                 fleet.name(m))))
    return out


def _ready(job: JobRecord) -> set[int]:
    """The tasks serving their shards."""
    running = TaskState.RUNNING
    return {i for i, r in job.tasks.items() if r.serving and r.healthy and r.state is running}


def _classify(job: JobRecord, ready: set[int], version: int, cause: npt.NDArray[np.int8],
              since: npt.NDArray[np.float64],
              failed_machines: set[int], failed_at: float, controller: _Recorded,
              now: float) -> tuple[int, int, int, int]:
    """Each task's cause of being down (``cause``, ``since``, updated in place) and the
    tasks updating, waiting for the update, down by the failure, and done."""
    updating_n = waiting_n = failed_n = done = 0
    for i, rec in job.tasks.items():
        new = rec.spec_version == version
        if i in ready:
            cause[i] = UP
            done += new
            if new:
                continue
        elif rec.machine in failed_machines:
            if cause[i] != BY_FAILURE:
                cause[i], since[i] = BY_FAILURE, failed_at
        elif cause[i] == UP:  # (a task down by the failure stays so until it serves)
            cause[i], since[i] = BY_UPDATE, controller.acked_at.get(i, now)
        if cause[i] == BY_FAILURE:
            failed_n += 1
        elif i in controller.update_acked:
            updating_n += 1
        else:
            waiting_n += 1
    return updating_n, waiting_n, failed_n, done


def run(scn: Fig14, progress: Callable[[float], None] | None = None) -> Fig14Result:
    wall = time.perf_counter()
    rng = np.random.default_rng(scn.seed)
    fleet = _region(scn)
    behaviour = Behaviour(start_seconds=scn.start_seconds, stop_seconds=scn.stop_seconds)
    config = SchedulerConfig(rate=1000.0, burst=1000.0,
                             controller_batch=max(scn.tasks, 1000))
    sim: Simulation = world(fleet=fleet, behaviour=lambda a: behaviour, config=config)
    sim.tick = scn.tick_seconds
    s = sim.scheduler
    layouts: list[Layout] = []
    #: the last view made, and the tasks serving then (the same while none changed)
    made: list[tuple[frozenset[int], ShardView]] = []

    def view() -> ShardView:
        """The shard map as the application sees it: a replica is ready while its
        task serves (nothing before the layout is made)."""
        if not layouts:
            return ShardView({}, scn.replication)
        ready = frozenset(_ready(s.job(JOB)))
        if made and made[0][0] == ready:
            return made[0][1]
        shown = ShardView({shard: tuple(t for t in tasks if t in ready)
                           for shard, tasks in layouts[0].replicas.items()}, scn.replication)
        made[:] = [(ready, shown)]
        return shown

    controller = _Recorded(ShardController(view, max_down=scn.max_down), lambda: sim.now)
    spec = job_spec(JOB, scn.tasks, cpu=int(fleet.cpu.min()) / 1000, memory_gb=1,
                    update=UpdatePolicy(max_unavailable=None))
    s.create_job(spec, sim.now, controller=controller)
    if not sim.run_until(lambda: len(_ready(s.job(JOB))) == scn.tasks,
                         scn.start_seconds + 600):
        raise RuntimeError("the cache's tasks did not all start")
    job = s.job(JOB)
    width = len(str(scn.shards - 1))
    layout = assign([f"shard{k:0{width}d}" for k in range(scn.shards)], scn.replication,
                    _place(fleet, job))
    layouts.append(layout)
    replicas = np.array([layout.replicas[k] for k in sorted(layout.replicas)], np.int64)
    shards_of = layout.shards_of()

    # T0: the update
    t0 = sim.now
    version = s.update_job(spec.model_copy(update={"args": ("--v2",)}), t0)
    cause = np.zeros(scn.tasks, np.int8)
    since = np.zeros(scn.tasks, np.float64)
    failed_machines: set[int] = set()
    failure: str | None = None
    injected = False
    failed_at = 0.0
    failed_tasks = shards_hit = 0
    trace = _Trace()
    counts = ShardCounts(0, 0, 0)
    last: tuple[bytes, bytes] | None = None
    first_done: float | None = None
    rollout: float | None = None
    told = 0.0
    while sim.now - t0 < scn.max_seconds - 1e-9:
        now = sim.now - t0
        if not injected and scn.failed_msbs and now >= scn.failure_start:
            injected = True
            updating = {t for t in controller.update_acked if t not in _ready(job)
                        or job.tasks[t].spec_version != version}
            msb_of = {i: _msb(fleet, r.machine) for i, r in job.tasks.items()
                      if r.machine is not None}
            doomed = set(worst_msbs(msb_of, layout.replicas, updating, scn.failed_msbs,
                                    rng))
            failed_machines = {m for m in range(len(fleet)) if _msb(fleet, m) in doomed}
            failed_tasks = sum(1 for t, m in msb_of.items() if m in doomed)
            shards_hit = len({sh for t, m in msb_of.items() if m in doomed
                              for sh in shards_of.get(t, ())})
            failure = sim.fail(fleet.names(sorted(failed_machines)))
            # between this tick and the next: after the acks stamped ``now``
            failed_at = float(np.nextafter(sim.now, np.inf))
        elif failure is not None and now >= scn.failure_end:
            sim.repair(failure)
            failure, failed_machines = None, set()
        sim.step()
        now = sim.now - t0
        ready = _ready(job)
        updating_n, waiting_n, failed_n, done = _classify(
            job, ready, version, cause, since, failed_machines, failed_at, controller, sim.now)
        key = (cause.tobytes(), since.tobytes())
        if key != last:
            counts, last = count_down(replicas, cause, since), key
        trace.add(now, updating_n, waiting_n, failed_n, counts)
        answers = [(t - t0, batch) for t, batch in controller.answers if t > t0]
        if first_done is None and answers and answers[0][1] and all(
                (t in ready and job.tasks[t].spec_version == version) or cause[t] == BY_FAILURE
                for t in answers[0][1]):
            first_done = now  # (its tasks the failure took come back after the repair)
        if done == scn.tasks and rollout is None:
            rollout = now
        if rollout is not None and failure is None and (
                now >= scn.failure_end or not scn.failed_msbs):
            break
        if progress is not None and done / scn.tasks - told >= 0.01:
            told = done / scn.tasks
            progress(0.8 * told)
    if progress is not None:
        progress(0.8)

    from plait.shardmanager.optimal import largest_safe_batch

    optimum = largest_safe_batch(range(scn.tasks), layout.replicas, (), scn.max_down,
                                 scn.replication, seconds=scn.optimal_seconds)
    if progress is not None:
        progress(1.0)
    answers = [(t - t0, batch) for t, batch in controller.answers if t > t0]
    first = answers[0][1] if answers else ()
    second = next(((t, b) for t, b in answers
                   if b and first_done is not None and t >= first_done), None)
    optimal = len(optimum.batch)
    series = trace.series()
    figures: dict[str, Any] = {
        "first_batch": len(first),
        "second_batch": len(second[1]) if second is not None else 0,
        "max_shards_two_down_caused_by_update": max(series.two_down_by_update, default=0),
        "shards_two_down_by_failure_peak": max(
            (a - b for a, b in zip(series.two_down, series.two_down_by_update, strict=True)),
            default=0),
        "rollout_seconds": rollout,
        "updated_tasks": sum(1 for r in job.tasks.values() if r.spec_version == version),
        "optimal_first_batch": optimal,
        "optimal_proven": optimum.proven,
        "optimal_bound": min(optimum.bound, load_bound(layout.replicas, scn.tasks,
                                                       scn.max_down)),
        "first_batch_ratio": round(len(first) / optimal, 4) if optimal else None,
        "shards_one_down_at_t0": len({sh for t in first for sh in shards_of.get(t, ())}),
        "first_batch_done_seconds": first_done,
        "second_batch_seconds": second[0] if second is not None else None,
        "batches": sum(1 for _, b in answers if b),
        "failed_tasks": failed_tasks,
        "shards_hit_by_failure": shards_hit,
        "largest_replica_group": max(
            (sum(1 for g in layout.groups.values() if g == k)
             for k in range(scn.replication)), default=0),
        "tasks": scn.tasks, "shards": scn.shards, "replication": scn.replication,
        "msbs": scn.msbs,
        "wall_seconds": round(time.perf_counter() - wall, 2),
    }
    window = (scn.failure_start, scn.failure_end) if failed_tasks else None
    return Fig14Result(figures, series, window, tuple((t, len(b)) for t, b in answers if b))


def plot(result: Fig14Result, path: str) -> None:
    """The paper's Figure 14: (a) tasks waiting, updating and failed; (b) shards with
    replicas down; the failure's window shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = result.series
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 6.5), sharex=True)
    top.plot(s.seconds, s.waiting, label="tasks not yet updated", color="C0", lw=1.3)
    top.plot(s.seconds, s.updating, label="tasks updating (acked)", color="C1", lw=1.3)
    top.plot(s.seconds, s.failed, label="tasks down by the failure", color="C3", lw=1.0,
             ls="--")
    top.set_ylabel("tasks")
    top.set_title("(a) the rolling update, acked by Shard Manager's TaskController")
    bottom.plot(s.seconds, s.one_down, label="shards with >= 1 replica down", color="C0",
                lw=1.3)
    bottom.plot(s.seconds, s.two_down, label="shards with >= 2 replicas down", color="C3",
                lw=1.3)
    bottom.plot(s.seconds, s.two_down_by_update, label=">= 2 down caused by the update",
                color="k", lw=1.0, ls=":")
    bottom.set_ylabel("shards")
    bottom.set_xlabel("seconds after the update started (T0)")
    bottom.set_title("(b) shards with replicas down")
    for ax in (top, bottom):
        if result.failure is not None:
            ax.axvspan(*result.failure, color="C3", alpha=0.12, label="failure")
        for t, _ in result.batches:
            ax.axvline(t, color="grey", lw=0.6, alpha=0.4)
        ax.legend(loc="upper right", fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
