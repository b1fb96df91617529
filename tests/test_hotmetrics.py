"""``plait.hotmetrics``: what a scrape shows is what prometheus-client's own counters and
histograms would show for the same observations (less their ``_created`` samples),
whether the values were sorted in at once, in batches, or from several threads."""

import threading

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client import Counter as PromCounter
from prometheus_client import Histogram as PromHistogram
from prometheus_client.parser import text_string_to_metric_families

from plait import hotmetrics

BUCKETS = (0.001, 0.01, 0.1, 1.0)


def samples(registry: CollectorRegistry) -> dict:
    text = generate_latest(registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples
            if not s.name.endswith("_created")}


def test_a_histogram_and_a_counter_expose_what_prometheus_client_would() -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    h = hotmetrics.Histogram("t_seconds", "doc", ["op"], buckets=BUCKETS, registry=ours)
    ph = PromHistogram("t_seconds", "doc", ["op"], buckets=BUCKETS, registry=theirs)
    c = hotmetrics.Counter("t_things", "doc", ["kind"], registry=ours)
    pc = PromCounter("t_things", "doc", ["kind"], registry=theirs)
    values = [0.0005, 0.001, 0.0011, 0.01, 0.5, 1.0, 7.0]  # (on a bound: in its bucket)
    for v in values:
        h.labels("get").observe(v)
        ph.labels("get").observe(v)
    h.labels("set").observe(0.02)
    ph.labels("set").observe(0.02)
    for kind, n in (("a", 1), ("b", 2.5)):
        c.labels(kind).inc(n)
        pc.labels(kind).inc(n)
    got = samples(ours)
    assert got == samples(theirs)
    assert got[("t_seconds_bucket", (("le", "0.001"), ("op", "get")))] == 2
    assert got[("t_seconds_bucket", (("le", "+Inf"), ("op", "get")))] == len(values)
    assert got[("t_seconds_count", (("op", "get"),))] == len(values)
    assert abs(got[("t_seconds_sum", (("op", "get"),))] - sum(values)) < 1e-9


def test_observations_are_all_counted_in_batches_and_from_many_threads() -> None:
    registry = CollectorRegistry()
    h = hotmetrics.Histogram("t_seconds", "doc", buckets=BUCKETS, registry=registry)
    c = hotmetrics.Counter("t_things", "doc", registry=registry)
    per_thread = 3 * hotmetrics.BATCH + 7  # (several batches sorted in on the way)

    def work() -> None:
        child = h.labels()
        for i in range(per_thread):
            child.observe(0.005 if i % 2 else 2.0)
            c.inc()

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    got = samples(registry)
    assert got[("t_seconds_count", ())] == 4 * per_thread
    assert got[("t_seconds_bucket", (("le", "0.01"),))] == 4 * (per_thread // 2)
    assert got[("t_things_total", ())] == 4 * per_thread


def test_count_of_a_histogram_is_a_counter_of_its_observations_by_label() -> None:
    registry = CollectorRegistry()
    h = hotmetrics.Histogram("t_seconds", "doc", ["result"], buckets=BUCKETS,
                             registry=registry)
    hotmetrics.CountOf(h, "t_requests", "doc", registry=registry)
    for _ in range(3):
        h.labels("placed").observe(0.002)
    h.labels("unplaced").observe(5.0)
    got = samples(registry)
    assert got[("t_requests_total", (("result", "placed"),))] == 3
    assert got[("t_requests_total", (("result", "unplaced"),))] == 1
