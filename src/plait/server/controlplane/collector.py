"""The control plane's gauges, read when scraped (``ControlPlaneCollector``): what
readers see of its jobs, its machines, host profiles, loans and the allocator's cache,
and whether it leads. Handed what it reads, not the control plane (``plait.metrics``
has the process's counters and histograms)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from plait.metrics import OTHER_JOBS, Metrics, largest_jobs


class JobView(Protocol):
    """What the collector reads of a job's published view (``views.JobState``)."""

    @property
    def records(self) -> int: ...
    @property
    def counts(self) -> Mapping[str, int]: ...
    @property
    def entitlement(self) -> str: ...
    @property
    def unavailable(self) -> int: ...
    @property
    def rollout_active(self) -> bool: ...
    @property
    def halted(self) -> str | None: ...


class RegionCore(Protocol):
    """What the collector reads of a region's core objects (``RegionState``): read
    each scrape, since a rebuild replaces them."""

    @property
    def scheduler(self) -> Any: ...
    @property
    def region(self) -> Any: ...
    @property
    def allocator(self) -> Any: ...


class ControlPlaneCollector(Collector):
    """Gauges read from a control plane when scraped: what readers see of its jobs
    (published by each pass, read without the lock: ``snapshot``), its machines
    (``core``) and whether it leads (``leading``). ``metrics``: the control plane's,
    told which jobs have series of their own (at most ``shown_jobs``)."""

    def __init__(self, leading: Callable[[], bool],
                 snapshot: Callable[[], Mapping[str, JobView]], core: RegionCore,
                 metrics: Metrics, shown_jobs: int) -> None:
        self.leading, self.snapshot, self.core = leading, snapshot, core
        self.metrics, self.shown_jobs = metrics, shown_jobs
        metrics.pick_jobs = lambda: self._largest(list(snapshot().items()))

    def _largest(self, views: list[tuple[str, JobView]]) -> frozenset[str]:
        return largest_jobs({name: view.records for name, view in views}, self.shown_jobs)

    def describe(self) -> list[Metric]:
        return []  # (read at each scrape; nothing to check at registration)

    def collect(self) -> Iterator[Metric]:
        leads = bool(self.leading())
        lead = GaugeMetricFamily("plait_leader", "1 if this replica runs the control "
                                                 "plane's loop (leads), else 0")
        lead.add_metric([], 1.0 if leads else 0.0)
        yield lead
        views = list(self.snapshot().items())
        shown = self._largest(views)
        self.metrics.show_jobs(shown)
        tasks: Counter[str] = Counter()
        unavailable = GaugeMetricFamily(
            "plait_job_unavailable_tasks", "Tasks of the job not serving, by job and "
            f"entitlement: of the jobs with the most tasks (plait serve --metrics-jobs), "
            f"those of the others summed per entitlement as job {OTHER_JOBS!r}",
            labels=["job", "entitlement"])
        others: Counter[str] = Counter()
        active = halted = 0
        for name, view in views:
            tasks.update(view.counts)
            if name in shown:
                unavailable.add_metric([name, view.entitlement], float(view.unavailable))
            else:
                others[view.entitlement] += view.unavailable
            active += bool(view.rollout_active)
            halted += view.halted is not None
        for ent, n in sorted(others.items()):
            unavailable.add_metric([OTHER_JOBS, ent], float(n))
        by_state = GaugeMetricFamily("plait_tasks", "Tasks by state", labels=["state"])
        for state, n in sorted(tasks.items()):
            by_state.add_metric([state], float(n))
        yield by_state
        yield unavailable
        rollouts = GaugeMetricFamily("plait_rollouts", "Jobs with a rollout under way, and "
                                                       "halted", labels=["state"])
        rollouts.add_metric(["active"], float(active))
        rollouts.add_metric(["halted"], float(halted))
        yield rollouts
        yield self._machines()
        core = self.core
        sched = core.scheduler
        profiles = GaugeMetricFamily(
            "plait_host_profile_machines", "Machines whose host profile is switching (joined "
            "an entitlement, not switched yet), failing (their last switch failed) and "
            "rolling (drained for a changed profile)", labels=["state"])
        for state, n in (("switching", len(sched.profiles.pending)),
                         ("failing", len(sched.profiles.failing)),
                         ("rolling", len(sched.rolling))):
            profiles.add_metric([state], float(n))
        yield profiles
        loaned = GaugeMetricFamily(
            "plait_loaned_machines", "Machines on loan to elastic entitlements: lent (in "
            "use by a borrower) and revoking (notice given, due back)", labels=["state"])
        revoking = len(sched.revokes)
        held = sum(len(core.region.machines_of(n)) for n in list(sched.elastic))
        loaned.add_metric(["lent"], float(held - revoking))
        loaned.add_metric(["revoking"], float(revoking))
        yield loaned
        revokes = CounterMetricFamily("plait_loan_revokes", "Loans revoked, and those whose "
                                      "machine came back past its deadline", labels=["when"])
        revokes.add_metric(["all"], float(sched.counters["loan_revokes"]))
        revokes.add_metric(["late"], float(sched.counters["loan_revokes_late"]))
        yield revokes
        cache = core.allocator.cache
        hits = CounterMetricFamily("plait_allocator_cache_hits", "Placements answered from "
                                   "the allocator's job-level cache")
        hits.add_metric([], float(cache.hits))
        yield hits
        misses = CounterMetricFamily("plait_allocator_cache_misses", "Placements computed "
                                     "(not in the cache)")
        misses.add_metric([], float(cache.misses))
        yield misses
        ratio = GaugeMetricFamily("plait_allocator_cache_hit_ratio", "Hits over lookups "
                                  "of the allocator's cache since start")
        ratio.add_metric([], float(cache.hit_ratio))
        yield ratio

    def _machines(self) -> Metric:
        """Machines by state and entitlement (free: ""), counted per data center's
        broker from its arrays (a copy each: no lock held)."""
        import numpy as np

        states = ("healthy", "failed", "maintenance")
        family = GaugeMetricFamily("plait_machines", "Machines by state and entitlement "
                                   "(\"\" free)", labels=["state", "entitlement"])
        counts: Counter[tuple[str, str]] = Counter()
        for broker in list(self.core.region.brokers.values()):
            codes, ents = broker.state_codes(), broker.entitlement_codes()
            if len(codes) != len(ents):
                continue  # (changed between the two copies: the next scrape counts it)
            names = list(self.core.region.entitlements.names)
            pairs, n = np.unique(np.stack([codes.astype(np.int64), ents.astype(np.int64)]),
                                 axis=1, return_counts=True)
            for (state, ent), count in zip(pairs.T.tolist(), n.tolist(), strict=True):
                name = "" if ent < 0 else names[ent] if ent < len(names) else "?"
                counts[(states[state], name)] += int(count)
        for (state, ent), count in sorted(counts.items()):
            family.add_metric([state, ent], float(count))
        return family
