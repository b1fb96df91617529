"""Records split into parts by task index: a change to a few tasks changes their
parts only."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from plait import fastjson
from plait.persist.parts import index_parts


@given(st.sets(st.integers(0, 99), min_size=1), st.integers(0, 99), st.integers(1, 30))
def test_a_row_added_or_taken_out_changes_the_part_of_its_index_only(indices, changed,
                                                                     per_part):
    rows = {str(i): [f"m{i % 7}", i] for i in range(100)}
    before = index_parts(indices, rows, per_part, 10_000)
    after = index_parts(indices ^ {changed}, rows, per_part, 10_000)
    # (part k holds the indices of k * per_part up; parts past the last index are none)
    for k, (a, b) in enumerate(zip(before, after, strict=False)):
        assert (a != b) == (k == changed // per_part)
    merged: dict[str, object] = {}
    for part in after:
        merged.update(fastjson.loads(part)["tasks"])
    assert merged == {str(i): rows[str(i)] for i in indices ^ {changed}}


def test_a_part_past_the_limit_is_split_further():
    rows = {str(i): ["x" * 100, i] for i in range(40)}
    parts = index_parts(range(40), rows, 20, 1_000)
    assert len(parts) > 2 and all(len(p) <= 1_000 for p in parts)
    merged: dict[str, object] = {}
    for part in parts:
        merged.update(fastjson.loads(part)["tasks"])
    assert merged == rows
