"""`plait bench versions` runs and reports what it says (figures are not asserted:
only that a job's record keeps keep_versions of its versions)."""

from plait.bench import versions


def test_the_versions_bench_reports_a_bounded_record():
    figures = versions.run(updates=12, spec_kb=5, keep_versions=4)
    assert figures["versions"] == 13 and figures["kept"] == 4, figures
    assert 0 < figures["record_bytes_max"] < 6 * 5 * 1024 + 20_000, figures
    assert set(figures) >= {"put_ms_median_first10", "put_ms_median_last10"}
