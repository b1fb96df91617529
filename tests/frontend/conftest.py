"""Fixtures: a live API on loopback (see livecp.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from livecp import Live, start_live, stop_live


@pytest.fixture
def live(tmp_path) -> Iterator[Live]:
    api = start_live(tmp_path / "data")
    yield api
    stop_live(api)


@pytest.fixture(scope="module")
def live_module(tmp_path_factory) -> Iterator[Live]:
    """One live API shared by a module's tests (for tests that build on each other's
    state, such as the schema fuzzing and the checks after it)."""
    api = start_live(tmp_path_factory.mktemp("live") / "data")
    yield api
    stop_live(api)
