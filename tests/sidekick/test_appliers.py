"""The agent's host-profile appliers: record, sysctl (over a fake /proc/sys made of
files) and script (small shell scripts)."""

from __future__ import annotations

import errno
import json
import os
import re
import stat
import types
from pathlib import Path
from typing import Any

import pytest

from plait.sidekick import appliers
from plait.sidekick.appliers import ApplyError
from plait.testing import wait_for


def wire(name: str, version: int = 1, **settings: Any) -> dict[str, Any]:
    """A profile's wire form, as ``HostProfile.wire()`` gives it: every setting, unset
    ones empty."""
    unset: dict[str, Any] = {"sysctls": {}, "cgroup_controllers": [], "turbo": None,
                             "hugepages_2m": 0, "hugepages_1g": 0, "fs_label": None,
                             "nic": {}, "user": {}}
    return {"name": name, "version": version, "settings": unset | settings}


DEFAULT = wire("default")


@pytest.fixture
def proc_sys(tmp_path: Path) -> Path:
    root = tmp_path / "proc-sys"
    for key, value in {"net.core.somaxconn": "4096", "vm.swappiness": "60",
                       "net.ipv4.tcp_rmem": "4096\t131072\t6291456",
                       "kernel.pid_max": "4194304"}.items():
        path = root.joinpath(*key.split("."))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(value + "\n")  # (as the kernel shows them)
    return root


def value(proc_sys: Path, key: str) -> str:
    return proc_sys.joinpath(*key.split(".")).read_text().rstrip("\n")


def record(state: Path) -> Any:
    return json.loads((state / appliers.RECORD_FILE).read_text())


# -- make ----------------------------------------------------------------------------------

def test_make_builds_each_kind_and_refuses_what_it_cannot_build(tmp_path: Path) -> None:
    assert appliers.make("record", tmp_path).name == "record"
    assert appliers.make("sysctl", tmp_path).name == "sysctl"
    assert appliers.make("script", tmp_path, script="/bin/true").name == "script"
    with pytest.raises(ValueError, match="unknown profile applier"):
        appliers.make("turbo", tmp_path)
    with pytest.raises(ValueError, match="needs a command"):
        appliers.make("script", tmp_path)
    with pytest.raises(ValueError, match="needs a command"):
        appliers.make("script", tmp_path, script="   ")
    with pytest.raises(ValueError, match="timeout is positive"):
        appliers.make("script", tmp_path, script="/bin/true", timeout=0)


# -- record --------------------------------------------------------------------------------

def test_record_writes_the_wire_form_privately_and_replaces_it(tmp_path: Path) -> None:
    state = tmp_path / "state"  # (made when first written)
    applier = appliers.make("record", state)
    batch = wire("batch", 2, sysctls={"vm.swappiness": "10"}, turbo=False)
    applier.apply(batch, None)
    assert record(state) == batch
    assert stat.S_IMODE((state / appliers.RECORD_FILE).stat().st_mode) == 0o600
    applier.apply(DEFAULT, batch)
    assert record(state) == DEFAULT
    assert sorted(p.name for p in state.iterdir()) == [appliers.RECORD_FILE]  # no temp left


def test_record_names_the_path_it_cannot_write(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    with pytest.raises(ApplyError, match="not-a-dir") as info:
        appliers.make("record", blocker / "state").apply(DEFAULT, None)
    assert "\n" not in str(info.value)


# -- sysctl --------------------------------------------------------------------------------

def test_sysctl_sets_the_keys_records_the_profile_and_restores_on_leave(
        tmp_path: Path, proc_sys: Path) -> None:
    state = tmp_path / "state"
    applier = appliers.make("sysctl", state, proc_sys=proc_sys)
    web = wire("web", sysctls={"net.core.somaxconn": "65535", "vm.swappiness": "10"},
               hugepages_2m=512, turbo=True)  # (not applied by this applier)
    applier.apply(web, DEFAULT)
    assert value(proc_sys, "net.core.somaxconn") == "65535"
    assert value(proc_sys, "vm.swappiness") == "10"
    assert record(state) == web
    assert json.loads((state / appliers.SYSCTL_SAVED_FILE).read_text())["saved"] == {
        "net.core.somaxconn": "4096", "vm.swappiness": "60"}
    assert stat.S_IMODE((state / appliers.SYSCTL_SAVED_FILE).stat().st_mode) == 0o600

    # a profile that sets one of the keys again, another not, and a new one
    web2 = wire("web", 2, sysctls={"vm.swappiness": "1", "kernel.pid_max": "65536"})
    applier.apply(web2, web)
    assert value(proc_sys, "net.core.somaxconn") == "4096"  # left: its original back
    assert value(proc_sys, "vm.swappiness") == "1"
    assert value(proc_sys, "kernel.pid_max") == "65536"
    # the original is the one from before the first write, not the value web set
    assert appliers.SysctlApplier(state, proc_sys).saved() == {
        "kernel.pid_max": "4194304", "vm.swappiness": "60"}

    applier.apply(DEFAULT, web2)  # sets nothing: everything as it was
    assert value(proc_sys, "vm.swappiness") == "60"
    assert value(proc_sys, "kernel.pid_max") == "4194304"
    assert appliers.SysctlApplier(state, proc_sys).saved() == {}
    assert record(state) == DEFAULT


def test_sysctl_restores_a_value_with_tabs_as_it_was(tmp_path: Path, proc_sys: Path) -> None:
    applier = appliers.make("sysctl", tmp_path, proc_sys=proc_sys)
    applier.apply(wire("net", sysctls={"net.ipv4.tcp_rmem": "4096 87380 16777216"}), None)
    assert value(proc_sys, "net.ipv4.tcp_rmem") == "4096 87380 16777216"
    applier.apply(DEFAULT, None)
    assert value(proc_sys, "net.ipv4.tcp_rmem") == "4096\t131072\t6291456"


def test_sysctl_saved_originals_survive_a_new_applier(tmp_path: Path, proc_sys: Path) -> None:
    state = tmp_path / "state"
    web = wire("web", sysctls={"net.core.somaxconn": "65535"})
    appliers.make("sysctl", state, proc_sys=proc_sys).apply(web, None)
    # (the agent restarts: a new applier over the same state directory)
    again = appliers.make("sysctl", state, proc_sys=proc_sys)
    again.apply(web, web)  # switching to the same profile keeps the first original
    assert value(proc_sys, "net.core.somaxconn") == "65535"
    appliers.make("sysctl", state, proc_sys=proc_sys).apply(DEFAULT, web)
    assert value(proc_sys, "net.core.somaxconn") == "4096"


def test_sysctl_is_all_or_nothing(tmp_path: Path, proc_sys: Path) -> None:
    state = tmp_path / "state"
    applier = appliers.make("sysctl", state, proc_sys=proc_sys)
    first = wire("first", sysctls={"vm.swappiness": "10"})
    applier.apply(first, None)
    # net.core.somaxconn is set, vm.swappiness left (restored), then the third key
    # (in name order) does not exist
    bad = wire("bad", sysctls={"net.core.somaxconn": "1024", "vm.zzz_missing": "1"})
    with pytest.raises(ApplyError) as info:
        applier.apply(bad, first)
    message = str(info.value)
    assert "vm.zzz_missing" in message and "No such file or directory" in message
    assert "\n" not in message
    # as after `first`: what the failed switch changed is back, the saved originals too
    assert value(proc_sys, "net.core.somaxconn") == "4096"
    assert value(proc_sys, "vm.swappiness") == "10"
    assert appliers.SysctlApplier(state, proc_sys).saved() == {"vm.swappiness": "60"}
    assert record(state) == first
    # and leaving later still restores what `first` changed
    applier.apply(DEFAULT, first)
    assert value(proc_sys, "vm.swappiness") == "60"


def fake_os(**calls: Any) -> types.SimpleNamespace:
    """The os module as the appliers see it, with some calls replaced (a kernel's
    refusals that a tree of files cannot show, as root)."""
    real = {k: getattr(os, k) for k in dir(os) if not k.startswith("__")}
    return types.SimpleNamespace(**(real | calls))


def test_sysctl_second_key_refused_by_the_kernel_restores_the_first(
        tmp_path: Path, proc_sys: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # /proc/sys answers a value out of range with EINVAL on write: the fake refuses
    # writes of "-1" so
    real_write = os.write

    def write(fd: int, data: bytes) -> int:
        if data == b"-1":
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
        return real_write(fd, data)

    monkeypatch.setattr(appliers, "os", fake_os(write=write))
    state = tmp_path / "state"
    applier = appliers.make("sysctl", state, proc_sys=proc_sys)
    with pytest.raises(ApplyError) as info:
        applier.apply(wire("bad", sysctls={"kernel.pid_max": "65536",
                                           "vm.swappiness": "-1"}), None)
    assert str(info.value) == "cannot set sysctl vm.swappiness to '-1': Invalid argument"
    assert value(proc_sys, "kernel.pid_max") == "4194304"
    assert value(proc_sys, "vm.swappiness") == "60"
    assert appliers.SysctlApplier(state, proc_sys).saved() == {}
    assert not (state / appliers.RECORD_FILE).exists()


def test_sysctl_key_refused_before_any_change_is_not_reported_stuck(
        tmp_path: Path, proc_sys: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # EPERM/EACCES come at open, before the value changes; nothing to set back then
    path = str(proc_sys / "vm" / "swappiness")
    real_open = os.open

    def open_(file: Any, flags: int, *args: Any) -> int:
        if str(file) == path and flags & os.O_WRONLY:
            raise OSError(errno.EPERM, os.strerror(errno.EPERM))
        return real_open(file, flags, *args)

    monkeypatch.setattr(appliers, "os", fake_os(open=open_))
    applier = appliers.make("sysctl", tmp_path, proc_sys=proc_sys)
    with pytest.raises(ApplyError) as info:
        applier.apply(wire("p", sysctls={"kernel.pid_max": "1", "vm.swappiness": "5"}), None)
    assert str(info.value) == "cannot set sysctl vm.swappiness to '5': Operation not permitted"
    assert value(proc_sys, "kernel.pid_max") == "4194304"
    assert value(proc_sys, "vm.swappiness") == "60"


def test_sysctl_second_key_unreadable_restores_the_first(
        tmp_path: Path, proc_sys: Path) -> None:
    # a key whose original cannot be read (a directory in its place: EISDIR, even as
    # root), after the first key is set
    proc_sys.joinpath("vm", "zz_dir").mkdir()
    applier = appliers.make("sysctl", tmp_path, proc_sys=proc_sys)
    with pytest.raises(ApplyError, match=r"vm\.zz_dir"):
        applier.apply(wire("bad", sysctls={"vm.swappiness": "5", "vm.zz_dir": "1"}), None)
    assert value(proc_sys, "vm.swappiness") == "60"
    assert appliers.SysctlApplier(tmp_path, proc_sys).saved() == {}
    assert not (tmp_path / appliers.RECORD_FILE).exists()


@pytest.mark.parametrize("key", ["net...somaxconn", "net.core..x", "net.core/../../etc.x",
                                 "..", "vm."])
def test_sysctl_refuses_a_key_naming_a_file_elsewhere(tmp_path: Path, proc_sys: Path,
                                                      key: str) -> None:
    applier = appliers.make("sysctl", tmp_path, proc_sys=proc_sys)
    # (past the model's check, as a wire form from anywhere could be)
    profile = {"name": "evil", "version": 1,
               "settings": {"sysctls": {"vm.swappiness": "1", key: "x"}}}
    with pytest.raises(ApplyError, match="not a sysctl name"):
        applier.apply(profile, None)
    assert value(proc_sys, "vm.swappiness") == "60"  # nothing written at all


def test_sysctl_forgets_a_key_the_kernel_no_longer_has(tmp_path: Path,
                                                       proc_sys: Path) -> None:
    applier = appliers.make("sysctl", tmp_path, proc_sys=proc_sys)
    applier.apply(wire("a", sysctls={"kernel.pid_max": "1000", "vm.swappiness": "5"}), None)
    (proc_sys / "kernel" / "pid_max").unlink()  # (say its module was unloaded)
    applier.apply(DEFAULT, None)
    assert value(proc_sys, "vm.swappiness") == "60"
    assert appliers.SysctlApplier(tmp_path, proc_sys).saved() == {}


def test_sysctl_refuses_a_saved_file_it_cannot_read(tmp_path: Path, proc_sys: Path) -> None:
    (tmp_path / appliers.SYSCTL_SAVED_FILE).write_text("{not json")
    applier = appliers.make("sysctl", tmp_path, proc_sys=proc_sys)
    with pytest.raises(ApplyError, match=re.escape(appliers.SYSCTL_SAVED_FILE)):
        applier.apply(wire("a", sysctls={"vm.swappiness": "5"}), None)
    assert value(proc_sys, "vm.swappiness") == "60"


# -- script --------------------------------------------------------------------------------

def script(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


def test_script_gets_the_profile_and_the_previous_one(tmp_path: Path) -> None:
    got = tmp_path / "got.json"
    ok = script(tmp_path, "ok.sh", f'echo "$1" > {tmp_path}/verb\ncp "$2" {got}\n'
                                   'echo applied\n')
    state = tmp_path / "state"
    applier = appliers.make("script", state, script=f"{ok}", timeout=30)
    web = wire("web", 3, sysctls={"vm.swappiness": "10"}, user={"tier": "gold"})
    applier.apply(web, DEFAULT)
    assert (tmp_path / "verb").read_text().strip() == "apply"
    data = json.loads(got.read_text())
    assert data["name"] == "web" and data["version"] == 3
    assert data["settings"] == web["settings"]
    assert data["settings"]["user"] == {"tier": "gold"}
    assert data["previous"] == DEFAULT
    assert record(state) == web
    assert [p.name for p in state.iterdir()] == [appliers.RECORD_FILE]  # temp file gone


def test_script_command_is_split_like_a_shell_line(tmp_path: Path) -> None:
    got = tmp_path / "args"
    ok = script(tmp_path, "args.sh", f'printf "%s\\n" "$@" > {got}\n')
    applier = appliers.make("script", tmp_path, script=f"{ok} --mode 'two words'")
    applier.apply(DEFAULT, None)
    args = got.read_text().splitlines()
    assert args[:3] == ["--mode", "two words", "apply"]
    assert len(args) == 4  # and the path


def test_script_failure_says_its_status_and_last_line(tmp_path: Path) -> None:
    bad = script(tmp_path, "bad.sh", 'echo "setting mtu"\n'
                                     'echo "eth9: no such device" >&2\necho\nexit 3\n')
    applier = appliers.make("script", tmp_path, script=str(bad))
    with pytest.raises(ApplyError) as info:
        applier.apply(DEFAULT, None)
    assert str(info.value) == "profile script exited with status 3: eth9: no such device"
    assert not (tmp_path / appliers.RECORD_FILE).exists()


def test_script_output_is_bounded_and_the_last_line_cut(tmp_path: Path) -> None:
    loud = script(tmp_path, "loud.sh",
                  "i=0\nwhile [ $i -lt 2000 ]; do echo line $i; i=$((i+1)); done\n"
                  "head -c 1000 /dev/zero | tr '\\0' x\nexit 1\n")
    out = appliers.run([str(loud)], timeout=30)
    assert out[0] == "exited with status 1"
    assert len(out[1]) == appliers.OUTPUT_KEPT
    assert out[1].endswith(b"x" * 1000)
    with pytest.raises(ApplyError) as info:
        appliers.make("script", tmp_path, script=str(loud)).apply(DEFAULT, None)
    assert str(info.value) == "profile script exited with status 1: " + "x" * 200


def test_script_timeout_kills_its_whole_process_group(tmp_path: Path) -> None:
    slow = script(tmp_path, "slow.sh", f"sleep 300 &\necho $! > {tmp_path}/child\n"
                                       f"echo $$ > {tmp_path}/parent\necho started\n"
                                       "sleep 300\n")
    applier = appliers.make("script", tmp_path, script=str(slow), timeout=1)
    with pytest.raises(ApplyError) as info:
        applier.apply(DEFAULT, None)
    assert str(info.value) == "profile script timed out after 1s: started"
    for who in ("parent", "child"):
        pid = int((tmp_path / who).read_text())
        wait_for(lambda pid=pid: gone(pid), what=f"the script's {who} {pid} ends")
    assert not (tmp_path / appliers.RECORD_FILE).exists()


def gone(pid: int) -> bool:
    """Whether a process has ended (a zombie waiting for its reaper has)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return True
    return fields[0] in ("Z", "X")


def test_script_that_cannot_start(tmp_path: Path) -> None:
    applier = appliers.make("script", tmp_path, script=str(tmp_path / "no-such-script"))
    with pytest.raises(ApplyError, match=r"could not start .*no-such-script.*"
                                         r"No such file or directory"):
        applier.apply(DEFAULT, None)
    assert not (tmp_path / appliers.RECORD_FILE).exists()


def test_script_that_exits_leaving_a_child_holding_its_output(tmp_path: Path) -> None:
    # a script that starts a daemon and exits 0 has applied the profile; the daemon
    # keeping the pipe open neither fails the switch nor is killed
    quick = script(tmp_path, "daemon.sh", f"sleep 300 &\necho $! > {tmp_path}/child\n"
                                          "echo done\n")
    applier = appliers.make("script", tmp_path, script=str(quick), timeout=60)
    applier.apply(DEFAULT, None)
    assert record(tmp_path) == DEFAULT
    child = int((tmp_path / "child").read_text())
    assert not gone(child)
    os.kill(child, 9)
