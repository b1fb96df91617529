"""The Job Control Plane through the API on a live control plane (simulated agents):
the post's Table 1 (each dimension its own resource and writer; no per-task
customization), staged pushes with gates and rollback, a push that stays a share of
the job while it is resized, canaries that never take pushed tasks, and a canary by
hardware."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator

import httpx
import pytest
from livecp import Live, wait_for

from plait.taskcontrol.urlpolicy import UrlPolicy, networks

JOB = {"name": "web", "entitlement": "e", "task_count": 4, "command": "serve",
       "resources": {"cpu": 1, "memory_gb": 1},
       "update": {"max_unavailable": 1}}


def spec(**changes: object) -> dict:
    return {**JOB, **changes}


@pytest.fixture
def alice(live: Live) -> httpx.Client:
    assert live.admin.post("/v1/entitlements", json={
        "name": "e", "owner": "alice", "quota": {"machines": 24}}).status_code == 201
    client = live.owner("alice")
    assert client.post("/v1/jobs", json=JOB).status_code == 201
    wait_for(lambda: client.get("/v1/jobs/web").json()["settled"])
    return client


def commands(live: Live) -> dict[str, int]:
    """Tasks running healthy per command they run."""
    cp = live.cp
    with cp.lock:
        job = cp.scheduler.jobs["web"]
        out: dict[str, int] = {}
        for r in job.tasks.values():
            if r.serving and r.healthy and r.op is None and r.index < job.spec.task_count:
                c = job.versions[r.spec_version - 1].command
                out[c] = out.get(c, 0) + 1
        return out


def events(live: Live, kind: str) -> list[dict]:
    return live.admin.get("/v1/events", params={"job": "web", "kind": kind}).json()["events"]


def phase(client: httpx.Client) -> str:
    return str(client.get("/v1/jobs/web/push").json()["status"]["phase"])


def test_table_1_each_dimension_is_its_own_resource_and_no_actor_addresses_tasks(
        live: Live, alice: httpx.Client) -> None:
    bob = live.owner("bob")
    # the job intent is the job's spec (the service owner)
    assert alice.put("/v1/jobs/web", json=spec(args=["--v1"])).status_code == 200
    # a push intent (continuous delivery), a sizing intent (a person or the autoscaler),
    # a canary intent (testing): each its own resource
    r = alice.put("/v1/jobs/web/push", json={"spec": spec(command="serve-v2"),
                                             "stages": [50], "soak_seconds": 0})
    assert r.status_code == 200, r.text
    assert r.json()["intent"]["stages"] == [50] and r.json()["actor"] == "owner:alice"
    assert alice.put("/v1/jobs/web/sizing", json={"task_count": 6, "min": 2,
                                                  "max": 8}).status_code == 200
    assert alice.put("/v1/jobs/web/canaries/c1", json={
        "spec": spec(command="serve-canary"), "tasks": 1,
        "duration_seconds": 600}).status_code == 200
    wait_for(lambda: commands(live) == {"serve": 2, "serve-v2": 3, "serve-canary": 1})
    intents = alice.get("/v1/jobs/web/intents").json()
    assert intents["unified"]["roles"] == {"stable": 2, "push": 3, "canary:c1": 1}
    assert intents["sizing"]["size"] == 6 and intents["conflicts"] == []
    for kind in ("push_started", "sizing_set", "canary_started"):
        wait_for(lambda k=kind: bool(events(live, k)))
        assert events(live, kind)[0]["actor"] == "owner:alice"
    # another owner cannot tell them from missing ones
    for path in ("/v1/jobs/web/intents", "/v1/jobs/web/push", "/v1/jobs/web/sizing",
                 "/v1/jobs/web/canaries/c1"):
        assert bob.get(path).status_code == 404
    assert bob.put("/v1/jobs/web/sizing", json={"task_count": 1}).status_code == 404
    # per-task customization: refused, pointing to Shard Manager
    r = alice.put("/v1/jobs/web/tasks/3/spec", json=spec(command="special"))
    assert r.status_code == 422 and "Shard Manager" in r.json()["message"]
    r = alice.put("/v1/jobs/web/canaries/c2", json={
        "spec": spec(command="special"), "indexes": [3]})
    assert r.status_code == 422 and "Shard Manager" in r.text
    # bad intents are named
    r = alice.put("/v1/jobs/web/push", json={"spec": spec(), "stages": [50, 10]})
    assert r.status_code == 422 and "stages must increase" in r.text
    r = alice.put("/v1/jobs/web/push", json={"spec": spec(name="api")})
    assert r.status_code == 422 and "spec.name" in r.text
    r = alice.put("/v1/jobs/web/sizing", json={"task_count": 3, "min": 5, "max": 4})
    assert r.status_code == 422 and "min 5 is above max 4" in r.text
    assert alice.get("/v1/jobs/nope/intents").status_code == 404


def test_a_staged_push_passes_its_gates_and_becomes_the_jobs_spec(
        live: Live, alice: httpx.Client) -> None:
    r = alice.put("/v1/jobs/web/push", json={
        "spec": spec(command="serve-v2"), "stages": [25, 50, 100], "soak_seconds": 0.2,
        "gate": {"external": True}})
    assert r.status_code == 200, r.text
    # nothing to decide yet: a verdict before the stage is gated is refused
    for stage, pushed in ((1, 1), (2, 2)):
        wait_for(lambda: phase(alice) == "gating")
        assert commands(live) == {"serve": 4 - pushed, "serve-v2": pushed}
        # under way: a host profile's roll waits for it (decision 104)
        wait_for(lambda: live.cp.scheduler.pushing == {"web"})
        assert alice.get("/v1/jobs/web/push").json()["status"]["stage"] == stage - 1
        r = alice.post("/v1/jobs/web/push/gate", json={"passed": True, "message": "ok"})
        assert r.status_code == 200, r.text
    r = alice.post("/v1/jobs/web/push/gate", json={"passed": True})
    assert r.status_code == 409  # stage 3 is not healthy yet
    wait_for(lambda: phase(alice) == "gating")
    assert alice.post("/v1/jobs/web/push/gate", json={"passed": True}).status_code == 200
    wait_for(lambda: phase(alice) == "completed")
    wait_for(lambda: live.cp.scheduler.pushing == set())
    # the push is the job's spec now; no task pinned
    wait_for(lambda: alice.get("/v1/jobs/web").json()["spec"]["command"] == "serve-v2")
    wait_for(lambda: commands(live) == {"serve-v2": 4})
    assert live.cp.jobs.get("web").pins == {}
    wait_for(lambda: bool(events(live, "push_completed")))
    assert [e["kind"] for e in events(live, "push_completed")] == ["push_completed"]


@pytest.fixture
def gate() -> Iterator[dict]:
    """A gate URL on loopback that answers what ``state['status']`` says."""
    state = {"status": 200, "asked": 0}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            state["asked"] += 1
            self.send_response(state["status"])
            self.end_headers()
            self.wfile.write(b"error rate 9%" if state["status"] >= 300 else b"fine")

        def log_message(self, *args: object) -> None:
            pass
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    state["url"] = f"http://127.0.0.1:{server.server_address[1]}/gate"
    yield state
    server.shutdown()


def test_a_failing_gate_rolls_the_push_back(live: Live, alice: httpx.Client,
                                            gate: dict) -> None:
    # gate URLs follow the rules of TaskController URLs: loopback only when allowed
    r = alice.put("/v1/jobs/web/push", json={"spec": spec(command="serve-v2"),
                                             "gate": {"url": gate["url"]}})
    assert r.status_code == 422 and r.json()["field"] == "gate.url"
    assert "gate URL" in r.json()["message"] and "loopback" in r.json()["message"]
    live.cp.controllers.url_policy = UrlPolicy(allow=networks(("loopback", "any")))
    gate["status"] = 500
    r = alice.put("/v1/jobs/web/push", json={
        "spec": spec(command="serve-v2"), "stages": [50, 100], "soak_seconds": 0,
        "gate": {"url": gate["url"]}})
    assert r.status_code == 200, r.text
    wait_for(lambda: phase(alice) == "rolled_back")
    status = alice.get("/v1/jobs/web/push").json()
    assert "the gate failed" in status["status"]["message"]
    assert "500: error rate 9%" in status["status"]["message"] and status["percent"] == 0
    wait_for(lambda: commands(live) == {"serve": 4})
    assert alice.get("/v1/jobs/web").json()["spec"]["command"] == "serve"
    wait_for(lambda: bool(events(live, "push_rolled_back")))
    assert events(live, "push_rolled_back")[0]["actor"] == "owner:alice"
    # a passing gate: the next push goes through
    gate["status"] = 200
    alice.put("/v1/jobs/web/push", json={
        "spec": spec(command="serve-v3"), "stages": [50, 100], "soak_seconds": 0,
        "gate": {"url": gate["url"]}})
    wait_for(lambda: phase(alice) == "completed")
    wait_for(lambda: commands(live) == {"serve-v3": 4})
    assert gate["asked"] >= 3


def test_a_push_that_never_gets_healthy_times_out_and_rolls_back(
        live: Live, alice: httpx.Client) -> None:
    alice.put("/v1/jobs/web/push", json={
        "spec": spec(command="crash"), "stages": [50], "soak_seconds": 0,
        "stage_timeout_seconds": 3})
    wait_for(lambda: phase(alice) == "rolled_back")
    assert "tasks healthy after 3s" in alice.get("/v1/jobs/web/push").json()["status"][
        "message"] or "halted" in alice.get("/v1/jobs/web/push").json()["status"]["message"]
    wait_for(lambda: commands(live) == {"serve": 4})


def test_a_push_stays_its_share_while_resized_and_canaries_never_take_pushed_tasks(
        live: Live, alice: httpx.Client) -> None:
    alice.put("/v1/jobs/web/push", json={"spec": spec(command="serve-v2"), "stages": [50],
                                         "soak_seconds": 0})
    wait_for(lambda: phase(alice) == "holding")
    assert commands(live) == {"serve": 2, "serve-v2": 2}
    # the autoscaler (a sizing intent) grows the job: the push stays 50 %
    alice.put("/v1/jobs/web/sizing", json={"task_count": 10})
    wait_for(lambda: commands(live) == {"serve": 5, "serve-v2": 5})
    alice.put("/v1/jobs/web/sizing", json={"task_count": 5})
    wait_for(lambda: commands(live) == {"serve": 2, "serve-v2": 3})  # half of 5, up
    # a canary takes only tasks the push does not hold
    pushed = {t["index"] for t in alice.get("/v1/jobs/web/intents").json()["unified"]["tasks"]
              if t["role"] == "push"}
    alice.put("/v1/jobs/web/canaries/c", json={"spec": spec(command="serve-canary"),
                                               "tasks": 2})
    wait_for(lambda: commands(live) == {"serve-v2": 3, "serve-canary": 2})
    tasks = alice.get("/v1/jobs/web/intents").json()["unified"]["tasks"]
    assert {t["index"] for t in tasks if t["role"] == "push"} == pushed
    assert not pushed & {t["index"] for t in tasks if t["role"] == "canary:c"}
    # a canary larger than what the push leaves: reported on the job, not guessed
    alice.put("/v1/jobs/web/canaries/c", json={"spec": spec(command="serve-canary"),
                                               "tasks": 4})
    wait_for(lambda: bool(alice.get("/v1/jobs/web/intents").json()["conflicts"]))
    assert "canaries leave" in alice.get("/v1/jobs/web/intents").json()["conflicts"][0]
    wait_for(lambda: bool(events(live, "intents_conflict")))
    # the canary ends: its tasks go back to the job's spec
    assert alice.delete("/v1/jobs/web/canaries/c").status_code == 200
    wait_for(lambda: commands(live) == {"serve": 2, "serve-v2": 3})
    assert alice.post("/v1/jobs/web/push/abort").status_code == 200
    wait_for(lambda: commands(live) == {"serve": 5})


def test_a_canary_by_hardware_runs_on_that_machine_type(live: Live,
                                                        alice: httpx.Client) -> None:
    cp = live.cp

    def types() -> dict[str, str]:
        with cp.lock:
            job = cp.scheduler.jobs["web"]
            return {job.versions[r.spec_version - 1].command:
                    cp.fleet.type_names[int(cp.fleet.type_code[r.machine])]
                    for r in job.tasks.values() if r.machine is not None and r.serving}
    with cp.lock:
        job = cp.scheduler.jobs["web"]
        used = {cp.fleet.type_names[int(cp.fleet.type_code[r.machine])]
                for r in job.tasks.values()}
    # a type the job's tasks are not on, if there is one: the canary's task is moved
    other = next((t for t in cp.fleet.type_names if t not in used), cp.fleet.type_names[0])
    r = alice.put("/v1/jobs/web/canaries/hw", json={
        "spec": spec(command="serve-canary"), "tasks": 1, "hardware": other})
    assert r.status_code == 200, r.text
    wait_for(lambda: commands(live) == {"serve": 3, "serve-canary": 1})
    assert types()["serve-canary"] == other
    r = alice.put("/v1/jobs/web/canaries/hw2", json={
        "spec": spec(command="x"), "hardware": "no-such-type"})
    assert r.status_code == 422 and "no machine of type 'no-such-type'" in r.text


def test_a_code_config_and_host_profile_canary_runs_on_machines_of_its_own(
        live: Live, alice: httpx.Client) -> None:
    """One canary that changes both the spec and the host profile: its tasks run the
    canary's spec on machines that carry the canary's profile (a canary entitlement
    whose machines count against the job's entitlement's quota), no other task runs
    there, and when it ends its tasks go back and its machines leave."""
    cp = live.cp
    r = live.admin.put("/v1/hostprofiles/tuned", json={
        "name": "tuned", "sysctls": {"net.core.somaxconn": "4096"}})
    assert r.status_code == 201, r.text
    r = alice.put("/v1/jobs/web/canaries/pc", json={"spec": spec(command="serve-canary"),
                                                   "tasks": 2, "host_profile": "nope"})
    assert r.status_code == 422 and "host profile 'nope' does not exist" in r.text
    # a host profile its entitlement does not allow canaries on is refused, by name,
    # until an admin allows it (owners cannot: entitlements are an admin's)
    canary = {"spec": spec(command="serve-canary"), "tasks": 2, "host_profile": "tuned"}
    r = alice.put("/v1/jobs/web/canaries/pc", json=canary)
    assert r.status_code == 422 and r.json()["field"] == "host_profile", r.text
    assert "'tuned' is not one entitlement 'e' may run canaries on" in r.text
    assert "canary_host_profiles: none" in r.text
    assert alice.get("/v1/jobs/web/canaries/pc").status_code == 404  # (nothing written)
    allowed = {"name": "e", "owner": "alice", "quota": {"machines": 24},
               "canary_host_profiles": ["tuned"]}
    assert alice.post("/v1/entitlements", json=allowed).status_code == 403
    assert live.admin.post("/v1/entitlements", json=allowed).status_code == 200
    r = alice.put("/v1/jobs/web/canaries/pc", json=canary)
    assert r.status_code == 200, r.text
    wait_for(lambda: commands(live) == {"serve": 2, "serve-canary": 2})
    child = alice.get("/v1/jobs/web/canaries/pc").json()["entitlement"]
    assert child and child.startswith("e.canary-")

    def where() -> dict[str, set[tuple[str | None, str | None]]]:
        """Per command: (entitlement, profile applied) of the machines it runs on."""
        with cp.lock:
            job = cp.scheduler.jobs["web"]
            out: dict[str, set[tuple[str | None, str | None]]] = {}
            for r in job.tasks.values():
                if r.machine is None or not r.serving:
                    continue
                applied = cp.scheduler.profiles.applied.get(r.machine)
                out.setdefault(job.versions[r.spec_version - 1].command, set()).add(
                    (cp.region.broker_of(r.machine).entitlement_of(r.machine),
                     None if applied is None else applied.name))
            return out
    seen = where()
    assert seen["serve-canary"] == {(child, "tuned")}
    assert all(ent == "e" and profile in (None, "default") for ent, profile in seen["serve"])
    view = alice.get(f"/v1/entitlements/{child}").json()
    assert view["canary_of"] == "e" and view["host_profile"] == "tuned"
    # a canary entitlement goes with its canary, or with its entitlement: not alone
    r = live.admin.delete(f"/v1/entitlements/{child}")
    assert r.status_code == 409 and "canary entitlement of e" in r.text, r.text
    assert 1 <= view["machines"] <= 2
    # the two share e's machine quota
    with cp.lock:
        parent = cp.allocator.quota_of(cp.allocator.entitlements["e"]).machines
    assert parent == 24 - view["machines"]
    # ended: its tasks go back to the job's spec, on e's machines, and its machines leave
    assert alice.delete("/v1/jobs/web/canaries/pc").status_code == 200
    wait_for(lambda: commands(live) == {"serve": 4})
    wait_for(lambda: alice.get(f"/v1/entitlements/{child}").json()["machines"] == 0)
    assert alice.get(f"/v1/entitlements/{child}").json()["quota"] == {"machines": 0,
                                                                      "rru": None}
    assert {ent for ent, _ in where()["serve"]} == {"e"}
    started = events(live, "canary_started")
    assert "host profile tuned" in started[-1]["message"]


def test_a_host_profile_canary_is_refused_where_it_could_not_get_machines(
        live: Live, alice: httpx.Client) -> None:
    """Lenders, borrowers and entitlements with no unused machine quota get no
    host-profile canary (its machines would be counted nowhere, or never come), and no
    job runs in a canary entitlement directly; each refusal names why."""
    assert live.admin.put("/v1/hostprofiles/tuned", json={
        "name": "tuned", "sysctls": {"net.core.somaxconn": "4096"}}).status_code == 201
    canary = {"spec": spec(command="serve-canary"), "tasks": 1, "host_profile": "tuned"}
    # e holds 4 of 4 machines (whole-machine tasks): no room for a canary's machine
    assert live.admin.post("/v1/entitlements", json={
        "name": "e", "owner": "alice", "quota": {"machines": 4},
        "canary_host_profiles": ["tuned"]}).status_code == 200
    alice.put("/v1/jobs/web", json=spec(resources={"cpu": 16, "memory_gb": 1}))
    wait_for(lambda: alice.get("/v1/entitlements/e").json()["machines"] == 4)
    r = alice.put("/v1/jobs/web/canaries/pc", json={
        **canary, "spec": spec(command="serve-canary", resources={"cpu": 16,
                                                                   "memory_gb": 1})})
    assert r.status_code == 422 and "unused machine" in r.text, r.text
    # a lender
    live.admin.post("/v1/entitlements", json={"name": "e", "owner": "alice", "lends": True,
                                              "quota": {"machines": 24},
                                              "canary_host_profiles": ["tuned"]})
    r = alice.put("/v1/jobs/web/canaries/pc", json={
        **canary, "spec": spec(command="serve-canary", resources={"cpu": 16,
                                                                   "memory_gb": 1})})
    assert r.status_code == 422 and "lends or borrows" in r.text, r.text
    # a job straight into a canary entitlement
    live.admin.post("/v1/entitlements", json={"name": "e", "owner": "alice",
                                              "quota": {"machines": 24},
                                              "canary_host_profiles": ["tuned"]})
    r = alice.put("/v1/jobs/web/canaries/pc", json={
        **canary, "spec": spec(command="serve-canary", resources={"cpu": 16,
                                                                   "memory_gb": 1})})
    assert r.status_code == 200, r.text
    wait_for(lambda: bool(alice.get("/v1/jobs/web/canaries/pc").json()["entitlement"]))
    child = alice.get("/v1/jobs/web/canaries/pc").json()["entitlement"]
    r = alice.post("/v1/jobs", json={**JOB, "name": "other", "entitlement": child})
    assert r.status_code == 422 and "canary entitlement" in r.text, r.text


def test_a_canary_of_the_whole_job_or_with_a_bad_name_is_refused(
        live: Live, alice: httpx.Client) -> None:
    # a canary of 9 tasks on this 4-task job ran the canary on every task (an ungated
    # push), and "Bad Name" was taken as a canary's name
    r = alice.put("/v1/jobs/web/canaries/c1", json={"spec": spec(command="serve-c"),
                                                    "tasks": 4})
    assert r.status_code == 422 and r.json()["field"] == "tasks", r.text
    assert "would run every task of job web (4): at most 3" in r.json()["message"]
    r = alice.put("/v1/jobs/web/canaries/Bad%20Name", json={"spec": spec(command="serve-c")})
    assert r.status_code == 422 and r.json()["field"] == "canary", r.text
    assert "'Bad Name' is not a valid name" in r.json()["message"]
    assert alice.get("/v1/jobs/web/intents").json()["canaries"] == {}  # nothing stored
    r = alice.put("/v1/jobs/web/canaries/c1", json={"spec": spec(command="serve-c"),
                                                    "tasks": 3})
    assert r.status_code == 200, r.text
