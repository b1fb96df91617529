"""A sharded region in this process: two scheduler shards (each its own control plane
over its part of one SQLite store, elected leader of its shard), the front end over
them, and real agents running ``sleep`` tasks, talking to the front end only. Every
wait is a liveness bound."""

from __future__ import annotations

import json
import time

import httpx
import pytest
from livecp import wait_for

from plait.agent.daemon import Agent, JoinRefused
from plait.harness.shards import ShardedBox, measure_move


def job(name: str, ent: str, tasks: int = 2, version: str = "1") -> dict:
    return {"name": name, "entitlement": ent, "task_count": tasks, "command": "sleep",
            "args": ["600"], "env": {"V": version}, "resources": {"cpu": 1, "memory_gb": 1},
            "update": {"max_unavailable": 1}}


@pytest.fixture
def region(tmp_path):
    with ShardedBox(tmp_path, shards=2, machines=6) as box:
        yield box


def test_one_api_over_two_shards(region):
    api = region.api
    for ent in ("a", "b"):
        r = api.post("/v1/entitlements", json={"name": ent, "owner": "o",
                                                "quota": {"machines": 3}})
        assert r.status_code == 201, r.text
    # each new entitlement went to the shard with the least quota mapped to it
    assert (region.entry("a")["shard"], region.entry("b")["shard"]) == (0, 1)
    assert sorted(region.cp(0).allocator.entitlements) == ["a"]
    assert sorted(region.cp(1).allocator.entitlements) == ["b"]
    assert [e["name"] for e in api.get("/v1/entitlements").json()["entitlements"]] == [
        "a", "b"]
    for name, ent in (("ja", "a"), ("jb", "b")):
        r = api.post("/v1/jobs", json=job(name, ent))
        assert r.status_code == 201, r.text
    # both shards' jobs run on the agents, which only ever called the front end
    wait_for(lambda: region.running("ja", 2) and region.running("jb", 2))
    assert set(region.cp(0).scheduler.jobs) == {"ja"}
    assert set(region.cp(1).scheduler.jobs) == {"jb"}
    assert [j["name"] for j in api.get("/v1/jobs").json()["jobs"]] == ["ja", "jb"]
    assert api.get("/v1/jobs/jb").json()["entitlement"] == "b"
    wait_for(lambda: len(api.get("/v1/discovery/jb").json()["endpoints"]) == 2)
    # the shared free pool: no machine is bound twice, and the shards agree
    machines = api.get("/v1/machines").json()["machines"]
    bound = {m["id"]: m["entitlement"] for m in machines if m["entitlement"]}
    assert sorted(bound.values()) == ["a", "a", "b", "b"]
    assert sum(m["tasks"] for m in machines) == 4
    for s in (0, 1):
        cp = region.cp(s)
        wait_for(lambda cp=cp: {cp.fleet.name(m): cp.region.broker_of(m).entitlement_of(m)
                                for m in range(len(cp.fleet))
                                if cp.region.broker_of(m).entitlement_of(m)} == bound)
    # a shard that reads its records again (as after a restart) leaves the machines of
    # the other shard's entitlements bound: they are not its to give back
    pids = region.pids()
    region.cp(0).membership.reload()
    region.cp(1).membership.reload()
    machines = api.get("/v1/machines").json()["machines"]
    assert {m["id"]: m["entitlement"] for m in machines if m["entitlement"]} == bound
    wait_for(lambda: region.running("ja", 2) and region.running("jb", 2))
    assert region.pids() == pids
    # the event log is both shards', merged oldest first, and pages without a gap
    created = [e for e in api.get("/v1/events", params={"kind": "entitlement_created"}).json()[
        "events"]]
    assert [(e["entitlement"], e["shard"]) for e in created] == [("a", 0), ("b", 1)]
    seen, after = [], 0
    while True:
        page = api.get("/v1/events", params={"after": after, "limit": 3}).json()
        if not page["events"]:
            break
        seen += [(e["shard"], e["shard_seq"]) for e in page["events"]]
        if page["next"] is None:
            break
        after = page["next"]
    whole = api.get("/v1/events", params={"limit": 1000}).json()["events"]
    assert sorted(seen) == sorted((e["shard"], e["shard_seq"]) for e in whole)
    # an event's seq is where a follower goes on from: after the last, nothing new
    # but what happened since
    last = whole[-1]["seq"]
    tail = api.get("/v1/events", params={"after": last}).json()["events"]
    assert all(e["time"] >= whole[-1]["time"] for e in tail)
    assert len(seen) == len(set(seen))
    # a job cannot move to an entitlement of another shard; it says what to do instead
    r = api.post("/v1/jobs/ja/move", json={"entitlement": "b"})
    assert r.status_code == 422 and "plait admin entitlement move" in r.json()["message"]


def test_an_entitlement_moves_between_shards_without_restarting_a_task(region):
    api = region.api
    for ent in ("a", "b"):
        api.post("/v1/entitlements", json={"name": ent, "owner": "o",
                                           "quota": {"machines": 3}})
    api.post("/v1/jobs", json=job("ja", "a", tasks=3))
    wait_for(lambda: region.running("ja", 3))
    before = region.pids()
    assert len(before) == 3
    # while the map says the entitlement is moving, its jobs take no writes (409 and a
    # retry hint); its machines' agents are still answered by the shard holding it
    entry, version = region.front_store.get("/frontend/entitlements/a")
    region.front_store.set("/frontend/entitlements/a", json.dumps(
        {**json.loads(entry), "moving_to": 1}).encode(), version)
    r = api.put("/v1/jobs/ja", json=job("ja", "a", tasks=3, version="2"))
    assert r.status_code == 409 and r.headers["retry-after"] == "1"
    assert "moving to scheduler shard 1" in r.json()["message"]
    # its owner is told so too; another owner is told what a missing job or an
    # entitlement that does not exist would tell it (not that this one moves)
    o = httpx.Client(base_url=region.front.url, timeout=30, headers={
        "Authorization": "Bearer " + api.post("/v1/tokens", json={
            "role": "owner", "name": "o"}).json()["token"]})
    x = httpx.Client(base_url=region.front.url, timeout=30, headers={
        "Authorization": "Bearer " + api.post("/v1/tokens", json={
            "role": "owner", "name": "x"}).json()["token"]})
    assert o.post("/v1/jobs/ja/resize", json={"task_count": 2}).status_code == 409
    for method, path, body in (("POST", "/v1/jobs/{}/resize", {"task_count": 2}),
                               ("DELETE", "/v1/jobs/{}", None)):
        theirs = x.request(method, path.format("ja"), json=body)
        missing = x.request(method, path.format("nope"), json=body)
        assert theirs.status_code == missing.status_code == 404, theirs.text
        assert theirs.json()["message"] == missing.json()["message"].replace("nope", "ja")
    theirs = x.post("/v1/jobs", json=job("jx", "a"))
    missing = x.post("/v1/jobs", json=job("jx", "nowhere"))
    assert theirs.status_code == missing.status_code == 422, theirs.text
    assert "moving" not in theirs.json()["message"]
    assert api.get("/v1/jobs/ja").json()["spec"]["task_count"] == 3  # (nothing changed)
    machine = api.get("/v1/jobs/ja/tasks").json()["tasks"][0]["machine"]
    r = api.get(f"/v1/machines/{machine}/desired")
    assert r.status_code == 200 and {t["job"] for t in r.json()["tasks"]} == {"ja"}
    # ... and after the handoff, by neither shard until the map points at the new one
    region.cp(0).membership.handoff("a", 1)
    r = api.get(f"/v1/machines/{machine}/desired")
    assert r.status_code == 503 and r.headers["retry-after"] == "1"
    # the move, resumed from that state (the handoff done), finishes on shard 1
    r = api.post("/v1/admin/entitlements/a/move", json={"shard": 1})
    assert r.status_code == 200, r.text
    assert (r.json()["from_shard"], r.json()["to_shard"]) == (0, 1)
    assert region.entry("a") == {"shard": 1, "machines": 3}
    assert "a" not in region.cp(0).allocator.entitlements
    assert "ja" not in region.cp(0).scheduler.jobs and "ja" in region.cp(1).scheduler.jobs
    assert not region.front_store.exists("/shards/0/scheduler/jobs/ja")
    # the agents are served by shard 1 now; their tasks were never restarted
    wait_for(lambda: all(a.reachable for a in region.agents))
    wait_for(lambda: region.running("ja", 3))
    assert region.pids() == before
    # and the job is managed by its new shard: an update rolls out there
    r = api.put("/v1/jobs/ja", json=job("ja", "a", tasks=3, version="2"))
    assert r.status_code == 200, r.text
    wait_for(lambda: [t["version"] for t in api.get("/v1/jobs/ja/tasks").json()["tasks"]] ==
             [2, 2, 2] and region.running("ja", 3))
    # and it moves back the same way
    r = api.post("/v1/admin/entitlements/a/move", json={"shard": 0})
    assert r.status_code == 200 and r.json()["to_shard"] == 0
    after = region.pids()
    wait_for(lambda: region.running("ja", 3))
    assert region.pids() == after


def test_moving_an_entitlement_refuses_bad_requests(region):
    api = region.api
    api.post("/v1/entitlements", json={"name": "a", "owner": "o", "quota": {"machines": 1}})
    owner = api.post("/v1/tokens", json={"role": "owner", "name": "o"}).json()["token"]
    url = "/v1/admin/entitlements/a/move"
    assert httpx.post(region.front.url + url, json={"shard": 1}).status_code == 401
    r = httpx.post(region.front.url + url, json={"shard": 1},
                   headers={"Authorization": f"Bearer {owner}"})
    assert r.status_code == 403 and "admin only" in r.json()["message"]
    r = api.post(url, json={"shard": 7})
    assert r.status_code == 422 and "not a scheduler shard" in r.json()["message"]
    r = api.post(url, json={"shard": "1"})
    assert r.status_code == 422
    r = api.post("/v1/admin/entitlements/nope/move", json={"shard": 1})
    assert r.status_code == 404 and "nope" in r.json()["message"]
    r = api.post(url, json={"shard": 0})
    assert r.status_code == 409 and "already" in r.json()["message"]
    # nothing is placed for a caller who may not create entitlements, and a name that
    # cannot be one is refused, not looked up
    for headers in ({}, {"Authorization": f"Bearer {owner}"}):
        r = httpx.post(region.front.url + "/v1/entitlements", headers=headers,
                       json={"name": "sneaky", "owner": "o", "quota": {"machines": 1}})
        assert r.status_code in (401, 403)
    assert not region.front_store.exists("/frontend/entitlements/sneaky")
    r = api.post("/v1/entitlements", json={"name": "Bad Name", "owner": "o",
                                           "quota": {"machines": 1}})
    assert r.status_code == 422
    # a path with dot segments is not served: the hop to a shard would resolve them to
    # another path (here: the shard's own part, which the front end does not serve)
    for method, raw in (("GET", "/v1/jobs/%2e%2e/tokens"), ("POST", "/v1/jobs/%2E%2E/shard/x"),
                        ("GET", "/v1/jobs/%2e/a")):
        r = api.request(method, raw)
        assert r.status_code == 404 and "'..' segments" in r.json()["message"], (raw, r.text)
    # a body nested past any parser's depth is the shard's 422 (never a 503 to retry)
    deep = b"[" * 5000 + b"]" * 5000
    for path in ("/v1/jobs", "/v1/entitlements"):
        r = api.post(path, content=deep, headers={"Content-Type": "application/json"})
        assert r.status_code == 422, (path, r.text)
    # an events cursor: thousands of digits, or bits of no shard, are refused naming it
    for after in ("9" * 5000, str(1 << 200)):
        r = api.get("/v1/events", params={"after": after})
        assert r.status_code == 422 and r.json()["field"] == "after", r.text
    assert api.get("/v1/events", params={"after": str((1 << 40) + 1)}).status_code == 200
    for path in ("/v1/jobs/a..b", "/v1/machines/x..y", "/v1/entitlements/a..b"):
        assert api.get(path).status_code in (404, 422), path
    # a shard's own part in a move is not reachable through the front end
    r = api.post("/v1/shard/entitlements/a/handoff", json={"shard": 1})
    assert r.status_code == 404 and "admin/entitlements" in r.json()["message"]
    # a job name is one job in the region, whichever shard holds it
    api.post("/v1/entitlements", json={"name": "b", "owner": "o", "quota": {"machines": 1}})
    assert region.entry("b")["shard"] == 1
    assert api.post("/v1/jobs", json=job("same", "a", tasks=1)).status_code == 201
    r = api.post("/v1/jobs", json=job("same", "b", tasks=1))
    # (the message names no entitlement: the job may be another owner's)
    assert r.status_code == 409 and "region-wide" in r.json()["message"]
    assert "'a'" not in r.json()["message"]
    # another owner naming entitlement b is told what an unknown entitlement tells it
    x = httpx.Client(base_url=region.front.url, timeout=30, headers={
        "Authorization": "Bearer " + api.post("/v1/tokens", json={
            "role": "owner", "name": "x"}).json()["token"]})
    theirs, missing = x.post("/v1/jobs", json=job("same", "b", tasks=1)), x.post(
        "/v1/jobs", json=job("same", "nowhere", tasks=1))
    assert theirs.status_code == missing.status_code == 422, theirs.text
    assert theirs.json()["message"] == missing.json()["message"].replace("nowhere", "b")
    assert not region.front_store.exists("/shards/1/scheduler/jobs/same")
    # nothing was half-done: the entitlement is where it was, and takes writes
    assert region.entry("a") == {"shard": 0, "machines": 1}
    assert api.post("/v1/jobs", json=job("ja", "a", tasks=1)).status_code == 201


def test_the_move_measured_under_writes(tmp_path):
    """What ``plait bench failover`` reports for the move, on SQLite: writes to the
    entitlement are refused only while it moves, and no task restarts."""
    found = measure_move(tmp_path, tasks=2, rate=20.0)
    assert found["entitlement_move_task_restarts"] == 0
    assert found["entitlement_move_other_statuses"] == []
    assert found["entitlement_move_server_s"] > 0


def test_a_handoff_asked_again_after_its_answer_was_lost_succeeds(region, monkeypatch):
    """The front end asks a shard again when an answer does not come back; if the
    records had moved and the shard's rebuild had not happened, the second call used to
    try the transaction again and fail on the records it had already written."""
    api = region.api
    for ent in ("a", "b"):
        assert api.post("/v1/entitlements", json={"name": ent, "owner": "o",
                                                   "quota": {"machines": 3}}).status_code == 201
    assert api.post("/v1/jobs", json=job("ja", "a")).status_code == 201
    wait_for(lambda: region.running("ja", 2))
    source = region.entry("a")["shard"]
    cp, target = region.cp(source), 1 - source
    real = cp.build
    failures = {"left": 3}

    def flaky(now, *args, **kwargs):
        if failures["left"] > 0:
            failures["left"] -= 1
            raise OSError("the store went away for a moment")
        return real(now, *args, **kwargs)

    monkeypatch.setattr(cp, "build", flaky)
    monkeypatch.setattr(cp.loop, "step", lambda: None)  # (no pass rebuilds meanwhile)
    with pytest.raises(OSError):
        cp.membership.handoff("a", target)  # the records moved; the rebuild failed
    assert cp.membership.stale and "a" in cp.allocator.entitlements  # (memory is old)
    assert cp.membership.handoff("a", target) == 0  # asked again: done, no conflict
    assert "a" not in cp.allocator.entitlements and not cp.membership.stale
    monkeypatch.undo()
    region.cp(target).membership.reload("a")
    assert "a" in region.cp(target).allocator.entitlements


def test_a_stale_copy_of_a_record_in_the_other_shards_part_does_not_block_a_move(region):
    """A record of the entitlement left under the destination shard's part (a stale
    copy: the map gives the entitlement to one shard at a time) used to refuse the
    whole handoff with the store's 'node exists'; the moving shard's record replaces
    it, and the move goes through."""
    api = region.api
    for ent in ("a", "b"):
        assert api.post("/v1/entitlements", json={"name": ent, "owner": "o",
                                                   "quota": {"machines": 3}}).status_code == 201
    assert api.post("/v1/jobs", json=job("ja", "a")).status_code == 201
    wait_for(lambda: region.running("ja", 2))
    source = region.entry("a")["shard"]
    target = 1 - source
    before = region.pids()
    stale = f"/shards/{target}/scheduler/jobs/ja"
    region.front_store.create(stale, b'{"stale": true}')
    r = api.post("/v1/admin/entitlements/a/move", json={"shard": target})
    assert r.status_code == 200, r.text
    assert region.entry("a")["shard"] == target
    assert b"stale" not in region.front_store.get(stale)[0]  # the moving shard's record
    assert "ja" in region.cp(target).scheduler.jobs
    wait_for(lambda: region.running("ja", 2))
    assert region.pids() == before


def test_host_profiles_are_the_regions_across_shards(region):
    """Profiles are written through the front end (shard 0 answers) and read by every
    shard: an entitlement of shard 1 names one, its machines switch to it before its
    tasks start, and it cannot be deleted while that entitlement names it."""
    api = region.api
    r = api.put("/v1/hostprofiles/web", json={"name": "web", "sysctls": {
        "net.core.somaxconn": "4096"}})
    assert r.status_code == 201, r.text
    for ent, profile in (("a", "default"), ("b", "web")):
        r = api.post("/v1/entitlements", json={"name": ent, "owner": "o", "host_profile":
                                                profile, "quota": {"machines": 3}})
        assert r.status_code == 201, r.text
    assert region.entry("b")["shard"] == 1
    r = api.post("/v1/jobs", json=job("jb", "b"))
    assert r.status_code == 201, r.text
    wait_for(lambda: region.running("jb", 2))
    on = {t["machine"] for t in api.get("/v1/jobs/jb/tasks").json()["tasks"]}
    # each machine as the shard that manages it knows it, one by one and in the list
    assert {api.get(f"/v1/machines/{m}").json()["host_profile"]["applied"] for m in on} == {
        "web@1"}
    listed = {m["id"]: m for m in api.get("/v1/machines").json()["machines"]}
    assert {listed[m]["host_profile"]["applied"] for m in on} == {"web@1"}
    assert all(m["host_profile"] is not None for m in listed.values())
    assert api.get("/v1/hostprofiles/web").json()["entitlements"] == ["b"]
    r = api.delete("/v1/hostprofiles/web")
    assert r.status_code == 409 and "named by b" in r.json()["message"]


def test_lenders_and_borrowers_share_a_shard_and_their_loans_are_listed(region):
    """Loans are counted per shard: the front end places every lender and elastic
    entitlement on one shard (the first one's), and lists their loans from it."""
    api = region.api
    for ent in ({"name": "plain", "owner": "o", "quota": {"machines": 3}},
                {"name": "web", "owner": "o", "quota": {"machines": 6}, "lends": True},
                {"name": "batch", "owner": "o", "quota": {"machines": 6},
                 "elastic": {"min_notice_seconds": 5}}):
        r = api.post("/v1/entitlements", json=ent)
        assert r.status_code == 201, r.text
    # (the least loaded shard would have taken batch away from web)
    assert region.entry("web")["shard"] == region.entry("batch")["shard"] != region.entry(
        "plain")["shard"]
    r = api.post("/v1/jobs", json=job("jb", "batch", tasks=2))
    assert r.status_code == 201, r.text
    wait_for(lambda: region.running("jb", 2))
    listed = api.get("/v1/machines", params={"loaned": "true"}).json()
    assert listed["total"] >= 1 and {m["loan"]["borrower"] for m in listed["machines"]} == {
        "batch"}


def test_a_beat_taken_after_a_move_does_not_have_the_old_shard_fail_the_machine(tmp_path):
    """An agent's heartbeat that reached the old shard just after its entitlement moved
    away must not have that shard watch the machine again: its agent beats to the new
    shard only, and the old one would fail it (and every task on it be replaced)."""
    with ShardedBox(tmp_path, shards=2, machines=6, heartbeat_timeout=2.0) as region:
        api = region.api
        api.post("/v1/entitlements", json={"name": "a", "owner": "o",
                                           "quota": {"machines": 3}})
        api.post("/v1/jobs", json=job("ja", "a", tasks=3))
        wait_for(lambda: region.running("ja", 3))
        before = region.pids()
        machines = {t["machine"] for t in api.get("/v1/jobs/ja/tasks").json()["tasks"]}
        r = api.post("/v1/admin/entitlements/a/move", json={"shard": 1})
        assert r.status_code == 200, r.text
        old = region.cp(0)
        wait_for(lambda: not machines & set(old.liveness.last))
        with old.pending_lock:  # beats the gateway took just before the handoff, that
            for m in machines:  # the old shard's pass reads after it
                old.incoming._beats[m] = old.clock()
        # two heartbeat timeouts and more on the shards' clocks, and a pass of each after
        # that: a stale beat would have failed its machine by then
        past = [region.cp(s).clock() + 4 * 2.0 for s in (0, 1)]
        wait_for(lambda: all(region.cp(s).clock() >= past[s] for s in (0, 1)), 30)
        passes = [region.cp(s).steps for s in (0, 1)]
        wait_for(lambda: all(region.cp(s).steps > passes[s] + 1 for s in (0, 1)))
        assert not machines & set(old.liveness.last)
        failed = [e.machine for s in (0, 1) for e in region.cp(s).events.query(limit=1000)[0]
                  if e.kind == "machine_unreachable"]
        assert failed == []
        assert all(api.get(f"/v1/machines/{m}").json()["state"] == "healthy" for m in machines)
        assert region.running("ja", 3) and region.pids() == before


def test_an_update_naming_another_shards_entitlement_says_an_update_moves_no_job(region):
    """Job ja runs in a (shard 0); a PUT of it naming b (shard 1) is answered as one
    control plane answers it, to whoever may see the job; anyone else learns nothing."""
    api = region.api
    for ent in ("a", "b"):
        api.post("/v1/entitlements", json={"name": ent, "owner": "o",
                                           "quota": {"machines": 3}})
    assert (region.entry("a")["shard"], region.entry("b")["shard"]) == (0, 1)
    assert api.post("/v1/jobs", json=job("ja", "a")).status_code == 201
    r = api.put("/v1/jobs/ja", json=job("ja", "b"))
    assert r.status_code == 422, r.text
    assert r.json()["message"] == ("job ja runs in entitlement 'a'; update cannot move it "
                                   "(move it to another entitlement with a move)")
    x = httpx.Client(base_url=region.front.url, timeout=30, headers={
        "Authorization": "Bearer " + api.post("/v1/tokens", json={
            "role": "owner", "name": "x"}).json()["token"]})
    theirs = x.put("/v1/jobs/ja", json=job("ja", "b"))
    assert theirs.status_code in (403, 404, 422) and "'a'" not in theirs.text
    assert api.get("/v1/jobs/ja").json()["entitlement"] == "a"


def test_a_move_across_shards_is_explained_only_to_whoever_may_change_both(region):
    """Job ja runs in a (owner o, shard 0); b is o's too, c another owner's (both on
    shard 1). Moving ja to b is refused naming the shards; another owner moving ja, or
    o moving ja to c, is answered as for a job or an entitlement that does not exist."""
    api = region.api
    for ent, owner, machines in (("a", "o", 4), ("b", "o", 1), ("c", "x", 1)):
        api.post("/v1/entitlements", json={"name": ent, "owner": owner,
                                           "quota": {"machines": machines}})
    assert [region.entry(e)["shard"] for e in "abc"] == [0, 1, 1]

    def owner(name):
        token = api.post("/v1/tokens", json={"role": "owner", "name": name}).json()["token"]
        return httpx.Client(base_url=region.front.url, timeout=30,
                            headers={"Authorization": f"Bearer {token}"})
    o, x = owner("o"), owner("x")
    assert o.post("/v1/jobs", json=job("ja", "a")).status_code == 201
    mine = o.post("/v1/jobs/ja/move", json={"entitlement": "b"})
    assert mine.status_code == 422 and "managed by scheduler shard 1" in mine.text
    # another owner: as for a job that does not exist
    theirs = x.post("/v1/jobs/ja/move", json={"entitlement": "c"})
    missing = x.post("/v1/jobs/nope/move", json={"entitlement": "c"})
    assert (theirs.status_code, theirs.json()["message"].replace("ja", "nope")) == (
        missing.status_code, missing.json()["message"])
    # the owner, to another owner's entitlement: as for one that does not exist
    other = o.post("/v1/jobs/ja/move", json={"entitlement": "c"})
    absent = o.post("/v1/jobs/ja/move", json={"entitlement": "nothing"})
    assert other.status_code == absent.status_code
    assert other.json()["message"].replace("'c'", "'nothing'") == absent.json()["message"]
    assert "shard" not in other.text
    # another owner deploying ja into its own entitlement: the name is taken, as a
    # single control plane says (it was "entitlement 'c' does not exist")
    deploy = x.put("/v1/jobs/ja", json=job("ja", "c"))
    assert deploy.status_code == 409 and "a name taken in the region" in deploy.text
    assert "'a'" not in deploy.text
    assert api.get("/v1/jobs/ja").json()["entitlement"] == "a"


def test_a_second_agent_cannot_join_as_a_live_machine_of_either_shard(region, tmp_path):
    """A join is answered by the shard that hears the machine's agent (the one its
    entitlement is on; shard 0 for a free machine), which refuses it while that agent
    is alive: the join token every agent host holds does not make its holder another
    machine. The agent says why it is refused."""
    api = region.api
    for ent in ("a", "b"):
        assert api.post("/v1/entitlements", json={"name": ent, "owner": "o",
                                                   "quota": {"machines": 3}}).status_code == 201
    assert region.entry("b")["shard"] == 1
    assert api.post("/v1/jobs", json=job("jb", "b")).status_code == 201
    wait_for(lambda: region.running("jb", 2))
    on_b = api.get("/v1/jobs/jb/tasks").json()["tasks"][0]["machine"]
    free = next(m["id"] for m in api.get("/v1/machines").json()["machines"]
                if m["entitlement"] is None)
    join = api.post("/v1/tokens", json={"role": "join", "name": "j2"}).json()["token"]
    joiner = httpx.Client(base_url=region.front.url, timeout=30,
                          headers={"Authorization": f"Bearer {join}"})
    for machine in (on_b, free):
        r = joiner.post("/v1/agents/join", json={"machine": machine})
        assert r.status_code == 409, (machine, r.text)  # (not shard 0's 503 for on_b)
        assert f"machine {machine}" in r.json()["message"] and "heard" in r.json()["message"]
    impostor = Agent(on_b, [region.front.url], join, tmp_path / "impostor")
    try:
        with pytest.raises(JoinRefused, match=f"joining as machine {on_b} was refused "
                                              r"\(409\).*heard"):
            impostor.join()
        assert impostor.token is None
    finally:
        impostor.close()
    assert region.running("jb", 2)


def test_an_agent_refused_its_credential_joins_again_and_stops_its_tasks_only_if_taken_over(
        tmp_path, monkeypatch):
    """An agent whose credential is refused joins again to learn why. An admin revoked
    it: joined with a new one, its tasks run on. Another agent joined as its machine
    (the machine's tasks are that one's now): it stops them, and asks to join at
    each heartbeat until that agent is gone. A frozen agent that woke after a
    takeover ran its task beside the replacement for as long as it was watched."""
    from plait.agent import daemon

    monkeypatch.setattr(daemon, "REVOKED_AFTER", 1.0)
    with ShardedBox(tmp_path, shards=1, machines=3, heartbeat_timeout=2.0) as region:
        api = region.api
        api.post("/v1/entitlements", json={"name": "a", "owner": "o",
                                           "quota": {"machines": 3}})
        assert api.post("/v1/jobs", json=job("ja", "a", tasks=1)).status_code == 201
        wait_for(lambda: region.running("ja", 1))
        machine = api.get("/v1/jobs/ja/tasks").json()["tasks"][0]["machine"]
        agent = next(a for a in region.agents if a.machine == machine)
        (pid,) = [h.pid for h in agent.handles.values()]

        def revoke(credential: str) -> None:
            assert api.delete(f"/v1/tokens/{credential.split('_')[1]}").status_code == 200

        # an admin revokes the credential: the agent joins again (once its own beats,
        # refused, are no longer heard); its machine looked dead meanwhile, and the
        # job runs its one task, once
        first = agent.token
        assert first is not None
        revoke(first)
        wait_for(lambda: agent.token not in (None, first))
        wait_for(lambda: region.running("ja", 1))
        wait_for(lambda: sum(1 for key in region.pids() if key.endswith("/ja.0")) == 1)
        machine = api.get("/v1/jobs/ja/tasks").json()["tasks"][0]["machine"]
        agent = next(a for a in region.agents if a.machine == machine)
        wait_for(lambda: len(agent.handles) == 1)
        (pid,) = [h.pid for h in agent.handles.values()]

        # another agent joins as the machine once this one's beats are refused (this
        # one held back from joining again meanwhile: whichever asked first would win)
        second = agent.token
        assert second is not None
        monkeypatch.setattr(daemon, "REVOKED_AFTER", 1000.0)
        revoke(second)
        join = api.post("/v1/tokens", json={"role": "join", "name": "j2"}).json()["token"]
        other = httpx.Client(base_url=region.front.url, timeout=30,
                             headers={"Authorization": f"Bearer {join}"})

        def joined() -> httpx.Response | None:
            r = other.post("/v1/agents/join", json={"machine": machine})
            assert r.status_code in (201, 409), r.text
            return r if r.status_code == 201 else None

        r = wait_for(joined, what="the other agent joins once the machine is free")
        taker = httpx.Client(base_url=region.front.url, timeout=30, headers={
            "Authorization": f"Bearer {r.json()['token']}"})

        def gone(pid: int) -> bool:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    return f.read().rsplit(")", 1)[1].split()[0] == "Z"
            except FileNotFoundError:
                return True

        report = {"tasks": [], "profile": {"name": None}}
        assert taker.post(f"/v1/machines/{machine}/status", json=report).status_code == 200
        monkeypatch.setattr(daemon, "REVOKED_AFTER", 1.0)
        deadline = time.monotonic() + 60
        quiet_since = None
        while quiet_since is None or time.monotonic() - quiet_since < 3:
            # (the other agent beats: alive; this one runs no copy of the task, for
            # 3 s on end once its process is gone)
            assert taker.post(f"/v1/machines/{machine}/status", json=report).status_code == 200
            assert time.monotonic() < deadline
            if not gone(pid) or "ja.0" in agent.handles:
                quiet_since = None
            elif quiet_since is None:
                quiet_since = time.monotonic()
            time.sleep(0.2)  # (the subject is time: quiet for 3 s on end)
        # the other agent goes quiet: this one joins again, and the job runs again
        wait_for(lambda: agent.token is not None)
        wait_for(lambda: region.running("ja", 1))
        assert sum(1 for key in region.pids() if key.endswith("/ja.0")) == 1
