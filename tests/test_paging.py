"""Paging by key (``plait.paging``), without a server: any sequence of pages over a
set of keys that changes between pages lists every key present throughout exactly
once, and shards' pages merged by key are the pages of the whole."""

from __future__ import annotations

import base64

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plait.paging import (
    MAX_LIMIT,
    BadRequest,
    Window,
    decode,
    encode,
    merged,
    page,
    scope_of,
    window,
)

SCOPE = scope_of("jobs")
names = st.sets(st.text("abcdef", min_size=1, max_size=4), max_size=40)


def read_all(pages_of, limit):
    """Follow tokens to the end; ``pages_of(win)`` answers one page."""
    seen, token = [], None
    while True:
        items, token = pages_of(window(str(limit), token, SCOPE))
        assert len(items) <= limit
        seen += items
        if token is None:
            return seen


@settings(max_examples=200, deadline=None)
@given(start=names, changes=st.lists(st.tuples(names, names), max_size=12),
       limit=st.integers(1, 7), keep=st.sets(st.text("abcdef", min_size=1, max_size=4)))
def test_every_key_present_throughout_is_listed_once(start, changes, limit, keep):
    current = set(start) | keep
    steps = iter(changes)
    present_throughout = set(current)

    def pages_of(win: Window):
        nonlocal current, present_throughout
        keys = sorted(current)
        items, token = page(keys, win, lambda k: k)
        # between pages: some keys come, some go (never those of ``keep``)
        added, removed = next(steps, (set(), set()))
        current = (current | added) - (removed - keep)
        present_throughout &= current
        return items, token

    seen = read_all(pages_of, limit)
    assert len(seen) == len(set(seen)) and seen == sorted(seen)
    assert present_throughout <= set(seen)
    assert keep <= set(seen)


@settings(max_examples=200, deadline=None)
@given(shards=st.lists(names, min_size=1, max_size=4), limit=st.integers(1, 6))
def test_shards_pages_merged_by_key_are_the_pages_of_the_whole(shards, limit):
    shards = [s - set().union(*shards[:i]) for i, s in enumerate(shards)]  # disjoint
    whole = sorted(set().union(*shards))

    def pages_of(win: Window):
        answers = []
        for keys in shards:
            items, token = page(sorted(keys), win, lambda k: {"name": k})
            answers.append({"jobs": items, "continue": token})
        items, token = merged(answers, "jobs", lambda x: x["name"], win)
        return [x["name"] for x in items], token

    seen = read_all(pages_of, limit)
    assert seen == whole


def test_a_filtered_page_is_full_and_its_token_ends_at_the_last_item():
    keys = [f"k{i:02d}" for i in range(20)]
    items, token = page(keys, window("3", None, SCOPE), lambda k: k if k[-1] in "05" else None)
    assert items == ["k00", "k05", "k10"]
    assert decode(token, SCOPE) == "k10"
    items, token = page(keys, window("3", token, SCOPE), lambda k: k if k[-1] in "05" else None)
    assert items == ["k15"] and token is None


def test_without_limit_or_token_the_whole_list_and_no_token():
    win = window(None, None, SCOPE)
    assert not win.paged
    assert page(["a", "b"], win, lambda k: k) == (["a", "b"], None)
    assert window(None, encode("a", SCOPE), SCOPE).limit == 500


@pytest.mark.parametrize(("limit", "token", "field"), [
    ("0", None, "limit"), (str(MAX_LIMIT + 1), None, "limit"), ("-1", None, "limit"),
    ("1.5", None, "limit"), ("\u00b9", None, "limit"), ("\u0663", None, "limit"),
    (None, "%%%", "continue"), (None, "eyJ2IjogMn0", "continue"),
    (None, encode("a", scope_of("jobs", state="settled")), "continue"),
    (None, encode("a", scope_of("entitlements")), "continue"),
    # thousands of digits (int() refuses them), JSON nested past any parser's depth
    ("9" * 5000, None, "limit"),
    (None, base64.urlsafe_b64encode(b"[" * 20000).decode(), "continue"),
    (None, base64.urlsafe_b64encode(b'{"v":1,"after":' + b"[" * 20000).decode(), "continue"),
])
def test_bad_limits_and_tokens_are_refused_naming_them(limit, token, field):
    with pytest.raises(BadRequest) as refused:
        window(limit, token, SCOPE)
    assert refused.value.field == field


def test_a_token_whose_key_is_of_another_kind_is_refused():
    with pytest.raises(BadRequest):
        page([0, 1, 2], window("1", encode("a", SCOPE), SCOPE), lambda k: k)
