"""Ports and processes of local regions (``plait.localprocs``)."""

from __future__ import annotations

import os
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


def test_the_processes_of_a_region_are_its_tasks_agents_and_replicas_only(tmp_path):
    # plait up's shutdown stopped whatever named its data dir: a `tail -f` of its log,
    # a script given the path in its environment, and the `timeout` that ran it
    import subprocess
    import sys

    from plait.localprocs import processes_under

    root = tmp_path / "region"
    (root / "agents" / "m1" / "tasks" / "web.0").mkdir(parents=True)
    (root / "up.log").write_text("")
    sleeping = [sys.executable, "-c", "import time; time.sleep(60)"]

    def start(argv, **env):
        return subprocess.Popen(argv, env={"PATH": "/usr/bin:/bin", **env},
                                start_new_session=True)
    task = start(sleeping, PLAIT_DATA_DIR=str(root / "agents" / "m1" / "tasks" / "web.0"))
    agent = start([*sleeping, "-m", "plait.cli.agent", "--data-dir",
                   str(root / "agents" / "m1")])
    bystanders = [start(["tail", "-f", str(root / "up.log")]),
                  start(sleeping, WATCHDIR=str(root) + "/"),
                  start([*sleeping, "plait", "up", "--data-dir", str(root)])]
    try:
        from plait.localprocs import argv_bytes
        from plait.testing import wait_for

        def execd(p: subprocess.Popen) -> bool:  # (its command line: its environment too)
            return argv_bytes(p.pid) == b"".join(a.encode() + b"\0" for a in p.args)

        wait_for(lambda: all(execd(p) for p in (task, agent, *bystanders)),
                 what="every process has its own command line")
        found = processes_under(root)
        assert {task.pid, agent.pid} <= found
        assert not {p.pid for p in bystanders} & found
        assert not ({os.getpid(), os.getppid()} & found)
    finally:
        for p in [task, agent, *bystanders]:
            p.kill()
            p.wait()
