"""Prometheus metrics of a plait process (prometheus-client).

Each process keeps its own registry (``Metrics``): a test may run several control
planes in one process, and each answers ``/metrics`` with its own figures. Two kinds
of metric:

* counted where things happen, on the hot path: HTTP requests by route template,
  method and status and their latency (``plait.httpmetrics.HttpMetrics``, an ASGI
  wrapper), events by
  kind (every event a control plane records: rollouts halted, tasks killed, machines
  failed, throttling...), passes and their duration, each stage of a pass
  (``PassTimer``), store operations and their errors (``plait.store.metered``),
  allocation requests by result and their latency (``PersistentAllocator.sink``),
  TaskControl calls by outcome and their latency; the store's, the stages' and the
  allocations' are ``plait.hotmetrics`` instruments, cheaper per observation;
* read when scraped, at no cost between scrapes (``server.controlplane.collector``): tasks by
  state, unavailable tasks per job, rollouts active and halted, machines by state and
  entitlement, the allocator's placement cache, whether this replica leads.

Series per job are bounded: the jobs with the most tasks (``largest_jobs``, at most
``ControlPlaneConfig.metrics_jobs``, 100 by default: ``plait serve --metrics-jobs``) have
series of their own (the unavailable tasks, the TaskControl calls), the others' are
summed under the job ``_other`` (``OTHER_JOBS``; the unavailable tasks per
entitlement). The jobs shown are chosen again at each scrape.

Names follow Prometheus' conventions: ``plait_`` first, the unit last, ``_total`` on
counters. ``docs/grafana-dashboard.json`` is a dashboard built on them.

Metrics can be turned off (``plait serve --no-metrics``, ``ControlPlaneConfig.metrics``):
the control plane then holds a ``NullMetrics``, which has the same methods and counts
nothing, its store is not wrapped and its passes are not timed by stage; ``/metrics``
answers an empty exposition. ``plait bench observability`` measures what the metrics
cost on the hot paths by comparing the two.
"""

from __future__ import annotations

import contextlib
import heapq
import re
from collections.abc import Callable, Iterator, Mapping
from time import perf_counter
from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client import Counter as PromCounter
from prometheus_client import Histogram as PromHistogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from plait import hotmetrics
from plait.httpmetrics import HttpMetrics as HttpMetrics  # (where it was first)
from plait.httpmetrics import api_route as api_route

if TYPE_CHECKING:
    from plait.allocator import AllocationResult
    from plait.store.protocol import Store

#: the content type of the text exposition format
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
#: seconds: an API call, a pass, a TaskControl call
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                   2.5, 5.0, 10.0, 30.0)
#: seconds: what often takes well under a millisecond (a store operation on SQLite,
#: an allocation, a stage of a pass)
FINE_BUCKETS = (0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
                0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)


#: the job label of the series summing the jobs not shown on their own (no job has
#: this name: a job's begins with a letter or a digit)
OTHER_JOBS = "_other"
#: the jobs with series of their own at most, by default (``ControlPlaneConfig``)
SERIES_JOBS = 100
#: the outcomes of a TaskControl call (``plait_taskcontrol_calls``)
TASKCONTROL_OUTCOMES = ("answered", "timeout", "error")


def largest_jobs(tasks: Mapping[str, int], n: int) -> frozenset[str]:
    """The ``n`` jobs with the most tasks (``tasks``: each job's count; on a tie, the
    first by name): those whose per-job series are their own."""
    if len(tasks) <= n:
        return frozenset(tasks)
    return frozenset(heapq.nsmallest(n, tasks, key=lambda job: (-tasks[job], job)))


def _remove(family: object, *labels: str) -> None:
    """Remove a labelled series of a prometheus-client metric, if it has it."""
    remove = getattr(family, "remove", None)
    if remove is not None:
        with contextlib.suppress(KeyError):
            remove(*labels)


class Increment(Protocol):
    def inc(self, amount: float = 1) -> None: ...


class Count(Protocol):
    """What the hot paths call on a counter (prometheus-client's, ``hotmetrics``', or
    ``_Off``)."""

    def labels(self, *values: str) -> Increment: ...


class Observation(Protocol):
    def observe(self, amount: float) -> None: ...


class Observe(Protocol):
    """What the hot paths call on a histogram (prometheus-client's, ``hotmetrics``',
    or ``_Off``)."""

    def labels(self, *values: str) -> Observation: ...

    def observe(self, amount: float) -> None: ...


class HttpOnly:
    """The metrics of a process that serves HTTP and nothing else (the front end)."""

    #: False for ``NullMetrics`` (``HttpMetrics`` then passes requests straight on)
    enabled = True

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.http_requests: Count = PromCounter(
            "plait_http_requests", "HTTP requests answered, by route template, method and "
            "status", ["route", "method", "status"], registry=r)
        self.http_seconds: Observe = PromHistogram(
            "plait_http_request_duration_seconds", "Time to answer an HTTP request, by "
            "route template and method", ["route", "method"], buckets=LATENCY_BUCKETS,
            registry=r)

    def exposition(self) -> bytes:
        return bytes(generate_latest(self.registry))


class Metrics(HttpOnly):
    """The metrics a control plane's process counts, in a registry of its own."""

    def __init__(self) -> None:
        super().__init__()
        r = self.registry
        self.events: Count = PromCounter(
            "plait_events", "Events recorded by the control plane, by kind (machine_failed, "
            "rollout_halted, task_killed, throttled, ...)", ["kind"], registry=r)
        self.pass_seconds: Observe = PromHistogram(
            "plait_pass_duration_seconds", "Time a control-plane pass held the region's "
            "lock", buckets=LATENCY_BUCKETS, registry=r)
        self.stage_seconds: Observe = hotmetrics.Histogram(
            "plait_pass_stage_duration_seconds", "Time a pass spent in one of its stages "
            "(summed over the jobs a pass reconciles), by stage; observed for the stages "
            "a pass entered", ["stage"], buckets=FINE_BUCKETS, registry=r)
        self.store_seconds: Observe = hotmetrics.Histogram(
            "plait_store_operation_duration_seconds", "Time a store operation took (get, "
            "get_many, exists, create, set, delete, children, commit), failed ones too",
            ["op"], buckets=FINE_BUCKETS, registry=r)
        self.store_errors: Count = hotmetrics.Counter(
            "plait_store_operation_errors", "Store operations that raised, by operation and "
            "error (not_found and conflict are answers callers expect: a missing key, a "
            "lost compare-and-swap; anything else is the store failing)", ["op", "error"],
            registry=r)
        allocations = hotmetrics.Histogram(
            "plait_allocation_duration_seconds", "Time the allocator took to answer one "
            "allocation request (cache lookup, placement, commit), by result (placed: "
            "every task asked for has a machine; unplaced: some have none)", ["result"],
            buckets=FINE_BUCKETS, registry=r)
        hotmetrics.CountOf(allocations, "plait_allocations", "Allocation requests answered "
                           "by the allocator, by result (placed, unplaced)", registry=r)
        self.allocation_seconds: Observe = allocations
        self.taskcontrol_calls: Count = PromCounter(
            "plait_taskcontrol_calls", "Calls of jobs' TaskControllers, by job and outcome "
            "(answered, timeout, error)", ["job", "outcome"], registry=r)
        self.taskcontrol_acks: Count = PromCounter(
            "plait_taskcontrol_acks", "Operations TaskControllers acked, by job", ["job"],
            registry=r)
        self.taskcontrol_seconds: Observe = PromHistogram(
            "plait_taskcontrol_call_duration_seconds", "Time a TaskController took to "
            "answer, by job", ["job"], buckets=LATENCY_BUCKETS, registry=r)
        #: the jobs whose series are their own (``show_jobs``); None until first set
        self._shown: frozenset[str] | None = None
        #: the jobs given TaskControl series of their own so far (removed once not shown)
        self._labelled: set[str] = set()
        #: the jobs to show, when the first series is counted before any scrape
        self.pick_jobs: Callable[[], frozenset[str]] = frozenset
        # the children the hot paths use, looked up once
        self._placed = self.allocation_seconds.labels("placed")
        self._unplaced = self.allocation_seconds.labels("unplaced")
        #: each event kind's counter (``labels`` takes a lock and builds a key per call:
        #: a few microseconds, three times per job in a pass); the kinds are plait's own
        self._event_counters: dict[str, Any] = {}

    def job_label(self, job: str) -> str:
        """The job label of a series counted for ``job``: its name while it is one of
        the jobs shown (``show_jobs``), else ``OTHER_JOBS``."""
        shown = self._shown
        if shown is None:
            shown = self._shown = self.pick_jobs()
        if job in shown:
            self._labelled.add(job)
            return job
        return OTHER_JOBS

    def show_jobs(self, jobs: frozenset[str]) -> None:
        """The jobs whose series are their own from now on (``largest_jobs``); the
        TaskControl series of those no longer shown are removed (a job's counts do
        not move to ``OTHER_JOBS``: a counter series that goes is a reset)."""
        gone = self._labelled - jobs
        for job in gone:
            for outcome in TASKCONTROL_OUTCOMES:
                _remove(self.taskcontrol_calls, job, outcome)
            _remove(self.taskcontrol_acks, job)
            _remove(self.taskcontrol_seconds, job)
        self._labelled -= gone
        self._shown = jobs

    def event(self, kind: str, n: int = 1) -> None:
        counter = self._event_counters.get(kind)
        if counter is None:
            counter = self._event_counters[kind] = self.events.labels(kind)
        counter.inc(n)

    def allocated(self, result: AllocationResult, seconds: float) -> None:
        """An allocation request answered in ``seconds``."""
        (self._unplaced if result.unplaced else self._placed).observe(seconds)

    def timer(self, op: str) -> Callable[[float], None]:
        """What a metered store calls with the seconds each ``op`` took
        (``plait.store.metered.OperationSink``)."""
        return self.store_seconds.labels(op).observe

    def failed(self, op: str, error: BaseException) -> None:
        """A store operation raised ``error``."""
        self.store_errors.labels(op, error_name(error)).inc()

    def metered(self, store: Store) -> Store:
        """``store`` with its operations timed into these metrics."""
        from plait.store.metered import MeteredStore

        return MeteredStore(store, self)

    def pass_timer(self) -> PassTimer:
        """A timer of a pass and its stages, observed into these metrics."""
        return PassTimer(self.pass_seconds, self.stage_seconds)


class PassTimer:
    """Times a pass and its stages. ``start()`` as the pass begins, ``enter(stage)`` as
    each stage begins (the shell's own, and the scheduler's through
    ``Scheduler.stage``), ``stop()`` as the pass ends: the pass is observed, and each
    stage it entered with the time spent in it (a stage entered once per job, such as
    ``wanted``, with its sum over the pass). ``with timer as enter:`` starts and stops
    it around a block. Used by the loop's thread only."""

    def __init__(self, pass_seconds: Observe, stage_seconds: Observe) -> None:
        self._pass, self._stage_seconds = pass_seconds, stage_seconds
        self._children: dict[str, Observation] = {}
        self._spent: dict[str, float] = {}
        self._stage = ""
        self._started = self._since = 0.0

    def start(self) -> None:
        self._spent.clear()
        self._stage = ""
        self._started = self._since = perf_counter()

    def enter(self, stage: str) -> None:
        now = perf_counter()
        spent = self._spent
        spent[self._stage] = spent.get(self._stage, 0.0) + (now - self._since)
        self._stage, self._since = stage, now

    def __enter__(self) -> Callable[[str], None]:
        self.start()
        return self.enter

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self.enter("")
        self._pass.observe(self._since - self._started)
        children = self._children
        for stage, seconds in self._spent.items():
            if not stage:
                continue  # (before the first stage: nothing worth a name)
            child = children.get(stage)
            if child is None:
                child = children[stage] = self._stage_seconds.labels(stage)
            child.observe(seconds)
        self._spent.clear()


_ERROR_NAMES: dict[type, str] = {}


def error_name(error: BaseException) -> str:
    """The label of an error: its class's name in snake case (``NotFound``:
    ``not_found``)."""
    kind = type(error)
    name = _ERROR_NAMES.get(kind)
    if name is None:
        name = _ERROR_NAMES[kind] = re.sub(r"(?<!^)(?=[A-Z])", "_", kind.__name__).lower()
    return name


class _Off:
    """A metric that counts nothing (``NullMetrics``)."""

    def labels(self, *values: str) -> _Off:
        return self

    def inc(self, amount: float = 1) -> None:
        pass

    def observe(self, amount: float) -> None:
        pass


_OFF = _Off()


class _NoPassTimer(PassTimer):
    """A pass timer that times nothing (``NullMetrics``)."""

    def __init__(self) -> None:
        super().__init__(_OFF, _OFF)

    def start(self) -> None:
        pass

    def enter(self, stage: str) -> None:
        pass

    def stop(self) -> None:
        pass


class _NoCollectors(CollectorRegistry):
    """A registry that takes no collector: a control plane's scrape-time collector is
    not kept while metrics are off."""

    def register(self, collector: Collector) -> None:
        pass


class NullMetrics(Metrics):
    """A control plane's metrics when they are off: the same methods, counting
    nothing, at the least cost each hot path can have (``HttpMetrics`` passes requests
    on, the store is not wrapped, the pass timer does nothing)."""

    enabled = False

    def __init__(self) -> None:  # (no prometheus-client metric made at all)
        self.registry = _NoCollectors(auto_describe=True)
        self.http_requests = self.events = self.store_errors = _OFF
        self.taskcontrol_calls = self.taskcontrol_acks = _OFF
        self.http_seconds = self.pass_seconds = self.stage_seconds = _OFF
        self.store_seconds = self.allocation_seconds = self.taskcontrol_seconds = _OFF
        self._timer = _NoPassTimer()

    def job_label(self, job: str) -> str:
        return job

    def show_jobs(self, jobs: frozenset[str]) -> None:
        pass

    def event(self, kind: str, n: int = 1) -> None:
        pass

    def allocated(self, result: AllocationResult, seconds: float) -> None:
        pass

    def timer(self, op: str) -> Callable[[float], None]:
        return _OFF.observe

    def failed(self, op: str, error: BaseException) -> None:
        pass

    def metered(self, store: Store) -> Store:
        return store

    def pass_timer(self) -> PassTimer:
        return self._timer


def metrics_for(enabled: bool) -> Metrics:
    """A control plane's metrics: counted, or off (``NullMetrics``)."""
    return Metrics() if enabled else NullMetrics()


class AgentMetrics:
    """An agent's metrics: its reports to the control plane by outcome, the task
    starts and exits it saw, and (read when scraped) its tasks by phase.
    ``phases()``: the count of tasks per phase, called at each scrape."""

    def __init__(self, phases: Callable[[], dict[str, int]]) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.reports = PromCounter(
            "plait_agent_reports", "Heartbeats with the machine's task statuses, by outcome "
            "(sent, failed: the control plane not reached or refusing)", ["outcome"],
            registry=r)
        self.starts = PromCounter("plait_agent_task_starts", "Task processes started",
                                  registry=r)
        self.exits = PromCounter(
            "plait_agent_task_exits", "Task processes that exited on their own, by cause "
            "(exited, killed: SIGKILLed from outside)", ["cause"], registry=r)
        r.register(_Phases(phases))

    def exposition(self) -> bytes:
        return bytes(generate_latest(self.registry))


class _Phases(Collector):
    """An agent's tasks by phase, read when scraped."""

    def __init__(self, phases: Callable[[], dict[str, int]]) -> None:
        self.phases = phases

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily("plait_agent_tasks", "Tasks on this machine by phase",
                                   labels=["phase"])
        for phase, n in sorted(self.phases().items()):
            family.add_metric([phase], float(n))
        yield family
