"""/metrics of a running region (simulated agents): the figures move as a deploy, an
update and a machine failure say they should (store operations, each stage of a
pass and the allocations too); the front end and an agent count their own; a scrape
needs an admin token; with metrics off nothing is counted and the region works."""

from __future__ import annotations

from pathlib import Path

import httpx
from livecp import Live, start_behind_front_end, start_live, stop_live, wait_for
from prometheus_client.parser import text_string_to_metric_families

from plait.agent.daemon import Agent
from plait.server.controlplane.loop import PASS_STAGES

JOB = {"name": "web", "entitlement": "e", "task_count": 3, "command": "serve",
       "resources": {"cpu": 1, "memory_gb": 1}, "update": {"max_unavailable": 1}}


def scrape(client, path: str = "/metrics") -> dict[tuple[str, tuple[tuple[str, str], ...]],
                                                     float]:
    """Every sample of the exposition, by name and labels."""
    r = client.get(path)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain")
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(r.text) for s in family.samples}


def failed_machines(samples) -> float:
    return sum(v for (name, labels), v in samples.items()
               if name == "plait_machines" and dict(labels).get("state") == "failed")


def value(samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_the_figures_follow_a_deploy_an_update_and_a_machine_failure(live: Live) -> None:
    api = live.admin
    assert live.client(None).get("/metrics").status_code == 401
    owner = live.owner("alice")
    assert owner.get("/metrics").status_code == 403
    before = scrape(api)
    assert value(before, "plait_leader") == 1.0
    assert api.post("/v1/entitlements", json={"name": "e", "owner": "alice",
                                               "quota": {"machines": 4}}).status_code == 201
    assert api.post("/v1/jobs", json=JOB).status_code == 201
    wait_for(lambda: api.get("/v1/jobs/web").json()["settled"])
    wait_for(lambda: value(scrape(api), "plait_tasks", state="running") == 3)
    s = scrape(api)
    assert value(s, "plait_http_requests_total", route="/v1/jobs", method="POST",
                 status="201") == 1
    assert value(s, "plait_http_requests_total", route="/v1/jobs/{name}", method="GET",
                 status="200") >= 1  # a label per route, never per job
    assert not any("web" in dict(labels).get("route", "") for _, labels in s)
    assert value(s, "plait_events_total", kind="created") == 1
    assert value(s, "plait_job_unavailable_tasks", job="web", entitlement="e") == 0
    assert value(s, "plait_machines", state="healthy", entitlement="e") == 3
    assert value(s, "plait_pass_duration_seconds_count") > value(
        before, "plait_pass_duration_seconds_count")
    assert value(s, "plait_allocator_cache_misses_total") >= 1
    # the store's operations: the job's record created, each pass's outcome committed
    for op in ("create", "commit", "get"):
        assert value(s, "plait_store_operation_duration_seconds_count", op=op) > value(
            before, "plait_store_operation_duration_seconds_count", op=op), op
    # every stage of a pass (those of real agents' passes: the next test)
    for stage in set(PASS_STAGES) - {"health", "brokers", "desired"}:
        assert value(s, "plait_pass_stage_duration_seconds_count", stage=stage) >= 1, stage
    assert value(s, "plait_pass_stage_duration_seconds_count", stage="health") == 0
    # the allocations: the job's three tasks placed, each request timed
    placed = value(s, "plait_allocations_total", result="placed")
    assert placed >= 1
    assert value(s, "plait_allocations_total", result="unplaced") == 0
    assert value(s, "plait_allocation_duration_seconds_count", result="placed") >= 1
    # an update: a rollout under way, then done, and counted
    assert api.put("/v1/jobs/web", json={**JOB, "args": ["v2"]}).status_code == 200
    wait_for(lambda: value(scrape(api), "plait_events_total", kind="rollout_done") == 1)
    wait_for(lambda: api.get("/v1/jobs/web").json()["settled"])
    s = scrape(api)
    assert value(s, "plait_rollouts", state="active") == 0
    assert value(s, "plait_events_total", kind="updated") >= 1
    # a machine fails: counted as such, its task moves
    machine = api.get("/v1/jobs/web/tasks").json()["tasks"][0]["machine"]
    assert api.post(f"/v1/machines/{machine}/fail").status_code == 200
    # (counted failed wherever it is: once its task has moved, the entitlement may
    # give the failed machine back to the free pool, so the label can change)
    wait_for(lambda: failed_machines(scrape(api)) == 1)
    s = scrape(api)
    assert value(s, "plait_events_total", kind="machine_failed") == 1
    wait_for(lambda: api.get("/v1/jobs/web").json()["settled"])
    wait_for(lambda: value(scrape(api), "plait_tasks", state="running") == 3)
    # its task placed again: one more allocation placed
    assert value(scrape(api), "plait_allocations_total", result="placed") > placed


def test_a_pass_with_real_agents_times_its_health_and_desired_stages(tmp_path: Path) -> None:
    """Without simulated agents a pass checks heartbeats and publishes desired sets
    (the machines are within their start-up grace: a job is placed on them)."""
    api = start_live(tmp_path / "data", sim_agents=False)
    try:
        assert api.admin.post("/v1/entitlements", json={
            "name": "e", "owner": "alice", "quota": {"machines": 4}}).status_code == 201
        assert api.admin.post("/v1/jobs", json=JOB).status_code == 201
        wait_for(lambda: value(scrape(api.admin), "plait_allocations_total",
                               result="placed") >= 1)
        s = scrape(api.admin)
        for stage in set(PASS_STAGES) - {"simulate"}:
            assert value(s, "plait_pass_stage_duration_seconds_count", stage=stage) >= 1, stage
        assert value(s, "plait_pass_stage_duration_seconds_count", stage="simulate") == 0
    finally:
        stop_live(api)


def test_with_metrics_off_nothing_is_counted_and_the_region_works(tmp_path: Path) -> None:
    """``ControlPlaneConfig(metrics=False)`` (``plait serve --no-metrics``): a
    ``NullMetrics``, the store not wrapped, /metrics empty; jobs deploy as ever."""
    from plait.metrics import NullMetrics
    from plait.store.metered import MeteredStore

    api = start_live(tmp_path / "data", metrics=False)
    try:
        assert isinstance(api.cp.metrics, NullMetrics)
        assert not isinstance(api.cp.store, MeteredStore)
        assert api.admin.post("/v1/entitlements", json={
            "name": "e", "owner": "alice", "quota": {"machines": 4}}).status_code == 201
        assert api.admin.post("/v1/jobs", json=JOB).status_code == 201
        wait_for(lambda: api.admin.get("/v1/jobs/web").json()["running"] == 3)
        assert scrape(api.admin) == {}
        assert api.client(None).get("/metrics").status_code == 401  # (still an admin's)
    finally:
        stop_live(api)


def test_the_front_end_counts_its_own_requests(tmp_path: Path) -> None:
    api = start_behind_front_end(tmp_path)
    try:
        assert api.admin.post("/v1/entitlements", json={
            "name": "e", "owner": "alice", "quota": {"machines": 4}}).status_code == 201
        assert api.admin.get("/v1/jobs/nosuch").status_code == 404
        assert api.client(None).get("/metrics").status_code == 401
        front = scrape(api.admin)
        assert value(front, "plait_http_requests_total", route="/v1/entitlements",
                     method="POST", status="201") == 1
        assert value(front, "plait_http_requests_total", route="/v1/jobs/{name}",
                     method="GET", status="404") == 1
        assert ("plait_leader", ()) not in front  # (its own: it runs no control plane)
        # the shard it called answers its own at its own address
        shard = scrape(httpx.Client(base_url=api.server.url, timeout=30,
                                    headers={"Authorization": f"Bearer {api.admin_token}"}))
        assert value(shard, "plait_http_requests_total", route="/v1/entitlements",
                     method="POST", status="201") == 1
        assert value(shard, "plait_leader") == 1
    finally:
        stop_live(api)


def test_an_agent_counts_its_reports_and_tasks(tmp_path: Path) -> None:
    agent = Agent("m0000000", ["http://127.0.0.1:9"], None, tmp_path)
    try:
        agent.reachable = True
        agent._report()  # nothing listens there: a failed report
        families = {f.name: f for f in text_string_to_metric_families(
            agent.metrics.exposition().decode())}
        reports = {s.labels["outcome"]: s.value for s in families["plait_agent_reports"].samples
                   if s.name == "plait_agent_reports_total"}
        assert reports == {"failed": 1.0}
        phases = {s.labels["phase"]: s.value for s in families["plait_agent_tasks"].samples}
        assert phases == {"running": 0.0, "exited": 0.0, "stopping": 0.0}
    finally:
        agent.close()


DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana-dashboard.json"


def test_the_grafana_dashboard_names_only_metrics_plait_exports() -> None:
    """Every series the dashboard's queries name is one a plait process exports."""
    import json
    import re

    from plait.metrics import AgentMetrics, Metrics
    from plait.server.controlplane.collector import ControlPlaneCollector

    exported = set()
    for registry in (Metrics().registry, AgentMetrics(dict).registry):
        for family in registry.collect():
            exported |= {family.name, f"{family.name}_total", f"{family.name}_bucket"}
            if family.type == "histogram":
                exported |= {f"{family.name}_count", f"{family.name}_sum"}
    source = Path(ControlPlaneCollector.__module__.replace(".", "/") + ".py")
    text = (Path(__file__).resolve().parents[2] / "src" / source).read_text()
    exported |= set(re.findall(r'"(plait_[a-z_]+)"', text))  # (read when scraped)
    exported |= {f"{n}_total" for n in re.findall(r'"(plait_[a-z_]+)"', text)}
    panels = json.loads(DASHBOARD.read_text())["panels"]
    assert len(panels) >= 15
    shown = set()
    for panel in panels:
        for target in panel["targets"]:
            for name in re.findall(r"\b(plait_[a-z_]+)", target["expr"]):
                assert name in exported, (panel["title"], name)
                shown.add(name)
    assert {"plait_store_operation_duration_seconds_bucket",
            "plait_store_operation_errors_total", "plait_pass_stage_duration_seconds_bucket",
            "plait_allocations_total", "plait_allocation_duration_seconds_bucket",
            "plait_allocator_cache_hits_total"} <= shown
    assert len({p["id"] for p in panels}) == len(panels)


def test_plait_agent_serves_its_metrics_on_the_port_it_is_given(tmp_path: Path) -> None:
    """`plait agent --metrics-port`: served on loopback from the start (here while it
    cannot reach its control plane yet, and says so in its counters)."""
    import os
    import signal
    import subprocess
    import sys

    from plait.testing import free_port

    port = free_port()
    token = tmp_path / "join-token"
    token.write_text("plait_join_not_a_real_one\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "plait.cli.agent", "--machine-id", "m0000000",
         "--control-plane", f"http://127.0.0.1:{free_port()}", "--join-token-file", str(token),
         "--data-dir", str(tmp_path / "agent"), "--interval", "0.2",
         "--metrics-port", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        samples: dict = {}

        def served() -> bool:
            try:
                samples.update(scrape(httpx.Client(base_url=f"http://127.0.0.1:{port}")))
            except httpx.TransportError:
                return False
            return True

        wait_for(served)
        assert value(samples, "plait_agent_tasks", phase="running") == 0
        assert ("plait_agent_task_starts_total", ()) in samples
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


def test_machines_switching_host_profile_are_counted(live: Live) -> None:
    """Two machines join an entitlement whose profile reserves hugepages (a simulated
    switch of 244 s): both are counted switching, and their tasks have not started."""
    r = live.admin.put("/v1/hostprofiles/big", json={"name": "big", "hugepages_2m": 512})
    assert r.status_code == 201, r.text
    r = live.admin.post("/v1/entitlements", json={"name": "e", "owner": "o", "host_profile":
                                                  "big", "quota": {"machines": 4}})
    assert r.status_code == 201, r.text
    r = live.admin.post("/v1/jobs", json={**JOB, "task_count": 2, "policy": {
        "requirements": {"max_tasks_per_machine": 1}}})
    assert r.status_code == 201, r.text
    wait_for(lambda: value(scrape(live.admin), "plait_host_profile_machines",
                           state="switching") == 2)
    samples = scrape(live.admin)
    assert value(samples, "plait_host_profile_machines", state="failing") == 0
    assert value(samples, "plait_host_profile_machines", state="rolling") == 0
    tasks = live.admin.get("/v1/jobs/web/tasks").json()["tasks"]
    assert [t["state"] for t in tasks] == ["allocated", "allocated"]


def test_per_job_series_are_the_largest_jobs_and_the_rest_summed(tmp_path: Path) -> None:
    live = start_live(tmp_path / "data", metrics_jobs=2)
    try:
        api = live.admin
        for ent in ("e", "f"):
            assert api.post("/v1/entitlements", json={
                "name": ent, "owner": "alice", "quota": {"machines": 8}}).status_code == 201
        for name, ent, n in (("big", "e", 40), ("mid", "f", 30), ("small", "e", 20),
                             ("tiny", "f", 1)):
            assert api.post("/v1/jobs", json={**JOB, "name": name, "entitlement": ent,
                                              "task_count": n}).status_code == 201

        def jobs_shown():
            return {dict(labels)["job"]: v for (name, labels), v in scrape(api).items()
                    if name == "plait_job_unavailable_tasks"}
        wait_for(lambda: set(jobs_shown()) == {"big", "mid", "_other"})
        s = scrape(api)
        shown = {labels: v for (name, labels), v in s.items()
                 if name == "plait_job_unavailable_tasks"}
        others = {dict(labels)["entitlement"]: v for labels, v in shown.items()
                  if dict(labels)["job"] == "_other"}
        assert len(shown) == 4 and set(others) == {"e", "f"}
    finally:
        stop_live(live)


def test_the_taskcontrol_series_of_a_job_no_longer_shown_go() -> None:
    from plait.metrics import OTHER_JOBS, Metrics, largest_jobs

    assert largest_jobs({"a": 3, "b": 5, "c": 5, "d": 1}, 2) == {"b", "c"}
    assert largest_jobs({"a": 3, "b": 3}, 1) == {"a"}  # (a tie: by name)
    assert largest_jobs({"a": 1}, 5) == {"a"}
    m = Metrics()
    m.pick_jobs = lambda: frozenset({"a"})
    for job in ("a", "b", "c"):
        m.taskcontrol_calls.labels(m.job_label(job), "answered").inc()
        m.taskcontrol_acks.labels(m.job_label(job)).inc(2)
    text = m.exposition().decode()
    assert 'job="a"' in text and f'job="{OTHER_JOBS}"' in text and 'job="b"' not in text
    assert f'plait_taskcontrol_calls_total{{job="{OTHER_JOBS}",outcome="answered"}} 2.0' in text
    m.show_jobs(frozenset({"b"}))
    m.taskcontrol_calls.labels(m.job_label("b"), "timeout").inc()
    text = m.exposition().decode()
    assert 'job="a"' not in text and 'job="b"' in text
