"""Group commit of job creates (``plait.server.controlplane.creates``), on either store:
a batch is one transaction, every create in it is answered for itself, and a batch
that fails answers each of its requests with the error and stores none of them."""

import threading
import time
from concurrent.futures import Future

import pytest

from plait.errors import Conflict, ValidationError
from plait.model import Entitlement, JobSpec, Quota, RegionSpec, parse
from plait.persist.scheduler import JobStore, new_job
from plait.server.controlplane import ControlPlane, ControlPlaneConfig
from plait.server.controlplane.creates import Pending
from plait.store import SqliteStore
from plait.store.protocol import WouldBlock
from plait.testing import wait_for

REGION = RegionSpec.sized(24, dcs=2, msbs_per_dc=2, rows_per_msb=1, racks_per_row=2)


def spec(name: str, entitlement: str = "web", cpu: float = 1) -> JobSpec:
    return parse(JobSpec, {"name": name, "entitlement": entitlement, "task_count": 1,
                           "resources": {"cpu": cpu, "memory_gb": 0.1}, "command": "serve"})


def pending(s: JobSpec) -> Pending:
    doc, value = new_job(s, 1000.0)
    return Pending(doc, value, Future())


@pytest.fixture
def cp(env):
    config = ControlPlaneConfig(region=REGION, sim_agents=True, sim_start_seconds=1.0)
    plane = ControlPlane(env.store, config, clock=lambda: 1000.0)
    plane.commands.define_entitlement(Entitlement(name="web", owner="o",
                                                  quota=Quota(machines=24)))
    return plane


def test_concurrent_creates_are_all_stored_and_each_answered(cp, env):
    names = [f"job-{i:03d}" for i in range(40)]
    answers: dict[str, tuple] = {}
    start = threading.Barrier(len(names))

    def create(name: str) -> None:
        start.wait()
        answers[name] = cp.commands.submit_create(spec(name)).result(timeout=60)

    threads = [threading.Thread(target=create, args=(n,)) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert {n: (doc.name, created) for n, (doc, created) in answers.items()} == {
        n: (n, True) for n in names}
    assert 1 <= cp.creates.batches <= len(names)
    assert cp.creates.written == len(names)
    # durable: another client of the store reads every record
    stored = JobStore(env.other()).get_many(names)
    assert sorted(stored) == names
    assert all(stored[n].spec == spec(n) for n in names)
    # and the pass applies and places them all, reading them back in one batch
    cp.loop.step()
    assert all(cp.views.job_view(n)["task_count"] == 1 for n in names)
    placed = [t for n in names for t in cp.views.tasks_view(n) if t["machine"] is not None]
    assert len(placed) == len(names)


def test_a_batch_is_one_transaction(cp, env):
    commits = []
    store = cp.jobs.ns.store
    real = store.commit

    def counted(txn, session=None):
        commits.append(len(txn.ops))
        return real(txn, session)

    store.commit = counted
    batch = [pending(spec(f"b-{i}")) for i in range(25)]
    cp.creates.commit(batch)
    assert commits == [25]
    assert [p.answer.result(timeout=0)[1] for p in batch] == [True] * 25
    assert sorted(JobStore(env.other()).get_many([f"b-{i}" for i in range(25)])) == sorted(
        f"b-{i}" for i in range(25))


def test_a_failing_batch_answers_every_request_with_the_error_and_stores_nothing(cp, env):
    store = cp.jobs.ns.store

    def broken(txn, session=None):
        raise OSError("disk full")

    store.commit = broken
    futures = [cp.commands.submit_create(spec(f"f-{i}")) for i in range(10)]
    for f in futures:
        with pytest.raises(OSError, match="disk full"):
            f.result(timeout=60)
    assert JobStore(env.other()).get_many([f"f-{i}" for i in range(10)]) == {}
    # the committer lives on: the next creates are stored
    del store.commit
    _doc, created = cp.commands.submit_create(spec("after")).result(timeout=60)
    assert created and JobStore(env.other()).get("after").name == "after"


def test_each_create_of_a_batch_is_answered_for_itself(cp, env):
    cp.commands.create_job(spec("old"))  # stored before: a retried create
    batch = [pending(spec("new-a")), pending(spec("old")), pending(spec("twice")),
             pending(spec("twice")), pending(spec("clash")), pending(spec("clash", cpu=2)),
             pending(spec("nowhere", entitlement="nope")), pending(spec("old", cpu=3))]
    cp.creates.commit(batch)

    def outcome(p: Pending) -> object:
        error = p.answer.exception(timeout=0)
        if error is not None:
            return type(error)
        _doc, created = p.answer.result(timeout=0)
        return created

    assert [outcome(p) for p in batch] == [True, False, True, False, True, Conflict,
                                           ValidationError, Conflict]
    stored = JobStore(env.other()).get_many(["new-a", "old", "twice", "clash", "nowhere"])
    assert sorted(stored) == ["clash", "new-a", "old", "twice"]
    assert stored["clash"].spec == spec("clash")  # the first of the batch, whole


def test_a_name_stored_meanwhile_by_another_writer_is_answered_as_a_retry(cp, env):
    other = JobStore(env.other())
    batch = [pending(spec(f"r-{i}")) for i in range(5)]
    other.create(spec("r-2"), 1000.0)  # between the request and its batch
    cp.creates.commit(batch)
    assert [p.answer.result(timeout=0)[1] for p in batch] == [True, True, False, True, True]
    assert sorted(other.get_many([f"r-{i}" for i in range(5)])) == [f"r-{i}" for i in range(5)]


def answered(batch: list[Pending]) -> list[object]:
    return [p.answer.result(timeout=0)[1] if p.answer.done() else None for p in batch]


def test_a_batch_is_stored_on_the_calling_thread_only_on_a_local_store(cp, env):
    """``commit_here`` (a front end's batch, on the shard's event loop): on SQLite the
    batch is stored and answered before it returns; a ZooKeeper write is a round trip
    over the network, so the batch is left to the committer thread."""
    batch = [pending(spec(f"h-{i}")) for i in range(6)]
    here = cp.creates.commit_here(batch)
    names = [f"h-{i}" for i in range(6)]
    if isinstance(env.store, SqliteStore):
        assert here is True
        assert answered(batch) == [True] * 6
        assert sorted(JobStore(env.other()).get_many(names)) == names
        assert cp.creates.batches == 1
    else:
        assert here is False
        assert answered(batch) == [None] * 6 and cp.creates.batches == 0
        assert JobStore(env.other()).get_many(names) == {}


@pytest.fixture
def sqlite_cp(tmp_path, request):
    store = SqliteStore(str(tmp_path / "plait.db"))
    config = ControlPlaneConfig(region=REGION, sim_agents=True, sim_start_seconds=1.0,
                                shard=getattr(request, "param", None))
    plane = ControlPlane(store, config, clock=lambda: 1000.0)
    plane.commands.define_entitlement(Entitlement(name="web", owner="o",
                                                  quota=Quota(machines=24)))
    yield plane, store
    store.close()


def test_a_batch_that_would_wait_for_another_threads_write_is_left_to_the_committer(
        sqlite_cp):
    cp, store = sqlite_cp
    writing, done = threading.Event(), threading.Event()

    def slow_write() -> None:  # another thread's write, held open (a pass's, say)
        with store._write():
            writing.set()
            done.wait(60)

    other = threading.Thread(target=slow_write)
    other.start()
    assert writing.wait(60)
    batch = [pending(spec(f"w-{i}")) for i in range(3)]
    try:
        assert cp.creates.commit_here(batch) is False
        assert answered(batch) == [None] * 3  # nothing of it answered, nothing stored
        cp.commands.submit_prepared(batch)  # (what the caller does then)
    finally:
        done.set()
        other.join(60)
    assert [p.answer.result(timeout=60)[1] for p in batch] == [True] * 3
    assert sorted(JobStore(store).get_many([f"w-{i}" for i in range(3)])) == [
        "w-0", "w-1", "w-2"]


def test_a_batch_that_would_wait_for_another_processs_write_is_left_to_the_committer(
        sqlite_cp):
    cp, store = sqlite_cp
    other = SqliteStore(store.path)  # another process's connection to the file
    try:
        with other._write():  # its write holds the file
            batch = [pending(spec("p-0")), pending(spec("p-1"))]
            assert cp.creates.commit_here(batch) is False
            assert answered(batch) == [None, None]
        # the connection waits for other writers as before (its busy timeout is back)
        assert store._db.execute("PRAGMA busy_timeout").fetchone()[0] == 30_000
        assert cp.creates.commit_here(batch) is True
        assert answered(batch) == [True, True]
    finally:
        other.close()


# (shard 0: a scheduler shard checks creates under the lock a handoff holds)
@pytest.mark.parametrize("sqlite_cp", [0], indirect=True)
def test_a_batch_waits_for_no_handoff_and_no_batch_of_the_committer(sqlite_cp):
    cp, _store = sqlite_cp
    batch = [pending(spec("q-0"))]
    held, done = threading.Event(), threading.Event()

    def handoff() -> None:
        with cp.creates.lock:
            held.set()
            done.wait(60)

    t = threading.Thread(target=handoff)
    t.start()
    assert held.wait(60)
    try:
        assert cp.creates.commit_here(batch) is False
    finally:
        done.set()
        t.join(60)
    # a batch the committer is writing: this one waits its turn there, not here
    gate = threading.Event()
    real = cp.jobs.create_many

    def held_up(items):
        gate.wait(60)
        return real(items)

    cp.jobs.create_many = held_up
    first = cp.commands.submit_create(spec("q-first"))
    wait_for(lambda: cp.creates._busy, what="the first create commits", poll=0.001)
    try:
        assert cp.creates.commit_here(batch) is False
    finally:
        gate.set()
    assert first.result(timeout=60)[1] is True
    del cp.jobs.create_many
    assert cp.creates.commit_here(batch) is True and answered(batch) == [True]


def test_after_a_slow_commit_batches_go_to_the_committer_for_a_while(sqlite_cp, monkeypatch):
    from plait.server.controlplane import creates

    cp, _store = sqlite_cp
    monkeypatch.setattr(creates, "INLINE_SLOW", 0.0)  # every commit counts as slow
    assert cp.creates.commit_here([pending(spec("s-0"))]) is True
    later = [pending(spec("s-1"))]
    assert cp.creates.commit_here(later) is False  # a slow disk: not on an event loop
    monkeypatch.setattr(cp.creates, "_inline_after", time.monotonic())  # the pause over
    assert cp.creates.commit_here(later) is True and answered(later) == [True]


def test_a_nowait_scope_refuses_only_its_first_write_and_finishes_what_it_began(tmp_path):
    store = SqliteStore(str(tmp_path / "plait.db"))
    writing, done = threading.Event(), threading.Event()

    def hold() -> None:  # another thread's write, held until let go
        with store._write():
            writing.set()
            done.wait(60)
    try:
        other = threading.Thread(target=hold)
        other.start()
        assert writing.wait(60)
        with store.nowait(0.01), pytest.raises(WouldBlock):
            store.create("/a", b"1")  # nothing written: it would have waited
        done.set()
        other.join(60)
        writing.clear()
        done.clear()
        with store.nowait(0.01):
            store.create("/a", b"1")  # the first write: nothing in its way
            other = threading.Thread(target=hold)
            other.start()
            assert writing.wait(60)
            threading.Timer(0.2, done.set).start()
            store.create("/b", b"2")  # begun: this one waits for the other write
        other.join(60)
        assert store.get("/a")[0] == b"1" and store.get("/b")[0] == b"2"
    finally:
        done.set()
        store.close()
