"""plait hostprofile: create, list, show, diff and delete through the CLI against a live
API (simulated agents), and an entitlement that names a profile."""

from __future__ import annotations

import json
import time
from pathlib import Path

from test_cli_client import EXAMPLES, plait, write

from plait.testing import wait_for

PROFILES = """\
name: web
description: front ends
sysctls:
  net.core.somaxconn: "4096"
  vm.swappiness: "10"
turbo: true
---
name: batch
hugepages_2m: 512
cgroup_controllers: [cpu, memory, io]
user: {tier: batch}
"""


def test_profiles_are_created_versioned_diffed_and_named_by_entitlements(plane, tmp_path: Path):
    plait("hostprofile", "create", str(write(tmp_path, "p.yaml", PROFILES)))
    listed = json.loads(plait("hostprofile", "list", "-o", "json").stdout)["profiles"]
    assert [p["name"] for p in listed] == ["batch", "default", "web"]
    table = plait("hostprofile", "list").stdout
    assert "turbo on" in table and "hugepages 512x2M" in table and "(sets nothing)" in table
    # the same file again makes no new version; a changed setting makes version 2
    plait("hostprofile", "create", str(write(tmp_path, "p.yaml", PROFILES)))
    assert json.loads(plait("hostprofile", "show", "web", "-o", "json").stdout)["version"] == 1
    plait("hostprofile", "create", str(write(tmp_path, "web2.yaml", PROFILES.split("---")[0]
                                                .replace('"10"', '"60"'))))
    web = json.loads(plait("hostprofile", "show", "web", "-o", "json").stdout)
    assert web["version"] == 2 and web["sysctls"]["vm.swappiness"] == "60"
    old = json.loads(plait("hostprofile", "show", "web", "--version", "1", "-o", "json").stdout)
    assert old["sysctls"]["vm.swappiness"] == "10"
    versions = json.loads(plait("hostprofile", "show", "web", "--versions", "-o",
                                "json").stdout)["versions"]
    assert [v["version"] for v in versions] == [1, 2]
    # a table shows times as local times; JSON keeps the Unix seconds
    created = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(versions[0]["created"]))
    assert created in plait("hostprofile", "show", "web", "--versions").stdout
    shown = plait("hostprofile", "show", "web").stdout
    assert time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(web["created"])) in shown
    assert str(int(web["created"])) not in shown
    # diff: the previous version against the current one, then two profiles
    diff = json.loads(plait("hostprofile", "diff", "web", "-o", "json").stdout)
    assert diff["changes"] == [{"setting": "sysctls.vm.swappiness", "old": "10", "new": "60"}]
    out = plait("hostprofile", "diff", "web@1", "batch").stdout
    assert "web v1 -> batch v1" in out and "hugepages_2m" in out and "turbo" in out
    # an entitlement names a profile that exists
    plait("entitlement", "create", "--name", "front", "--owner", "alice", "--machines", "4",
          "--host-profile", "web")
    res = plait("entitlement", "create", "--name", "x", "--owner", "alice", "--machines", "4",
                "--host-profile", "nope", ok=False)
    assert res.exit_code == 2 and "host profile 'nope' does not exist" in res.output
    spec = write(tmp_path, "job.yaml", "name: fe\nentitlement: front\ntask_count: 2\n"
                 "resources: {cpu: 1, memory_gb: 1}\ncommand: serve\n")
    plait("job", "deploy", str(spec), "--wait")
    def switched() -> list[dict]:  # (one JSON object per line)
        out = plait("events", "--kind", "profile_switched", "-o", "json").stdout
        return [json.loads(line) for line in out.splitlines() if line.strip()]
    wait_for(lambda: len(switched()) >= 2, what="two machines switched", poll=0.2)
    assert {"host profile web v2 applied" in e["message"] for e in switched()} == {True}
    shown = json.loads(plait("hostprofile", "show", "web", "-o", "json").stdout)
    assert shown["entitlements"] == ["front"] and shown["machines"] >= 2
    machines = json.loads(plait("machine", "list", "--entitlement", "front", "-o",
                                "json").stdout)["machines"]
    assert machines and {m["host_profile"]["applied"] for m in machines} == {"web@2"}
    assert {m["host_profile"]["target"] for m in machines} == {"web@2"}
    assert "web@2" in plait("machine", "list", "--entitlement", "front").stdout
    # a new version while its machines run tasks: rolled over them, one at a time
    plait("hostprofile", "create", str(write(tmp_path, "web3.yaml", PROFILES.split(
        "---")[0].replace('"4096"', '"8192"'))))

    def on_v3() -> bool:
        out = plait("events", "--kind", "profile_switched", "-o", "json").stdout
        return sum("web v3 applied" in line for line in out.splitlines()) >= 2
    wait_for(on_v3, poll=0.2)
    out = plait("events", "--kind", "profile_roll_started").stdout
    assert "entitlement front: host profile web v3 rolls over" in " ".join(out.split())
    plait("job", "show", "fe")  # and the job is whole again
    wait_for(lambda: json.loads(plait("job", "show", "fe", "-o", "json").stdout)["settled"],
             what="fe settled", poll=0.2)
    res = plait("hostprofile", "delete", "web", ok=False)
    assert res.exit_code != 0 and "named by front" in " ".join(res.output.split())
    plait("hostprofile", "delete", "batch")
    res = plait("hostprofile", "show", "batch", ok=False)
    assert res.exit_code != 0 and "not found" in res.output


def test_owners_read_profiles_and_admins_write_them(plane, tmp_path: Path):
    token = plait("token", "create", "--owner", "alice").stdout.strip()
    plait("hostprofile", "create", str(write(tmp_path, "p.yaml", PROFILES)))
    listed = json.loads(plait("--token", token, "hostprofile", "list", "-o", "json").stdout)
    assert {p["name"] for p in listed["profiles"]} == {"batch", "default", "web"}
    res = plait("--token", token, "hostprofile", "create",
                str(write(tmp_path, "q.yaml", "name: mine\n")), ok=False)
    assert res.exit_code == 4 and "admin only" in res.output
    res = plait("hostprofile", "create", str(write(tmp_path, "bad.yaml",
                                                   "name: bad\nsysctls: {'no such': '1'}\n")),
                ok=False)
    assert res.exit_code == 2 and "sysctls" in res.output and "not a valid sysctl" in res.output
    # user settings nested past a bound (the store writes them as JSON) are refused
    deep = "x"
    for _ in range(40):
        deep = f"[{deep}]"
    res = plait("hostprofile", "create", str(write(tmp_path, "deep.yaml",
                                                   f"name: deep\nuser: {{a: {deep}}}\n")),
                ok=False)
    assert res.exit_code == 2 and "nested more than 32 deep" in res.output, res.output
    assert not {"bad", "deep"} & {p["name"] for p in json.loads(
        plait("hostprofile", "list", "-o", "json").stdout)["profiles"]}


def test_the_example_profiles_are_valid(plane):
    made = json.loads(plait("hostprofile", "create", str(EXAMPLES / "hostprofiles.yaml"),
                            "-o", "json").stdout)
    assert [p["name"] for p in made] == ["web", "batch", "web-next"]


def test_an_owner_sees_only_its_own_entitlements_on_a_profile(plane, tmp_path: Path):
    plait("hostprofile", "create", str(write(tmp_path, "p.yaml", PROFILES)))
    for name, owner in (("mine", "alice"), ("theirs", "bob")):
        plait("entitlement", "create", "--name", name, "--owner", owner, "--machines", "2",
              "--host-profile", "web")
    token = plait("token", "create", "--owner", "alice").stdout.strip()
    seen = json.loads(plait("--token", token, "hostprofile", "show", "web", "-o",
                            "json").stdout)
    assert seen["entitlements"] == ["mine"]
    assert json.loads(plait("hostprofile", "show", "web", "-o", "json").stdout)[
        "entitlements"] == ["mine", "theirs"]
