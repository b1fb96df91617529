"""The job list of a sharded region through ``plait frontend``: both shards' jobs
merged by name into one list of pages, each job once, jobs created on either shard
between pages included when their name comes later, owners kept apart."""

from __future__ import annotations

import pytest

from plait.harness.shards import ShardedBox


@pytest.fixture
def region(tmp_path):
    with ShardedBox(tmp_path, shards=2, machines=4) as box:
        yield box


def job(name: str, ent: str) -> dict:
    return {"name": name, "entitlement": ent, "task_count": 0, "command": "sleep",
            "args": ["600"], "resources": {"cpu": 1, "memory_gb": 1}}


def pages(client, limit, **params):
    found, token, sizes = [], None, []
    while True:
        r = client.get("/v1/jobs", params={"limit": limit, **params, **(
            {"continue": token} if token else {})})
        assert r.status_code == 200, r.text
        body = r.json()
        found += [j["name"] for j in body["jobs"]]
        sizes.append(len(body["jobs"]))
        token = body["continue"]
        if token is None:
            return found, sizes


def test_the_front_end_merges_both_shards_pages_by_name(region):
    api = region.api
    for ent, owner in (("a", "alice"), ("b", "bob")):
        r = api.post("/v1/entitlements", json={"name": ent, "owner": owner,
                                                "quota": {"machines": 2}})
        assert r.status_code == 201, r.text
    assert (region.entry("a")["shard"], region.entry("b")["shard"]) == (0, 1)
    # names interleave across the shards: a-jobs on shard 0, b-jobs on shard 1
    made = {}
    for i in range(9):
        ent = "a" if i % 3 else "b"
        made[f"j{i * 2:02d}"] = ent
        assert api.post("/v1/jobs", json=job(f"j{i * 2:02d}", ent)).status_code == 201
    assert set(region.cp(0).jobs.names()) == {n for n, e in made.items() if e == "a"}
    assert set(region.cp(1).jobs.names()) == {n for n, e in made.items() if e == "b"}
    everything = [j["name"] for j in api.get("/v1/jobs").json()["jobs"]]
    assert everything == sorted(made)
    found, sizes = pages(api, 4)
    assert found == sorted(made) and sizes == [4, 4, 1]
    # jobs created on both shards between pages: listed when after the cursor
    seen, token, added = [], None, []
    while True:
        body = api.get("/v1/jobs", params={"limit": 3, **(
            {"continue": token} if token else {})}).json()
        seen += [j["name"] for j in body["jobs"]]
        token = body["continue"]
        if token is None:
            break
        n = int(seen[-1][1:])
        for name, ent in ((f"j{n + 1:02d}", "a"), (f"j{n + 3:02d}", "b")):
            if name not in made and n + 3 < 18:
                assert api.post("/v1/jobs", json=job(name, ent)).status_code == 201
                made[name] = ent
                added.append(name)
    assert added and len(seen) == len(set(seen)) == len(made)
    assert seen == sorted(made)
    # filters through the front end: each shard filters, the front end merges
    only_b, _ = pages(api, 2, entitlement="b")
    assert only_b == sorted(n for n, e in made.items() if e == "b")
    # a bad token is refused whichever shard reads it
    r = api.get("/v1/jobs", params={"continue": "garbage"})
    assert r.status_code == 400 and r.json()["field"] == "continue"
    r = api.get("/v1/jobs", params={"limit": "0"})
    assert r.status_code == 400 and r.json()["field"] == "limit"
    # an owner's pages hold its own jobs only, from both shards' answers
    token = api.post("/v1/tokens", json={"role": "owner", "name": "alice"}).json()["token"]
    alice = region.api.__class__(base_url=region.front.url, timeout=30,
                                 headers={"Authorization": f"Bearer {token}"})
    mine, _ = pages(alice, 2)
    assert mine == sorted(n for n, e in made.items() if e == "a")
    # entitlements page across shards too
    ents = api.get("/v1/entitlements", params={"limit": 1}).json()
    assert [e["name"] for e in ents["entitlements"]] == ["a"] and ents["continue"]
    rest = api.get("/v1/entitlements", params={"continue": ents["continue"]}).json()
    assert [e["name"] for e in rest["entitlements"]] == ["b"] and rest["continue"] is None
