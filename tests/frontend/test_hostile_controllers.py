"""A tenant's TaskController delays only its own job: a tarpit, a hung one, a slow
one, one answering 10 MB and one answering garbage, beside healthy jobs, in a
control plane whose machines are kept up by agents heartbeating over the API."""

from __future__ import annotations

import threading
import time

import httpx
import pytest
from livecp import Live, start_live, stop_live, wait_for

from plait.bench.controllers import ControllerFarm
from plait.taskcontrol import signing

HOSTILE = ("tarpit", "hung", "slow", "huge", "garbage")


def spec(name, ent, count, controller=None, version=1):
    body = {"name": name, "entitlement": ent, "task_count": count,
            "resources": {"cpu": 1, "memory_gb": 1}, "command": "serve",
            "args": [f"--v{version}"], "update": {"max_unavailable": 1}}
    if controller:
        body["task_controller"] = controller
    return body


class Agents:
    """One thread per machine doing what an agent does over the API: read the desired
    set, report every task in it running and healthy, every ``interval`` seconds."""

    def __init__(self, live: Live, machines: list[str], interval: float = 0.3) -> None:
        self.stop = threading.Event()
        self.longest = 0.0  # the longest a status report took to be taken
        self.errors: list[str] = []
        self.threads = [threading.Thread(target=self._run, args=(live, m, interval),
                                         daemon=True) for m in machines]
        for t in self.threads:
            t.start()

    def _run(self, live: Live, machine: str, interval: float) -> None:
        with live.client(live.admin_token) as c:
            while not self.stop.is_set():
                try:
                    desired = c.get(f"/v1/machines/{machine}/desired").json()["tasks"]
                    tasks = [{"job": t["job"], "index": t["index"], "revision": t["revision"],
                              "phase": "running", "healthy": True} for t in desired]
                    started = time.monotonic()
                    r = c.post(f"/v1/machines/{machine}/status", json={"tasks": tasks})
                    self.longest = max(self.longest, time.monotonic() - started)
                    if r.status_code != 200:
                        self.errors.append(f"{machine}: {r.status_code} {r.text}")
                except httpx.HTTPError as exc:
                    self.errors.append(f"{machine}: {exc}")
                self.stop.wait(interval)

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(10)


@pytest.fixture
def region(tmp_path):
    farm = ControllerFarm()
    live = start_live(tmp_path / "data", sim_agents=False, heartbeat_timeout=3.0,
                      startup_grace=0.0, controller_networks=("loopback", "any"))
    live.cp.loop.start()
    machines = [live.cp.fleet.name(m) for m in range(len(live.cp.fleet))]
    agents = Agents(live, machines)
    yield live, farm, agents
    agents.close()
    stop_live(live)
    farm.stop()


def view(live, name):
    return live.admin.get(f"/v1/jobs/{name}").json()


def test_hostile_controllers_delay_only_their_own_jobs(region):
    live, farm, agents = region
    admin = live.admin
    r = admin.post("/v1/entitlements", json={"name": "t", "owner": "alice",
                                             "quota": {"machines": 24}})
    assert r.status_code in (200, 201), r.text
    for mode in HOSTILE:
        r = admin.post("/v1/jobs", json=spec(mode, "t", 3, farm.controller(mode, mode)))
        assert r.status_code == 201, r.text
    for name in ("plain", "acked"):
        r = admin.post("/v1/jobs", json=spec(name, "t", 3, farm.controller("ack", name)
                                              if name == "acked" else None))
        assert r.status_code == 201, r.text
    everything = (*HOSTILE, "plain", "acked")
    wait_for(lambda: all(view(live, n)["settled"] for n in everything))

    # every hostile controller is asked about an update at once
    for mode in HOSTILE:
        r = admin.put(f"/v1/jobs/{mode}", json=spec(mode, "t", 3, farm.controller(mode, mode),
                                                    version=2))
        assert r.status_code == 200, r.text
    wait_for(lambda: all(farm.state.seen[m] for m in HOSTILE))
    # meanwhile the healthy jobs' reads and updates proceed: both roll out
    for name in ("plain", "acked"):
        r = admin.put(f"/v1/jobs/{name}", json=spec(name, "t", 3, farm.controller(
            "ack", name) if name == "acked" else None, version=2))
        assert r.status_code == 200, r.text
    wait_for(lambda: all(view(live, n)["settled"] and view(live, n)["applied_version"] == 2
                         for n in ("plain", "acked")), timeout=60)
    assert any(farm.state.seen["tarpit"]) and not view(live, "tarpit")["settled"]

    # the slow controller's answer comes, and its job paces under max_unavailable
    peak = 0

    def updated() -> bool:
        nonlocal peak
        v = view(live, "slow")
        peak = max(peak, v["unavailable"])
        return bool(v["settled"] and v["applied_version"] == 2)

    wait_for(updated, 90, "the slow controller's job finishes its update", poll=0.1)
    assert peak <= 1
    seqs = [s.sequence_number for s in farm.state.seen["slow"]]
    assert seqs == sorted(set(seqs))  # one call at a time, sequence numbers increase

    # the others acked nothing: their tasks stay on version 1, and the events say why
    for mode in ("tarpit", "hung", "huge", "garbage"):
        tasks = admin.get(f"/v1/jobs/{mode}/tasks").json()["tasks"]
        assert {t["version"] for t in tasks} == {1}, mode
    errors = {e["job"]: e["message"] for e in admin.get(
        "/v1/events", params={"kind": "controller_error", "limit": 1000}).json()["events"]}
    assert "deadline" in errors["tarpit"] and "deadline" in errors["hung"]
    assert "byte cap" in errors["huge"]
    assert "not JSON" in errors["garbage"]
    assert "slow" not in errors
    # and so do their jobs' views (`plait job show`, `--wait`): it said "error -"
    for mode in ("tarpit", "hung", "huge", "garbage"):
        said = view(live, mode)["error"]
        assert said is not None and said.startswith("its TaskController acked nothing: "), (
            mode, said)
    assert "not JSON" in view(live, "garbage")["error"]
    assert view(live, "slow")["error"] is None and view(live, "acked")["error"] is None

    # no heartbeat was missed: no machine was ever declared failed
    assert admin.get("/v1/events", params={"kind": "machine_unreachable"}).json()[
        "events"] == []
    assert agents.errors == []
    assert agents.longest < live.cp.config.heartbeat_timeout
    assert {m["state"] for m in admin.get("/v1/machines", params={"limit": 1000})
            .json()["machines"]} == {"healthy"}


def test_calls_are_signed_with_the_jobs_key_and_a_controller_can_ask_again_sooner(region):
    live, farm, _ = region
    admin = live.admin
    admin.post("/v1/entitlements", json={"name": "t", "owner": "alice",
                                         "quota": {"machines": 24}})
    url = farm.controller("later", "later")
    assert admin.post("/v1/jobs", json=spec("later", "t", 2, url)).status_code == 201
    wait_for(lambda: view(live, "later")["settled"])
    assert admin.put("/v1/jobs/later", json=spec("later", "t", 2, url, 2)).status_code == 200
    # it declined three times, asking again after 1 s each time (not the 30 s re-check)
    wait_for(lambda: view(live, "later")["settled"] and view(live, "later")[
        "applied_version"] == 2, timeout=60)
    seen = farm.state.seen["later"]
    assert len(seen) >= 4
    key = admin.get("/v1/jobs/later/controller-key").json()["key"]
    for s in seen:
        signing.verify(key, s.signature, s.body, time.time())
    with pytest.raises(signing.SignatureError):
        signing.verify(key, seen[0].signature, seen[0].body + b" ", time.time())
    # another job's key does not verify them, nor the key of the job's name alone (a
    # job made later under the name has a key of its own)
    secret = live.cp.controllers._secret()
    for name in ("other", "later"):
        with pytest.raises(signing.SignatureError):
            signing.verify(signing.job_key(secret, name), seen[0].signature, seen[0].body,
                           time.time())


def test_controller_urls_are_checked_and_a_refusal_names_the_rule(tmp_path):
    live = start_live(tmp_path / "data")  # the default: loopback not allowed
    try:
        live.admin.post("/v1/entitlements", json={"name": "t", "owner": "alice",
                                                  "quota": {"machines": 4}})
        for url, rule in [("http://169.254.169.254/latest", "metadata"),
                          ("http://metadata.google.internal/x", "metadata"),
                          ("http://[fe80::1]:80/", "link-local"),
                          ("http://127.0.0.1:9000/tc", "loopback"),
                          ("http://localhost:9000/tc", "loopback"),
                          ("http://0.0.0.0:9000/", "unspecified")]:
            r = live.admin.post("/v1/jobs", json=spec("j", "t", 1, url))
            assert r.status_code == 422, (url, r.text)
            assert r.json()["field"] == "task_controller"
            assert f"rule {rule}" in r.json()["message"], r.text
        assert live.admin.get("/v1/jobs/j").status_code == 404  # nothing written
        r = live.admin.post("/v1/jobs", json=spec("j", "t", 1, "http://10.1.2.3:9000/tc"))
        assert r.status_code == 201, r.text
        r = live.admin.put("/v1/jobs/j", json=spec("j", "t", 1, "http://169.254.169.254/"))
        assert r.status_code == 422 and "rule metadata" in r.json()["message"]
        # a dry run says what the deploy would: refused, for the same rule
        for url, rule in (("http://169.254.169.254/", "metadata"),
                          (live.url + "/v1/jobs", "own-api")):
            for method, path in (("put", "/v1/jobs/j"), ("post", "/v1/jobs")):
                r = getattr(live.admin, method)(path, params={"dry_run": "true"},
                                                json=spec("j", "t", 1, url))
                assert r.status_code == 422, (method, url, r.text)
                assert f"rule {rule}" in r.json()["message"], r.text
    finally:
        stop_live(live)


def test_the_control_planes_own_api_is_refused_even_where_loopback_is_allowed(tmp_path):
    live = start_live(tmp_path / "data", controller_networks=("loopback",))
    try:
        live.admin.post("/v1/entitlements", json={"name": "t", "owner": "alice",
                                                  "quota": {"machines": 4}})
        r = live.admin.post("/v1/jobs", json=spec("j", "t", 1, live.url + "/v1/jobs"))
        assert r.status_code == 422 and "rule own-api" in r.json()["message"], r.text
        r = live.admin.post("/v1/jobs", json=spec("j", "t", 1, "http://10.0.0.1/tc"))
        assert r.status_code == 422 and "rule allow-list" in r.json()["message"], r.text
        r = live.admin.post("/v1/jobs", json=spec("j", "t", 1, "http://127.0.0.1:1/tc"))
        assert r.status_code == 201, r.text
    finally:
        stop_live(live)
