"""A region's worth of entitlements and jobs, shaped like the paper's (section 3.1):
a few huge entitlements and jobs, and a long tail of small ones.

At 1,000,000 machines the defaults give about 2,000,000 tasks, a largest job of
15,000 tasks and a largest entitlement of 60,000 machines; a smaller region gets
the same mix scaled down (the largest entitlement 6% of the machines, the largest
job 0.75% of the tasks).

* **entitlements**: the largest one, then quotas drawn from a Pareto law (a long
  tail of entitlements of a few dozen machines) until the quotas add up to ``fill``
  of the region, so a free pool is left;
* **jobs**: each entitlement gets about ``tasks_per_machine / fill`` tasks per
  machine of its quota, cut into jobs whose sizes follow a heavier-tailed Pareto law
  (most jobs have a handful of tasks, a few have thousands); the largest job sits in
  the largest entitlement;
* **tasks** ask for 1, 2, 4 or 8 RRU and 3 GB of memory per RRU (one size per job):
  on average a quota's jobs ask for half its RRU (``machine_rru`` per machine),
  and never more than ``max_rru_share`` of it (a job that would pass it takes a
  smaller size), so every job fits whatever the packing.

Deterministic for a seed; pure (no clock, no I/O).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from plait.model import Entitlement, JobSpec, Quota, parse

#: task sizes (RRU) and how often a job picks each
TASK_CPU = (1, 2, 4, 8)
TASK_CPU_WEIGHTS = (0.2, 0.3, 0.3, 0.2)
#: memory per RRU of a task (GB); the default machines have 4
MEMORY_GB_PER_RRU = 3
#: the paper's region: largest entitlement and largest job per machine and per task
LARGEST_ENTITLEMENT_SHARE = 0.06
LARGEST_JOB_SHARE = 0.0075
#: most of a quota's RRU its jobs may ask for
MAX_RRU_SHARE = 0.6
#: Pareto shapes: entitlement quotas, job sizes (smaller = heavier tail)
QUOTA_SHAPE = 1.0
JOB_SHAPE = 0.9


@dataclass(frozen=True)
class JobMix:
    entitlements: tuple[Entitlement, ...]
    jobs: tuple[JobSpec, ...]

    @property
    def tasks(self) -> int:
        return sum(j.task_count for j in self.jobs)

    @property
    def largest_job(self) -> int:
        return max((j.task_count for j in self.jobs), default=0)

    @property
    def largest_entitlement(self) -> int:
        return max((e.quota.machines or 0 for e in self.entitlements), default=0)


def region_mix(machines: int, *, seed: int = 0, tasks_per_machine: float = 2.0,
               fill: float = 0.9, largest_entitlement: int | None = None,
               largest_job: int | None = None, machine_rru: float = 16.0,
               max_rru_share: float = MAX_RRU_SHARE) -> JobMix:
    """The entitlements and jobs of a region of ``machines`` machines; see the module
    docstring. Entitlements come largest quota first."""
    if machines < 1:
        raise ValueError("machines must be >= 1")
    if not 0 < fill <= 1:
        raise ValueError("fill must be in (0, 1]")
    rng = np.random.default_rng(seed)
    top = largest_entitlement or max(1, round(machines * LARGEST_ENTITLEMENT_SHARE))
    biggest_job = largest_job or max(1, round(machines * tasks_per_machine * LARGEST_JOB_SHARE))
    quotas = _quotas(rng, round(machines * fill), top)
    per_quota_machine = tasks_per_machine / fill
    templates = [parse(JobSpec, {
        "name": "template", "entitlement": "template", "task_count": 1, "command": "serve",
        "resources": {"cpu": cpu, "memory_gb": cpu * MEMORY_GB_PER_RRU},
    }) for cpu in TASK_CPU]
    weights = np.asarray(TASK_CPU_WEIGHTS) / sum(TASK_CPU_WEIGHTS)
    entitlements: list[Entitlement] = []
    jobs: list[JobSpec] = []
    width = len(str(len(quotas)))
    for k, quota in enumerate(quotas.tolist()):
        name = f"ent{k:0{width}d}"
        entitlements.append(Entitlement(name=name, owner="sim", quota=Quota(machines=quota)))
        budget = max(1, round(quota * per_quota_machine))
        sizes = _job_sizes(rng, budget, biggest_job, first=biggest_job if k == 0 else None)
        picks = rng.choice(len(templates), size=sizes.size, p=weights)
        rru_left = quota * machine_rru * max_rru_share
        for j, (size, pick) in enumerate(zip(sizes.tolist(), picks.tolist(), strict=True)):
            while pick > 0 and TASK_CPU[pick] * size > rru_left:
                pick -= 1  # a smaller size keeps the entitlement's jobs within its quota
            rru_left -= TASK_CPU[pick] * size
            # a copy shares the template's nested values (resources, policy): one
            # compiled policy per entitlement and size, as jobs of one team would
            jobs.append(templates[pick].model_copy(update={
                "name": f"{name}-job{j:05d}", "entitlement": name, "task_count": size}))
    return JobMix(tuple(entitlements), tuple(jobs))


def _quotas(rng: np.random.Generator, total: int, top: int) -> np.ndarray:
    """Quotas (machines) adding up to ``total``: ``top`` first, then a Pareto tail
    starting at a few dozen machines (at a million), largest first."""
    top = min(top, total)
    rest = total - top
    smallest = max(1, total // 20_000)
    out = [top]
    while rest > 0:
        draw = np.minimum(np.ceil(smallest * (1 + rng.pareto(QUOTA_SHAPE, size=256))),
                          max(1, int(top * 0.75))).astype(np.int64)
        ends = np.cumsum(draw)
        cut = int(np.searchsorted(ends, rest))
        if cut < draw.size:
            draw = draw[: cut + 1]
            draw[-1] -= int(ends[cut]) - rest  # the last one takes what is left
        out.extend(int(q) for q in draw if q > 0)
        rest -= int(draw.sum())
    head, tail = out[0], sorted(out[1:], reverse=True)
    return np.asarray([head, *tail], np.int64)


def _job_sizes(rng: np.random.Generator, budget: int, largest: int,
               first: int | None = None) -> np.ndarray:
    """Job sizes (tasks) adding up to ``budget``, none above ``largest``."""
    sizes: list[int] = []
    if first is not None:
        sizes.append(min(first, budget))
    rest = budget - sum(sizes)
    while rest > 0:
        n = max(16, min(4096, math.ceil(rest / 20)))
        draw = np.minimum(np.ceil(rng.pareto(JOB_SHAPE, size=n) * 3 + 1),
                          largest).astype(np.int64)
        ends = np.cumsum(draw)
        cut = int(np.searchsorted(ends, rest))
        if cut < draw.size:
            draw = draw[: cut + 1]
            draw[-1] -= int(ends[cut]) - rest
        sizes.extend(int(s) for s in draw if s > 0)
        rest -= int(draw.sum())
    return np.asarray(sizes, np.int64)
