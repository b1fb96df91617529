"""Ports for local regions and their tests (``plait.localprocs.free_port_block``)."""

from __future__ import annotations

import socket

import pytest

from plait import localprocs
from plait.localprocs import free_port_block, listen_error


def test_a_block_is_free_and_outside_the_ephemeral_range():
    # PORT+1 of a port the kernel picked (bind to 0) is any outgoing connection's to take
    low, high = localprocs._ephemeral_range()
    for _ in range(20):
        base = free_port_block(5)
        assert all(not low <= p <= high for p in range(base, base + 5))
        assert all(listen_error("127.0.0.1", p) is None for p in range(base, base + 5))


def test_a_port_in_use_is_never_given(monkeypatch):
    import random

    with socket.socket() as held:
        held.bind(("127.0.0.1", free_port_block()))
        held.listen()
        taken = held.getsockname()[1]
        picks = iter([taken - 1, taken])  # (blocks that hold it are tried first)
        monkeypatch.setattr(localprocs.random, "randint",
                            lambda lo, hi: next(picks, None) or random.Random().randint(lo, hi))
        base = free_port_block(3)
        assert taken not in range(base, base + 3)
        assert next(picks, None) is None  # (both were tried, and passed over)


def test_a_box_whose_ephemeral_range_is_everything_still_gets_ports(monkeypatch):
    monkeypatch.setattr(localprocs, "_ephemeral_range", lambda: (1024, 65535))
    base = free_port_block(9)
    assert 10_000 <= base <= 65_535 - 8
    assert all(listen_error("127.0.0.1", p) is None for p in range(base, base + 9))


def test_no_room_at_all_is_an_error_that_says_so(monkeypatch):
    monkeypatch.setattr(localprocs, "listen_error", lambda host, port: "Address in use")
    with pytest.raises(OSError, match="no 2 consecutive free ports"):
        free_port_block(2)
