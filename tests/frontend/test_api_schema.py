"""Property test of the REST API against its own OpenAPI document (schemathesis).

One live control plane with simulated agents serves the module, once per variant:
reached directly and through the front end (``plait frontend``'s router over a
scheduler shard), on SQLite and on a ZooKeeper with ACLs. It is seeded with an
entitlement, two jobs and spare tokens, and valid generated requests are mostly
steered towards those real objects, so the fuzzing reaches past
"404 not found" into the scheduler, the allocator and the brokers. Every response
must be a non-5xx with a status code the document lists, and an error must be the
API's JSON error body. After the fuzzing the control plane must still be whole: its
loop steps and applies new operations, every job record reads, the seeded job is
there, the allocator's invariants hold, and a control plane rebuilt from a backup of
the store agrees with the live one.

The number of requests per operation comes from ``PLAIT_FUZZ_EXAMPLES``, else 25
under ``CI`` and 20 otherwise (the module takes about two minutes on two cores; at 40
its four variants took 2.5 - 2.8 minutes of the suite's 20).
The regression tests at the end pin the bugs the fuzzing found.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import hypothesis.strategies as st
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from livecp import REGION, Live, start_behind_front_end, start_live, stop_live, wait_for
from schemathesis import GenerationMode

from plait.harness.zkensemble import LocalEnsemble, installed
from plait.server.controlplane import ControlPlane, ControlPlaneConfig
from plait.store.backup import backup, restore
from plait.store.sqlite import SqliteStore
from plait.testing import Cluster, check_invariants

MAX_EXAMPLES = int(os.environ.get("PLAIT_FUZZ_EXAMPLES") or (25 if os.environ.get("CI") else 20))

ENTITLEMENT = "team"
QUOTA = {"machines": 8}
#: the job that must survive the fuzzing: the fuzzer may change it, never delete it
KEEP = "web"
#: a job the fuzzer may do anything to, deleting included
VICTIM = "victim"
#: names steered job creates use (the seeded ones conflict or are the same spec)
JOB_NAMES = [KEEP, VICTIM, "fuzz-a", "fuzz-b"]
#: task counts of steered specs and resizes stay small: the point is the state
#: machine, not the loop's speed on a hundred thousand tasks
MAX_TASKS = 16

SPEC: dict[str, Any] = {"name": KEEP, "entitlement": ENTITLEMENT, "task_count": 2,
                        "resources": {"cpu": 1, "memory_gb": 1}, "command": "serve"}

#: (operation, status) of every request the fuzzing sent
SENT: list[tuple[str, int]] = []


def _post(api: Live, path: str, body: dict[str, Any]) -> dict[str, Any]:
    r = api.admin.post(path, json=body)
    assert r.status_code == 201, r.text
    result: dict[str, Any] = r.json()
    return result


#: how the fuzzing reaches the API, and the store under it: directly and through the
#: front end (a region of one scheduler shard), on SQLite and on ZooKeeper with ACLs
VARIANTS = ["direct-sqlite", "frontend-sqlite", "direct-zookeeper", "frontend-zookeeper"]


@pytest.fixture(scope="module", params=VARIANTS)
def live_module(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
                ) -> Iterator[Live]:
    """One live API per variant, shared by the module's tests."""
    route, store = request.param.split("-")
    work = tmp_path_factory.mktemp(request.param)
    url, ensemble = None, None
    if store == "zookeeper":
        if not installed():  # (make test installs it: scripts/system-deps)
            pytest.fail("ZooKeeper is not installed: run scripts/system-deps")
        ensemble = LocalEnsemble(work / "zk", size=1).start()
        auth = work / "zk-auth"
        auth.write_text("plait:fuzzing-secret\n")
        auth.chmod(0o600)
        url = f"{ensemble.url}?auth_file={auth}"
    try:
        api = (start_live(work / "data", store=url) if route == "direct"
               else start_behind_front_end(work, url))
        yield api
        stop_live(api)
    finally:
        # the ensemble stops after every client of it: stopped first, the API
        # server's stop waits out its 30 s bound on a control plane whose store
        # keeps retrying the lost ZooKeeper
        if ensemble is not None:
            ensemble.stop()


@pytest.fixture(scope="module")
def seeded(live_module: Live) -> dict[str, Any]:
    """Real objects for the fuzzer to hit."""
    api = live_module
    _post(api, "/v1/entitlements", {"name": ENTITLEMENT, "owner": "alice", "quota": QUOTA})
    for name in (KEEP, VICTIM):
        _post(api, "/v1/jobs", {**SPEC, "name": name})
    wait_for(lambda: api.admin.get(f"/v1/jobs/{KEEP}").json()["settled"])
    spare = _post(api, "/v1/tokens", {"role": "owner", "name": "alice"})
    join = _post(api, "/v1/tokens", {"role": "join", "name": "agents"})
    return {"spare_token": spare["id"], "join_token": join["token"],
            "machines": [api.cp.fleet.name(m) for m in range(0, len(api.cp.fleet), 5)]}


def _path_values(seeded: dict[str, Any], method: str, path: str, key: str) -> list[Any]:
    """Real values for a path parameter (empty: leave the generated one)."""
    if key == "name" and path.startswith("/v1/entitlements/"):
        return [ENTITLEMENT]
    if key == "name" and method == "DELETE":
        return [VICTIM]  # KEEP must survive
    if key in ("name", "job"):
        return [KEEP, VICTIM]
    return {"machine": seeded["machines"], "token_id": [seeded["spare_token"]],
            "index": [0, 1], "version": [1, 2, 3]}.get(key, [])


def _steer_body(case: Any, draw: Any, seeded: dict[str, Any]) -> None:
    """Make a generated body name real objects (and pass the checks the document
    cannot express: name patterns, exactly one quota)."""
    body, path = case.body, case.path
    if not isinstance(body, dict):
        return
    body = dict(body)
    if path == "/v1/entitlements":
        body["name"] = draw(st.sampled_from([ENTITLEMENT, "spare"]))
        body["owner"] = "alice"
        if body["name"] == ENTITLEMENT:
            body["quota"] = QUOTA  # lowered quotas evict nothing, by design; keep it
        else:
            body["quota"] = draw(st.sampled_from([{"machines": 2}, {"rru": 10.5}]))
    elif path in ("/v1/jobs", "/v1/jobs/{name}"):
        body["name"] = (case.path_parameters or {}).get("name") or draw(st.sampled_from(JOB_NAMES))
        body["entitlement"] = ENTITLEMENT
        body["task_count"] = min(int(body.get("task_count", 0)), MAX_TASKS)
        body["env"] = {}
        resources = body.get("resources")
        if isinstance(resources, dict) and resources.get("cpu", 0) < 0.001:
            body["resources"] = {**resources, "cpu": 0.5}
        body["task_controller"] = None  # no calls out of the test
    elif path == "/v1/jobs/{name}/resize":
        body["task_count"] = draw(st.integers(0, MAX_TASKS))
    elif path == "/v1/jobs/{name}/rollback":
        body["version"] = draw(st.integers(1, 3))
    elif path == "/v1/jobs/{name}/restart" and "index" in body:
        body["index"] = draw(st.sampled_from([None, 0, 1, 5]))
    elif path == "/v1/maintenance":
        body["machines"] = draw(st.lists(st.sampled_from(seeded["machines"]), min_size=1,
                                            max_size=5))
    elif path == "/v1/machines/{machine}/status" and isinstance(body.get("tasks"), list):
        body["tasks"] = [{**t, "job": draw(st.sampled_from([KEEP, VICTIM])),
                          "index": draw(st.integers(0, 2)), "revision": draw(st.integers(1, 4))}
                         for t in body["tasks"] if isinstance(t, dict)]
    elif path == "/v1/agents/join":
        body["machine"] = draw(st.sampled_from(seeded["machines"]))
    case.body = body


@pytest.fixture(scope="module")
def api_schema(live_module: Live, seeded: dict[str, Any]) -> Any:
    config = schemathesis.Config.from_dict({
        "headers": {"Authorization": f"Bearer {live_module.admin_token}"},
        # an over-long list can be refused for its size (413) before it is read
        "checks": {"negative_data_rejection": {
            "expected-statuses": [400, 401, 403, 404, 405, 409, 413, 422]}}})
    schema = schemathesis.openapi.from_url(f"{live_module.url}/openapi.json", config=config)

    @schema.hook
    def flatmap_case(context: Any, case: Any) -> Any:
        meta = case.meta
        if meta is not None and meta.generation.mode is not GenerationMode.POSITIVE:
            return st.just(case)  # invalid input is refused before any object is read

        @st.composite
        def steered(draw: Any) -> Any:
            query = case.query or {}
            if case.path.endswith("/desired") and isinstance(query.get("wait"), int | float):
                # a long-poll waits when nothing changes: short ones keep the run short
                case.query = {**query, "wait": min(float(query["wait"]), 0.2)}
            if draw(st.integers(0, 3)) == 3:
                return case  # a quarter stay as generated (not the simplest draw)
            for key in list(case.path_parameters or {}):
                values = _path_values(seeded, case.method.upper(), case.path, key)
                if values:
                    case.path_parameters[key] = draw(st.sampled_from(values))
            _steer_body(case, draw, seeded)
            if case.path == "/v1/agents/join":
                case.headers = {**(case.headers or {}),
                                "Authorization": f"Bearer {seeded['join_token']}"}
            return case

        return steered()

    return schema


def error_body(ctx: Any, response: Any, case: Any) -> bool | None:
    """Every error is the API's JSON error: {"error", "message", "field"?}."""
    if response.status_code < 400:
        return None
    body = response.json()
    assert isinstance(body, dict), f"error body is not an object: {response.text[:200]}"
    assert isinstance(body.get("error"), str) and isinstance(body.get("message"), str), \
        f"error body without error and message: {response.text[:200]}"
    assert set(body) <= {"error", "message", "field"}, f"unexpected keys: {sorted(body)}"
    return True


def _fuzz(operation: Any) -> None:
    """Up to MAX_EXAMPLES requests to one operation, valid and invalid ones mixed.

    Driven with hypothesis directly rather than ``schemathesis.pytest.from_fixture``
    and ``parametrize()``: schemathesis 4.32 renames the pytest node through
    ``request.node._nodeid``, which pytest 9.2 no longer has. No example database:
    a failing example is a request against a live server whose state moved on."""
    strategy = st.one_of([operation.as_strategy(generation_mode=m) for m in GenerationMode])

    @given(case=strategy)
    @settings(max_examples=MAX_EXAMPLES, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    def run(case: Any) -> None:
        # every default check (not_a_server_error, status_code_conformance,
        # content_type_conformance, response_schema_conformance,
        # negative_data_rejection, ...) but positive_data_acceptance: the document
        # cannot state the model's own checks (name patterns, exactly one quota)
        response = case.call_and_validate(
            additional_checks=[error_body],
            excluded_checks=[schemathesis.checks.positive_data_acceptance])
        SENT.append((operation.label, response.status_code))

    run()


def test_every_operation_conforms_and_never_fails(api_schema: Any,
                                                  subtests: pytest.Subtests) -> None:
    """Each operation of the document, fuzzed; a failure names the operation."""
    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert len(operations) >= 30
    for operation in operations:
        with subtests.test(operation.label):
            _fuzz(operation)


def _placements(cp: ControlPlane) -> dict[str, dict[int, int]]:
    return {name: dict(job.placement) for name, job in cp.allocator.jobs.items()}


def test_state_survives_fuzzing(live_module: Live, seeded: dict[str, Any], tmp_path) -> None:
    api, cp = live_module, live_module.cp
    # the fuzzing reached real objects (the steering works)
    reached = {label for label, status in SENT if status < 300 and "{" in label}
    assert not SENT or len(reached) >= 10, sorted(reached)
    # the API and the loop are alive
    r = api.client(None).get("/healthz")
    assert r.status_code == 200 and r.json()["ok"] is True, r.text
    steps = cp.steps
    wait_for(lambda: cp.steps >= steps + 3)
    r = api.admin.get("/v1/events", params={"kind": "step_failed"})
    assert r.status_code == 200 and r.json()["events"] == [], r.text
    # every job record reads, through the store and the API
    names = cp.jobs.names()
    assert KEEP in names
    for name in names:
        cp.jobs.get(name)
        r = api.admin.get(f"/v1/jobs/{name}")
        assert r.status_code in (200, 404), r.text  # 404: deleted meanwhile
    assert api.admin.get("/v1/jobs").status_code == 200
    # the scheduler still applies new operations
    r = api.admin.put(f"/v1/jobs/{KEEP}", json={**SPEC, "command": "serve-again"})
    assert r.status_code == 200, r.text
    version = r.json()["version"]
    steps = cp.steps
    try:  # (or a later one: an autoscaling policy the fuzzing set may resize the job)
        wait_for(lambda: api.admin.get(f"/v1/jobs/{KEEP}").json()["applied_version"]
                 >= version)
    except AssertionError:  # what the loop was doing meanwhile, to tell why
        failed = api.admin.get("/v1/events", params={"kind": "step_failed"}).json()
        raise AssertionError(
            f"version {version} of {KEEP} not applied: {cp.steps - steps} passes since "
            f"(failures {cp.failures}, last pass ended "
            f"{time.monotonic() - (cp.last_step or 0):.1f}s ago, jobs "
            f"{len(cp.scheduler.jobs)}, tasks "
            f"{sum(len(j.tasks) for j in cp.scheduler.jobs.values())}); "
            f"job {api.admin.get(f'/v1/jobs/{KEEP}').text[:400]}; "
            f"failed passes {failed['events'][-3:]}") from None
    # the allocator's invariants hold, and a restart from the store sees the same
    with cp.lock:
        check_invariants(Cluster(cp.fleet, cp.region, cp.allocator.index, cp.allocator))
        # (a shard's store is its view of the region's: the backup is the region's)
        document = backup(getattr(cp.store, "base", cp.store))
        live_placements = _placements(cp)
        live_jobs = cp.jobs.names()
    store = SqliteStore(str(tmp_path / "copy.db"))
    try:
        restore(store, document)
        again = ControlPlane(store, ControlPlaneConfig(region=REGION, shard=cp.config.shard))
        check_invariants(Cluster(again.fleet, again.region, again.allocator.index,
                                 again.allocator))
        assert again.jobs.names() == live_jobs
        assert _placements(again) == live_placements
        assert again.allocator.entitlements == cp.allocator.entitlements
    finally:
        store.close()


# -- regressions: what the fuzzing found -----------------------------------------------


JOB = {**SPEC, "name": "regress"}


@pytest.mark.parametrize(("path", "body", "field"), [
    # a cpu whose milli-RRU overflow a float: OverflowError while validating (500)
    ("/v1/jobs", {**JOB, "resources": {"cpu": 1e300}}, "resources.cpu"),
    ("/v1/jobs?dry_run=true", {**JOB, "resources": {"cpu": 1e300}}, "resources.cpu"),
    # units beyond 64 bits: stored, then every pass of the loop failed on it
    ("/v1/jobs", {**JOB, "resources": {"cpu": 1, "memory_gb": 1e20}}, "resources.memory_gb"),
    ("/v1/jobs", {**JOB, "policy": {"requirements": {"min_free": {"cpu": 1e17}}}},
     "policy.requirements.min_free.cpu"),
    ("/v1/jobs", {**JOB, "policy": {"requirements": {"max_tasks_per_machine": 10**20}}},
     "policy.requirements.max_tasks_per_machine"),
    # a quota whose milli-RRU overflow: every pass failed once a job of it placed
    ("/v1/entitlements", {"name": "huge", "owner": "alice", "quota": {"rru": 1e308}},
     "quota.rru"),
    # every number and string has a bound a real fleet never reaches
    ("/v1/entitlements", {"name": "huge", "owner": "alice", "quota": {"machines": 10**9}},
     "quota.machines"),
    ("/v1/entitlements", {"name": "huge", "owner": "alice", "quota": {"machines": 1},
                          "host_profile": "p" * 65}, "host_profile"),
    ("/v1/jobs", {**JOB, "update": {"halt_after_failures": 10**9}},
     "update.halt_after_failures"),
    ("/v1/jobs", {**JOB, "update": {"max_unavailable": 10**9}}, "update.max_unavailable"),
    ("/v1/jobs", {**JOB, "update": {"min_ready_seconds": 1e9}}, "update.min_ready_seconds"),
    ("/v1/jobs", {**JOB, "command": "x" * 5000}, "command"),
    ("/v1/jobs", {**JOB, "args": ["a"] * 1025}, "args"),
    ("/v1/jobs", {**JOB, "args": ["a" * 70_000]}, "args.0"),
    ("/v1/jobs", {**JOB, "env": {f"V{i}": "x" for i in range(1025)}}, "env"),
    ("/v1/jobs", {**JOB, "policy": {"requirements": {"machine_types": ["t" * 65]}}},
     "policy.requirements.machine_types.0"),
    # NUL bytes: a name that means one thing to plait and another to the kernel
    ("/v1/jobs", {**JOB, "command": "sleep\u0000; rm"}, "command"),
    ("/v1/jobs", {**JOB, "args": ["ok", "a\u0000b"]}, "args"),
    ("/v1/jobs", {**JOB, "env": {"A": "x\u0000y"}}, "env"),
    ("/v1/entitlements", {"name": "huge", "owner": "alice", "quota": {"machines": 1},
                          "host_profile": "a\u0000"}, "host_profile"),
    # a data center the region does not have
    ("/v1/entitlements", {"name": "huge", "owner": "alice", "quota": {"machines": 1},
                          "pin_dc": "dc9"}, "pin_dc"),
])
def test_amounts_beyond_the_index_range_are_refused(live_module: Live, path: str,
                                                    body: dict[str, Any], field: str) -> None:
    r = live_module.admin.post(path, json=body)
    assert r.status_code == 422, r.text
    assert r.json()["field"] == field, r.json()
    assert "regress" not in live_module.cp.jobs.names()
    assert "huge" not in live_module.cp.allocator.entitlements


def test_a_data_center_the_region_does_not_have_is_refused(live: Live) -> None:
    _post(live, "/v1/entitlements", {"name": ENTITLEMENT, "owner": "alice",
                                     "quota": {"machines": 4}})
    for requirements, field in (({"dc": "dc9"}, "policy.requirements.dc"),
                                ({"attributes": {"dc": "nowhere"}},
                                 "policy.requirements.attributes.dc")):
        for dry in ("false", "true"):
            r = live.admin.post("/v1/jobs", params={"dry_run": dry}, json={
                **SPEC, "policy": {"requirements": requirements}})
            assert r.status_code == 422 and r.json()["field"] == field, r.text
            assert "this region has dc1" in r.json()["message"]
    assert live.cp.jobs.names() == []
    ok = {**SPEC, "policy": {"requirements": {"dc": "dc1"}}}
    assert live.admin.post("/v1/jobs", json=ok).status_code == 201


def test_largest_amounts_are_accepted_and_the_loop_survives_them(live: Live) -> None:
    """At the bounds a job stays pending (nothing fits) and the loop keeps stepping."""
    _post(live, "/v1/entitlements", {"name": ENTITLEMENT, "owner": "alice",
                                     "quota": {"rru": 1e12}})
    big = {"cpu": 1e9, "memory_gb": 1e9, "disk_gb": 1e9}
    spec = {**SPEC, "resources": big, "policy": {"requirements": {
        "min_free": big, "max_tasks_per_machine": 100_000}}}
    r = live.admin.post("/v1/jobs", params={"dry_run": "true"}, json=spec)
    assert r.status_code == 200 and r.json()["placement"]["unplaced"] == 2, r.text
    _post(live, "/v1/jobs", spec)
    wait_for(lambda: live.admin.get(f"/v1/jobs/{KEEP}").json()["tasks"] == {"pending": 2})
    steps = live.cp.steps
    wait_for(lambda: live.cp.steps >= steps + 3)
    r = live.admin.get("/v1/events", params={"kind": "step_failed"})
    assert r.json()["events"] == [], r.text


@pytest.mark.parametrize(("content", "status", "text"), [
    (b"\xff", 422, "not valid JSON (UTF-8)"),  # was 400 {"detail": ...}
    (b"{not json", 422, "not valid JSON: Expecting"),  # was field "1", "1: JSON decode error"
])
def test_an_unreadable_body_is_the_api_error(live_module: Live, content: bytes, status: int,
                                             text: str) -> None:
    r = live_module.admin.post("/v1/entitlements", content=content,
                               headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    assert r.json()["error"] == "invalid" and text in r.json()["message"], r.text
    assert "field" not in r.json()


def test_framework_errors_are_the_api_error(live_module: Live) -> None:
    r = live_module.admin.get("/v1/nothing")  # was {"detail": "Not Found"}
    assert r.status_code == 404 and r.json() == {"error": "not_found", "message": "Not Found"}
    r = live_module.admin.patch("/v1/jobs")
    assert r.status_code == 405 and r.json()["error"] == "method_not_allowed"
    assert "allow" in r.headers


def test_the_document_lists_the_error_responses(live_module: Live) -> None:
    doc = live_module.admin.get("/openapi.json").json()
    error = doc["components"]["schemas"]["ErrorBody"]
    assert set(error["required"]) == {"error", "message"}
    for path, operations in doc["paths"].items():
        for method, operation in operations.items():
            codes = set(operation["responses"])
            assert {"401", "404", "422"} <= codes, (method, path, codes)
            schema = operation["responses"]["422"]["content"]["application/json"]["schema"]
            assert schema == {"$ref": "#/components/schemas/ErrorBody"}, (method, path)


def test_requests_reach_the_api_as_sent(live_module: Live) -> None:
    """Through the front end as directly: a path of any bytes is answered for (was a
    503 "InvalidURL"), a long-poll wait the API refuses is refused (was a 503
    "WriteTimeout": the forwarder's timeout went negative), and a method a list does
    not take is a 405 with its Allow header (was a 422 about a store key)."""
    api = live_module.admin
    r = api.get("/v1/entitlements/%C3%82%C2%9B%7F")
    assert r.status_code in (404, 422) and r.json()["error"] in ("not_found", "invalid"), r.text
    r = api.get("/v1/machines/%0C%22/status")
    assert r.status_code < 500, r.text
    machine = live_module.cp.fleet.name(0)
    r = api.get(f"/v1/machines/{machine}/desired", params={"wait": "-1e86"})
    assert r.status_code == 422 and r.json()["field"] == "wait", r.text
    for path in ("/v1/jobs", "/v1/entitlements"):
        r = api.patch(path)
        assert r.status_code == 405 and "allow" in r.headers, r.text
    # an empty cursor is not the first page (the front end took it for 0)
    r = api.get("/v1/events", params={"after": ""})
    assert r.status_code == 422 and r.json()["field"] == "after", r.text
