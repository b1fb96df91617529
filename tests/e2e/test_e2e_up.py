"""`plait up`: a region on one box, stopped with Ctrl-C, brought back, and surviving
a SIGKILL of its control plane. Liveness bounds only; nothing asserts speed."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
from test_e2e_agents import WEB, alive, answers, wait_for

from plait.harness.region import cmdline, kill_groups, processes_under
from plait.testing import free_port


def task_pids(data: Path) -> dict[str, int]:
    pids = {}
    for state in (data / "agents").glob("*/agent.json"):
        for key, task in json.loads(state.read_text())["tasks"].items():
            if task["handle"]:
                pids[key] = task["handle"]["pid"]
    return pids


def test_up_stop_up_again_and_survive_a_killed_control_plane(tmp_path):
    data, port = tmp_path / "region", free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "PLAIT_CONFIG": str(tmp_path / "config.yaml")}

    def up(machines: str = "4") -> subprocess.Popen[bytes]:
        proc = subprocess.Popen([sys.executable, "-m", "plait.cli.main", "up", "--data-dir",
                                 str(data), "--machines", machines, "--port", str(port),
                                 "--heartbeat-timeout", "3"], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        wait_for(lambda: httpx.get(f"{url}/healthz").status_code == 200, what="plait up")
        return proc

    def endpoints(admin: httpx.Client) -> dict[int, str]:
        found = admin.get("/v1/discovery/web").json()["endpoints"]
        return {e["index"]: e["endpoint"] for e in found if e["endpoint"]}

    proc = up()
    try:
        token = (data / "admin-token").read_text().strip()
        admin = httpx.Client(base_url=url, timeout=30,
                             headers={"Authorization": f"Bearer {token}"})
        admin.post("/v1/entitlements", json={"name": "web", "owner": "o",
                                             "quota": {"machines": 4}})
        assert admin.post("/v1/jobs", json=WEB).status_code == 201
        wait_for(lambda: len(endpoints(admin)) == 3 and all(
            answers(e) for e in endpoints(admin).values()), what="the job serves")
        first = task_pids(data)
        assert len(first) == 3

        # Ctrl-C: the agents and their tasks stop
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0
        wait_for(lambda: not any(alive(p) for p in first.values()), what="tasks stopped")

        # up again: the job comes back and serves again
        proc = up()
        wait_for(lambda: len(endpoints(admin)) == 3 and all(
            answers(e) for e in endpoints(admin).values()), what="the job serves again")
        second = task_pids(data)

        # the control plane alone is killed: agents and tasks keep serving, and the
        # next `plait up` adopts them without restarting any task
        proc.kill()
        proc.wait(timeout=30)
        time.sleep(1)  # (the subject is time: a while with no control plane, from outside)
        assert all(alive(p) for p in second.values())
        assert all(answers(e) for e in endpoints_from_state(data).values())
        proc = up(machines="5")  # (a region's size is its own: said, and ignored)
        output = b""
        wait_for(lambda: len(endpoints(admin)) == 3, what="the tasks are adopted")
        time.sleep(2)  # (the subject is time: agents' steps after the adoption, from outside)
        assert task_pids(data) == second
        assert all(alive(p) for p in second.values())
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            output = proc.communicate(timeout=60)[0]
        except subprocess.TimeoutExpired:
            proc.kill()
            output = proc.communicate()[0]
        for pid in task_pids(data).values():
            if alive(pid):
                os.killpg(pid, signal.SIGKILL)
    assert b"adopted" in output
    said = " ".join(output.decode(errors="replace").split())
    assert said.count("ignored") == 1  # (once)
    assert f"{data} holds a region of 4 machines already: --machines 5 ignored" in said


def endpoints_from_state(data: Path) -> dict[str, str]:
    found = {}
    for state in (data / "agents").glob("*/agent.json"):
        for key, task in json.loads(state.read_text())["tasks"].items():
            if task["handle"]:
                found[key] = f"127.0.0.1:{task['port']}"
    return found


def test_up_with_replicas_survives_the_loss_of_its_own_process(tmp_path):
    """`plait up --replicas 2`: the replica it starts takes over when `plait up` itself
    (the leader) is killed; the next `plait up` adopts that replica, the agents and
    their tasks; Ctrl-C stops every one of them."""
    data, port = tmp_path / "region", free_port(size=2)
    urls = [f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port + 1}"]
    env = {**os.environ, "PLAIT_CONFIG": str(tmp_path / "config.yaml")}

    def up() -> subprocess.Popen[bytes]:
        proc = subprocess.Popen([sys.executable, "-m", "plait.cli.main", "up", "--data-dir",
                                 str(data), "--machines", "3", "--port", str(port),
                                 "--heartbeat-timeout", "3", "--replicas", "2"], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        wait_for(lambda: httpx.get(f"{urls[0]}/healthz").status_code == 200, what="plait up")
        return proc

    def role(url: str) -> str | None:
        try:
            return httpx.get(f"{url}/healthz", timeout=2).json().get("role")
        except httpx.HTTPError:
            return None

    proc = up()
    replica = None
    try:
        # plait up's own process leads; on a box that stalls it for a session timeout
        # (1 s, decision 36) while its replica starts, the replica leads and keeps the
        # lead, and what follows holds all the same (takeovers: test_e2e_replicas)
        wait_for(lambda: {role(urls[0]), role(urls[1])} == {"leader", "follower"},
                 what="one leads, one follows", logs=data)
        replica = int((data / "replicas" / "1.pid").read_text())
        token = (data / "admin-token").read_text().strip()
        # a client of the follower: its requests are served by the leader
        admin = httpx.Client(base_url=urls[1], timeout=30,
                             headers={"Authorization": f"Bearer {token}"})
        admin.post("/v1/entitlements", json={"name": "web", "owner": "o",
                                             "quota": {"machines": 3}})
        assert admin.post("/v1/jobs", json=WEB).status_code == 201
        wait_for(lambda: len(task_pids(data)) == 3 and all(
            t["state"] == "running" for t in admin.get("/v1/jobs/web/tasks").json()["tasks"]),
            what="the job runs")
        first = task_pids(data)

        proc.kill()  # `plait up` (the leader) dies; its replica and the agents do not
        proc.wait(timeout=30)
        wait_for(lambda: role(urls[1]) == "leader", what="the replica takes over", logs=data)
        assert admin.post("/v1/jobs", json={**WEB, "name": "web2", "task_count": 0}
                          ).status_code == 201
        time.sleep(4)  # past the heartbeat timeout (the subject): agents beat to the new leader
        events = admin.get("/v1/events", params={"limit": 1000}).json()["events"]
        assert not [e for e in events if e["kind"] == "machine_unreachable"]
        assert task_pids(data) == first and all(alive(p) for p in first.values())

        proc = up()  # adopts the replica (still leading), the agents and the tasks
        wait_for(lambda: role(urls[0]) == "follower", what="the new process follows")
        assert int((data / "replicas" / "1.pid").read_text()) == replica
        assert task_pids(data) == first
        assert {j["name"] for j in admin.get("/v1/jobs").json()["jobs"]} == {"web", "web2"}
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            output = proc.communicate(timeout=60)[0]
        except subprocess.TimeoutExpired:
            proc.kill()
            output = proc.communicate()[0]
        left = processes_under(data)  # (only when this test failed)
        kill_groups(left)
    assert proc.returncode == 0, output.decode(errors="replace")
    assert not left, [cmdline(p) for p in left]  # Ctrl-C stopped every process
    assert replica is not None and not alive(replica)
    assert not any(alive(p) for p in first.values())


def test_ctrl_c_stops_agents_and_replicas_restarted_by_hand(tmp_path):
    """An agent and a replica killed and started again by hand (same command line, as
    an operator would) are plait up's too: Ctrl-C leaves no process of the region."""
    data, port = tmp_path / "region", free_port(size=2)
    urls = [f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port + 1}"]
    env = {**os.environ, "PLAIT_CONFIG": str(tmp_path / "config.yaml")}
    proc = subprocess.Popen([sys.executable, "-m", "plait.cli.main", "up", "--data-dir",
                             str(data), "--machines", "3", "--port", str(port),
                             "--heartbeat-timeout", "3", "--replicas", "2"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    hand: list[subprocess.Popen[bytes]] = []
    left: set[int] = set()
    try:
        wait_for(lambda: httpx.get(f"{urls[0]}/healthz").status_code == 200, what="plait up")
        token = (data / "admin-token").read_text().strip()
        admin = httpx.Client(base_url=urls[0], timeout=30,
                             headers={"Authorization": f"Bearer {token}"})
        admin.post("/v1/entitlements", json={"name": "web", "owner": "o",
                                             "quota": {"machines": 3}})
        assert admin.post("/v1/jobs", json=WEB).status_code == 201
        wait_for(lambda: len(task_pids(data)) == 3, what="the job runs")

        def restart_by_hand(pid: int) -> None:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:-1]
            environ = dict(e.split(b"=", 1) for e in Path(
                f"/proc/{pid}/environ").read_bytes().split(b"\0") if b"=" in e)
            os.kill(pid, signal.SIGKILL)
            wait_for(lambda: not alive(pid), what="killed")
            hand.append(subprocess.Popen(argv, env=environ, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.DEVNULL, start_new_session=True))

        agent_pid = int(next((data / "agents").glob("*/agent.pid")).read_text())
        replica_pid = int((data / "replicas" / "1.pid").read_text())
        restart_by_hand(agent_pid)
        restart_by_hand(replica_pid)
        wait_for(lambda: all(alive(p.pid) for p in hand), what="restarted by hand")
        time.sleep(2)  # (the subject is time: the agent adopts its tasks, the replica campaigns)
        assert all(p.poll() is None for p in hand)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            output = proc.communicate(timeout=90)[0]
        except subprocess.TimeoutExpired:
            proc.kill()
            output = proc.communicate()[0]
        for p in hand:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=10)  # (reaped here: they are this test's children)
        left = {p for p in processes_under(data) if alive(p)}
        kill_groups(left)
    assert proc.returncode == 0, output.decode(errors="replace")
    assert not left, [cmdline(p) for p in left]
    assert all(p.poll() is not None for p in hand)


def test_up_on_a_taken_port_says_so_and_starts_nothing(tmp_path):
    # it started its agents, then failed with a traceback when its API could not
    # listen, and the agents ran on with nothing to join
    import socket

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "plait.cli.main", "up", "--data-dir",
             str(tmp_path / "region"), "--machines", "2", "--port", str(port)],
            capture_output=True, text=True, timeout=120,
            env={**os.environ, "PLAIT_CONFIG": str(tmp_path / "config.yaml")})
    assert done.returncode == 2, done.stderr
    said = " ".join(done.stderr.split())
    assert f"cannot listen on 127.0.0.1:{port}" in said and "Traceback" not in said
    assert not (tmp_path / "region" / "agents").exists()  # no agent was started


def test_up_on_a_taken_replica_port_says_so_and_starts_nothing(tmp_path):
    # its replicas listen on PORT+1...: one that could not went unnoticed (the region
    # ran with a replica less, and the test that waited for it timed out saying nothing)
    import socket

    port = free_port(size=2)
    with socket.socket() as held:
        held.bind(("127.0.0.1", port + 1))
        held.listen()
        done = subprocess.run(
            [sys.executable, "-m", "plait.cli.main", "up", "--data-dir",
             str(tmp_path / "region"), "--machines", "2", "--port", str(port),
             "--replicas", "2"],
            capture_output=True, text=True, timeout=120,
            env={**os.environ, "PLAIT_CONFIG": str(tmp_path / "config.yaml")})
    assert done.returncode == 2, done.stderr
    said = " ".join(done.stderr.split())
    assert f"cannot listen on 127.0.0.1:{port + 1}" in said and "Traceback" not in said
    assert f"plait up listens on {port}-{port + 1}" in said
    assert not (tmp_path / "region" / "agents").exists()


def interrupt(proc: subprocess.Popen[bytes]) -> None:
    """Ctrl-C ``plait up``, and wait for it (killed past a minute)."""
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def up_logged(tmp_path: Path, data: Path, *args: str) -> tuple[subprocess.Popen[bytes], Path]:
    """``plait up`` on ``data`` with ``args``, its output in a file (read as it runs)."""
    out = tmp_path / "up.out"
    with open(out, "wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "plait.cli.main", "up", "--data-dir", str(data), *args],
            env={**os.environ, "PLAIT_CONFIG": str(tmp_path / "config.yaml")},
            stdout=sink, stderr=subprocess.STDOUT)
    return proc, out


def test_up_says_when_a_replica_or_an_agent_it_started_exits(tmp_path):
    # a replica killed while `plait up` ran stayed a zombie, and nothing was said: the
    # region ran on with a replica less, looking whole
    data, port = tmp_path / "region", free_port(size=2)
    proc, out = up_logged(tmp_path, data, "--machines", "2", "--port", str(port),
                          "--replicas", "2")
    try:
        wait_for(lambda: b"CLI configured" in out.read_bytes(), what="plait up",
                 logs=data)
        replica = int((data / "replicas" / "1.pid").read_text())
        agent = int(next((data / "agents").glob("*/agent.pid")).read_text())
        machine = next((data / "agents").glob("*/agent.pid")).parent.name
        os.kill(replica, signal.SIGKILL)
        os.kill(agent, signal.SIGKILL)
        said = lambda: " ".join(out.read_text().split())  # noqa: E731
        wait_for(lambda: "replica 1 exited with -9 and is not restarted" in said()
                 and f"agent {machine} exited with -9, and nothing of its machine runs: "
                 "the machine is taken as dead and not restarted" in said(),
                 what="the warnings", logs=data)
        # reaped: no zombie left (a zombie keeps its /proc entry)
        assert not Path(f"/proc/{replica}").exists() and not Path(f"/proc/{agent}").exists()
        time.sleep(2)  # (the subject is time: `plait up` watches on, and says it once)
        assert said().count("replica 1 exited") == 1  # (once)
        assert said().count(f"agent {machine} exited") == 1
        # (its machine ran nothing: not restarted)
        assert (data / "agents" / machine / "agent.pid").read_text().strip() == str(agent)
    finally:
        interrupt(proc)


def copies(data: Path, job: str) -> dict[int, set[int]]:
    """The processes that run each task of ``job`` in the region (by their environment;
    a task's children are not counted)."""
    found: dict[int, set[int]] = {}
    for pid in processes_under(data.resolve()):
        try:
            env = dict(e.split(b"=", 1) for e in Path(f"/proc/{pid}/environ").read_bytes()
                       .split(b"\0") if b"=" in e)
            parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError):
            continue
        try:
            parent_env = Path(f"/proc/{parent}/environ").read_bytes()
        except OSError:  # (init, or gone)
            parent_env = b""
        if env.get(b"PLAIT_JOB") == job.encode() and alive(pid) and \
                b"PLAIT_TASK_INDEX=" not in parent_env:
            found.setdefault(int(env[b"PLAIT_TASK_INDEX"]), set()).add(pid)
    return found


def test_an_agent_killed_while_its_tasks_run_is_restarted_and_adopts_them(tmp_path):
    # a SIGKILLed agent's task ran on, out of plait's control, while the control plane
    # took the machine for failed and started a replacement elsewhere: two copies of
    # one task, until a next `plait up` restarted the agent
    data, port = tmp_path / "region", free_port(size=1)
    proc, out = up_logged(tmp_path, data, "--machines", "3", "--port", str(port),
                          "--heartbeat-timeout", "3")
    try:
        wait_for(lambda: b"CLI configured" in out.read_bytes(), what="plait up", logs=data)
        token = (data / "admin-token").read_text().strip()
        admin = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30,
                             headers={"Authorization": f"Bearer {token}"})
        admin.post("/v1/entitlements", json={"name": "web", "owner": "o",
                                             "quota": {"machines": 3}})
        assert admin.post("/v1/jobs", json={**WEB, "task_count": 2}).status_code == 201
        wait_for(lambda: len(copies(data, "web")) == 2, what="the job runs", logs=data)
        before = copies(data, "web")
        state = next(p for p in (data / "agents").glob("*/agent.json")
                     if json.loads(p.read_text())["tasks"])
        machine = state.parent.name
        agent = int((state.parent / "agent.pid").read_text())
        os.kill(agent, signal.SIGKILL)
        # past the heartbeat timeout, with room on the third machine for a replacement:
        # the same processes run the tasks, once each
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline:
            assert copies(data, "web") == before
            time.sleep(0.25)  # (sampling past the heartbeat timeout: the subject is time)
        said = " ".join(out.read_text().split())
        assert f"agent {machine} exited with -9 while 1 processes of its tasks ran: " \
            "restarted" in said, said
        new = int((data / "agents" / machine / "agent.pid").read_text())
        assert new != agent and alive(new) and not Path(f"/proc/{agent}").exists()  # (reaped)
        # and no task was lost or moved
        kinds = [e["kind"] for e in admin.get("/v1/events", params={"limit": 1000})
                 .json()["events"]]
        assert "machine_unreachable" not in kinds and "task_lost" not in kinds, kinds
        tasks = admin.get("/v1/jobs/web/tasks").json()["tasks"]
        assert sorted(t["state"] for t in tasks) == ["running", "running"], tasks
    finally:
        interrupt(proc)


def test_a_second_up_on_a_data_dir_in_use_is_refused(tmp_path):
    # it was accepted on another port: two control planes led one region, the store
    # went to whichever wrote last, every machine ended up failed, and stopping one
    # stopped the other's agents and tasks
    data, port = tmp_path / "region", free_port(size=2)
    env = {**os.environ, "PLAIT_CONFIG": str(tmp_path / "config.yaml")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "plait.cli.main", "up", "--data-dir", str(data),
         "--machines", "2", "--port", str(port)], env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200,
                 what="plait up", logs=data)
        agents = {p.name: int(p.read_text()) for p in (data / "agents").glob("*/agent.pid")}
        second = subprocess.run(
            [sys.executable, "-m", "plait.cli.main", "up", "--data-dir", str(data),
             "--machines", "2", "--port", str(port + 1)],
            capture_output=True, text=True, timeout=120, env=env)
        assert second.returncode == 2, second.stderr
        said = " ".join(second.stderr.split())
        assert f"another plait up (pid {proc.pid}) runs the region of {data}" in said
        assert httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200
        assert all(alive(pid) for pid in agents.values())  # (nothing of it was touched)
    finally:
        interrupt(proc)
    # once it has stopped, the data dir is free again
    wait_for(lambda: not any(alive(pid) for pid in agents.values()), what="agents stopped")
