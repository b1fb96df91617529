"""The client verbs through Typer's runner against a live API on loopback."""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from plait.clientconfig import ClientConfig
from plait.model import RegionSpec
from plait.testing import free_port, wait_for

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def plait(*args: str, ok: bool = True):
    from plait.cli.main import app

    result = CliRunner().invoke(app, list(args))
    if ok:
        assert result.exit_code == 0, (args, result.output, result.exception)
    return result


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_first_start_writes_a_private_client_configuration(plane):
    assert plane.config_path is not None
    mode = stat.S_IMODE(os.stat(plane.config_path).st_mode)
    assert mode == 0o600
    cfg = ClientConfig.load(plane.config_path)
    assert cfg.current_context == "local"
    assert cfg.contexts["local"].url == plane.url
    assert cfg.contexts["local"].token == plane.admin_token
    assert json.loads(plait("context", "list", "-o", "json").stdout)["current_context"] == \
        "local"


def test_deploy_a_yaml_job_follow_it_and_inspect_it(plane, tmp_path):
    plait("entitlement", "create", str(EXAMPLES / "entitlements.yaml"))
    ents = json.loads(plait("entitlement", "list", "-o", "json").stdout)["entitlements"]
    assert [e["name"] for e in ents] == ["batch", "web"]

    dry = plait("job", "deploy", str(EXAMPLES / "web.yaml"), "--dry-run")
    assert "create job web: +6 tasks" in dry.stdout
    assert plane.control_plane.jobs.names() == []  # a dry run changes nothing
    # an update changes an existing job: a misnamed one is not created by it
    res = plait("job", "update", str(EXAMPLES / "web.yaml"), ok=False)
    assert res.exit_code == 1 and "job web does not exist" in res.output
    assert "plait job deploy" in " ".join(res.output.split())
    assert plane.control_plane.jobs.names() == []
    res = plait("job", "deploy", str(EXAMPLES / "web.yaml"), "--wait", "--timeout", "60")
    assert "version 1 stored (created)" in res.output
    jobs = json.loads(plait("job", "list", "-o", "json").stdout)["jobs"]
    assert [(j["name"], j["settled"], j["serving"]) for j in jobs] == [("web", True, 6)]
    table = plait("job", "list").stdout
    assert "web" in table and "settled" in table

    # a new version: the plan diff names the changed field, then the rollout
    text = (EXAMPLES / "web.yaml").read_text().replace("PYTHONUNBUFFERED: \"1\"",
                                                       "PYTHONUNBUFFERED: \"1\", V: \"2\"")
    v2 = write(tmp_path, "web-v2.yaml", text)
    dry = plait("job", "deploy", str(v2), "--dry-run", "-o", "json")
    plan = json.loads(dry.stdout)
    assert plan["action"] == "update" and list(plan["changes"]) == ["env"]
    plait("job", "deploy", str(v2), "--wait", "--timeout", "60")
    show = json.loads(plait("job", "show", "web", "-o", "json").stdout)
    assert show["version"] == 2 and show["settled"]
    assert {t["version"] for t in show["task_list"]} == {2}
    assert "web" in plait("job", "show", "web").stdout

    plait("job", "resize", "web", "4", "--wait", "--timeout", "60")
    assert len(json.loads(plait("task", "list", "web", "-o", "json").stdout)["tasks"]) == 4
    plait("job", "rollback", "web", "1", "--wait", "--timeout", "60")
    plait("task", "restart", "web", "0")
    plait("job", "restart", "web", "--wait", "--timeout", "60")
    history = json.loads(plait("job", "history", "web", "-o", "json").stdout)
    assert [o["op"] for o in history["operations"]] == [
        "create", "update", "resize", "rollback", "restart", "restart"]
    endpoints = json.loads(plait("discover", "web", "-o", "json").stdout)["endpoints"]
    assert sorted(e["index"] for e in endpoints) == list(range(6))
    events = plait("events", "--job", "web", "--limit", "1000", "-o", "json").stdout.splitlines()
    assert any(json.loads(line)["kind"] == "created" for line in events)
    # one task's events: who did what to it and why
    task0 = [json.loads(line) for line in plait(
        "events", "--job", "web", "--task", "0", "--limit", "1000", "-o", "json",
    ).stdout.splitlines()]
    assert task0 and {e["task"] for e in task0} == {0}
    update = next(e for e in task0 if e["kind"] == "op_started" and e["op"] == "update")
    assert "version 2" in update["reason"] and update["decision"]
    table = plait("events", "--job", "web", "--kind", "updated").stdout
    assert "admin:" in table  # the actor: who asked for the update
    plait("job", "delete", "web", "--wait", "--timeout", "60")
    assert json.loads(plait("job", "list", "-o", "json").stdout)["jobs"] == []


def test_machines_maintenance_and_tokens(plane):
    machines = json.loads(plait("machine", "list", "--limit", "5", "-o", "json").stdout)
    assert machines["total"] == 24 and len(machines["machines"]) == 5
    said = plait("machine", "list", "--limit", "5").stdout
    assert "machines 1-5 of 24" in said and "from 0" not in said
    assert "24 of 24 machines" in plait("machine", "list", "--limit", "100").stdout
    plait("machine", "cordon", "m0000002")
    assert json.loads(plait("machine", "show", "m0000002", "-o", "json").stdout)["cordoned"]
    plait("machine", "uncordon", "m0000002")
    plait("machine", "fail", "m0000003")
    failed = json.loads(plait("machine", "list", "--state", "failed", "-o", "json").stdout)
    assert [m["id"] for m in failed["machines"]] == ["m0000003"]
    plait("machine", "repair", "m0000003")
    plait("machine", "drain", "m0000004", "--deadline", "10m")
    plait("maintenance", "schedule", "m0000005", "m0000006", "--start", "+1h",
          "--duration", "30m", "--reason", "kernel")
    listed = json.loads(plait("maintenance", "list", "-o", "json").stdout)["events"]
    kinds = {e["reason"]: e for e in listed}
    assert kinds["kernel"]["machines"] == ["m0000005", "m0000006"]
    assert kinds["kernel"]["end"] - kinds["kernel"]["start"] == pytest.approx(1800)
    assert "drain" in kinds

    token = plait("token", "create", "--owner", "web-team").stdout.strip()
    assert token.startswith("plait_")
    tokens = json.loads(plait("token", "list", "-o", "json").stdout)["tokens"]
    owner = next(t for t in tokens if t["name"] == "web-team")
    # the owner's token works through PLAIT_TOKEN, and sees nothing of admin's
    res = plait("--token", token, "machine", "list", ok=False)
    assert res.exit_code == 4 and "admin only" in res.output
    plait("token", "revoke", owner["id"])
    res = plait("--token", token, "job", "list", ok=False)
    assert res.exit_code == 4 and "invalid token" in res.output


def test_errors_are_one_line_with_an_exit_code(plane, tmp_path, monkeypatch):
    res = plait("job", "show", "nope", ok=False)
    assert res.exit_code == 1 and "job 'nope' not found" in res.output
    bad = write(tmp_path, "bad.yaml", "name: web\nentitlement: web\ntask_count: -3\n"
                                      "resources: {cpu: 1}\ncommand: x\n")
    res = plait("job", "deploy", str(bad), ok=False)
    assert res.exit_code == 2 and "task_count" in res.output
    res = plait("job", "deploy", str(write(tmp_path, "x.yaml", "a: [b")), ok=False)
    assert res.exit_code == 2 and "not valid YAML" in res.output
    res = plait("job", "deploy", str(tmp_path / "missing.yaml"), ok=False)
    assert res.exit_code == 2 and "cannot read" in res.output
    res = plait("job", "list", "-o", "xml", ok=False)
    assert res.exit_code == 2 and "must be table or json" in res.output
    res = plait("machine", "fail", "m0000001", "-o", "yml", ok=False)
    assert res.exit_code == 2
    assert plane.control_plane.views.machine("m0000001")["state"] == "healthy"  # nothing was sent
    monkeypatch.setenv("PLAIT_TOKEN", "plait_0000_wrong")
    res = plait("job", "list", ok=False)
    assert res.exit_code == 4 and "invalid token" in res.output
    monkeypatch.delenv("PLAIT_TOKEN")
    res = plait("--url", f"http://127.0.0.1:{free_port()}", "job", "list", ok=False)
    assert res.exit_code == 3 and "cannot reach the API" in res.output
    res = plait("--context", "nowhere", "job", "list", ok=False)
    assert res.exit_code == 2 and "no context 'nowhere'" in res.output


def test_named_contexts_and_environment_overrides(plane, monkeypatch):
    plait("context", "set", "other", "--url", "http://127.0.0.1:1", "--token", "plait_x_y")
    assert ClientConfig.load().current_context == "local"  # set does not switch
    plait("context", "use", "other")
    assert plait("job", "list", ok=False).exit_code == 3  # the other context's URL
    monkeypatch.setenv("PLAIT_URL", plane.url)
    monkeypatch.setenv("PLAIT_TOKEN", plane.admin_token)
    plait("job", "list")  # the environment overrides the context
    monkeypatch.delenv("PLAIT_URL")
    monkeypatch.delenv("PLAIT_TOKEN")
    plait("--context", "local", "job", "list")
    plait("context", "use", "local")


def test_wait_reports_a_halted_rollout(plane, tmp_path):
    plait("entitlement", "create", "--name", "web", "--owner", "o", "--machines", "12")
    spec = ("name: bad\nentitlement: web\ntask_count: 3\nresources: {{cpu: 1}}\n"
            "command: {cmd}\nupdate: {{max_unavailable: 1, halt_after_failures: 1}}\n")
    plait("job", "deploy", str(write(tmp_path, "ok.yaml", spec.format(cmd="serve"))),
          "--wait", "--timeout", "60")
    start = time.monotonic()
    res = plait("job", "deploy", str(write(tmp_path, "bad.yaml", spec.format(cmd="crash"))),
                "--wait", "--timeout", "60", ok=False)
    assert res.exit_code == 1 and "halted" in res.output, res.output
    assert time.monotonic() - start < 60  # it stopped at the halt, not at the timeout


def test_wait_stops_on_a_job_no_machine_could_ever_hold(plane, tmp_path):
    # it waited out its whole timeout (10 minutes by default) saying "no machine
    # satisfies the hard requirements with room", as if room could free up
    from plait.allocator.policy import NEVER_FITS
    from plait.client.status import NEVER_FITS as SEEN

    assert SEEN == NEVER_FITS  # (the CLI reads the allocator's words)
    plait("entitlement", "create", "--name", "web", "--owner", "o", "--machines", "4")
    spec = "name: huge\nentitlement: web\ntask_count: 2\nresources: {cpu: 640}\ncommand: serve\n"
    start = time.monotonic()
    res = plait("job", "deploy", str(write(tmp_path, "huge.yaml", spec)), "--wait",
                "--timeout", "60", ok=False)
    said = " ".join(res.output.split())
    assert res.exit_code == 1, said
    assert "huge cannot be placed: no machine of the region is big enough for one task: " \
        "cpu 640 > the largest machine's" in said
    assert "The job is stored and waits for such machines" in said
    assert time.monotonic() - start < 60  # it stopped on the reason, not at the timeout
    assert json.loads(plait("job", "show", "huge", "-o", "json").stdout)["name"] == "huge"


def test_a_dry_run_says_how_an_uncapped_job_is_paced(plane, tmp_path):
    # "at most None unavailable at once"
    plait("entitlement", "create", "--name", "web", "--owner", "o", "--machines", "4")
    spec = ("name: free\nentitlement: web\ntask_count: 2\nresources: {cpu: 1}\n"
            "command: serve\nupdate: {max_unavailable: null}\n")
    said = " ".join(plait("job", "deploy", str(write(tmp_path, "free.yaml", spec)),
                          "--dry-run").output.split())
    assert "(at most 1 unavailable at once: no cap and no TaskController)" in said, said
    assert "None" not in said
    plan = json.loads(plait("job", "deploy", str(write(tmp_path, "free.yaml", spec)),
                            "--dry-run", "-o", "json").stdout)
    assert plan["max_unavailable"] is None and plan["task_controller"] is False


def test_task_logs_prints_what_the_task_printed(plane):
    plait("entitlement", "create", "--name", "web", "--owner", "o", "--machines", "4")
    plait("job", "deploy", str(EXAMPLES / "web.yaml"), "--wait", "--timeout", "60")
    out = plait("task", "logs", "web", "3").stdout
    assert "starting sh -c exec python3 -m http.server" in out and "running on m" in out
    res = plait("task", "logs", "nope", "0", ok=False)
    assert res.exit_code == 1 and "not found" in res.output


def test_job_move_follows_the_move_to_the_new_entitlement(plane, tmp_path):
    plait("entitlement", "create", "--name", "web", "--owner", "o", "--machines", "6")
    plait("entitlement", "create", "--name", "web2", "--owner", "o", "--machines", "6")
    spec = ("name: app\nentitlement: web\ntask_count: 4\nresources: {cpu: 1}\n"
            "command: serve\npolicy: {requirements: {max_tasks_per_machine: 1}}\n")
    plait("job", "deploy", str(write(tmp_path, "app.yaml", spec)), "--wait", "--timeout", "60")
    res = plait("job", "move", "app", "--to-entitlement", "nope", ok=False)
    assert res.exit_code == 2 and "entitlement 'nope' does not exist" in res.output
    res = plait("job", "move", "app", "--to-entitlement", "web", ok=False)
    assert res.exit_code == 2 and "already runs in entitlement 'web'" in res.output
    res = plait("job", "move", "ghost", "--to-entitlement", "web2", ok=False)
    assert res.exit_code == 1 and "not found" in res.output

    res = plait("job", "move", "app", "--to-entitlement", "web2", "--wait", "--timeout", "60")
    assert "move to entitlement web2 stored" in res.output
    show = json.loads(plait("job", "show", "app", "-o", "json").stdout)
    assert show["entitlement"] == "web2" and show["moving_from"] is None and show["settled"]
    assert show["on_entitlement"] == 4
    ents = {e["name"]: e for e in json.loads(
        plait("entitlement", "list", "-o", "json").stdout)["entitlements"]}
    assert ents["web"]["machines"] == 0 and ents["web2"]["machines"] == 4
    assert ents["web2"]["jobs"] == ["app"]


def test_restart_wait_returns_once_every_task_restarted(plane, tmp_path):
    plait("entitlement", "create", str(EXAMPLES / "entitlements.yaml"))
    spec = write(tmp_path, "r.yaml", "name: r\nentitlement: web\ntask_count: 3\n"
                                     "command: serve\nresources: {cpu: 0.5, memory_gb: 0.5}\n")
    plait("job", "deploy", str(spec), "--wait", "--timeout", "60")
    cp = plane.control_plane
    before = cp.scheduler.counters["ops_completed"]
    cp.loop.stop()  # stored, not applied yet: already under way, not settled
    plait("job", "restart", "r")
    show = json.loads(plait("job", "show", "r", "-o", "json").stdout)
    assert show["rollout_active"] and not show["settled"]
    cp.loop.start()
    plait("job", "restart", "r", "--wait", "--timeout", "60")
    # returned once every task restarted (the two requests may be served by one restart
    # of a task that had not restarted yet when the second came)
    job = cp.scheduler.job("r")
    assert not any(t.restart or t.op for t in job.tasks.values())
    assert cp.scheduler.counters["ops_completed"] - before >= 3
    show = json.loads(plait("job", "show", "r", "-o", "json").stdout)
    assert show["settled"] and not show["rollout_active"]


def test_names_are_escaped_in_urls_and_matched_whole(plane, tmp_path):
    plait("entitlement", "create", str(EXAMPLES / "entitlements.yaml"))
    spec = write(tmp_path, "v.yaml", "name: victim\nentitlement: web\ntask_count: 1\n"
                                     "command: serve\nresources: {cpu: 0.5, memory_gb: 0.5}\n")
    plait("job", "deploy", str(spec))
    for name in ("nosuch/../victim", "../victim", "victim/../victim", "%2e%2e"):
        res = plait("job", "delete", name, ok=False)
        assert res.exit_code != 0, name
    assert plane.control_plane.jobs.get("victim").deleting is False
    # a name with a newline at its end is not the same name (nor a valid one)
    bad = write(tmp_path, "nl.json", json.dumps({
        "name": "victim\n", "entitlement": "web", "task_count": 1, "command": "serve",
        "resources": {"cpu": 0.5, "memory_gb": 0.5}}))
    res = plait("job", "deploy", str(bad), ok=False)
    assert res.exit_code == 2 and "name" in res.output
    assert plane.control_plane.jobs.names() == ["victim"]


def test_a_second_region_keeps_the_first_regions_context(plane, tmp_path):
    # a second `plait serve` on another port used to overwrite `local`: the first
    # region's URL and admin token gone from the configuration
    from plait.server.controlplane import ControlPlaneConfig
    from plait.server.serve import prepare

    second = prepare(tmp_path / "data2", None, ControlPlaneConfig(
        region=RegionSpec.sized(4, dcs=1, msbs_per_dc=2, rows_per_msb=1, racks_per_row=1)),
        port=1)
    try:
        port = second.url.rsplit(":", 1)[1]
        assert second.context == f"local-{port}"
        cfg = ClientConfig.load(plane.config_path)
        assert cfg.contexts["local"].url == plane.url
        assert cfg.contexts["local"].token == plane.admin_token
        assert cfg.contexts[f"local-{port}"].token == second.admin_token
        assert cfg.current_context == f"local-{port}"
        # the same region again (a restart): its own context, not a third
        assert ClientConfig.load(plane.config_path).own_context("local", plane.url) == "local"
    finally:
        second.control_plane.store.close()


def test_a_large_jobs_tasks_are_drawn_up_to_a_limit(plane, tmp_path):
    # a table of 100,000 tasks took minutes to draw (the API answered in 0.6 s)
    plait("entitlement", "create", str(EXAMPLES / "entitlements.yaml"))
    spec = write(tmp_path, "many.yaml", "name: many\nentitlement: batch\ntask_count: 150\n"
                 "resources: {cpu: 0.01, memory_gb: 0.01}\ncommand: sleep\n"
                 "args: [\"1000\"]\n")
    plait("job", "deploy", str(spec))
    wait_for(lambda: len(json.loads(plait("task", "list", "many", "-o", "json").stdout)[
        "tasks"]) >= 150, what="the job's 150 tasks")
    shown = plait("job", "show", "many").stdout
    assert "... and 50 more tasks (plait task list many --limit 0, or -o json)" in shown
    assert len(json.loads(plait("job", "show", "many", "-o", "json").stdout)[
        "task_list"]) == 150
    listed = plait("task", "list", "many", "--limit", "10").stdout
    assert "... and 140 more tasks (--limit 0 for all)" in listed
    every = plait("task", "list", "many", "--limit", "0").stdout
    assert "more tasks" not in every and "│ 149 " in every


def test_an_entitlement_is_changed_by_update_never_replaced_from_options(plane, tmp_path):
    # `entitlement create --name web-online --owner web-team --machines 2` on a lender
    # with host profile web replaced it whole: profile default, lending off, a roll
    lender = ("name: web\nowner: o\nquota: {machines: 4}\nlends: true\n"
              "surge_buffer: 1\n")
    plait("entitlement", "create", str(write(tmp_path, "web.yaml", lender)))
    res = plait("entitlement", "create", "--name", "web", "--owner", "o", "--machines", "2",
                ok=False)
    said = " ".join(res.output.split())
    assert res.exit_code == 2 and "entitlement web exists" in said
    assert "plait entitlement update web" in said
    res = plait("entitlement", "create", "--name", "x", "--owner", "o", "--machines", "2",
                "--rru", "5", ok=False)
    assert res.exit_code == 2 and "not both" in res.output
    res = plait("entitlement", "update", "web", ok=False)
    assert res.exit_code == 2 and "nothing to change" in res.output
    plait("entitlement", "update", "web", "--machines", "6")
    shown = json.loads(plait("entitlement", "show", "web", "-o", "json").stdout)
    assert shown["quota"]["machines"] == 6 and shown["lends"] is True
    assert shown["surge_buffer"] == 1 and shown["host_profile"] == "default"
    def changed() -> list[str]:  # (recorded with the next pass)
        return [json.loads(line)["message"] for line in plait(
            "events", "--kind", "entitlement_changed", "-o", "json").stdout.splitlines()]
    wait_for(changed)
    assert changed() == ["web: quota 4 machines -> 6 machines"]
    res = plait("entitlement", "update", "nope", "--machines", "1", ok=False)
    assert res.exit_code != 0 and "not found" in res.output
    # a quota lowered below what the entitlement uses: taken, and said (it was silent)
    job = ("name: big\nentitlement: web\ntask_count: 3\ncommand: serve\n"
           "resources: {cpu: 9, memory_gb: 1}\n")
    plait("job", "deploy", str(write(tmp_path, "big.yaml", job)), "--wait", "--timeout", "60")
    res = plait("entitlement", "update", "web", "--machines", "1")
    assert "entitlement web uses 3 machines, above its quota of 1: nothing is taken back" \
        in " ".join(res.output.split())
    wait_for(lambda: len(changed()) >= 2)
    assert changed()[-1] == ("web: quota 6 machines -> 1 machine (it uses 3 machines, above "
                             "its quota: nothing is taken back, and its jobs' new tasks wait "
                             "until it is under)")


def test_an_empty_token_is_refused_and_a_files_partial_apply_is_said(plane, tmp_path):
    # an empty --token fell back to the configuration's admin token
    res = plait("--token", "", "job", "list", ok=False)
    assert res.exit_code == 2 and "--token is empty" in " ".join(res.output.split())
    import os

    os.environ["PLAIT_TOKEN"] = " "
    try:
        res = plait("job", "list", ok=False)
    finally:
        del os.environ["PLAIT_TOKEN"]
    assert res.exit_code == 2 and "PLAIT_TOKEN is set and empty" in " ".join(
        res.output.split())
    # a file whose second entitlement is refused by the server: the first was stored,
    # and the error says so
    two = ("name: half1\nowner: o\nquota: {machines: 1}\n---\n"
           "name: half2\nowner: o\nquota: {machines: 1}\nhost_profile: nope\n")
    res = plait("entitlement", "create", str(write(tmp_path, "two.yaml", two)), ok=False)
    said = " ".join(res.output.split())
    assert res.exit_code == 2 and "entry 2" in said and "nope" in said
    assert "entry 1, half1, was created or changed" in said
    assert json.loads(plait("entitlement", "show", "half1", "-o", "json").stdout)["name"] == \
        "half1"


def test_an_agent_refused_its_join_says_why_in_one_line(plane, tmp_path, monkeypatch):
    """A second agent started as a machine whose agent is alive: the control plane's
    reason, one line, and an exit code (not a traceback)."""
    import signal

    import httpx

    monkeypatch.setattr(signal, "signal", lambda *_: None)  # (the test's own handlers)
    admin = httpx.Client(base_url=plane.url,
                         headers={"Authorization": f"Bearer {plane.admin_token}"})
    join = admin.post("/v1/tokens", json={"role": "join", "name": "c"}).json()["token"]
    first = httpx.post(f"{plane.url}/v1/agents/join", json={"machine": "m0000003"},
                       headers={"Authorization": f"Bearer {join}"})
    assert first.status_code == 201, first.text
    beat = httpx.post(f"{plane.url}/v1/machines/m0000003/status",
                      json={"tasks": [], "profile": {"name": None}},
                      headers={"Authorization": f"Bearer {first.json()['token']}"})
    assert beat.status_code == 200, beat.text
    token_file = write(tmp_path, "join-token", join)
    import plait.cli.daemons as daemons

    # (it waits out a live agent's last heartbeats first: here, none)
    monkeypatch.setattr(daemons, "JOIN_WAIT", 0.0)
    res = plait("agent", "--machine-id", "m0000003", "--control-plane", plane.url,
                "--join-token-file", str(token_file), "--data-dir", str(tmp_path / "a"),
                ok=False)
    text = " ".join(res.output.split())
    assert res.exit_code == 2, (res.output, res.exception)
    assert "the control plane refused machine m0000003: machine m0000003 has a live agent" \
        in text and "Traceback" not in res.output
    assert isinstance(res.exception, SystemExit)
    # a join token that is not one: refused as such (exit 4)
    bad = write(tmp_path, "bad-token", "plait_0000_nothing")
    res = plait("agent", "--machine-id", "m0000004", "--control-plane", plane.url,
                "--join-token-file", str(bad), "--data-dir", str(tmp_path / "b"), ok=False)
    assert res.exit_code == 4 and "invalid token" in res.output, res.output
