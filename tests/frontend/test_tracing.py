"""Traces of a live region (a scheduler shard behind the front end, simulated agents):
one request is one trace from the front end through the proxy hop to the shard and
its store writes; the pass that applies it is a trace of its phases. Without
tracing configured, plait imports nothing of OpenTelemetry."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from livecp import Live, start_behind_front_end, stop_live, wait_for

from plait import tracing

JOB = {"name": "web", "entitlement": "e", "task_count": 2, "command": "serve",
       "resources": {"cpu": 1, "memory_gb": 1}}


@pytest.fixture
def traced(tmp_path: Path) -> Iterator[tuple[Live, Path]]:
    path = tmp_path / "spans.jsonl"
    assert tracing.configure(file=path, service="plait-test")  # (before the servers)
    api = start_behind_front_end(tmp_path)
    try:
        yield api, path
    finally:
        stop_live(api)
        tracing.shutdown()


def read(path: Path) -> list[dict[str, Any]]:
    tracing.flush()
    return [json.loads(line) for line in path.read_text().splitlines()]


def children(spans: list[dict[str, Any]], parent: dict[str, Any]) -> list[dict[str, Any]]:
    return [s for s in spans if s["parent_id"] == parent["span_id"]
            and s["trace_id"] == parent["trace_id"]]


def test_a_request_is_one_trace_from_the_front_end_to_the_shards_store(traced) -> None:
    api, path = traced
    assert api.admin.post("/v1/entitlements", json={
        "name": "e", "owner": "alice", "quota": {"machines": 4}}).status_code == 201
    created = api.admin.post("/v1/jobs", json=JOB, headers={"X-Request-Id": "deploy-web-1"})
    assert created.status_code == 201, created.text
    wait_for(lambda: api.admin.get("/v1/jobs/web").json()["settled"])
    spans = read(path)

    # the front end: a server span of its own (no caller's trace), the request's id
    fronts = [s for s in spans if s["name"] == "POST /v1/jobs" and s["parent_id"] is None]
    assert len(fronts) == 1
    front = fronts[0]
    assert front["kind"] == "server"
    assert front["attributes"]["http.route"] == "/v1/jobs"
    assert front["attributes"]["http.request.method"] == "POST"
    assert front["attributes"]["http.response.status_code"] == 201
    assert front["attributes"]["plait.request_id"] == "deploy-web-1"
    # its children: the shard map read from the store, and the hop to the shard (a
    # create is carried in a batch of the creates waiting for that shard: here one)
    below = children(spans, front)
    assert any(s["name"].startswith("store.") for s in below)
    hops = [s for s in below if s["name"] == "proxy"]
    assert len(hops) == 1 and hops[0]["kind"] == "client"
    assert hops[0]["attributes"]["http.response.status_code"] == 200
    # the shard: a server span whose parent is the hop (it came in traceparent), with
    # the id of the batch's first create
    shard = children(spans, hops[0])
    assert [s["name"] for s in shard] == ["POST /v1/shard/creates"]
    assert shard[0]["kind"] == "server"
    assert shard[0]["attributes"]["plait.request_id"] == "deploy-web-1"
    assert shard[0]["attributes"]["http.response.status_code"] == 200
    # ... and its store write of the job: the acknowledgement of the request (the
    # transaction of its batch of creates: group commit, here a batch of one)
    writes = [s for s in children(spans, shard[0]) if s["name"] == "store.commit"]
    assert [w["attributes"]["plait.store.key"] for w in writes] == [
        "/shards/0/scheduler/jobs/web"]
    trace = {s["trace_id"] for s in (front, *hops, *shard, *writes)}
    assert trace == {front["trace_id"]}

    # the pass that applied it: a root of its own, its phases, their store calls
    passes = [s for s in spans if s["name"] == "pass"]
    assert passes and all(p["parent_id"] is None for p in passes)
    applied = []
    for p in passes:
        phases = {s["name"]: s for s in children(spans, p)}
        ops = phases.get("pass.operations")
        if ops is not None and any(
                s["attributes"].get("plait.store.key") == "/shards/0/scheduler/jobs/web"
                for s in children(spans, ops)):
            applied.append(phases)
    assert applied, "no exported pass read the job's record"
    phases = applied[0]
    assert {"pass.reports", "pass.operations", "pass.events", "pass.save",
            "pass.publish"} <= phases.keys()
    assert phases["pass.save"]["attributes"]["changed_jobs"] >= 1
    assert any(s["name"] == "store.commit" for s in children(spans, phases["pass.save"]))
    # idle passes are not exported: the loop passed more often than it wrote passes
    assert len(passes) < api.cp.steps


NO_TRACING = textwrap.dedent("""
    import builtins, json, sys
    from pathlib import Path

    # who imports OpenTelemetry: FastAPI itself may (its own telemetry, off unless
    # configured), plait must not
    by_plait = []
    real_import = builtins.__import__

    def spying(name, globals=None, locals=None, fromlist=(), level=0):
        importer = (globals or {}).get("__name__", "")
        if name.startswith("opentelemetry") and importer.startswith("plait"):
            by_plait.append(f"{importer} -> {name}")
        return real_import(name, globals, locals, fromlist, level)

    builtins.__import__ = spying
    for sdk in ("opentelemetry.sdk", "opentelemetry.exporter"):
        sys.modules[sdk] = None  # importing them would fail

    sys.path.insert(0, sys.argv[2])
    from livecp import start_behind_front_end, stop_live, wait_for

    api = start_behind_front_end(Path(sys.argv[1]))
    try:
        codes = [api.admin.post("/v1/entitlements", json={
                     "name": "e", "owner": "alice", "quota": {"machines": 4}}).status_code,
                 api.admin.post("/v1/jobs", json={
                     "name": "web", "entitlement": "e", "task_count": 1, "command": "x",
                     "resources": {"cpu": 1, "memory_gb": 1}}).status_code]
        wait_for(lambda: api.admin.get("/v1/jobs/web").json()["settled"])
        steps = api.cp.steps
    finally:
        stop_live(api)
    print(json.dumps({"codes": codes, "steps": steps, "by_plait": by_plait,
                      "otel": sorted(m for m in sys.modules if m.startswith("opentelemetry")
                                     and sys.modules[m] is not None),
                      "tracing": sorted(m for m in sys.modules if m.startswith("plait.tracing"))}))
""")


def test_without_configuration_plait_imports_nothing_of_opentelemetry(tmp_path) -> None:
    env = {k: v for k, v in os.environ.items()
           if k not in (tracing.ENV_ENDPOINT, tracing.ENV_FILE)}
    done = subprocess.run([sys.executable, "-c", NO_TRACING, str(tmp_path),
                           str(Path(__file__).parent)],
                          env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["codes"] == [201, 201]  # requests were served, passes ran
    assert out["steps"] > 0
    assert out["by_plait"] == []
    assert not [m for m in out["otel"] if m.startswith(("opentelemetry.sdk",
                                                        "opentelemetry.exporter"))]
    assert out["tracing"] == ["plait.tracing"]  # the facade only, never plait.tracing.otel
