"""Lists in pages (``limit`` and ``continue``) and filtered on the server, through a
live API: every item once across pages while jobs come and go, filters, refused
tokens and sizes, owners kept apart, and the shapes callers without ``limit`` read."""

from __future__ import annotations

import base64
import json

import pytest
from livecp import wait_for

from plait.client import Client
from plait.paging import MAX_LIMIT, encode, scope_of


def entitlement(live, name, owner="alice", machines=6):
    r = live.admin.post("/v1/entitlements", json={"name": name, "owner": owner,
                                                  "quota": {"machines": machines}})
    assert r.status_code in (200, 201), r.text


def job(name, ent, tasks=0, command="serve"):
    return {"name": name, "entitlement": ent, "task_count": tasks, "command": command,
            "resources": {"cpu": 0.5, "memory_gb": 0.5}}


def create(client, name, ent, tasks=0, command="serve"):
    r = client.post("/v1/jobs", json=job(name, ent, tasks, command))
    assert r.status_code == 201, r.text


def names(client, path="/v1/jobs", field="jobs", key="name", **params):
    """Every item of a list, page by page: (the keys in order, the pages read)."""
    found, token, pages = [], None, 0
    while True:
        body = client.get(path, params={**params, **({"continue": token} if token else {})})
        assert body.status_code == 200, body.text
        data = body.json()
        assert "continue" in data
        found += [x[key] for x in data[field]]
        pages += 1
        token = data["continue"]
        if token is None:
            return found, pages


def test_pages_list_every_job_once_while_jobs_are_created_and_deleted(live):
    entitlement(live, "web")
    for i in range(0, 40, 2):  # j00, j02, ..., j38
        create(live.admin, f"j{i:02d}", "web")
    seen, token, rounds = [], None, 0
    created_after, created_before, deleted = [], [], []
    while True:
        data = live.admin.get("/v1/jobs", params={"limit": 6, **(
            {"continue": token} if token else {})}).json()
        page = [j["name"] for j in data["jobs"]]
        assert page == sorted(page) and len(page) <= 6
        seen += page
        token = data["continue"]
        if token is None:
            break
        rounds += 1
        last = page[-1]
        # between pages: a job created after the cursor (listed later), one before it
        # (not listed: its place was read already), and a job not read yet deleted
        n = int(last[1:])
        after, before = f"j{n + 1:02d}", f"j{n - 1:02d}"
        create(live.admin, after, "web")
        created_after.append(after)
        if before not in seen:
            create(live.admin, before, "web")
            created_before.append(before)
        victim = f"j{n + 4:02d}"
        if victim < "j40" and victim not in seen:
            assert live.admin.delete(f"/v1/jobs/{victim}").status_code == 202
            deleted.append(victim)
    assert rounds >= 3
    assert len(seen) == len(set(seen)), "a job was listed twice"
    assert seen == sorted(seen)
    unchanged = {f"j{i:02d}" for i in range(0, 40, 2)} - set(deleted)
    assert unchanged <= set(seen), "a job present throughout was skipped"
    assert set(created_after) <= set(seen)
    assert not set(created_before) & set(seen)
    # a deleted job is listed at most once (as deleting, until its record goes)
    for name in deleted:
        assert seen.count(name) <= 1


def test_without_limit_the_answer_keeps_its_shape_and_a_page_matches_the_job(live):
    entitlement(live, "web")
    for name in ("b", "a", "c"):
        create(live.admin, name, "web", tasks=1)
    whole = live.admin.get("/v1/jobs").json()
    assert list(whole) == ["jobs"]
    assert [j["name"] for j in whole["jobs"]] == ["a", "b", "c"]
    paged = live.admin.get("/v1/jobs", params={"limit": 2}).json()
    assert sorted(paged) == ["continue", "jobs"] and len(paged["jobs"]) == 2
    wait_for(lambda: live.admin.get("/v1/jobs/a").json()["settled"])
    # what a list shows of a job is what the job's own view shows
    for j in live.admin.get("/v1/jobs", params={"limit": 10}).json()["jobs"]:
        assert j == live.admin.get(f"/v1/jobs/{j['name']}").json()
    # a change shows in the next list (the index reads the record again)
    live.admin.post("/v1/jobs/b/resize", json={"task_count": 2}).raise_for_status()
    listed = {j["name"]: j for j in live.admin.get("/v1/jobs").json()["jobs"]}
    assert listed["b"]["task_count"] == 2 and listed["b"]["version"] == 2


def test_a_list_reads_only_the_records_that_changed(live):
    entitlement(live, "web")
    for i in range(12):
        create(live.admin, f"r{i:02d}", "web")
    index = live.cp.views.index
    assert len(live.admin.get("/v1/jobs").json()["jobs"]) == 12
    live.admin.get("/v1/jobs")
    assert index.last_read == 0  # nothing changed: no record read
    live.admin.post("/v1/jobs/r03/resize", json={"task_count": 1}).raise_for_status()
    live.admin.get("/v1/jobs", params={"limit": 3})
    assert index.last_read == 1
    # a record written behind the API's back (another process) is seen too: the
    # store's watch marks it
    assert live.admin.get("/v1/jobs/r05").json()["deleting"] is False
    live.cp.jobs.delete("r05", live.cp.clock())

    def seen() -> bool:
        listed = {j["name"]: j for j in live.admin.get("/v1/jobs").json()["jobs"]}
        return bool(listed.get("r05", {"deleting": True})["deleting"])
    wait_for(seen)


def test_filters_by_entitlement_and_state(live):
    entitlement(live, "web")
    entitlement(live, "batch")
    create(live.admin, "w1", "web", tasks=1)
    create(live.admin, "w2", "web", tasks=1)
    create(live.admin, "b1", "batch", tasks=1)
    r = live.admin.post("/v1/jobs", json={**job("b2", "batch", 1, "finish"),
                                          "restart": {"policy": "never"}})
    assert r.status_code == 201, r.text
    found, _ = names(live.admin, entitlement="web", limit=1)
    assert found == ["w1", "w2"]
    wait_for(lambda: names(live.admin, state="settled", limit=50)[0] == ["b1", "w1", "w2"])
    wait_for(lambda: names(live.admin, state="complete", limit=50)[0] == ["b2"])
    assert names(live.admin, state="complete,settled", entitlement="batch",
                 limit=50)[0] == ["b1", "b2"]
    # without limit: filtered, in the former shape
    whole = live.admin.get("/v1/jobs", params={"state": "complete"}).json()
    assert list(whole) == ["jobs"] and [j["name"] for j in whole["jobs"]] == ["b2"]
    # a task list pages and filters too
    create(live.admin, "many", "web", tasks=5)
    wait_for(lambda: len(live.admin.get("/v1/jobs/many/tasks", params={
        "state": "running"}).json()["tasks"]) == 5)
    indices, pages = names(live.admin, "/v1/jobs/many/tasks", "tasks", "index", limit=2)
    assert indices == [0, 1, 2, 3, 4] and pages == 3
    assert live.admin.get("/v1/jobs/many/tasks", params={"state": "pending"}).json()[
        "tasks"] == []


@pytest.mark.parametrize(("params", "field"), [
    ({"limit": "0"}, "limit"), ({"limit": str(MAX_LIMIT + 1)}, "limit"),
    ({"limit": "ten"}, "limit"), ({"limit": ""}, "limit"),
    ({"continue": "not-a-token"}, "continue"),
    ({"continue": base64.urlsafe_b64encode(b'{"v": 1}').decode()}, "continue"),
    ({"continue": encode("a", scope_of("jobs", state="settled"))}, "continue"),
    ({"continue": encode(3, scope_of("jobs"))}, "continue"),
    ({"state": "sleepy"}, "state"), ({"state": ""}, "state"),
])
def test_a_bad_page_or_filter_is_a_400_naming_it(live, params, field):
    entitlement(live, "web")
    create(live.admin, "a", "web")
    r = live.admin.get("/v1/jobs", params=params)
    assert r.status_code == 400, r.text
    assert r.json()["error"] == "invalid" and r.json()["field"] == field
    assert field in r.json()["message"]


def test_a_token_of_one_list_or_filter_is_refused_by_another(live):
    entitlement(live, "web")
    for name in ("a", "b", "c"):
        create(live.admin, name, "web")
    token = live.admin.get("/v1/jobs", params={"limit": 1}).json()["continue"]
    assert live.admin.get("/v1/jobs", params={"continue": token}).status_code == 200
    for other in ({"continue": token, "entitlement": "web"},):
        assert live.admin.get("/v1/jobs", params=other).status_code == 400
    assert live.admin.get("/v1/entitlements", params={"continue": token}).status_code == 400
    assert live.admin.get("/v1/machines", params={"continue": token}).status_code == 400


def test_owners_see_only_their_own_jobs_in_every_page(live):
    entitlement(live, "alices", owner="alice")
    entitlement(live, "bobs", owner="bob")
    alice, bob = live.owner("alice"), live.owner("bob")
    for i in range(6):  # interleaved names
        create(alice, f"x{2 * i}", "alices")
        create(bob, f"x{2 * i + 1}", "bobs")
    mine, pages = names(alice, limit=2)
    assert mine == sorted(f"x{2 * i}" for i in range(6)) and pages == 3
    # another owner's entitlement as a filter: nothing (as if it did not exist)
    assert names(alice, entitlement="bobs", limit=2)[0] == []
    assert live.admin.get("/v1/jobs", params={"entitlement": "bobs"}).json()["jobs"]
    # a token is no key to another owner's jobs: it only says where to start
    token = alice.get("/v1/jobs", params={"limit": 1}).json()["continue"]
    page = bob.get("/v1/jobs", params={"continue": token, "limit": 100}).json()
    assert page["jobs"] and all(j["entitlement"] == "bobs" for j in page["jobs"])
    made_up = encode("", scope_of("jobs"))
    assert {j["entitlement"] for j in bob.get("/v1/jobs", params={
        "continue": made_up}).json()["jobs"]} == {"bobs"}
    # entitlements page by name, each owner's own
    ents, _ = names(alice, "/v1/entitlements", "entitlements", limit=1)
    assert ents == ["alices"]


def test_machines_tokens_and_entitlements_page(live):
    total = live.admin.get("/v1/machines", params={"limit": 1000}).json()["total"]
    ids, pages = names(live.admin, "/v1/machines", "machines", "id", limit=10)
    assert len(ids) == len(set(ids)) == total and pages == -(-total // 10)
    assert ids == [m["id"] for m in live.admin.get("/v1/machines", params={
        "limit": 1000}).json()["machines"]]
    token = live.admin.get("/v1/machines", params={"limit": 10}).json()["continue"]
    r = live.admin.get("/v1/machines", params={"continue": token, "offset": 5})
    assert r.status_code == 400 and r.json()["field"] == "offset"
    # filtered by state: the token is bound to the filter
    up, _ = names(live.admin, "/v1/machines", "machines", "id", limit=7, state="healthy")
    assert len(up) == total
    r = live.admin.get("/v1/machines", params={"state": "up"})
    assert r.status_code == 400 and r.json()["field"] == "state"
    for name in ("e3", "e1", "e2"):
        entitlement(live, name)
    assert names(live.admin, "/v1/entitlements", "entitlements", limit=2)[0] == [
        "e1", "e2", "e3"]
    for i in range(3):
        live.admin.post("/v1/tokens", json={"role": "owner", "name": f"o{i}"})
    ids, pages = names(live.admin, "/v1/tokens", "tokens", "id", limit=2)
    assert len(ids) == len(set(ids)) == 4 and ids == sorted(ids) and pages == 2


def test_the_sdk_follows_tokens(live):
    entitlement(live, "web")
    for i in range(7):
        create(live.admin, f"s{i}", "web")
    with Client([live.url], live.admin_token) as c:
        assert [j["name"] for j in c.jobs.iter(page=3)] == [f"s{i}" for i in range(7)]
        assert [j["name"] for j in c.jobs.list(entitlement="web")] == [
            f"s{i}" for i in range(7)]
        assert len(list(c.machines.iter(page=5))) == len(live.cp.fleet)
        # the pages the SDK asked for: 3 jobs at most each
        sizes = [len(p) for p in c.pages("/v1/jobs", "jobs", 3)]
    assert sizes == [3, 3, 1]


def test_plait_job_list_pages_and_filters(live, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from plait.cli.main import app

    entitlement(live, "web")
    entitlement(live, "other")
    for i in range(5):
        create(live.admin, f"c{i}", "web")
    create(live.admin, "z", "other")
    monkeypatch.setenv("PLAIT_CONFIG", str(tmp_path / "none.yaml"))
    base = ["--url", live.url, "--token", live.admin_token, "job", "list"]
    res = CliRunner().invoke(app, [*base])
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    assert lines[0].split()[:2] == ["name", "entitlement"]
    assert [line.split()[0] for line in lines[1:]] == ["c0", "c1", "c2", "c3", "c4", "z"]
    res = CliRunner().invoke(app, [*base, "--entitlement", "web", "--limit", "2", "-o",
                                   "json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert [j["name"] for j in data["jobs"]] == ["c0", "c1"] and data["continue"]
    res = CliRunner().invoke(app, [*base, "--entitlement", "web", "--limit", "2",
                                   "--continue", data["continue"], "-o", "json"])
    assert [j["name"] for j in json.loads(res.stdout)["jobs"]] == ["c2", "c3"]
    res = CliRunner().invoke(app, [*base, "--state", "sleepy"])
    assert res.exit_code == 2 and "state" in res.output


def test_a_job_created_is_in_the_very_next_list(live):
    """Creates are stored in batches by the committer: each job it stores is read again
    by the next list, not a second later when the store's names are compared."""
    entitlement(live, "web")
    create(live.admin, "first", "web")
    assert names(live.admin, limit=100)[0] == ["first"]  # the index is filled now
    for name in ("second", "third"):
        create(live.admin, name, "web")
        assert name in names(live.admin, limit=100)[0]
