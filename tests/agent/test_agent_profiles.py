"""Sidekick on real agents: a machine that joins an entitlement is switched to the
entitlement's host profile (by the record or the script applier) before any task
starts there; a failing switch keeps the machine out of service, with the reason,
until a retry succeeds. The control plane and the agents run in this process; tasks
are real processes. Every wait is a liveness bound, not a speed check."""

from __future__ import annotations

import json
import stat

import pytest
import test_agent_policies
from test_agent_policies import wait_for

from plait.agent import profile as agent_profile
from plait.sidekick import book
from plait.sidekick.appliers import make

MACHINES = ["m0000000", "m0000001"]
PROFILE = {"name": "web", "sysctls": {"net.core.somaxconn": "4096"}, "turbo": True,
           "user": {"tier": "frontend"}}
# the task prints the profile its machine had on record when it started, and what the
# script applied; seen.json last, whole (renamed into place): the test reads both once
# it is there (a task is running from its start, maybe before it wrote either)
TASK = ('cat "$PLAIT_DATA_DIR/../../sidekick/script-ran" > "$PLAIT_DATA_DIR/script.txt" '
        '2>/dev/null; '
        'cat "$PLAIT_DATA_DIR/../../sidekick/host-profile.json" > "$PLAIT_DATA_DIR/seen.tmp" '
        '&& mv "$PLAIT_DATA_DIR/seen.tmp" "$PLAIT_DATA_DIR/seen.json"; exec sleep 600')


class Box(test_agent_policies.Box):
    """The two-machine region of the policies' tests, its agents with an applier."""

    def setup(self):
        r = self.api.put("/v1/hostprofiles/web", json=PROFILE)
        assert r.status_code == 201, r.text
        # (the box made entitlement e on default: now it names web)
        r = self.api.post("/v1/entitlements", json={"name": "e", "owner": "o",
                                                    "quota": {"machines": 2},
                                                    "host_profile": "web"})
        assert r.status_code == 200 and r.json()["host_profile"] == "web", r.text
        spec = {"name": "svc", "entitlement": "e", "task_count": 2,
                "resources": {"cpu": 0.1, "memory_gb": 0.1}, "command": "sh",
                "args": ["-c", TASK],
                "policy": {"requirements": {"max_tasks_per_machine": 1}}}
        r = self.api.post("/v1/jobs", json=spec)
        assert r.status_code == 201, r.text

    def running(self):
        tasks = self.api.get("/v1/jobs/svc/tasks").json()["tasks"]
        return all(t["state"] == "running" for t in tasks)

    def seen(self, machine):
        """What each task on the machine found on record when it started."""
        out = []
        for path in (self.dirs[machine] / "tasks").glob("*/seen.json"):
            out.append((json.loads(path.read_text()),
                        (path.parent / "script.txt").read_text()))
        return out

    def events(self, kind):
        return self.api.get("/v1/events", params={"kind": kind, "limit": 1000}).json()["events"]


@pytest.fixture
def box_of(tmp_path):
    boxes = []

    def make_box(applier):
        box = Box(tmp_path, applier)
        boxes.append(box)
        return box
    yield make_box
    for box in boxes:
        box.close()


def test_the_record_applier_switches_a_joining_machine_before_its_task_starts(box_of):
    box = box_of(lambda state: make("record", state))
    box.setup()
    wait_for(box.running, what="the job running")
    used = {t["machine"] for t in box.api.get("/v1/jobs/svc/tasks").json()["tasks"]}
    for machine in used:
        wait_for(lambda m=machine: box.seen(m), what=f"the task on {machine} writing what it saw")
        seen = box.seen(machine)
        for profile, _ in seen:  # on record before the task's first line ran
            assert profile["name"] == "web" and profile["version"] == 1
            assert profile["settings"]["sysctls"] == PROFILE["sysctls"]
    # each machine's last switch is to web; one that joined while its entitlement still
    # named the default profile (the box made it so) switched to that first
    switched = box.events("profile_switched")
    last = {e["machine"]: e["message"] for e in switched}
    assert set(last) >= used
    assert all("host profile web v1 applied" in last[m] for m in used), last
    assert all(any(f"host profile {p} v1 applied" in e["message"] for p in ("web", "default"))
               for e in switched), [e["message"] for e in switched]
    # the control plane knows what each machine carries
    machines = {m["id"]: m for m in box.api.get("/v1/machines").json()["machines"]}
    assert all(machines[m]["state"] == "healthy" for m in used)


def test_the_script_applier_runs_before_the_task_and_a_failing_switch_keeps_the_machine_out(
        box_of, tmp_path, monkeypatch):
    monkeypatch.setattr(agent_profile, "RETRY", 0.5)  # the agent's retries
    monkeypatch.setattr(book, "OUT_FIRST", 1.0)  # the machine's time out of service
    broken = tmp_path / "broken"
    broken.write_text("yes")
    script = tmp_path / "apply.sh"
    # switching to web fails while the flag file exists; a switch that succeeds notes
    # the profile it applied beside PATH
    script.write_text(f"""#!/bin/sh
[ "$1" = apply ] || exit 9
name=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["name"])' "$2")
if [ "$name" = web ] && [ -e {broken} ]; then echo "firmware says no to turbo"; exit 3; fi
echo "$name" > "$(dirname "$2")/script-ran"
""")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    box = box_of(lambda state: make("script", state, script=str(script), timeout=30))
    box.setup()
    wait_for(lambda: len(box.events("profile_switch_failed")) >= 2,
             what="both machines' switches failing")
    failed = box.events("profile_switch_failed")
    assert all("switching to host profile web v1 failed" in e["message"]
               and "firmware says no to turbo" in e["message"] for e in failed)
    assert all("status 3" in (e["reason"] or "") for e in failed)
    # out of service while the switch fails, and no task started anywhere
    machines = box.api.get("/v1/machines").json()["machines"]
    assert {m["state"] for m in machines if m["id"] in MACHINES} == {"failed"}
    assert not any(box.seen(m) for m in MACHINES)
    assert not box.running()
    broken.unlink()  # the next retry succeeds
    wait_for(box.running, what="the job running once the switch succeeds")
    # each machine got web in the end: by a retry while still out of service, or by a
    # switch after it went back to the free pool and joined again
    back = {e["machine"] for e in box.events("profile_switch_retried")} | {
        e["machine"] for e in box.events("profile_switched") if "web v1" in e["message"]}
    assert back == set(MACHINES)
    for machine in MACHINES:
        wait_for(lambda m=machine: box.seen(m), what=f"the task on {machine} writing what it saw")
        for profile, ran in box.seen(machine):
            assert profile["name"] == "web" and ran.strip() == "web"
    machines = box.api.get("/v1/machines").json()["machines"]
    assert {m["state"] for m in machines if m["id"] in MACHINES} == {"healthy"}
