"""The Shard Manager service with real tasks on loopback (the client library in this
process): it lays the shards out, loads them onto the tasks, publishes the map, and
answers plait's signed TaskControl calls from it; a restarted task is loaded again,
a task under long maintenance is emptied before its move is acked, and bad input is
refused by name."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Sequence

import httpx
import pytest

from plait.errors import ValidationError
from plait.model import TaskRef
from plait.shardmanager import credentials
from plait.shardmanager.client import ShardApp, ShardTask
from plait.shardmanager.service import ShardManager, app_token
from plait.taskcontrol.protocol import (
    AdvanceNotice,
    NoticeKind,
    OpKind,
    TaskControlRequest,
    new_op,
    to_wire,
)
from plait.taskcontrol.signing import JOB_HEADER, SIGNATURE_HEADER, sign, task_credential
from plait.testing import free_port, wait_for

TOKEN = "t" * 32
KEY = "ab" * 32


class Dict(ShardApp):
    def __init__(self) -> None:
        self.held: dict[str, list[str]] = {}

    def add_shard(self, shard: str, peers: Sequence[str]) -> None:
        self.held[shard] = list(peers)

    def drop_shard(self, shard: str) -> None:
        self.held.pop(shard, None)


@pytest.fixture
def sm(tmp_path) -> Iterator[ShardManager]:
    manager = ShardManager(TOKEN, tmp_path / "sm").start()
    yield manager
    manager.stop()


def own(sm: ShardManager, index: int, app: str = "kv", job: str = "kv",
        endpoint: str = "127.0.0.1:9") -> dict[str, str]:
    """What task ``index`` at ``endpoint`` (host:port) holds, as plait gives it: its own
    credential when the application has its job's controller key, else the
    application's task secret."""
    defined = sm.apps.get(app)
    if defined is not None and defined.spec.controller_key is not None:
        return {"credential": task_credential(defined.spec.controller_key, job, index,
                                              endpoint)}
    return {"token": app_token(TOKEN, app)}


def task(sm: ShardManager, index: int, msb: int) -> ShardTask:
    port = free_port()
    return ShardTask(Dict(), app="kv", job="kv", index=index, port=port,
                     manager=sm.url, **own(sm, index, endpoint=f"127.0.0.1:{port}"),
                     domains=(f"msb{msb}", f"rack{index}", f"m{index}")).start()


def api(sm: ShardManager) -> httpx.Client:
    return httpx.Client(base_url=sm.url, headers={"Authorization": f"Bearer {TOKEN}"},
                        timeout=30)


def full(c: httpx.Client) -> bool:
    shards = c.get("/v1/apps/kv/map").json()["shards"]
    return all(len(eps) == 3 for eps in shards.values())


def six_tasks(sm: ShardManager, shards: int) -> tuple[httpx.Client, list[ShardTask]]:
    """Application kv (``shards`` x 3, plait's controller key) on six tasks in three
    MSBs, once every shard has its three replicas."""
    c = api(sm)
    c.put("/v1/apps/kv", json={"job": "kv", "shards": shards, "replication": 3,
                               "controller_key": KEY})
    tasks = [task(sm, i, i % 3) for i in range(6)]
    wait_for(lambda: full(c))
    return c, tasks


def control(c: httpx.Client, request: TaskControlRequest, key: str = KEY) -> httpx.Response:
    body = json.dumps(to_wire(request)).encode()
    return c.post("/v1/apps/kv/taskcontrol", content=body, headers={
        JOB_HEADER: "kv", SIGNATURE_HEADER: sign(key, body, time.time()),
        "Content-Type": "application/json"})


def register(sm: ShardManager, reg: dict, secret: str | None = None,
             app: str = "kv", content: bytes | None = None) -> httpx.Response:
    """A registration as a task's library sends it: signed with its process's key
    (from ``secret``, else from what the task holds: ``own``)."""
    body = json.dumps(reg).encode() if content is None else content
    try:
        at = credentials.host_port(reg["endpoint"])
    except ValidationError:
        at = ""  # (an endpoint discovery cannot have: no credential is good for it)
    held = own(sm, reg["index"], app, reg["job"], at)
    key = credentials.task_key(secret or held.get("credential") or held["token"], app,
                               reg["job"], reg["index"], reg["incarnation"])
    return httpx.post(f"{sm.url}/v1/apps/{app}/tasks", content=body, timeout=30, headers={
        "Content-Type": "application/json",
        credentials.SIGNATURE_HEADER: credentials.sign(key, body, time.time())})


def ops(indexes, kind=OpKind.UPDATE, reason="update to version 2", serial=1):
    return tuple(new_op(f"kv/{i}/{kind.value}/{serial}", "kv", i, kind, reason, f"m{i}")
                 for i in indexes)


def test_shards_are_loaded_published_and_acked_by_availability(sm: ShardManager) -> None:
    c = api(sm)
    r = c.put("/v1/apps/kv", json={"job": "kv", "shards": 12, "replication": 3,
                                   "controller_key": KEY})
    assert r.status_code == 200, r.text
    tasks = [task(sm, i, i % 3) for i in range(6)]
    try:
        wait_for(lambda: full(c))
        # (the moves of the first rounds, while tasks were joining, end with drops)
        wait_for(lambda: sum(len(t.impl.held) for t in tasks) == 36)  # type: ignore[attr-defined]
        # the map is watched: a call past the generation waits for the next change (the
        # balancing rounds), then, once the map is settled, times out unchanged
        settled: list[dict] = []

        def quiet() -> bool:
            now = c.get("/v1/apps/kv/map").json()
            later = c.get("/v1/apps/kv/map", params={"after": now["generation"],
                                                     "wait": 0.5}).json()
            settled[:] = [later]
            return later["generation"] == now["generation"] and full(c)
        wait_for(quiet)
        m = settled[0]
        view = c.get("/v1/apps/kv").json()
        assert view["fully_replicated"] == 12 and view["min_ready"] == 3
        for eps in m["shards"].values():  # three tasks, three MSBs
            idx = [int(ep.rsplit(":", 1)[1]) for ep in eps]
            assert len(set(idx)) == 3
        # an update of every task: the ack never takes a shard two replicas down
        answer = control(c, TaskControlRequest("kv", ops(range(6)), sequence_number=1))
        assert answer.status_code == 200, answer.text
        acked = {int(op_id.split("/")[1]) for op_id in answer.json()["ack"]}
        replicas = {s: {int(ep.rsplit(":", 1)[1]) for ep in eps}
                    for s, eps in m["shards"].items()}
        ports = {t.endpoint.rsplit(":", 1)[1]: t.index for t in tasks}
        by_task = {s: {ports[str(p)] for p in ps} for s, ps in replicas.items()}
        assert acked and all(len(ts & acked) <= 1 for ts in by_task.values())
        # asked again before they completed: nothing more (they count as down)
        again = control(c, TaskControlRequest("kv", ops(range(6)), sequence_number=2))
        assert set(again.json()["ack"]) <= {f"kv/{i}/update/1" for i in acked}
        # a restarted task (a new incarnation, empty) is loaded again
        first = min(t for t in acked if tasks[t].impl.held)  # type: ignore[attr-defined]
        tasks[first].stop()
        done = ops(sorted(acked))  # (the others were updated in place, say)
        control(c, TaskControlRequest("kv", (), completed=done,
                                      all_unhealthy_tasks=(TaskRef("kv", first),),
                                      sequence_number=3))
        assert not full(c)
        tasks[first] = task(sm, first, first % 3)
        wait_for(lambda: full(c) and bool(tasks[first].impl.held))  # type: ignore[attr-defined]
        # bad input, named
        assert httpx.get(f"{sm.url}/v1/apps/kv").status_code == 401
        assert control(c, TaskControlRequest("kv", sequence_number=4),
                       key="cd" * 32).status_code == 401
        garbage = c.post("/v1/apps/kv/taskcontrol", content=b"{", headers={
            JOB_HEADER: "kv", SIGNATURE_HEADER: sign(KEY, b"{", time.time())})
        assert garbage.status_code == 422 and "TaskControl" in garbage.text
        assert c.get("/v1/apps/nope").status_code == 404
        bad = c.put("/v1/apps/kv2", json={"job": "kv", "shards": 0})
        assert bad.status_code == 422 and "shards" in bad.text
    finally:
        for t in tasks:
            t.stop()


def test_a_task_under_long_maintenance_is_emptied_before_its_move(sm: ShardManager,
                                                                  tmp_path) -> None:
    c, tasks = six_tasks(sm, shards=8)
    try:
        victim = 0
        notice = AdvanceNotice("mx-1", NoticeKind.MAINTENANCE, ("m0",),
                               (TaskRef("kv", victim),), time.time() + 600,
                               time.time() + 600, time.time() + 600 + 7200)
        pair = (*ops([victim], OpKind.MOVE, "maintenance mx-1"),
                *ops([victim], OpKind.STOP, "maintenance mx-1"))
        first = control(c, TaskControlRequest("kv", pair, advance_notices=(notice,),
                                               sequence_number=1)).json()
        assert first["ack"] == [] and first["ask_again_after"]
        assert c.get("/v1/apps/kv").json()["evacuating"] == [victim]
        # its shards move away, added elsewhere before they are dropped from it
        wait_for(lambda: not tasks[victim].impl.held and full(c))  # type: ignore[attr-defined]
        later = control(c, TaskControlRequest("kv", pair, advance_notices=(notice,),
                                              sequence_number=2)).json()
        assert later["ack"] == ["kv/0/move/1"]
        # the maps outlive a restart of the service
        before = c.get("/v1/apps/kv/map").json()["shards"]
        sm.stop()
        again = ShardManager(TOKEN, tmp_path / "sm").start()
        try:
            c2 = httpx.Client(base_url=again.url, headers={
                "Authorization": f"Bearer {TOKEN}"}, timeout=30)
            # (published again once each task confirms what it holds: asked at once)
            wait_for(lambda: c2.get("/v1/apps/kv/map").json()["shards"] == before)
        finally:
            again.stop()
    finally:
        for t in tasks:
            t.stop()


def test_a_replayed_call_is_refused_and_acks_outlive_a_restart(sm: ShardManager,
                                                               tmp_path) -> None:
    """An older sequence number is a replay (refused, naming it); what was acked is on
    disk before the answer, so a restarted service still counts that task as going
    down and acks none of its partners."""
    c, tasks = six_tasks(sm, shards=6)
    try:
        before = c.get("/v1/apps/kv/map").json()["shards"]
        one = control(c, TaskControlRequest("kv", ops([0]), sequence_number=5)).json()
        assert one["ack"] == ["kv/0/update/1"]
        old = control(c, TaskControlRequest("kv", ops([0]), sequence_number=4))
        assert old.status_code == 422 and "sequence_number" in old.text
        sm.stop()
        again = ShardManager(TOKEN, tmp_path / "sm").start()
        try:
            c2 = api(again)
            held = {s for s, eps in before.items() if tasks[0].endpoint in eps}
            partners = {int(ep.rsplit(":", 1)[1]) for s, eps in before.items()
                        if s in held for ep in eps}
            ports = {int(t.endpoint.rsplit(":", 1)[1]): t.index for t in tasks}
            others = sorted(ports[p] for p in partners if ports[p] != 0)
            assert others  # (0 shares shards with some tasks)
            answer = control(c2, TaskControlRequest("kv", ops(others), sequence_number=6))
            assert answer.json()["ack"] == []  # 0 still counts as going down
        finally:
            again.stop()
    finally:
        for t in tasks:
            t.stop()


def test_a_task_that_cannot_be_called_holds_up_no_other(sm: ShardManager) -> None:
    c = api(sm)
    c.put("/v1/apps/kv", json={"job": "kv", "shards": 6, "replication": 2})
    tasks = [task(sm, i, i % 2) for i in range(4)]
    member = httpx.Client(base_url=sm.url, timeout=30, headers={
        "Authorization": f"Bearer {app_token(TOKEN, 'kv')}"})
    nowhere = f"http://127.0.0.1:{free_port()}"  # (nothing listens there)
    try:
        r = register(sm, {"index": 9, "endpoint": nowhere, "job": "kv", "incarnation": "x",
                          "domains": ["msb9", "rack9", "m9"]})
        assert r.status_code == 200, r.text
        # every shard is served twice by the others; only the replicas laid out on
        # task 9 wait (and the replicas they were to replace stay until they are ready)

        def loaded() -> bool:
            m = c.get("/v1/apps/kv/map").json()
            stuck = [ep for eps in m["adding"].values() for ep in eps]
            return bool(stuck) and set(stuck) == {nowhere} and all(
                len(eps) == 2 for eps in m["shards"].values())
        wait_for(loaded)
        # the application's token may not define applications, nor read another's map
        assert member.put("/v1/apps/kv", json={"job": "kv", "shards": 1}).status_code == 401
        assert member.get("/v1/apps/other/map").status_code == 401
    finally:
        member.close()
        for t in tasks:
            t.stop()


class Told(Dict):
    def __init__(self) -> None:
        super().__init__()
        self.told: list[str] = []

    def superseded(self, reason: str) -> None:
        self.told.append(reason)


def endpoints(c: httpx.Client) -> set[str]:
    return {ep for eps in c.get("/v1/apps/kv/map").json()["shards"].values() for ep in eps}


def test_an_orphan_copy_of_a_task_is_refused_and_the_map_keeps_its_replacement(
        sm: ShardManager, tmp_path) -> None:
    """plait replaced task 0 (its machine was cut off) and its first process runs on,
    beating: the process started later is the task's, the map never names the orphan
    again, and the orphan stops serving (410), told why. A service restarted from its
    saved maps still refuses the orphan, even once the replacement has gone quiet."""
    c, tasks = six_tasks(sm, shards=6)
    orphan = tasks[0]
    orphan.impl = Told()
    port = free_port()
    replacement = ShardTask(Dict(), app="kv", job="kv", index=0, port=port,
                            manager=sm.url, **own(sm, 0, endpoint=f"127.0.0.1:{port}"),
                            domains=("msb0", "rack9", "m9"))
    try:
        assert replacement.started > orphan.started
        replacement.start()
        wait_for(lambda: replacement.shards and replacement.endpoint in endpoints(c))
        # the orphan beats on (each beat here at once): refused, and it stops
        assert orphan.register() is False
        assert orphan.gone is not None and "superseded" in orphan.gone
        assert orphan.impl.told == [orphan.gone]
        assert orphan.shards == set()
        r = httpx.get(f"{orphan.endpoint}/anything", timeout=10)
        assert r.status_code == 410 and "orphan" in r.json()["error"]
        for _ in range(3):
            orphan.gone = None  # (as if it went on beating)
            assert orphan.register() is False
            assert orphan.endpoint not in endpoints(c)
        wait_for(lambda: full(c))
        assert replacement.endpoint in endpoints(c)
        assert c.get("/v1/apps/kv").json()["tasks"]["0"]["endpoint"] == replacement.endpoint
        # a process that started before the one registered is refused at its first beat
        port = free_port()
        late = ShardTask(Dict(), app="kv", job="kv", index=0, port=port,
                         manager=sm.url, **own(sm, 0, endpoint=f"127.0.0.1:{port}"))
        late.started = replacement.started - 60
        assert late.register() is False and late.gone is not None
        assert "started" in late.gone and replacement.incarnation in late.gone
        late._server.server_close()
        # the refusals outlive a restart of the service
        sm._save(force=True)
        sm.stop()
        replacement.stop()
        again = ShardManager(TOKEN, tmp_path / "sm").start()
        try:
            again.apps["kv"].tasks.pop(0)  # (the replacement gone quiet)
            orphan.gone = None
            orphan.manager = again.url
            assert orphan.register() is False and orphan.gone is not None
            assert 0 not in again.apps["kv"].tasks
        finally:
            again.stop()
    finally:
        for t in tasks:
            t.stop()


def test_a_registrations_start_time_must_be_a_finite_number(sm: ShardManager) -> None:
    c = api(sm)
    c.put("/v1/apps/kv", json={"job": "kv", "shards": 2, "replication": 1})
    reg = {"index": 0, "endpoint": "http://127.0.0.1:9", "job": "kv", "incarnation": "x"}
    body = ('{"index": 0, "endpoint": "http://127.0.0.1:9", "job": "kv", '
            '"incarnation": "x", "started": %s}')
    for bad in ("NaN", "1e400", "true", '"abc"', "-1"):
        r = register(sm, reg, content=(body % bad).encode())
        assert r.status_code == 422, (bad, r.status_code, r.text)
        assert r.json()["detail"][0]["loc"] == ["body", "started"], bad
    assert register(sm, reg, content=(body % "1700000000.5").encode()).status_code == 200
    assert sm.apps["kv"].tasks[0].started == 1700000000.5
