"""Crash tests: a writer killed with SIGKILL mid-stream loses no acknowledged write
and leaves no partial transaction; writers in several processes never lose an
update (compare-and-swap)."""

import os
import signal
import subprocess
import sys
import time

from plait.store import SqliteStore

WRITER = r"""
import sys
from plait.store import SqliteStore, Transaction
s = SqliteStore(sys.argv[1])
i = 0
while True:
    s.commit(Transaction().create(f"/w/{i}/a", b"x" * 100).create(f"/w/{i}/b", b"y"))
    print(i, flush=True)  # acknowledged: durable from here on
    i += 1
"""

COUNTER = r"""
import sys
from plait.errors import Conflict
from plait.store import SqliteStore
s = SqliteStore(sys.argv[1])
done = 0
while done < int(sys.argv[2]):
    value, version = s.get("/counter")
    try:
        s.set("/counter", str(int(value) + 1).encode(), version)
        done += 1
    except Conflict:
        pass
print(done, flush=True)
"""


def _env():
    env = dict(os.environ)
    src = os.path.join(os.path.dirname(__file__), "..", "..", "src")
    env["PYTHONPATH"] = os.path.abspath(src) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def test_sigkill_mid_stream_loses_no_acknowledged_write_and_no_half_transaction(tmp_path):
    db = str(tmp_path / "plait.db")
    SqliteStore(db).close()
    proc = subprocess.Popen([sys.executable, "-c", WRITER, db], stdout=subprocess.PIPE,
                            text=True, env=_env())
    acked = -1
    deadline = time.monotonic() + 60
    assert proc.stdout is not None
    while acked < 150 and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        acked = int(line)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert acked >= 150, "the writer did not get going"
    s = SqliteStore(db)
    written = s.children("/w")
    assert {str(i) for i in range(acked + 1)} <= set(written)  # every ack survived
    for i in written:  # and every transaction is whole
        assert s.children(f"/w/{i}") == ["a", "b"]
    s.close()


def test_compare_and_swap_across_processes_never_loses_an_increment(tmp_path):
    db = str(tmp_path / "plait.db")
    s = SqliteStore(db)
    s.create("/counter", b"0")
    procs = [subprocess.Popen([sys.executable, "-c", COUNTER, db, "60"],
                              stdout=subprocess.PIPE, text=True, env=_env()) for _ in range(3)]
    done = sum(int(p.communicate(timeout=120)[0]) for p in procs)
    assert done == 180
    assert s.get("/counter")[0] == b"180"
    s.close()
