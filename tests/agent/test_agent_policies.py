"""Agents apply restart policies (batch jobs) and per-task health probes, against a
live control plane on loopback. Every wait is a liveness bound, not a speed check."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from plait.agent.daemon import Agent
from plait.localprocs import alive
from plait.model import RegionSpec
from plait.server.controlplane import ControlPlane, ControlPlaneConfig
from plait.server.serve import ApiServer, store_for
from plait.testing import wait_for

MACHINES = ["m0000000", "m0000001"]


def probed_and_reported(box, key: str, probes: int) -> None:
    """Until the agent running task ``key`` has probed it ``probes`` times, and has
    reported to the control plane since (what it saw has arrived there)."""
    agent = next(a for a in box.agents if key in a.tasks)
    wait_for(lambda: (st := agent.prober.states.get(key)) is not None and st.checks >= probes,
             what=f"{probes} probes of {key}")
    beat = box.cp.liveness.last.get(agent.machine, 0.0)
    wait_for(lambda: box.cp.liveness.last.get(agent.machine, 0.0) > beat,
             what=f"a report from {agent.machine}")


class Box:
    """A two-machine region with the control plane and both agents in this process."""

    def __init__(self, tmp, applier=None):
        """``applier``: makes each agent's host-profile applier from its state dir."""
        region = RegionSpec.sized(2, dcs=1, msbs_per_dc=2, rows_per_msb=1, racks_per_row=1)
        self.cp = ControlPlane(store_for(tmp / "cp"), ControlPlaneConfig(
            region=region, tick_seconds=0.05, heartbeat_timeout=30))
        token = self.cp.bootstrap_admin()
        self.server = ApiServer(self.cp).start()
        self.api = httpx.Client(base_url=self.server.url, timeout=30,
                                headers={"Authorization": f"Bearer {token}"})
        join = self.api.post("/v1/tokens", json={"role": "join", "name": "j"}).json()["token"]
        self.stop = threading.Event()
        self.dirs = {m: tmp / m for m in MACHINES}
        self.agents = [Agent(m, [self.server.url], join, self.dirs[m], applier=None if applier
                             is None else applier(self.dirs[m] / "sidekick"))
                       for m in MACHINES]
        self.threads = [threading.Thread(target=a.run, args=(0.1, self.stop), daemon=True)
                        for a in self.agents]
        for t in self.threads:
            t.start()
        r = self.api.post("/v1/entitlements", json={"name": "e", "owner": "o",
                                                    "quota": {"machines": 2}})
        assert r.status_code == 201, r.text

    def deploy(self, name, script, tasks=2, **fields):
        spec = {"name": name, "entitlement": "e", "task_count": tasks,
                "resources": {"cpu": 0.1, "memory_gb": 0.1}, "command": "sh",
                "args": ["-c", script], **fields}
        r = self.api.post("/v1/jobs", json=spec)
        assert r.status_code == 201, r.text

    def job(self, name):
        return self.api.get(f"/v1/jobs/{name}").json()

    def tasks(self, name):
        return self.api.get(f"/v1/jobs/{name}/tasks").json()["tasks"]

    def serving(self, name):
        return {e["index"] for e in self.api.get(f"/v1/discovery/{name}").json()["endpoints"]}

    def close(self):
        self.stop.set()
        for t in self.threads:
            t.join(timeout=30)
        for a in self.agents:
            a.shutdown()
            a.close()
        self.api.close()
        self.server.stop()
        self.cp.store.close()


@pytest.fixture
def box(tmp_path):
    b = Box(tmp_path)
    yield b
    b.close()


def test_a_batch_job_completes_and_its_output_is_kept(box):
    box.deploy("sum", 'echo "sum $PLAIT_TASK_INDEX = $((PLAIT_TASK_INDEX + 40))"',
               restart={"policy": "on-failure", "max_retries": 2})
    wait_for(lambda: box.job("sum")["phase"] == "complete", what="the batch job completes")
    job = box.job("sum")
    assert (job["succeeded"], job["failed"], job["running"]) == (2, 0, 0)
    assert [(t["state"], t["exit_code"], t["machine"]) for t in box.tasks("sum")] == [
        ("succeeded", 0, None)] * 2
    # what a task printed just before it exited reaches the API
    logs = box.api.get("/v1/jobs/sum/tasks/1/logs").json()["data"]
    assert "sum 1 = 41" in logs
    # finished tasks leave their machines: the agents stop tracking them
    wait_for(lambda: all(not a.tasks for a in box.agents), what="agents drop finished tasks")


def test_a_task_gets_its_specs_environment_not_the_agents(box, monkeypatch):
    # what the agent was started with (a cloud's key) is not the tasks'; what finds
    # programs and sets the locale is, and the spec's own variables and plait's
    monkeypatch.setenv("CLOUD_SECRET_KEY", "hunter2")
    monkeypatch.setenv("LANG", "C.UTF-8")
    box.deploy("envy", 'echo "secret=[$CLOUD_SECRET_KEY] mine=[$MINE] lang=[$LANG] '
                       'path=[${PATH:+set}] job=[$PLAIT_JOB]"', tasks=1,
               env={"MINE": "spec"}, restart={"policy": "never"})
    wait_for(lambda: box.job("envy")["phase"] == "complete", what="it runs")
    wait_for(lambda: "job=" in box.api.get("/v1/jobs/envy/tasks/0/logs").json()["data"],
             what="its output")
    logs = box.api.get("/v1/jobs/envy/tasks/0/logs").json()["data"]
    assert "secret=[] mine=[spec] lang=[C.UTF-8] path=[set] job=[envy]" in logs, logs


def test_each_task_gets_its_own_credential_and_the_agent_keeps_it_nowhere(box):
    from plait.taskcontrol import signing

    # the spec names one too: a job's env is every task's, so it is not the credential
    box.deploy("cred", 'printf "%s %s" "$PLAIT_TASK_ENDPOINT" "$PLAIT_TASK_CREDENTIAL" '
                       '> "$PLAIT_DATA_DIR/cred.tmp" && '
                       'mv "$PLAIT_DATA_DIR/cred.tmp" "$PLAIT_DATA_DIR/cred"; exec sleep 600',
               env={"PLAIT_TASK_CREDENTIAL": "forged", "PLAIT_TASK_ENDPOINT": "10.9.9.9:1"})
    key = box.api.get("/v1/jobs/cred/controller-key").json()["key"]
    files = {i: [box.dirs[m] / "tasks" / f"cred.{i}" / "cred" for m in MACHINES]
             for i in (0, 1)}

    def written() -> bool:
        return all(any(f.exists() for f in fs) for fs in files.values())
    wait_for(written, what="both tasks start")
    seen = {i: next(f for f in fs if f.exists()).read_text().split(" ")
            for i, fs in files.items()}
    # bound to the endpoint plait's discovery has for the task, which it is given
    found: dict[int, str] = {}

    def discovered() -> bool:
        found.update({e["index"]: e["endpoint"] for e in
                      box.api.get("/v1/discovery/cred").json()["endpoints"]})
        return set(found) == {0, 1}
    wait_for(discovered, what="both tasks in discovery")
    assert {i: where for i, (where, _) in seen.items()} == found
    got = {i: cred for i, (_, cred) in seen.items()}
    assert got == {i: signing.task_credential(key, "cred", i, found[i]) for i in (0, 1)}
    assert got[0] != signing.task_credential(key, "cred", 0, found[1])
    # the agents' saved state holds none (a restarted agent gets it again)
    for m in MACHINES:
        state = (box.dirs[m] / "agent.json").read_text()
        assert not any(c in state for c in got.values())


def test_a_task_data_dir_is_absolute_when_the_agent_was_given_a_relative_one(
        tmp_path, monkeypatch):
    # `plait up` gives its agents relative data dirs (.plait/agents/M): a task runs in
    # its own directory, where a relative PLAIT_DATA_DIR named nothing
    monkeypatch.chdir(tmp_path)
    agent = Agent("m0", ["http://127.0.0.1:9"], None, Path(".plait/agents/m0"))
    try:
        assert agent.data_dir == tmp_path / ".plait" / "agents" / "m0"
        from plait.agent.daemon import Task
        env = agent._env(Task("j", 0, 1, 8080), {"command": "x"})
        assert env["PLAIT_DATA_DIR"] == str(tmp_path / ".plait/agents/m0/tasks/j.0")
    finally:
        agent.close()


def test_on_failure_retries_then_fails_the_job(box):
    box.deploy("flaky", 'echo "try on $PLAIT_MACHINE"; exit 3', tasks=1,
               restart={"policy": "on-failure", "max_retries": 1})
    wait_for(lambda: box.job("flaky")["phase"] == "failed", what="the job fails")
    job = box.job("flaky")
    assert (job["succeeded"], job["failed"]) == (0, 1)
    assert [(t["state"], t["exit_code"]) for t in box.tasks("flaky")] == [("dead", 3)]
    wait_for(lambda: box.api.get("/v1/jobs/flaky/tasks/0/logs").json()["data"].count(
        "try on") == 2, what="both runs' output")
    kinds = [e["kind"] for e in box.api.get("/v1/events", params={"job": "flaky"}).json()[
        "events"]]
    assert "task_failed" in kinds and "job_failed" in kinds


def test_restart_policy_never_and_a_rerun_by_restart(box):
    box.deploy("once", 'n=$(cat "$PLAIT_DATA_DIR/n" 2>/dev/null || echo 0); '
                       'echo $((n + 1)) > "$PLAIT_DATA_DIR/n"; echo "run $((n + 1))"; exit 0',
               tasks=1, restart={"policy": "never"})
    wait_for(lambda: box.job("once")["phase"] == "complete", what="it runs once")
    assert box.api.post("/v1/jobs/once/restart").status_code == 200
    wait_for(lambda: box.api.get("/v1/jobs/once/tasks/0/logs").json()["data"].count(
        "run 1") == 2, what="a restart runs it again")
    wait_for(lambda: box.job("once")["phase"] == "complete", what="complete again")


def test_an_always_task_is_restarted_whatever_its_exit_code(box):
    box.deploy("svc", "echo up; sleep 0.2; exit 0", tasks=1)
    wait_for(lambda: box.api.get("/v1/jobs/svc/tasks/0/logs").json()["data"].count(
        "up") >= 2, what="restarted after exit 0")
    assert box.job("svc")["phase"] == "running"
    assert box.tasks("svc")[0]["state"] != "succeeded"


SERVER = r"""
import http.server, os, pathlib
ready = pathlib.Path(os.environ["PLAIT_DATA_DIR"]) / "ready"
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if ready.exists() else 503)
        self.end_headers()
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", int(os.environ["PLAIT_PORT"])), H).serve_forever()
"""


def _data_dir(box, job, index):
    for a in box.agents:
        task = a.tasks.get(f"{job}.{index}")
        if task is not None:
            return a.data_dir / "tasks" / task.key
    raise AssertionError(f"{job}.{index} is on no agent")


def test_an_http_probe_gates_service_discovery(box):
    box.api.post("/v1/jobs", json={
        "name": "gated", "entitlement": "e", "task_count": 1,
        "resources": {"cpu": 0.1, "memory_gb": 0.1}, "command": "python3",
        "args": ["-c", SERVER],
        "health": {"http": "/", "interval_seconds": 0.2, "failure_threshold": 2}})
    wait_for(lambda: [t["state"] for t in box.tasks("gated")] == ["running"], what="the task runs")
    probed_and_reported(box, "gated.0", 7)  # several probes fail (503)
    # not healthy, not in discovery
    assert box.serving("gated") == set()
    assert box.tasks("gated")[0]["healthy"] is False
    home = _data_dir(box, "gated", 0)
    (home / "ready").touch()
    wait_for(lambda: box.serving("gated") == {0}, what="enabled once the probe passes")
    (home / "ready").unlink()
    wait_for(lambda: box.serving("gated") == set(), what="disabled after failures")
    assert box.tasks("gated")[0]["state"] == "running"  # reported, not restarted


def test_a_command_probe(box):
    box.deploy("cmd", "sleep infinity", tasks=1,
               health={"command": ["sh", "-c", 'test -f "$PLAIT_DATA_DIR/ok"'],
                       "interval_seconds": 0.2, "failure_threshold": 1})
    wait_for(lambda: [t["state"] for t in box.tasks("cmd")] == ["running"], what="the task runs")
    probed_and_reported(box, "cmd.0", 5)  # its probe fails, again and again
    assert box.serving("cmd") == set()
    (_data_dir(box, "cmd", 0) / "ok").touch()
    wait_for(lambda: box.serving("cmd") == {0}, what="the command probe passes")


def test_the_desired_set_is_a_long_poll(box):
    url = "/v1/machines/m0000000/desired"
    # (a new agent is told to take the default profile once its first report said it
    # carries none: a change of its set)
    wait_for(lambda: box.api.get(url).json()["profile"]["switch"], what="the agent heard")
    first = box.api.get(url).json()
    # nothing changes: the answer comes after the wait, with the same generation
    same = box.api.get(url, params={"since": first["generation"], "wait": 0.5}).json()
    assert same["generation"] == first["generation"] and same["tasks"] == first["tasks"]
    # a change answers a waiting poll with the new set
    timer = threading.Timer(0.5, box.deploy, ("lp", "sleep infinity"),
                            {"tasks": 2, "policy": {"requirements": {
                                "max_tasks_per_machine": 1}}})
    timer.start()
    changed = box.api.get(url, params={"since": same["generation"], "wait": 50}).json()
    timer.join()
    assert changed["generation"] > same["generation"]
    assert [t["job"] for t in changed["tasks"]] == ["lp"]


def test_a_task_whose_port_was_taken_restarts_on_a_new_one(box):
    import re
    import socket

    box.deploy("p", 'echo "port $PLAIT_PORT"; sleep 1; exit 1', tasks=1)

    def ports():
        return re.findall(r"port (\d+)", box.api.get("/v1/jobs/p/tasks/0/logs").json()["data"])
    wait_for(lambda: ports(), what="the task prints its port")
    first = int(ports()[0])
    with socket.socket() as taken:  # something else takes the port while the task is down
        taken.bind(("127.0.0.1", first))
        taken.listen()
        wait_for(lambda: len(ports()) >= 2, what="the task restarts")
        assert int(ports()[1]) != first


def test_a_task_that_prints_a_lot_still_finishes(box):
    # 400 KB of output, then its last line; and NUL bytes, which JSON escapes six-fold
    box.deploy("loud", "yes x | head -c 400000; head -c 100000 /dev/zero; echo; echo end",
               tasks=1,
               restart={"policy": "never"})
    wait_for(lambda: box.job("loud")["phase"] == "complete", what="the job completes")
    assert box.api.get("/v1/jobs/loud/tasks/0/logs").json()["data"].rstrip().endswith("end")
    assert all(m["state"] == "healthy" for m in box.api.get("/v1/machines").json()["machines"])


def test_a_command_that_cannot_start_follows_the_restart_policy(box):
    box.api.post("/v1/jobs", json={
        "name": "typo", "entitlement": "e", "task_count": 1,
        "resources": {"cpu": 0.1, "memory_gb": 0.1}, "command": "no-such-command-plait",
        "restart": {"policy": "on-failure", "max_retries": 1}})
    wait_for(lambda: box.job("typo")["phase"] == "failed", what="the job fails")
    assert [(t["state"], t["exit_code"]) for t in box.tasks("typo")] == [("dead", 127)]


def test_an_agent_whose_long_poll_never_answers_gets_its_set_from_the_reports(
        tmp_path, monkeypatch):
    # the long-poll hangs (on a replica that stopped leading, say): the reports'
    # answers name a newer generation, and the agent pulls the set itself
    monkeypatch.setattr(Agent, "_poll", lambda self, *args: None)
    box = Box(tmp_path)
    try:
        box.deploy("caught", "sleep infinity")
        wait_for(lambda: [t["state"] for t in box.tasks("caught")] == ["running"] * 2,
                 what="both tasks run")
        ack = box.api.post("/v1/machines/m0000000/status", json={"tasks": []}).json()
        desired = box.api.get("/v1/machines/m0000000/desired").json()
        assert ack["generation"] == desired["generation"]
    finally:
        box.close()


def test_the_loop_sleeps_until_the_next_report_probe_or_restart(tmp_path):
    # pure: no control plane is reached
    from plait.agent.daemon import PROBE_SLACK, Task
    from plait.agent.probe import _State

    agent = Agent("m0000000", ["http://127.0.0.1:9"], None, tmp_path)
    try:
        assert agent._sleep(10.0, 10.7, 1.0) == pytest.approx(0.7)  # the next report
        assert agent._sleep(10.0, 30.0, 1.0) == pytest.approx(1.0)  # never past interval
        agent.prober.states["a.0"] = _State(next_due=10.3)
        assert agent._sleep(10.0, 10.7, 1.0) == pytest.approx(0.3 - PROBE_SLACK)
        agent.prober.states["a.0"].running = object()  # type: ignore[assignment]
        # a running probe's next time still counts, but not once it is past: its end
        # wakes the loop then
        assert agent._sleep(10.0, 10.7, 1.0) == pytest.approx(0.3 - PROBE_SLACK)
        assert agent._sleep(10.5, 10.7, 1.0) == pytest.approx(0.2)
        agent.tasks["b.0"] = Task("b", 0, 1, 1, exit_code=1, next_start=10.55)
        assert agent._sleep(10.5, 10.7, 1.0) == pytest.approx(0.05)  # b restarts then
        agent.tasks["b.0"].final = True  # never restarted: nothing to wake for
        assert agent._sleep(10.5, 10.7, 1.0) == pytest.approx(0.2)
        assert agent._sleep(11.0, 10.7, 1.0) == 0.0  # a report is overdue
    finally:
        agent.close()


def test_a_task_that_ignores_sigterm_never_holds_up_its_agent(box):
    """The stop runs in the background: heartbeats keep their pace, the task counts as
    stopping (not stopped) until it is killed at its kill timeout, and then it is gone."""
    box.deploy("stubborn", "trap '' TERM; while true; do sleep 0.1; done", tasks=1,
               kill_timeout_seconds=4)
    wait_for(lambda: [t["state"] for t in box.tasks("stubborn")] == ["running"],
             what="it runs")
    agent = next(a for a in box.agents if a.handles)
    pid = agent.handles["stubborn.0"].pid
    assert box.api.delete("/v1/jobs/stubborn").status_code == 202
    wait_for(lambda: agent.stopping, what="its agent stops it")
    gaps, last = [], box.cp.liveness.last.get(agent.machine, 0.0)
    stopped_at = None

    def sample() -> bool:  # (every 0.1 s: the beats' pace during the stop)
        nonlocal last, stopped_at
        now = box.cp.liveness.last.get(agent.machine, 0.0)
        if now != last:
            gaps.append(now - last)
            last = now
        running = alive(pid)
        if running:  # still stopping: the job waits for it (never two copies)
            assert box.api.get("/v1/jobs/stubborn").status_code == 200
        elif stopped_at is None:
            stopped_at = time.monotonic()
        return stopped_at is not None and box.api.get("/v1/jobs/stubborn").status_code == 404

    wait_for(sample, 30, "killed at its kill timeout, and the job gone", poll=0.1)
    assert stopped_at is not None, "killed at its kill timeout"
    assert box.api.get("/v1/jobs/stubborn").status_code == 404
    assert gaps and max(gaps) < 3.0, gaps  # beats went on during the 4 s stop
    assert not agent.stopping


def test_discovery_survives_an_agent_restart_and_a_control_plane_restart(box, tmp_path):
    """Endpoints and health are kept: an adopted task stays in discovery while its new
    agent's probe starts over, and a restarted control plane lists its endpoint at once."""
    box.api.post("/v1/jobs", json={
        "name": "kept", "entitlement": "e", "task_count": 1,
        "resources": {"cpu": 0.1, "memory_gb": 0.1}, "command": "python3",
        "args": ["-c", SERVER],
        "health": {"http": "/", "interval_seconds": 0.3, "failure_threshold": 3}})
    wait_for(lambda: [t["state"] for t in box.tasks("kept")] == ["running"], what="it runs")
    (_data_dir(box, "kept", 0) / "ready").touch()
    wait_for(lambda: box.serving("kept") == {0}, what="in discovery")
    # the agent restarts (as after a crash or an upgrade): its task runs on, adopted
    k = next(i for i, a in enumerate(box.agents) if a.tasks)
    old = box.agents[k]
    machine, data_dir = old.machine, old.data_dir
    box.stop.set()
    for t in box.threads:
        t.join(timeout=30)
    old.close()
    box.stop.clear()
    new = Agent(machine, [box.server.url], None, data_dir)
    assert new.handles  # adopted
    box.agents[k] = new
    box.threads = [threading.Thread(target=a.run, args=(0.1, box.stop), daemon=True)
                   for a in box.agents]
    for t in box.threads:
        t.start()
    seen = set()

    def sample() -> bool:  # (every 0.1 s) until the new agent has probed it ten times
        found = box.api.get("/v1/discovery/kept").json()["endpoints"]
        seen.add(tuple((e["index"], e["endpoint"]) for e in found))
        probe = new.prober.states.get("kept.0")
        return probe is not None and probe.checks >= 10

    wait_for(sample, what="ten probes of the adopted task", poll=0.1)
    endpoint = f"127.0.0.1:{new.tasks['kept.0'].port}"
    assert seen == {((0, endpoint),)}, seen  # never gone, never without its endpoint
    # a second control plane over the same store (a restart, or a new leader) lists it
    # with its endpoint before any agent has reported to it
    box.cp.loop.step()
    again = ControlPlane(box.cp.store, box.cp.config)
    assert again.views.discovery("kept") == [
        {"index": 0, "machine": machine, "endpoint": endpoint}]


def test_a_task_killed_from_outside_is_reported_as_such(box):
    """Its agent reports a SIGKILL it did not send, and that its memory cgroup does not
    count as out of memory, as killed from outside: the control plane restarts the
    task without counting it against its version. Without a memory cgroup the agent
    cannot tell, and says nothing."""
    box.deploy("victim", "while true; do sleep 0.1; done", tasks=1)
    wait_for(lambda: [t["state"] for t in box.tasks("victim")] == ["running"],
             what="it runs")
    agent = next(a for a in box.agents if a.handles)
    handle = agent.handles["victim.0"]
    told = agent.runtime.oom_killed(handle) is not None
    os.kill(handle.pid, signal.SIGKILL)

    def killed_events():
        events = box.api.get("/v1/events", params={"kind": "task_killed"}).json()["events"]
        return [e for e in events if e["job"] == "victim"]

    wait_for(lambda: "victim.0" in agent.handles and agent.handles["victim.0"].pid
             != handle.pid, what="its agent starts it again")
    wait_for(lambda: [t["state"] for t in box.tasks("victim")] == ["running"],
             what="it runs again")
    if told:
        wait_for(lambda: killed_events(), what="a task_killed event")
    else:
        assert killed_events() == []


def test_one_agent_per_data_dir(tmp_path):
    """A second agent on a machine's data dir (a restart by hand while `plait up`
    restarted it too) is refused, naming the one that runs: two would each run the
    machine's tasks. The lock goes with the agent, however it ends."""
    first = Agent("m0000000", ["http://127.0.0.1:9"], None, tmp_path)
    with pytest.raises(RuntimeError, match=rf"another agent \(pid {os.getpid()}\) runs on"):
        Agent("m0000000", ["http://127.0.0.1:9"], None, tmp_path)
    first.close()
    Agent("m0000000", ["http://127.0.0.1:9"], None, tmp_path).close()
    # a SIGKILLed agent's lock is gone with it
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from pathlib import Path; from plait.agent.daemon import "
        "lock_data_dir; lock_data_dir(Path(sys.argv[1])); print('locked', flush=True); "
        "time.sleep(600)"), str(tmp_path)], stdout=subprocess.PIPE)
    assert holder.stdout is not None and holder.stdout.readline() == b"locked\n"
    with pytest.raises(RuntimeError, match=rf"pid {holder.pid}"):
        Agent("m0000000", ["http://127.0.0.1:9"], None, tmp_path)
    holder.kill()
    holder.wait(timeout=30)
    Agent("m0000000", ["http://127.0.0.1:9"], None, tmp_path).close()


def test_a_start_is_saved_before_the_agent_reports_it(box):
    """An agent killed between a task's start and its report (the control plane does
    not answer) comes back with the task's process adopted: never a second copy."""
    wait_for(lambda: all(a.reachable and a.profile.applied is not None
                         and a.profile.may_start() for a in box.agents),
             what="the agents carry their host profile")
    box.stop.set()
    for t in box.threads:
        t.join(timeout=30)
    agent = box.agents[0]
    box.stop.clear()

    def unreachable(now):
        raise ConnectionError("the control plane does not answer (a test)")
    agent._report = unreachable
    box.api.post("/v1/jobs", json={
        "name": "once", "entitlement": "e", "task_count": 2, "command": "sleep",
        "args": ["300"], "resources": {"cpu": 0.1, "memory_gb": 0.1}})

    def started() -> bool:
        with contextlib.suppress(ConnectionError):
            agent.step()
        return bool(agent.handles)
    wait_for(started, what="a task starts on the first agent")
    (key, handle), = agent.handles.items()
    saved = json.loads((agent.data_dir / "agent.json").read_text())
    assert saved["tasks"][key]["handle"]["pid"] == handle.pid  # (before any report)
    # as after a SIGKILL: the state file is all the next agent has
    agent.close()
    again = Agent(agent.machine, [box.server.url], None, agent.data_dir)
    box.agents[0] = again
    assert again.handles[key].pid == handle.pid
    again.step()
    assert again.handles[key].pid == handle.pid and len(again.handles) == 1


def test_what_a_tasks_process_leaves_running_goes_with_it(box):
    """A task whose main process exits leaving a child behind: the child is killed
    with it (it held the task's cgroups, so that no restart could start, or ran on
    beside the restart as a second copy), and each restart runs."""
    box.deploy("leaves", 'sleep 299 & echo "child $!"; sleep 0.3; exit 1', tasks=1,
               restart={"policy": "always"})
    wait_for(lambda: any("leaves.0" in a.tasks for a in box.agents), what="it starts")
    agent = next(a for a in box.agents if "leaves.0" in a.tasks)

    def children() -> list[int]:
        text = "".join(p.read_text() for p in (agent.data_dir / "logs").glob("*leaves.0.log*"))
        return [int(line.split()[1]) for line in text.splitlines() if line.startswith("child ")]
    wait_for(lambda: len(children()) >= 3, what="three runs of it started")
    assert [pid for pid in children()[:-1] if alive(pid)] == []  # (each went with its run)


def test_a_burst_of_output_does_not_hold_back_what_follows(box):
    """A task that prints megabytes at once: its agent sends the control plane (which
    keeps the last 64 KiB of a task's output) the newest part, saying how much it left
    out, so the lines after the burst show at once; it used to send every byte, 64 KiB
    a report (45 s for 5 MB). The agent's own log keeps all of it."""
    box.deploy("burst", "python3 -c \"print('x' * 3000000)\"; echo after-the-burst; "
                        "sleep infinity", tasks=1)

    def logs():
        return box.api.get("/v1/jobs/burst/tasks/0/logs").json()["data"]
    wait_for(lambda: "after-the-burst" in logs(), what="the line after the burst")
    page = box.api.get("/v1/jobs/burst/tasks/0/logs").json()
    said = page["data"]
    assert "bytes of output not sent here" in said
    left_out = [int(part.split(" ", 1)[0]) for part in said.split("[plait: ")[1:]]
    assert all(0 < n < 3_000_000 for n in left_out)
    # (the burst may be read while it is written: then in two or more skips, each with
    # its note, the first perhaps past the tail kept; what was sent in all is small)
    assert page["next"] < 1_000_000, page["next"]
    # the machine's own log of the task holds every byte
    (handle,) = [a.handles["burst.0"] for a in box.agents if "burst.0" in a.handles]
    assert handle.log_path.stat().st_size > 3_000_000
