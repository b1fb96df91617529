"""Counters and histograms cheap enough for the hot paths (a store operation, an
allocation, an HTTP request), exposed through prometheus-client as any metric.

prometheus-client's own take a lock per value and walk their buckets in Python:
about 1.5 microseconds an observation, as much as a SQLite read, and more between
two allocations or store writes, which leave the metric's objects out of the CPU's
caches. An observation here is one append to a deque (atomic, thread-safe, one
object touched); the values are sorted into buckets in batches, when a child has
``BATCH`` of them waiting or is read (a scrape). What they leave out: exemplars,
``_created`` samples and multiprocess mode, none of which plait uses.
``labels(*values)`` returns the child of those values, made on first use; callers on
a hot path keep the child. ``CountOf`` exposes a histogram's counts as a counter (the
allocations by result: one observation per allocation feeds both).
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections import deque
from collections.abc import Iterator, Sequence

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry
from prometheus_client.utils import floatToGoString

#: values a child keeps waiting before it sorts them in
BATCH = 512


class CounterChild:
    __slots__ = ("_lock", "_pending", "_value")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: deque[float] = deque()
        self._value = 0.0

    def inc(self, amount: float = 1) -> None:
        pending = self._pending
        pending.append(amount)
        if len(pending) >= BATCH:
            self._take()

    def _take(self) -> None:
        with self._lock:
            pending, value = self._pending, self._value
            for _ in range(len(pending)):
                value += pending.popleft()
            self._value = value

    @property
    def value(self) -> float:
        self._take()
        return self._value


class HistogramChild:
    __slots__ = ("_bounds", "_counts", "_lock", "_pending", "_sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self._bounds = bounds
        self._lock = threading.Lock()
        self._pending: deque[float] = deque()
        self._counts = [0] * (len(bounds) + 1)  # the last: above every bound (+Inf)
        self._sum = 0.0

    def observe(self, amount: float) -> None:
        pending = self._pending
        pending.append(amount)
        if len(pending) >= BATCH:
            self._take()

    def _take(self) -> None:
        with self._lock:
            pending, bounds, counts, total = self._pending, self._bounds, self._counts, self._sum
            for _ in range(len(pending)):  # (appends meanwhile wait for the next take)
                amount = pending.popleft()
                counts[bisect_left(bounds, amount)] += 1  # the first bound >= it (le)
                total += amount
            self._sum = total

    def snapshot(self) -> tuple[list[int], float]:
        """The count in each bucket (not cumulative; the last above every bound) and
        the sum of the values observed."""
        self._take()
        with self._lock:
            return list(self._counts), self._sum


class _Family(Collector):
    """Children by label values, registered in ``registry`` as one metric."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str],
                 registry: CollectorRegistry) -> None:
        self.name, self.documentation = name, documentation
        self.labelnames = tuple(labelnames)
        self._lock = threading.Lock()
        registry.register(self)

    def describe(self) -> list[Metric]:
        return [self._family()]

    def _family(self) -> Metric:
        raise NotImplementedError


class Counter(_Family):
    """A counter (``name`` without ``_total``: the exposition adds it)."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str] = (), *,
                 registry: CollectorRegistry) -> None:
        self._children: dict[tuple[str, ...], CounterChild] = {}
        super().__init__(name, documentation, labelnames, registry)

    def labels(self, *values: str) -> CounterChild:
        child = self._children.get(values)
        if child is None:
            if len(values) != len(self.labelnames):
                raise ValueError(f"{self.name}: {len(self.labelnames)} label values, "
                                 f"not {len(values)}")
            with self._lock:
                child = self._children.setdefault(values, CounterChild())
        return child

    def inc(self, amount: float = 1) -> None:
        self.labels().inc(amount)

    def _family(self) -> CounterMetricFamily:
        return CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)

    def collect(self) -> Iterator[Metric]:
        family = self._family()
        for values, child in list(self._children.items()):
            family.add_metric(list(values), child.value)
        yield family


class Histogram(_Family):
    """A histogram over ``buckets`` (upper bounds, increasing; +Inf is added)."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str] = (), *,
                 buckets: Sequence[float], registry: CollectorRegistry) -> None:
        self.bounds = tuple(float(b) for b in buckets)
        if list(self.bounds) != sorted(set(self.bounds)) or self.bounds[-1] == float("inf"):
            raise ValueError(f"{name}: buckets must increase, +Inf left out")
        self._children: dict[tuple[str, ...], HistogramChild] = {}
        super().__init__(name, documentation, labelnames, registry)

    def labels(self, *values: str) -> HistogramChild:
        child = self._children.get(values)
        if child is None:
            if len(values) != len(self.labelnames):
                raise ValueError(f"{self.name}: {len(self.labelnames)} label values, "
                                 f"not {len(values)}")
            with self._lock:
                child = self._children.setdefault(values, HistogramChild(self.bounds))
        return child

    def observe(self, amount: float) -> None:
        self.labels().observe(amount)

    def _family(self) -> HistogramMetricFamily:
        return HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)

    def children(self) -> list[tuple[tuple[str, ...], HistogramChild]]:
        return list(self._children.items())

    def collect(self) -> Iterator[Metric]:
        family = self._family()
        les = [floatToGoString(b) for b in self.bounds]  # type: ignore[no-untyped-call]
        les.append("+Inf")
        for values, child in self.children():
            counts, total = child.snapshot()
            cumulative, running = [], 0
            for le, n in zip(les, counts, strict=True):
                running += n
                cumulative.append((le, float(running)))
            family.add_metric(list(values), cumulative, total)
        yield family


class CountOf(Collector):
    """A counter read from a histogram's counts, by its labels (the histogram's
    observations, counted: nothing more on the hot path)."""

    def __init__(self, histogram: Histogram, name: str, documentation: str,
                 registry: CollectorRegistry) -> None:
        self.histogram, self.name, self.documentation = histogram, name, documentation
        registry.register(self)

    def _family(self) -> CounterMetricFamily:
        return CounterMetricFamily(self.name, self.documentation,
                                   labels=self.histogram.labelnames)

    def describe(self) -> list[Metric]:
        return [self._family()]

    def collect(self) -> Iterator[Metric]:
        family = self._family()
        for values, child in self.histogram.children():
            family.add_metric(list(values), float(sum(child.snapshot()[0])))
        yield family
