"""plait push / plait canary / plait job intents|sizing against a live API: a staged
push gated by a command run where it was started completes, one whose command fails
rolls back (exit status 1, every task back on the job's spec), and the other verbs
show and end what they set."""

from __future__ import annotations

import json
import re
from pathlib import Path

from test_cli_client import plait, write

from plait.testing import wait_for

JOB = """\
name: api
entitlement: e
task_count: 4
command: {command}
resources: {{cpu: 1, memory_gb: 1}}
update: {{max_unavailable: 1}}
"""


def running(plane) -> dict[str, int]:
    cp = plane.control_plane
    with cp.lock:
        job = cp.scheduler.jobs["api"]
        out: dict[str, int] = {}
        for r in job.tasks.values():
            if r.serving and r.op is None and r.index < job.spec.task_count:
                c = job.versions[r.spec_version - 1].command
                out[c] = out.get(c, 0) + 1
        return out


def test_a_staged_push_with_a_gate_command(plane, tmp_path: Path):
    plait("entitlement", "create", "--name", "e", "--owner", "alice", "--machines", "24")
    plait("job", "deploy", str(write(tmp_path, "api.yaml", JOB.format(command="serve"))),
          "--wait")
    v2 = write(tmp_path, "v2.yaml", JOB.format(command="serve-v2"))
    marks = tmp_path / "gated"
    gate = f"echo stage $PLAIT_STAGE >> {marks}"
    done = plait("push", "api", "--spec", str(v2), "--stages", "25,50,100", "--soak", "0",
                 "--gate-command", gate, "--wait", "-o", "json")
    final = json.loads(done.stdout)
    assert final["status"]["phase"] == "completed", done.output
    assert marks.read_text().split("\n")[:3] == ["stage 1", "stage 2", "stage 3"]
    wait_for(lambda: running(plane) == {"serve-v2": 4})
    status = json.loads(plait("push", "status", "api", "-o", "json").stdout)
    assert status["status"]["promoted"] is not None
    # a failing gate command: rolled back, exit status 1
    v3 = write(tmp_path, "v3.yaml", JOB.format(command="serve-v3"))
    failed = plait("push", "api", "--spec", str(v3), "--stages", "50,100", "--soak", "0",
                   "--gate-command", "echo error rate too high; exit 3", "--wait", ok=False)
    assert failed.exit_code == 1 and "rolled back" in failed.output
    assert "exited 3: error rate too high" in failed.output
    wait_for(lambda: running(plane) == {"serve-v2": 4})
    # misuse is named
    bad = plait("push", "api", "--spec", str(v3), "--gate-command", "true", ok=False)
    assert bad.exit_code != 0 and "needs --wait" in bad.output
    bad = plait("push", "api", "--spec", str(v3), "--stages", "50,x", ok=False)
    assert bad.exit_code != 0 and "--stages" in bad.output
    # the flags' own mistakes are not the spec file's; the file's are
    said = " ".join(plait("push", "api", "--spec", str(v3), "--stages", "50,20",
                          ok=False).output.split())
    assert "stages must increase" in said and "Value error" not in said, said
    assert str(v3) not in said
    broken = write(tmp_path, "v4.yaml", JOB.format(command="serve-v4").replace(
        "cpu: 1", "cpu: -1"))
    said = " ".join(plait("push", "api", "--spec", str(broken), ok=False).output.split())
    assert said.startswith(f"error: {broken}: spec.resources.cpu"), said


def test_canaries_sizing_and_the_unified_spec(plane, tmp_path: Path):
    plait("entitlement", "create", "--name", "e", "--owner", "alice", "--machines", "24")
    plait("job", "deploy", str(write(tmp_path, "api.yaml", JOB.format(command="serve"))),
          "--wait")
    sized = json.loads(plait("job", "sizing", "api", "6", "--max", "5", "-o", "json").stdout)
    assert sized["size"] == 5
    canary = write(tmp_path, "canary.yaml", JOB.format(command="serve-canary"))
    plait("canary", "start", "api", "c1", "--spec", str(canary), "--tasks", "2",
          "--duration", "600")
    wait_for(lambda: running(plane) == {"serve": 3, "serve-canary": 2})
    intents = json.loads(plait("job", "intents", "api", "-o", "json").stdout)
    assert intents["unified"]["roles"] == {"stable": 3, "canary:c1": 2}
    table = plait("job", "intents", "api").stdout
    assert "canary:c1" in table and "c1: 2 tasks" in table
    assert "ended" in plait("canary", "end", "api", "c1").stderr
    wait_for(lambda: running(plane) == {"serve": 5})
    assert "no sizing intent" in plait("job", "sizing", "api", "--off").stderr
    refused = plait("push", "status", "api", ok=False)
    assert refused.exit_code != 0 and "not found" in refused.output


def test_a_code_config_and_host_profile_canary(plane, tmp_path: Path):
    plait("entitlement", "create", "--name", "e", "--owner", "alice", "--machines", "24")
    plait("hostprofile", "create", str(write(tmp_path, "p.yaml", "name: tuned\nsysctls: "
                                             "{net.core.somaxconn: '4096'}\n")))
    plait("job", "deploy", str(write(tmp_path, "api.yaml", JOB.format(command="serve"))),
          "--wait")
    canary = write(tmp_path, "canary.yaml", JOB.format(command="serve-canary"))
    # a host profile the entitlement does not allow canaries on: refused until allowed
    refused = plait("canary", "start", "api", "pc", "--spec", str(canary), "--tasks", "1",
                    "--host-profile", "tuned", ok=False)
    said = " ".join(refused.output.split())
    assert refused.exit_code != 0 and "may run canaries on" in said, said
    assert "--canary-host-profiles tuned" in said
    allowed = plait("entitlement", "update", "e", "--canary-host-profiles", "tuned",
                    "-o", "json").stdout
    assert json.loads(allowed)[0]["canary_host_profiles"] == ["tuned"]
    shown = plait("canary", "start", "api", "pc", "--spec", str(canary), "--tasks", "1",
                  "--host-profile", "tuned").stdout
    assert "tuned" in shown
    # (its end as a time, not seconds since 1970; no "None" for a version to be made)
    said = " ".join(shown.replace("│", " ").split())
    assert "None" not in said and re.search(r"until \d{4}-\d\d-\d\d \d\d:\d\d", said)
    wait_for(lambda: running(plane) == {"serve": 3, "serve-canary": 1})
    view = json.loads(plait("canary", "show", "api", "pc", "-o", "json").stdout)
    child = view["entitlement"]
    assert child.startswith("e.canary-") and view["intent"]["host_profile"] == "tuned"
    cp = plane.control_plane
    with cp.lock:
        (rec,) = [r for r in cp.scheduler.jobs["api"].tasks.values() if r.spec_version != 1]
        m = rec.machine
        assert cp.region.broker_of(m).entitlement_of(m) == child
        assert cp.scheduler.profiles.applied[m].name == "tuned"
    assert "ended" in plait("canary", "end", "api", "pc").stderr
    wait_for(lambda: running(plane) == {"serve": 4})
    refused = plait("canary", "start", "api", "pc", "--spec", str(canary),
                    "--host-profile", "nope", ok=False)
    assert refused.exit_code != 0 and "host profile 'nope' does not exist" in refused.output
