"""Shard Manager verifies who calls it: a replayed or stale TaskControl call is
refused; a registration is signed by the task's own process key, names an index
under the job's task count, an endpoint the address policy allows and a start time
not in the future; clients' read token reads and writes nothing else; Shard
Manager's calls to a task carry no application-wide secret and cannot be played
again; one application's work holds up no other's map; an unanswered task is called
less and less often; a restart never moves a map's generation back, and a restored
map names only the replicas their tasks confirm."""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
from test_sm_service import (
    KEY,
    TOKEN,
    Dict,
    api,
    control,
    full,
    ops,
    register,
    six_tasks,
    task,
)

from plait.model.job import MAX_TASKS
from plait.shardmanager import credentials
from plait.shardmanager.client import ShardTask
from plait.shardmanager.credentials import read_token, task_secret
from plait.shardmanager.service import (
    BACKOFF_CAP,
    LOG_EVERY,
    MAX_REPLICAS,
    AppSpec,
    Registration,
    ShardManager,
)
from plait.taskcontrol.protocol import TaskControlRequest, to_wire
from plait.taskcontrol.signing import JOB_HEADER, SIGNATURE_HEADER, sign, task_credential
from plait.testing import free_port, wait_for


@pytest.fixture
def sm(tmp_path) -> Iterator[ShardManager]:
    manager = ShardManager(TOKEN, tmp_path / "sm").start()
    yield manager
    manager.stop()


def reg(index: int = 0, endpoint: str = "http://127.0.0.1:9", **more: Any) -> dict[str, Any]:
    return {"index": index, "endpoint": endpoint, "job": "kv", "incarnation": f"i{index}",
            **more}


# -- TaskControl ------------------------------------------------------------------------------
def test_a_replayed_taskcontrol_call_is_refused_and_changes_nothing(sm: ShardManager) -> None:
    c, tasks = six_tasks(sm, shards=8)
    try:
        body = json.dumps(to_wire(TaskControlRequest(
            "kv", ops([0]), sequence_number=7))).encode()
        headers = {JOB_HEADER: "kv", SIGNATURE_HEADER: sign(KEY, body, time.time()),
                   "Content-Type": "application/json"}
        first = c.post("/v1/apps/kv/taskcontrol", content=body, headers=headers)
        assert first.status_code == 200 and first.json()["ack"] == ["kv/0/update/1"]
        # task 0 comes back (its operation completed) and is loaded again
        done = control(c, TaskControlRequest("kv", (), completed=ops([0]),
                                             sequence_number=8))
        assert done.status_code == 200
        wait_for(lambda: full(c) and any(tasks[0].endpoint in eps for eps in c.get(
            "/v1/apps/kv/map").json()["shards"].values()))
        before = c.get("/v1/apps/kv/map").json()["shards"]
        # the captured first call, played again byte for byte: refused, nothing changes
        again = c.post("/v1/apps/kv/taskcontrol", content=body, headers=headers)
        assert again.status_code == 422 and "sequence_number" in again.text
        assert "replay" in again.text
        assert c.get("/v1/apps/kv/map").json()["shards"] == before
        # the same number as the last accepted one, freshly signed: refused too
        same = control(c, TaskControlRequest("kv", ops([1]), sequence_number=8))
        assert same.status_code == 422 and "sequence_number" in same.text
        # a signature of two minutes ago (outside the 60 s window): refused
        late = json.dumps(to_wire(TaskControlRequest("kv", sequence_number=9))).encode()
        stale = c.post("/v1/apps/kv/taskcontrol", content=late, headers={
            JOB_HEADER: "kv", SIGNATURE_HEADER: sign(KEY, late, time.time() - 120)})
        assert stale.status_code == 401 and "60" in stale.text
        assert control(c, TaskControlRequest("kv", sequence_number=9)).status_code == 200
    finally:
        for t in tasks:
            t.stop()


# -- registrations ----------------------------------------------------------------------------
def test_a_registration_names_an_index_of_the_job(sm: ShardManager) -> None:
    c = api(sm)
    assert c.put("/v1/apps/kv", json={"job": "kv", "shards": 4, "replication": 1,
                                      "tasks": 6}).status_code == 200
    for index in (6, 999_999):
        r = register(sm, reg(index))
        assert r.status_code == 422 and "index" in r.text and "6 tasks" in r.text, r.text
    assert register(sm, reg(5)).status_code == 200
    # an application defined without the count takes any index a job may have
    c.put("/v1/apps/kv2", json={"job": "kv", "shards": 4, "replication": 1})
    assert register(sm, reg(MAX_TASKS), app="kv2").status_code == 422
    assert register(sm, reg(MAX_TASKS - 1), app="kv2").status_code == 200
    assert set(sm.apps["kv"].tasks) == {5}


@pytest.mark.parametrize("endpoint,rule", [
    ("http://169.254.169.254", "metadata"),
    ("http://169.254.169.254:80/latest", "metadata"),
    ("http://metadata.google.internal", "metadata"),
    ("http://[fd00:ec2::254]", "metadata"),
    ("http://169.254.10.10:8080", "link-local"),
    ("http://0.0.0.0:8080", "unspecified"),
    ("http://[::1", "not a URL"),
])
def test_a_registration_at_an_address_the_policy_refuses_is_refused(
        sm: ShardManager, endpoint: str, rule: str) -> None:
    api(sm).put("/v1/apps/kv", json={"job": "kv", "shards": 4, "replication": 1})
    r = register(sm, reg(0, endpoint))
    assert r.status_code == 422 and "endpoint" in r.text and rule in r.text, r.text
    assert sm.apps["kv"].tasks == {}


def test_the_service_itself_is_no_task_endpoint(sm: ShardManager) -> None:
    api(sm).put("/v1/apps/kv", json={"job": "kv", "shards": 4, "replication": 1})
    r = register(sm, reg(0, sm.url))
    assert r.status_code == 422 and "own-api" in r.text, r.text


def test_task_networks_bound_where_tasks_may_be(tmp_path) -> None:
    sm = ShardManager(TOKEN, task_networks=["10.0.0.0/8"]).start()
    try:
        api(sm).put("/v1/apps/kv", json={"job": "kv", "shards": 4, "replication": 1})
        r = register(sm, reg(0, "http://127.0.0.1:9"))
        assert r.status_code == 422 and "loopback" in r.text and "--task-networks" in r.text
        assert register(sm, reg(0, "http://192.168.1.1:9")).status_code == 422
        assert register(sm, reg(0, "http://10.1.2.3:9")).status_code == 200
    finally:
        sm.stop()


def test_a_start_time_in_the_future_is_refused_and_the_real_task_stays(
        sm: ShardManager) -> None:
    c = api(sm)
    c.put("/v1/apps/kv", json={"job": "kv", "shards": 4, "replication": 3})
    year_5138 = 99_999_999_999.0
    forged = register(sm, {**reg(0), "incarnation": "forged", "started": year_5138})
    assert forged.status_code == 422 and "started" in forged.text, forged.text
    skewed = register(sm, {**reg(0), "incarnation": "ahead", "started": time.time() + 3600})
    assert skewed.status_code == 422 and "started" in skewed.text
    real = task(sm, 0, 0)
    try:
        wait_for(lambda: bool(real.shards))
        for _ in range(3):
            assert real.register() is True and real.gone is None
    finally:
        real.stop()


def test_registrations_need_the_tasks_own_signature(sm: ShardManager) -> None:
    c = api(sm)
    c.put("/v1/apps/kv", json={"job": "kv", "shards": 4, "replication": 1})
    body = json.dumps(reg(0)).encode()
    url = f"{sm.url}/v1/apps/kv/tasks"
    secret = task_secret(TOKEN, "kv")
    # the old way (the application's token as a bearer), the clients' read token, the
    # service's own token: none registers
    for bearer in (secret, read_token(TOKEN, "kv"), TOKEN):
        r = httpx.post(url, content=body, headers={"Authorization": f"Bearer {bearer}"})
        assert r.status_code == 401 and "not signed" in r.text
    # signed with a key of another process, of another application, or from the read
    # token: refused
    wrong = [credentials.task_key(secret, "kv", "kv", 0, "another"),
             credentials.task_key(task_secret(TOKEN, "kv2"), "kv", "kv", 0, "i0"),
             credentials.task_key(read_token(TOKEN, "kv"), "kv", "kv", 0, "i0")]
    for key in wrong:
        r = httpx.post(url, content=body, headers={
            credentials.SIGNATURE_HEADER: credentials.sign(key, body, time.time())})
        assert r.status_code == 401 and "does not match" in r.text
    # the body changed under a good signature (another endpoint): refused
    key = credentials.task_key(secret, "kv", "kv", 0, "i0")
    good = credentials.sign(key, body, time.time())
    moved = json.dumps(reg(0, "http://127.0.0.1:10")).encode()
    assert httpx.post(url, content=moved, headers={
        credentials.SIGNATURE_HEADER: good}).status_code == 401
    # stale, then a replay of a registration older than the last accepted one
    assert httpx.post(url, content=body, headers={
        credentials.SIGNATURE_HEADER: credentials.sign(key, body, time.time() - 120)
    }).status_code == 401
    old = credentials.sign(key, body, time.time() - 30)
    assert httpx.post(url, content=body, headers={
        credentials.SIGNATURE_HEADER: good}).status_code == 200
    replay = httpx.post(url, content=body, headers={credentials.SIGNATURE_HEADER: old})
    assert replay.status_code == 401 and "replay" in replay.text
    # an application that does not exist looks the same as a bad signature to anyone
    # without its secret
    r = httpx.post(f"{sm.url}/v1/apps/nope/tasks", content=body, headers={
        credentials.SIGNATURE_HEADER: good})
    assert r.status_code == 401


def test_a_task_registers_as_itself_only_with_its_own_credential(sm: ShardManager) -> None:
    """With its job's controller key, an application takes a registration signed from
    the credential of the task it names only: not a sibling's, not another job's, not
    the application's shared task secret."""
    c = api(sm)
    assert c.put("/v1/apps/kv", json={"job": "kv", "shards": 4, "replication": 1,
                                      "tasks": 6, "controller_key": KEY}).status_code == 200

    def signed(index: int, secret: str, job: str = "kv") -> httpx.Response:
        return register(sm, reg(index, job=job), secret=secret)

    at = "127.0.0.1:9"  # (where reg's tasks are)
    mine = task_credential(KEY, "kv", 3, at)
    # task 3's credential signs for task 3, not for its sibling 4 (nor 0)
    for sibling in (4, 0):
        r = signed(sibling, mine)
        assert r.status_code == 401 and "PLAIT_TASK_CREDENTIAL" in r.text, r.text
    # nor does the application's task secret, another job's key, or another job's task,
    # nor the credential its agent holds (not bound to an endpoint)
    for secret in (task_secret(TOKEN, "kv"), task_credential("cd" * 32, "kv", 4, at),
                   task_credential(KEY, "web", 4, at), KEY, task_credential(KEY, "kv", 4)):
        assert signed(4, secret).status_code == 401
    assert sm.apps["kv"].tasks == {}
    assert signed(3, mine).status_code == 200
    assert signed(4, task_credential(KEY, "kv", 4, at)).status_code == 200
    assert set(sm.apps["kv"].tasks) == {3, 4}
    # the job made again (a new controller key): the old credentials are refused
    again = "cd" * 32
    assert c.put("/v1/apps/kv", json={"job": "kv", "shards": 4, "replication": 1,
                                      "tasks": 6, "controller_key": again}).status_code == 200
    assert signed(3, mine).status_code == 401
    assert signed(3, task_credential(again, "kv", 3, at)).status_code == 200


def test_a_task_registers_its_own_endpoint_only(sm: ShardManager) -> None:
    """A task's credential is bound to the endpoint discovery has for it: with it, the
    task registers that endpoint (however its URL spells it), and another endpoint,
    a sibling's included, is refused (401 naming the endpoint) and never called."""
    c = api(sm)
    assert c.put("/v1/apps/kv", json={"job": "kv", "shards": 4, "replication": 1,
                                      "tasks": 6, "controller_key": KEY}).status_code == 200
    mine = task_credential(KEY, "kv", 3, "127.0.0.1:4100")
    for elsewhere in ("http://127.0.0.1:4101", "http://127.0.0.2:4100",
                      "http://localhost:4100", "http://127.0.0.1:41000"):
        r = register(sm, reg(3, elsewhere), secret=mine)
        assert r.status_code == 401, r.text
        assert "PLAIT_TASK_ENDPOINT" in r.text and elsewhere[7:] in r.text, r.text
    # a sibling's endpoint, with a credential for its own
    sibling = task_credential(KEY, "kv", 4, "127.0.0.1:4104")
    assert register(sm, reg(4, "http://127.0.0.1:4100"), secret=sibling).status_code == 401
    assert sm.apps["kv"].tasks == {}
    assert register(sm, reg(3, "http://127.0.0.1:4100/"), secret=mine).status_code == 200
    assert sm.apps["kv"].tasks[3].endpoint == "http://127.0.0.1:4100/"
    assert register(sm, reg(4, "http://127.0.0.1:4104"), secret=sibling).status_code == 200
    # an endpoint without a port cannot be one discovery has
    r = register(sm, reg(5, "http://127.0.0.1"), secret=task_credential(KEY, "kv", 5, "x"))
    assert r.status_code == 422 and "endpoint" in r.text, r.text


def test_a_task_with_its_credential_is_loaded_and_one_posing_as_a_sibling_is_not(
        sm: ShardManager) -> None:
    """Through the client library: a task whose agent gave it its credential registers
    and is called (Shard Manager signs with its key), one that claims a sibling's
    index with it is refused and never in the map."""
    c = api(sm)
    assert c.put("/v1/apps/kv", json={"job": "kv", "shards": 2, "replication": 1,
                                      "tasks": 3, "controller_key": KEY}).status_code == 200

    def from_env(index: int, credential: str, port: int) -> ShardTask:
        return ShardTask.from_env(Dict(), app="kv", env={
            "PLAIT_JOB": "kv", "PLAIT_TASK_INDEX": str(index), "PLAIT_PORT": str(port),
            "PLAIT_TASK_ENDPOINT": f"127.0.0.1:{port}",
            "PLAIT_SM_URL": sm.url, "PLAIT_TASK_CREDENTIAL": credential,
            # (the application's task secret too: the credential is what it signs with)
            "PLAIT_SM_TOKEN": task_secret(TOKEN, "kv")})

    ports = [free_port() for _ in range(3)]
    honest = from_env(0, task_credential(KEY, "kv", 0, f"127.0.0.1:{ports[0]}"),
                      ports[0]).start()
    # (task 0's, as task 1)
    hostile = from_env(1, task_credential(KEY, "kv", 0, f"127.0.0.1:{ports[1]}"), ports[1])
    # task 2's own, registering elsewhere than its PLAIT_TASK_ENDPOINT
    astray = from_env(2, task_credential(KEY, "kv", 2, f"127.0.0.1:{ports[2]}"), ports[2])
    astray.endpoint = f"http://127.0.0.1:{ports[1]}"
    try:
        assert honest.endpoint == f"http://127.0.0.1:{ports[0]}"
        wait_for(lambda: honest.shards == {"s00000", "s00001"})
        assert hostile.register() is False
        assert astray.register() is False
        assert set(sm.apps["kv"].tasks) == {0}
        assert hostile.endpoint not in json.dumps(c.get("/v1/apps/kv/map").json())
    finally:
        honest.stop()
        for t in (hostile, astray):
            t._server.server_close()
            t.http.close()
    with pytest.raises(SystemExit, match="PLAIT_TASK_CREDENTIAL"):
        ShardTask.from_env(Dict(), app="kv", env={
            "PLAIT_JOB": "kv", "PLAIT_TASK_INDEX": "0", "PLAIT_PORT": "1",
            "PLAIT_SM_URL": sm.url})


def test_the_read_token_reads_the_map_and_nothing_else(sm: ShardManager) -> None:
    c = api(sm)
    c.put("/v1/apps/kv", json={"job": "kv", "shards": 4, "replication": 1})
    c.put("/v1/apps/other", json={"job": "other", "shards": 4, "replication": 1})
    reader = httpx.Client(base_url=sm.url, timeout=30, headers={
        "Authorization": f"Bearer {read_token(TOKEN, 'kv')}"})
    try:
        assert reader.get("/v1/apps/kv/map").status_code == 200
        assert reader.get("/v1/apps/other/map").status_code == 401
        assert reader.put("/v1/apps/kv", json={"job": "kv", "shards": 1}).status_code == 401
        assert reader.get("/v1/apps/kv").status_code == 401
        assert reader.get("/v1/apps/kv/token").status_code == 401
        assert reader.post("/v1/apps/kv/load", json={"s00000": 1.0}).status_code == 401
        assert reader.post("/v1/apps/kv/tasks", json=reg(0)).status_code == 401
        assert sm.apps["kv"].tasks == {}
        # the task secret is no bearer token: it reads no map either
        assert httpx.get(f"{sm.url}/v1/apps/kv/map", headers={
            "Authorization": f"Bearer {task_secret(TOKEN, 'kv')}"}).status_code == 401
        said = c.get("/v1/apps/kv/token").json()
        assert said["read_token"] == read_token(TOKEN, "kv") != said["token"]
    finally:
        reader.close()


# -- Shard Manager's calls to tasks -------------------------------------------------------------
class Recorder(ThreadingHTTPServer):
    """An endpoint that records what it is sent and answers 503."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, dict[str, str], bytes]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def _any(self) -> None:
                size = int(self.headers.get("Content-Length") or 0)
                server.seen.append((self.command, self.path, dict(self.headers.items()),
                                    self.rfile.read(size) if size else b""))
                self.send_response(503)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_GET = do_POST = _any

            def log_message(self, *args: object) -> None:
                pass

        super().__init__(("127.0.0.1", free_port()), Handler)
        self.daemon_threads = True
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


def test_calls_to_a_task_carry_no_secret_and_cannot_be_played_again(
        sm: ShardManager) -> None:
    c = api(sm)
    c.put("/v1/apps/kv", json={"job": "kv", "shards": 2, "replication": 1})
    rec = Recorder()
    try:
        assert register(sm, reg(0, rec.url)).status_code == 200
        wait_for(lambda: bool(rec.seen))
        method, path, headers, body = rec.seen[0]
        assert (method, path) == ("POST", "/sm/add")
        said = json.dumps(headers) + body.decode()
        for secret in (TOKEN, task_secret(TOKEN, "kv"), read_token(TOKEN, "kv")):
            assert secret not in said
        assert "authorization" not in {k.lower() for k in headers}
        # signed with the key of that one process of task 0, over method, path, body
        key = credentials.task_key(task_secret(TOKEN, "kv"), "kv", "kv", 0, "i0")
        credentials.verify(key, headers[credentials.SIGNATURE_HEADER],
                           credentials.call_message(method, path, body), time.time())
        # with its job's controller key: signed with a key from task 0's own credential
        c.put("/v1/apps/kv3", json={"job": "kv", "shards": 1, "replication": 1,
                                    "controller_key": KEY})
        rec.seen.clear()
        assert register(sm, reg(0, rec.url), app="kv3").status_code == 200
        wait_for(lambda: bool(rec.seen))
        method, path, headers, body = rec.seen[0]
        own = task_credential(KEY, "kv", 0, credentials.host_port(rec.url))
        assert own not in json.dumps(headers) + body.decode()
        credentials.verify(credentials.task_key(own, "kv3", "kv", 0, "i0"),
                           headers[credentials.SIGNATURE_HEADER],
                           credentials.call_message(method, path, body), time.time())
    finally:
        rec.shutdown()
        rec.server_close()
    # a real task refuses that call played again, an unsigned one, and one signed for
    # another process
    t = task(sm, 1, 0)
    try:
        wait_for(lambda: bool(t.shards))
        body = json.dumps({"shard": "s00000", "nonce": "n" * 32}).encode()
        signed = credentials.sign(t.key, credentials.call_message("POST", "/sm/drop", body),
                                  time.time())
        first = httpx.post(f"{t.endpoint}/sm/drop", content=body,
                           headers={credentials.SIGNATURE_HEADER: signed})
        assert first.status_code == 200
        again = httpx.post(f"{t.endpoint}/sm/drop", content=body,
                           headers={credentials.SIGNATURE_HEADER: signed})
        assert again.status_code == 401 and "replay" in again.text
        other = credentials.task_key(task_secret(TOKEN, "kv"), "kv", "kv", 1, "another")
        fresh = json.dumps({"shard": "s00001", "nonce": "m" * 32}).encode()
        for header in (None, credentials.sign(other, credentials.call_message(
                "POST", "/sm/drop", fresh), time.time())):
            r = httpx.post(f"{t.endpoint}/sm/drop", content=fresh, headers={} if header is None
                           else {credentials.SIGNATURE_HEADER: header})
            assert r.status_code == 401
        assert httpx.post(f"{t.endpoint}/sm/drop", content=fresh, headers={
            "Authorization": f"Bearer {task_secret(TOKEN, 'kv')}"}).status_code == 401
    finally:
        t.stop()


def test_an_unanswered_task_is_called_after_a_growing_backoff_and_logged_rarely() -> None:
    now = [1_000_000.0]
    sm = ShardManager(TOKEN, clock=lambda: now[0], task_networks=["any", "loopback"])
    sm.define("kv", AppSpec(job="kv", shards=3, replication=1))
    sm.register("kv", Registration(index=0, endpoint="http://127.0.0.1:9", job="kv",
                                   incarnation="x", started=now[0]))
    app = sm.apps["kv"]
    info = app.tasks[0]
    waits, logged = [], set()
    for _ in range(12):
        calls = sm._plan(app, now[0])
        assert calls and all(call[2] == 0 for call in calls)
        for call in calls:  # (the calls of a round fail together)
            failed: Future[tuple[bool, str, Any]] = Future()
            failed.set_result((False, "x", "ConnectError: refused"))
            sm._answered(call, failed)
        waits.append(info.next_try - now[0])
        logged.add(info.logged_at)
        # nothing is called again before its time
        now[0] = info.next_try - 0.01
        info.seen = now[0]
        assert sm._plan(app, now[0]) == []
        now[0] = info.next_try
        info.seen = now[0]
    assert all(b > a for a, b in itertools.pairwise(waits[:6])), waits
    assert max(waits) <= BACKOFF_CAP * 1.25 and min(waits[-3:]) >= BACKOFF_CAP
    # 36 calls failed over a few minutes: one line a LOG_EVERY, the others counted
    assert len(logged) <= sum(waits) / LOG_EVERY + 1 < 36 and info.quiet > 0
    # it answers: called at once again from then on
    calls = sm._plan(app, now[0])
    for call in calls:
        ok: Future[tuple[bool, str, Any]] = Future()
        ok.set_result((True, "x", {"incarnation": "x"}))
        sm._answered(call, ok)
    assert info.failures == 0 and info.next_try == 0.0


# -- isolation and bounds -----------------------------------------------------------------------
def test_one_application_held_up_holds_up_no_other_map(sm: ShardManager) -> None:
    c = api(sm)
    c.put("/v1/apps/big", json={"job": "big", "shards": 8, "replication": 1})
    c.put("/v1/apps/small", json={"job": "small", "shards": 8, "replication": 1})
    big = sm.apps["big"]
    with big.lock:  # (as a long layout of big would)
        r = c.get("/v1/apps/small/map", timeout=20)
        assert r.status_code == 200 and len(r.json()["shards"]) == 8
        assert c.get("/v1/apps/small", timeout=20).status_code == 200


def test_an_application_over_the_replica_bound_is_refused_by_name(sm: ShardManager) -> None:
    c = api(sm)
    r = c.put("/v1/apps/huge", json={"job": "huge", "shards": 100_000, "replication": 9})
    assert r.status_code == 422 and str(MAX_REPLICAS) in r.text, r.text
    assert r.json()["detail"][0]["loc"] == ["body", "replication"]
    assert "huge" not in sm.apps
    ok = c.put("/v1/apps/huge", json={"job": "huge", "shards": 100_000, "replication": 3})
    assert ok.status_code == 200


# -- restarts -----------------------------------------------------------------------------------
def test_a_restart_never_moves_the_generation_back(tmp_path) -> None:
    """Even a service killed before it saved its maps, and whose clock says an earlier
    time, publishes maps past every one it published before."""
    now = [1_000.0]
    first = ShardManager(TOKEN, tmp_path, clock=lambda: now[0])
    first.define("kv", AppSpec(job="kv", shards=2, replication=1))
    first._save(force=True)
    app = first.apps["kv"]
    with app.lock:
        for _ in range(25_000):  # (published, never saved in shardmanager.json)
            first._changed(app)
    published = app.generation
    now[0] = 10.0  # (the clock stepped back)
    second = ShardManager(TOKEN, tmp_path, clock=lambda: now[0])
    assert second.apps["kv"].generation > published
    # and with no data dir, the clock in milliseconds is where a generation starts
    third = ShardManager(TOKEN, clock=time.time)
    third.define("kv", AppSpec(job="kv", shards=2, replication=1))
    assert third.apps["kv"].generation > time.time() * 1000 - 60_000


def test_a_restored_map_names_only_replicas_that_confirm(sm: ShardManager, tmp_path) -> None:
    _, tasks = six_tasks(sm, shards=6)
    try:
        dead = tasks[0]
        sm.stop()
        dead.stop()  # (its process went away while the service was down)
        again = ShardManager(TOKEN, tmp_path / "sm").start()
        for t in tasks[1:]:  # (the service's new address: they beat there)
            t.manager = again.url
        try:
            c2 = api(again)
            seen = []

            def settled() -> bool:
                m = c2.get("/v1/apps/kv/map").json()
                seen.append(m)
                named = {e for eps in m["shards"].values() for e in eps}
                return named == {t.endpoint for t in tasks[1:]}
            wait_for(settled)
            assert all(dead.endpoint not in eps for m in seen
                       for eps in m["shards"].values())
            assert not again.apps["kv"].tasks[0].confirmed
            # the others answered, and its shards are loaded elsewhere in time
            wait_for(lambda: full(c2), 60)
        finally:
            again.stop()
    finally:
        for t in tasks[1:]:
            t.stop()


def test_restored_tasks_not_confirmed_yet_are_not_taken_for_empty_ones(tmp_path) -> None:
    """Right after a restart, before any task confirmed its replicas, the controller
    still counts them: the partners of a task it acked before are not acked."""
    loopback = ["any", "loopback"]
    first = ShardManager(TOKEN, tmp_path, task_networks=loopback)
    first.define("kv", AppSpec(job="kv", shards=3, replication=2, controller_key=KEY))
    for i in range(4):
        first.register("kv", Registration(index=i, endpoint=f"http://127.0.0.1:{9 + i}",
                                          job="kv", incarnation=f"x{i}"))
    app = first.apps["kv"]
    app.ready = {"s00000": {0, 1}, "s00001": {0, 2}, "s00002": {3, 1}}
    first._save(force=True)
    second = ShardManager(TOKEN, tmp_path, task_networks=loopback)  # (nothing confirms)
    assert set(second.apps["kv"].restored) == {0, 1, 2, 3}
    assert json.loads(second.map_json("kv"))["shards"] == {
        "s00000": [], "s00001": [], "s00002": []}
    body = json.dumps(to_wire(TaskControlRequest("kv", ops([0, 1, 2]),
                                                 sequence_number=1))).encode()
    said = second.taskcontrol("kv", body, "kv", sign(KEY, body, time.time()))
    acked = {int(a.split("/")[1]) for a in said["ack"]}
    assert acked and not ({0, 1} <= acked or {0, 2} <= acked), acked
