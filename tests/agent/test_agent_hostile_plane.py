"""An agent facing a control plane that answers garbage or drips its answers: its
tasks keep running as they are, its heartbeats go on, and no request holds its loop
past a deadline. (Liveness bounds only: nothing asserts speed.)"""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from plait.agent.daemon import Agent, BadDesired, JoinRefused, Task, checked_desired
from plait.model import JobSpec
from plait.testing import wait_for


def wire_spec(**fields: object) -> dict[str, object]:
    """A job's spec as the control plane sends it (the wire's ``JobSpec``)."""
    return JobSpec.model_validate({"name": "a", "entitlement": "e", "task_count": 1,
                                   "command": "sleep", "args": ["60"],
                                   "resources": {"cpu": 0.1, "memory_gb": 0.1},
                                   **fields}).model_dump(mode="json")


GOOD_TASK = {"job": "a", "index": 0, "revision": 1, "spec": wire_spec()}


@pytest.mark.parametrize("desired", [
    None, [], {"generation": 1}, {"tasks": "x"}, {"tasks": [], "generation": "1"},
    {"tasks": [{**GOOD_TASK, "spec": {"command": "sleep"}}]},  # (no resources)
    {"tasks": [{k: v for k, v in GOOD_TASK.items() if k != "index"}]},
    {"tasks": [{**GOOD_TASK, "index": True}]},
    {"tasks": [GOOD_TASK, {**GOOD_TASK, "spec": {**GOOD_TASK["spec"], "env": ["X=1"]}}]},
    {"tasks": [], "stopping": [{"job": "a"}]},
    {"tasks": [{**GOOD_TASK, "credential": 1}]},
    {"tasks": [{**GOOD_TASK, "spec": {**GOOD_TASK["spec"], "restart": {"policy": "x"}}}]},
])
def test_a_malformed_desired_set_is_refused_whole(desired) -> None:
    with pytest.raises(BadDesired):
        checked_desired(desired)


def test_a_well_formed_desired_set_is_taken() -> None:
    desired = {"generation": 3, "tasks": [GOOD_TASK, {**GOOD_TASK, "index": 1,
                                                      "credential": "ptc_00"}],
               "stopping": [{"job": "b", "index": 1}]}
    taken = checked_desired(desired)
    assert taken.generation == 3 and [t.key for t in taken.tasks] == ["a.0", "a.1"]
    assert taken.tasks[0].spec.restart.policy == "always"  # (the model's default, not restated)
    assert taken.tasks[1].credential == "ptc_00" and taken.stopping[0].index == 1
    assert "profile" not in taken.model_fields_set and not taken.profile_unknown


def test_a_spec_from_a_newer_control_plane_is_taken_without_the_fields_it_adds() -> None:
    """A control plane is upgraded before its agents: a field its spec gained (at the
    top, or in a nested part of it) is left out, and every field the agent knows is
    still checked by its model."""
    newer = {**GOOD_TASK["spec"], "a_new_field": {"x": 1},
             "restart": {**GOOD_TASK["spec"]["restart"], "jitter": 0.5},
             "resources": {**GOOD_TASK["spec"]["resources"], "gpus": 1}}
    taken = checked_desired({"tasks": [{**GOOD_TASK, "spec": newer}]})
    spec = taken.tasks[0].spec
    assert spec.command == "sleep" and spec.resources.cpu == 0.1
    assert spec.restart.policy == "always"
    with pytest.raises(BadDesired):  # (a known field still obeys the model)
        checked_desired({"tasks": [{**GOOD_TASK, "spec": {**newer, "resources": {
            **newer["resources"], "cpu": -1}}}]})


class Plane(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, desired: bytes, drip: bool = False) -> None:
        self.desired, self.drip = desired, drip
        self.reports = 0
        self.stop = threading.Event()
        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class Handler(http.server.BaseHTTPRequestHandler):
    server: Plane

    def log_message(self, *args: object) -> None:
        pass

    def _answer(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not self.server.drip:
            self.wfile.write(body)
            return
        for byte in body:  # a byte now and then, never the whole answer in time
            if self.server.stop.wait(0.2):
                return
            self.wfile.write(bytes([byte]))
            self.wfile.flush()

    def do_GET(self) -> None:
        self._answer(self.server.desired)

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", 0))
        self.rfile.read(length)
        if self.path.endswith("/join"):
            body = {"machine": "m0", "token": "t", "id": "i"}
        else:
            self.server.reports += 1
            body = {"machine": "m0", "accepted": 0, "generation": 1}
        self._answer(json.dumps(body).encode())


@pytest.fixture
def planes() -> Iterator[list[Plane]]:
    made: list[Plane] = []
    yield made
    for plane in made:
        plane.stop.set()
        plane.shutdown()
        plane.server_close()


def test_a_malformed_desired_set_stops_no_heartbeat(planes, tmp_path: Path) -> None:
    bad = {"generation": 1, "tasks": [{**GOOD_TASK, "spec": {"command": "sleep"}}]}
    plane = Plane(json.dumps(bad).encode())
    planes.append(plane)
    agent = Agent("m0", [plane.url], "join", tmp_path / "agent", timeout=2.0)
    stop = threading.Event()
    runner = threading.Thread(target=agent.run, args=(0.2, stop), daemon=True)
    runner.start()
    try:
        wait_for(lambda: plane.reports >= 5, what="the heartbeats go on")
        assert agent.handles == {}  # (nothing started from a set read in part)
    finally:
        stop.set()
        runner.join(timeout=30)
        agent.shutdown()
        agent.close()


def test_a_dripping_answer_fails_at_its_deadline(planes, tmp_path: Path) -> None:
    plane = Plane(json.dumps({"generation": 1, "tasks": []}).encode() * 1000, drip=True)
    planes.append(plane)
    agent = Agent("m0", [plane.url], None, tmp_path / "agent", timeout=0.5)
    agent.token = "t"
    failed: list[BaseException] = []

    def pull() -> None:
        try:
            agent._pull(0.0, None)
        except BaseException as exc:
            failed.append(exc)
    puller = threading.Thread(target=pull, daemon=True)
    puller.start()
    puller.join(timeout=60)  # (a liveness bound: without a deadline it never ends)
    assert not puller.is_alive()
    assert failed and isinstance(failed[0], (ConnectionError, httpx.TimeoutException))
    plane.stop.set()
    agent.close()


def test_stops_that_wait_out_their_kill_timeout_hold_up_no_other_stop(tmp_path: Path) -> None:
    """Tasks that ignore SIGTERM keep their stops waiting for their whole kill
    timeout (up to an hour): another task's stop (fencing, say) goes on meanwhile."""
    from plait.agent.daemon import Stopping

    agent = Agent("m0", ["http://127.0.0.1:9"], None, tmp_path / "agent")
    release = threading.Event()
    stopped: list[str] = []

    class Stuck:
        def stop(self, handle: object, grace: float) -> None:
            if handle == "stubborn":
                release.wait(60)
            stopped.append(str(handle))
    agent.runtime = Stuck()  # type: ignore[assignment]
    try:
        for k in range(16):
            agent._stop_later(f"s.{k}", Stopping("s", k, 1, {}, 3600.0, False), "stubborn")
        agent._stop_later("other.0", Stopping("other", 0, 1, {}, 10.0, False), "other")
        wait_for(lambda: "other" in stopped, what="the other task stopped", poll=0.01)
        assert stopped == ["other"]
    finally:
        release.set()
        agent.close()


@pytest.mark.parametrize(("answer", "stops", "token"), [
    # another agent heard after this one's refusals began: it took the machine over
    (JoinRefused("m0", 409, "a live agent", heard_ago=0.5), True, None),
    # heard no later than this agent's own last beats: perhaps this agent itself
    (JoinRefused("m0", 409, "a live agent", heard_ago=9.0), False, "old"),
    (JoinRefused("m0", 409, "a live agent"), False, "old"),
    # a join refused otherwise, or no answer: nothing learnt, nothing stopped
    (JoinRefused("m0", 401, "invalid token"), False, "old"),
    (ConnectionError("no control plane reachable"), False, "old"),
    # joined: the credential had been revoked, or lost; the tasks go on
    (None, False, "new"),
])
def test_a_refused_credential_stops_the_tasks_only_when_another_agent_took_the_machine(
        tmp_path: Path, answer: Exception | None, stops: bool, token: str | None) -> None:
    """A refusal alone stops nothing (a control plane refusing every agent for a while
    must not stop the region): the agent joins again, and only a refusal naming an
    agent heard since its own beats were refused stops its tasks, files kept."""
    from plait.agent import daemon

    agent = Agent("m0", ["http://127.0.0.1:9"], "join", tmp_path / "agent")
    try:
        agent.token = "old"
        agent.tasks = {"web.0": Task("web", 0, 1, 0)}
        stopped: list[tuple[str, bool]] = []
        agent._stop = lambda key, remove=False, reason="", cause=None: (  # type: ignore
            stopped.append((key, remove)))

        def join() -> None:
            if answer is None:
                agent.token = "new"
                return
            raise answer
        agent.join = join  # type: ignore[method-assign]
        agent._refused(100.0)
        agent._refused(100.0 + daemon.REVOKED_AFTER - 1)
        assert stopped == [] and agent.token == "old"
        agent._refused(100.0 + daemon.REVOKED_AFTER + 1)
        assert stopped == ([("web.0", False)] if stops else [])
        assert agent.token == token and bool(agent.tasks) is not stops
    finally:
        agent.close()
