"""Creates carried to a shard in batches (``plait.frontend.batch``): each caller gets
the answer it would get alone, under its own token and request id, and a batch can do
nothing its creates could not."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from livecp import Live, start_behind_front_end, stop_live, wait_for

from plait.frontend import batch


def spec(name: str, entitlement: str = "web", **extra: Any) -> dict[str, Any]:
    return {"name": name, "entitlement": entitlement, "task_count": 1,
            "resources": {"cpu": 1, "memory_gb": 1}, "command": "serve", **extra}


# -- the wire form ---------------------------------------------------------------------------
items = st.lists(st.builds(batch.Item, st.text(max_size=40), st.text(max_size=20),
                           st.binary(max_size=200)), max_size=20)


@given(items)
def test_a_batch_reads_back_as_it_was_written(written: list[batch.Item]) -> None:
    assert batch.decode(batch.encode(written)) == written


@given(st.lists(st.one_of(st.none(), st.tuples(st.integers(100, 599), st.binary(max_size=100))),
                max_size=20))
def test_answers_read_back_as_they_were_written(answers) -> None:
    assert batch.decode_answers(batch.encode_answers(answers), len(answers)) == answers


@pytest.mark.parametrize(("data", "reason"), [
    (b"no newline", "create 0: no header line"),
    (b"[1]\nxx", "create 0: the header line is not"),
    (b'{"authorization": "a", "request_id": "r", "length": 9}\nshort', "past the end"),
    (b'{"authorization": 1, "request_id": "r", "length": 0}\n', "wrong type"),
    (b'{"authorization": "a", "request_id": "r", "length": -1}\n', "wrong type"),
])
def test_a_malformed_batch_is_refused_saying_where(data: bytes, reason: str) -> None:
    with pytest.raises(batch.BadBatch, match=reason):
        batch.decode(data)


def test_too_many_creates_or_answers_that_do_not_match_are_refused() -> None:
    many = batch.encode([batch.Item("a", "r", b"{}")] * 3)
    with pytest.raises(batch.BadBatch, match="more than 2 creates"):
        batch.decode(many, max_items=2)
    with pytest.raises(batch.BadBatch, match="1 answers to 2 creates"):
        batch.decode_answers(batch.encode_answers([None]), 2)
    with pytest.raises(batch.BadBatch, match="not a 'STATUS LENGTH' line"):
        batch.decode_answers(b"201\n{}", 1)


# -- through the front end --------------------------------------------------------------------
@pytest.fixture
def region(tmp_path: Path) -> Iterator[Live]:
    api = start_behind_front_end(tmp_path)
    api.admin.post("/v1/entitlements", json={"name": "web", "owner": "alice",
                                             "quota": {"machines": 12}}).raise_for_status()
    api.admin.post("/v1/entitlements", json={"name": "db", "owner": "bob",
                                             "quota": {"machines": 2}}).raise_for_status()
    yield api
    stop_live(api)


def held_batches(region: Live, creates: int) -> threading.Event:
    """Hold the front end's first batch until ``creates`` more creates wait behind it
    (so they leave together, as under load); returns the event that lets it go."""
    router = region.router
    router.creates.in_flight = 1
    real = router.to_shard
    release = threading.Event()
    first = True

    async def holding(shard: int, scope: Any, body: bytes, *args: Any, **kw: Any) -> Any:
        nonlocal first
        if scope["path"] == batch.PATH and first:
            first = False
            while not release.is_set():
                await asyncio.sleep(0.01)
        return await real(shard, scope, body, *args, **kw)
    router.to_shard = holding
    return release


def send_together(calls: list[tuple[httpx.Client, dict[str, Any], dict[str, str]]],
                  region: Live) -> list[httpx.Response]:
    """Send every create at once; the first alone, the rest in one batch behind it (but
    for a create of an entitlement the map does not know: the front end sends it to
    shard 0 at once, for its refusal)."""
    release = held_batches(region, len(calls) - 1)
    answers: list[httpx.Response | None] = [None] * len(calls)

    def one(i: int) -> None:
        client, body, headers = calls[i]
        answers[i] = client.post("/v1/jobs", json=body, headers=headers)
    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(calls))]
    threads[0].start()
    wait_for(lambda: region.router.creates.batches == 1)
    for t in threads[1:]:
        t.start()
    queue = region.router.creates._queues
    unmapped = sum(1 for _, body, _ in calls if body["entitlement"] not in ("web", "db"))
    wait_for(lambda: sum(len(q) for q in queue.values()) == len(calls) - 1 - unmapped)
    release.set()
    for t in threads:
        t.join(60)
    assert all(a is not None for a in answers)
    return [a for a in answers if a is not None]


def test_creates_waiting_together_go_in_one_batch_and_each_gets_its_own_answer(
        region: Live) -> None:
    alice, bob = region.owner("alice"), region.owner("bob")
    with alice, bob:
        for c in (alice, bob):
            c.get("/v1/jobs")  # (their tokens cached by the shard, as after any call)
        assert alice.post("/v1/jobs", json=spec("taken")).status_code == 201
        batches_before = region.router.creates.batches
        region.router.creates.batches = 0
        calls = [
            (alice, spec("first"), {"X-Request-Id": "c-0"}),
            *((alice, spec(f"a{i}"), {"X-Request-Id": f"c-a{i}"}) for i in range(6)),
            (bob, spec("b0", "db"), {"X-Request-Id": "c-b0"}),
            (alice, spec("taken"), {}),                             # the same spec again
            (alice, spec("taken", args=["--other"]), {}),           # another spec
            (alice, {**spec("bad"), "task_count": -1}, {}),         # invalid
            (alice, spec("theirs", "db"), {}),                      # bob's entitlement
            (bob, spec("nowhere", "nowhere"), {}),                  # unknown entitlement
        ]
        got = send_together(calls, region)
        # two batches: the held one, then every other create at once
        assert region.router.creates.batches == 2 and batches_before >= 1
        assert [r.status_code for r in got[:8]] == [201] * 8
        assert got[8].status_code == 200 and got[8].json()["created"] is False
        assert got[9].status_code == 409, got[9].text
        assert got[10].status_code == 422 and got[10].json()["field"] == "task_count"
        # another owner's entitlement reads as one that does not exist
        assert got[11].status_code == got[12].status_code == 422
        assert got[11].json()["message"] == got[12].json()["message"].replace(
            "'nowhere'", "'db'")
        # each answer is the one that create gets alone, from the shard's route
        direct = httpx.post(f"{region.server.url}/v1/jobs", json=spec("taken"),
                            headers=dict(alice.headers))
        assert got[8].content == direct.content
        for r, (_, body, headers) in zip(got, calls, strict=True):
            assert r.headers["x-request-id"] == headers.get("X-Request-Id",
                                                            r.headers["x-request-id"])
            if r.status_code == 201:
                assert r.json()["name"] == body["name"]
    jobs = {j["name"]: j["entitlement"] for j in region.admin.get("/v1/jobs").json()["jobs"]}
    assert jobs == {"taken": "web", "first": "web", "b0": "db",
                    **{f"a{i}": "web" for i in range(6)}}
    # each create's effects carry its own request id, not the batch's
    wait_for(lambda: {e["job"]: e["request"] for e in region.admin.get(
        "/v1/events", params={"kind": "created", "limit": 100}).json()["events"]
        if e["job"].startswith("a")} == {f"a{i}": f"c-a{i}" for i in range(6)})


def test_a_second_batch_leaves_while_one_is_on_its_way_only_once_enough_creates_wait(
        region: Live) -> None:
    router = region.router
    creates = router.creates
    assert (creates.in_flight, creates.more_at) == (2, 4)
    real = router.to_shard
    release = threading.Event()
    held: list[int] = []

    async def holding(shard: int, scope: Any, body: bytes, *args: Any, **kw: Any) -> Any:
        if scope["path"] == batch.PATH and not held:
            held.append(len(batch.decode(body)))  # the first batch waits on its way
            while not release.is_set():
                await asyncio.sleep(0.01)
        return await real(shard, scope, body, *args, **kw)
    router.to_shard = holding
    alice = region.owner("alice")
    answers: dict[str, int] = {}

    def create(name: str) -> threading.Thread:
        def run() -> None:
            answers[name] = alice.post("/v1/jobs", json=spec(name)).status_code
        t = threading.Thread(target=run)
        t.start()
        return t
    with alice:
        alice.get("/v1/jobs")  # (the token cached by the shard)
        creates.batches = 0
        threads = [create("held")]
        wait_for(lambda: held == [1])
        # three wait: a batch of them would cost the shard more than it saves them
        threads += [create(f"w{i}") for i in range(3)]
        wait_for(lambda: len(creates._queues.get(0, [])) == 3)
        assert creates.batches == 1 and answers == {}
        # a fourth: the four leave together while the first is still on its way
        threads.append(create("w3"))
        wait_for(lambda: len(answers) == 4)
        assert creates.batches == 2 and "held" not in answers
        assert answers == {f"w{i}": 201 for i in range(4)}
        release.set()
        for t in threads:
            t.join(60)
    assert answers["held"] == 201


def test_a_batch_sent_to_the_shard_directly_is_checked_create_by_create(region: Live) -> None:
    url = f"{region.server.url}{batch.PATH}"
    alice_token = region.admin.post("/v1/tokens", json={"role": "owner", "name": "alice"}
                                    ).json()["token"]
    region.client(alice_token).get("/v1/jobs")  # (cached by the shard)
    kind = {"Content-Type": batch.CONTENT_TYPE}

    def send(token: str | None, data: bytes, headers: dict[str, str] = kind
             ) -> httpx.Response:
        auth = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.post(url, content=data, headers={**headers, **auth})
    one = batch.encode([batch.Item(f"Bearer {alice_token}", "r1",
                                   httpx.Request("POST", "/", json=spec("d1")).content)])
    # no token, a wrong one, the wrong type, a malformed batch: refused, nothing stored
    assert send(None, one).status_code == 401
    # every bad token gets the routes' one answer (no reason to tell tokens apart by)
    for token in ("plait_nope_nope", "garbage", f"{alice_token[:-1]}x"):
        refused = send(token, one)
        assert refused.status_code == 401 and refused.json()["message"] == "invalid token"
        assert refused.headers["www-authenticate"] == "Bearer"
    # a machine's or a join token carries no creates (owners' and admins' only)
    join = region.admin.post("/v1/tokens", json={"role": "join", "name": "j"}).json()["token"]
    assert send(join, one).status_code == 403
    wrong = send(alice_token, one, {"Content-Type": "application/json"})
    assert wrong.status_code == 415 and batch.CONTENT_TYPE in wrong.json()["message"]
    bad = send(alice_token, b"garbage")
    assert bad.status_code == 422 and "create 0" in bad.json()["message"]
    # a create under a token not valid, or for another owner's entitlement, is not
    # answered by the batch (the front end sends it alone: the route refuses it)
    mixed = batch.encode([
        batch.Item("Bearer plait_nope_nope", "r2",
                   httpx.Request("POST", "/", json=spec("d2")).content),
        batch.Item(f"Bearer {alice_token}", "r3",
                   httpx.Request("POST", "/", json=spec("d3", "db")).content),
        batch.Item(f"Bearer {alice_token}", "r4", b"not json"),
    ])
    r = send(alice_token, mixed)
    assert r.status_code == 200 and r.headers["content-type"] == batch.CONTENT_TYPE
    assert batch.decode_answers(r.content, 3) == [None, None, None]
    assert region.admin.get("/v1/jobs").json()["jobs"] == []
    # and a plain one is stored and answered
    r = send(alice_token, one)
    (answer,) = batch.decode_answers(r.content, 1)
    assert answer is not None and answer[0] == 201
    assert [j["name"] for j in region.admin.get("/v1/jobs").json()["jobs"]] == ["d1"]
    # a batch of many is stored in one transaction (one fsync), the refused one left
    # out of it, each answered for itself
    committed = region.cp.creates.batches
    many = batch.encode([
        *(batch.Item(f"Bearer {alice_token}", f"m{k}",
                     httpx.Request("POST", "/", json=spec(f"m{k}")).content)
          for k in range(12)),
        batch.Item(f"Bearer {alice_token}", "m-bad", b"not json")])
    r = send(alice_token, many)
    answers = batch.decode_answers(r.content, 13)
    assert [a[0] if a else None for a in answers] == [201] * 12 + [None]
    assert region.cp.creates.batches == committed + 1
    assert {j["name"] for j in region.admin.get("/v1/jobs").json()["jobs"]} == {
        "d1", *(f"m{k}" for k in range(12))}


def test_creates_whose_shard_cannot_be_reached_get_a_retry(region: Live) -> None:
    alice = region.owner("alice")
    with alice:
        alice.get("/v1/jobs")
        region.server.stop()
        r = alice.post("/v1/jobs", json=spec("late"))
    assert r.status_code == 503 and r.headers["retry-after"] == "1", r.text
    assert "scheduler shard 0" in r.json()["message"]
