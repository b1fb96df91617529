"""The HTTP transport against a small local controller (the only tests here that
open a socket, on 127.0.0.1)."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest

from plait.model import TaskRef
from plait.taskcontrol import (
    OneAtATime,
    OpKind,
    TaskControlRequest,
    TaskOp,
    request_from_wire,
    response_to_wire,
)
from plait.taskcontrol.http import HttpController, TaskControlError, http_leader


class Handler(BaseHTTPRequestHandler):
    controller = None
    mode = "ok"
    seen: ClassVar[list] = []

    def log_message(self, *args):
        pass

    def do_GET(self):
        self._reply(200, {"leader": 2})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        Handler.seen.append(body)
        if Handler.mode == "slow":
            time.sleep(1.5)  # longer than the client's timeout (the subject: a timeout)
            self._reply(200, {"ack": []})
        elif Handler.mode == "garbage":
            self._raw(200, b"this is not json")
        elif Handler.mode == "wrong-shape":
            self._reply(200, {"ack": "op-1"})
        elif Handler.mode == "error":
            self._reply(500, {"error": "boom"})
        else:
            response = Handler.controller.process(request_from_wire(body))
            self._reply(200, response_to_wire(response))

    def _reply(self, code, data):
        self._raw(code, json.dumps(data).encode())

    def _raw(self, code, payload):
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


@pytest.fixture
def server():
    Handler.controller = OneAtATime()
    Handler.mode = "ok"
    Handler.seen = []
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def request(n=2, seq=1):
    ops = tuple(TaskOp(f"op-{i}", TaskRef("job", i), OpKind.UPDATE, "update to version 2", "m1")
                for i in range(n))
    return TaskControlRequest("job", ops, (), (), (), seq)


def test_round_trip_through_a_remote_controller(server):
    client = HttpController(server + "/taskcontrol", timeout=5)
    response = client.process(request())
    assert response.ack == ("op-0",)  # one at a time
    wire = Handler.seen[0]
    assert wire["job_handle"] == "job" and wire["sequence_number"] == 1
    assert wire["request"][1] == {"op_id": "op-1", "task": {"job": "job", "index": 1},
                                  "kind": "update", "reason": "update to version 2",
                                  "machine": "m1"}
    assert set(wire) == {"job_handle", "request", "completed", "advance_notices",
                         "all_unhealthy_tasks", "sequence_number"}


@pytest.mark.parametrize("mode", ["garbage", "wrong-shape", "error"])
def test_bad_answers_raise_a_clear_error(server, mode):
    Handler.mode = mode
    with pytest.raises(TaskControlError) as err:
        HttpController(server).process(request())
    assert server in str(err.value)


def test_unreachable_controller_is_an_error_not_a_hang():
    with pytest.raises(TaskControlError):
        HttpController("http://127.0.0.1:9/", timeout=1).process(request())


def test_leader_endpoint(server):
    assert http_leader(server + "/leader")() == 2
    assert http_leader("http://127.0.0.1:9/leader", timeout=1)() is None


def test_an_unreachable_controller_holds_the_rollout_and_the_scheduler_goes_on():
    from plait.sim.scenarios import job_spec, world

    sim = world()
    s = sim.scheduler
    spec = job_spec("web", 3)
    s.create_job(spec, 0, controller=HttpController("http://127.0.0.1:9/", timeout=0.5))
    assert sim.run_until(lambda: len(s.discovery("web")) == 3, 60)
    s.update_job(spec.model_copy(update={"args": ("--v2",)}), sim.now)
    sim.run(40)
    assert all(r.spec_version == 1 for r in s.job("web").tasks.values())
    assert len(s.discovery("web")) == 3  # nothing was taken down without an ack
    assert s.counters["controller_errors"] >= 2  # asked again after the re-check interval


def test_a_controller_that_times_out_is_an_error(server):
    Handler.mode = "slow"
    with pytest.raises(TaskControlError) as err:
        HttpController(server, timeout=0.3).process(request())
    assert "Timeout" in str(err.value)
