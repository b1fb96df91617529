"""The agent's sandbox runtime with real bubblewrap sandboxes.

bwrap must be installed (CI installs Debian's bubblewrap package): without it these
tests fail, they are not skipped. Every test runs under the isolation this machine
offers and, where that is a cgroup mode, under ``rlimit`` too. Every wait is bounded;
nothing asserts speed; every test stops and cleans up what it started.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from runtimeutil import MODES, WAIT, RuntimeEnv, gone, proc_stat, wait_for

from plait.agent import EXIT_UNKNOWN, Handle, ProcessRuntime
from plait.agent.runtime import task_name
from plait.agent.runtimes import RUNTIMES, create_runtime
from plait.agent.sandbox import MISSING_BWRAP, SandboxRuntime, sandbox_hostname
from plait.testing import free_port

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")


def _others_may_run(path: str) -> bool:
    """Can a user who is neither its owner nor in its group run ``path`` (every
    directory on the way searchable by others, the file executable by others)?"""
    real = Path(os.path.realpath(path))
    return all(os.stat(d).st_mode & 0o001 for d in real.parents) and bool(
        os.stat(real).st_mode & 0o001)


#: the interpreter the sandboxed test tasks run (their scripts use the standard library
#: only): as root the sandbox runs tasks as nobody, who must be able to run it (a
#: virtualenv's python may lead into /root)
PY = next((p for p in ("/usr/bin/python3", sys.executable) if os.path.exists(p)
           and _others_may_run(p)), sys.executable)
#: whom the tests' sandboxes run tasks as: nobody, unless nobody could run PY
TASK_USER = "nobody" if _others_may_run(PY) else "root"

def _pids() -> list[int]:
    return [int(e.name) for e in os.scandir("/proc") if e.name.isdigit()]


def _ns(pid: int | str, kind: str = "pid") -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/{kind}")
    except OSError:
        return None


def sandbox_ns(h: Handle) -> str:
    """The pid namespace of a running task's sandbox: that of bwrap's child."""
    found: list[str] = []

    def child() -> bool:
        for pid in _pids():
            rest = proc_stat(pid)
            if rest is not None and int(rest[1]) == h.pid:
                ns = _ns(pid)
                if ns is not None and ns != _ns("self"):
                    found.append(ns)
                    return True
        return False

    wait_for(child, what=f"the sandbox of {h.key}")
    return found[0]


def ns_members(ns: str) -> list[int]:
    """Host pids of the live processes in a pid namespace."""
    out = []
    for pid in _pids():
        rest = proc_stat(pid)
        if rest is not None and rest[0] not in (b"Z", b"X") and _ns(pid) == ns:
            out.append(pid)
    return out


class Env(RuntimeEnv):
    """A sandbox runtime plus bookkeeping so every test leaves no process behind."""

    def __init__(self, data_dir: Path, isolation: str) -> None:
        self.data_dir = data_dir
        self.isolation = isolation
        self.rt = SandboxRuntime(data_dir, isolation=isolation, task_user=TASK_USER)
        self.handles: list[tuple[ProcessRuntime, Handle]] = []
        self.namespaces: list[str] = []
        self.work = data_dir / "work"
        self.work.mkdir(exist_ok=True)

    def key(self) -> str:
        return f"m1.{uuid.uuid4().hex[:8]}/t.0"

    def task_env(self, **extra: str) -> dict[str, str]:
        return {"PATH": os.environ.get("PATH", ""), "PLAIT_DATA_DIR": str(self.work), **extra}

    def run(self, script: str, key: str | None = None, rt: ProcessRuntime | None = None,
            env: dict[str, str] | None = None, memory_mb: int = 256) -> Handle:
        return self.start([PY, "-u", "-c", textwrap.dedent(script)], key, rt, env, memory_mb)

    def start(self, argv: list[str], key: str | None = None, rt: ProcessRuntime | None = None,
              env: dict[str, str] | None = None, memory_mb: int = 256) -> Handle:
        rt = rt or self.rt
        h = rt.start(key or self.key(), argv[0], argv[1:],
                     env=env if env is not None else self.task_env(),
                     cwd=self.work, cpu=0.5, memory_mb=memory_mb)
        self.handles.append((rt, h))
        return h

    def track(self, h: Handle) -> str:
        """The task's pid namespace, checked to be empty when the test ends."""
        ns = sandbox_ns(h)
        self.namespaces.append(ns)
        return ns

    def result(self, h: Handle) -> dict[str, object]:
        """The JSON the task printed on a line starting ``result=``."""
        self.wait_log(h, "result=")
        line = next(ln for ln in self.log_text(h).splitlines() if ln.startswith("result="))
        data = json.loads(line[len("result="):])
        assert isinstance(data, dict)
        return data

    def close(self) -> None:
        super().close()
        for ns in self.namespaces:
            wait_for(lambda ns=ns: not ns_members(ns), what="the sandbox to be empty")


@pytest.fixture(params=MODES)
def env(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Env]:
    e = Env(tmp_path, request.param)
    yield e
    e.close()


# --------------------------------------------------------------------- construction


def test_bwrap_is_installed() -> None:
    assert shutil.which("bwrap"), MISSING_BWRAP


def test_a_missing_bwrap_is_a_clear_error(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(RuntimeError) as info:
        SandboxRuntime(tmp_path, bwrap=str(tmp_path / "no-such-bwrap"))
    assert str(info.value) == MISSING_BWRAP
    assert "bubblewrap" in MISSING_BWRAP and "bwrap" in MISSING_BWRAP
    empty = tmp_path / "empty-path"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    with pytest.raises(RuntimeError, match="needs bubblewrap"):
        SandboxRuntime(tmp_path)
    with pytest.raises(RuntimeError, match="needs bubblewrap"):
        create_runtime("sandbox", tmp_path)


def test_create_runtime(tmp_path: Path) -> None:
    assert RUNTIMES == ("process", "sandbox")
    process = create_runtime("process", tmp_path)
    assert type(process) is ProcessRuntime
    sandbox = create_runtime("sandbox", tmp_path)
    assert isinstance(sandbox, SandboxRuntime)
    assert sandbox.isolation == process.isolation
    for bad in ("docker", "", "Sandbox"):
        with pytest.raises(ValueError) as info:
            create_runtime(bad, tmp_path)
        assert "process" in str(info.value) and "sandbox" in str(info.value)


def test_described(tmp_path: Path) -> None:
    rt = SandboxRuntime(tmp_path)
    text = rt.describe()
    print(f"sandbox runtime on this machine: {text}")
    assert text.startswith(f"sandbox (bubblewrap {rt.bwrap_version}: ")
    assert "pid/ipc/uts" in text and "read-only root" in text and "private /tmp" in text
    assert text.endswith(ProcessRuntime.describe(rt))
    assert f"+ {rt.isolation}" in text
    assert "\n" not in text


def test_hostnames() -> None:
    assert sandbox_hostname("m1.ab12/web.0") == "m1.ab12-web.0"
    assert sandbox_hostname("/x y/") == "x-y"
    assert sandbox_hostname("%%") == "plait-task"
    assert len(sandbox_hostname("a" * 200)) == 63


# --------------------------------------------------------------------- the sandbox


def test_own_namespaces_and_the_host_network(env: Env) -> None:
    h = env.run("""
        import json, os, socket, sys
        names = sorted(p for p in os.listdir("/proc") if p.isdigit())
        ns = {k: os.readlink(f"/proc/self/ns/{k}") for k in ("pid", "ipc", "uts", "net")}
        print("result=" + json.dumps({"pid": os.getpid(), "procs": names, "ns": ns,
                                      "hostname": socket.gethostname(), "cwd": os.getcwd(),
                                      "data": os.environ["PLAIT_DATA_DIR"]}))
        print("oops", file=sys.stderr)
        sys.exit(3)
    """)
    assert h.pid == h.pgid  # its own session and process group, as a plain process
    assert env.wait_exit(h) == 3  # the command's exit code, through bwrap
    res = env.result(h)
    # its own pid namespace: pid 2 under bwrap's init, and nothing else to see
    assert res["pid"] == 2
    assert res["procs"] == ["1", "2"]
    mine = {k: _ns("self", k) for k in ("pid", "ipc", "uts", "net")}
    ns = res["ns"]
    assert isinstance(ns, dict)
    for kind in ("pid", "ipc", "uts"):
        assert ns[kind] != mine[kind], kind
    assert ns["net"] == mine["net"]  # the network is shared, on purpose
    assert res["hostname"] == sandbox_hostname(h.key) != socket.gethostname()
    assert res["cwd"] == res["data"] == str(env.work)
    assert "oops" in env.log_text(h)
    assert h.log_path == env.data_dir / "logs" / f"{task_name(h.key)}.log"


def test_filesystem_view(env: Env) -> None:
    tag = uuid.uuid4().hex[:8]
    host_tmp = Path(f"/tmp/plait-sandbox-host-{tag}")
    inner_tmp = Path(f"/tmp/plait-sandbox-inner-{tag}")
    # a host directory outside the data dir, and outside /tmp (which the sandbox replaces)
    outside = Path(tempfile.mkdtemp(prefix="plait-sandbox-", dir="/var/tmp"))
    try:
        host_tmp.write_text("host")
        outside.chmod(0o755)  # (the host's own files, as anyone may read them)
        (outside / "host.txt").write_text("readable")
        (outside / "host.txt").chmod(0o644)
        (outside / "secret.txt").write_text("root's")  # (as /etc/shadow, a credential)
        (outside / "secret.txt").chmod(0o600)
        h = env.run(f"""
            import json, os
            def attempt(path):
                try:
                    with open(path, "w") as f:
                        f.write("from the task")
                    return "ok"
                except OSError as e:
                    return e.errno
            caps = next(int(ln.split()[1], 16) for ln in open("/proc/self/status")
                        if ln.startswith("CapEff:"))
            data = os.environ["PLAIT_DATA_DIR"]
            def read(path):
                try:
                    return open(path).read()
                except OSError as e:
                    return e.errno
            print("result=" + json.dumps({{
                "read_outside": read({str(outside / "host.txt")!r}),
                "read_secret": read({str(outside / "secret.txt")!r}),
                "uid": os.getuid(),
                "write_outside": attempt({str(outside / "new.txt")!r}),
                "write_usr": attempt("/usr/plait-sandbox-{tag}"),
                "write_agent_dir": attempt({str(env.data_dir / "intruder")!r}),
                "agent_logs_visible": os.path.exists({str(env.data_dir / "logs")!r}),
                "write_data": attempt(os.path.join(data, "out.txt")),
                "write_tmp": attempt({str(inner_tmp)!r}),
                "read_tmp_back": open({str(inner_tmp)!r}).read(),
                "host_tmp_visible": os.path.exists({str(host_tmp)!r}),
                "sys_admin": bool(caps >> 21 & 1),
            }}))
        """)
        assert env.wait_exit(h) == 0, env.log_text(h)
        res = env.result(h)
        assert res["read_outside"] == "readable"  # the host's files, read-only
        if env.rt.task_ids is not None:  # the task runs as nobody: root's files are root's
            assert res["uid"] == 65534 and res["read_secret"] == errno.EACCES
            assert (env.work / "out.txt").stat().st_uid == 65534
        assert res["write_outside"] == errno.EROFS
        assert res["write_usr"] == errno.EROFS
        assert not (outside / "new.txt").exists()
        # the agent's data dir (logs, other tasks, its credential) is hidden
        assert res["agent_logs_visible"] is False
        assert res["write_agent_dir"] == errno.EROFS
        assert not (env.data_dir / "intruder").exists()
        # its data dir is the host's, read-write
        assert res["write_data"] == "ok"
        assert (env.work / "out.txt").read_text() == "from the task"
        # a private /tmp
        assert res["write_tmp"] == "ok"
        assert res["read_tmp_back"] == "from the task"
        assert not inner_tmp.exists()
        assert res["host_tmp_visible"] is False
        if os.geteuid() == 0:  # root keeps no CAP_SYS_ADMIN: the mounts stay read-only
            assert res["sys_admin"] is False
    finally:
        shutil.rmtree(outside, ignore_errors=True)
        host_tmp.unlink(missing_ok=True)
        inner_tmp.unlink(missing_ok=True)


def test_a_task_listening_on_its_port_is_reached_from_the_host(env: Env) -> None:
    (env.work / "hello.txt").write_text("hello from the sandbox")
    port = free_port()
    h = env.start([PY, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
                  env=env.task_env(PLAIT_PORT=str(port)))
    env.track(h)
    body: list[bytes] = []

    def fetched() -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/hello.txt", timeout=5) as r:
                body.append(r.read())
            return True
        except OSError:
            assert env.rt.poll(h) is None, env.log_text(h)
            return False

    wait_for(fetched, what="the task's HTTP server")
    assert body[0] == b"hello from the sandbox"
    # http.server dies of SIGTERM: reported the way bwrap reports it, 128 + 15
    assert env.rt.stop(h, grace=20) == 128 + signal.SIGTERM


# --------------------------------------------------------------------- stop


def test_stop_honours_sigterm(env: Env) -> None:
    h = env.run("""
        import signal, sys, time
        def term(*_):
            print("got term", flush=True)
            sys.exit(0)
        signal.signal(signal.SIGTERM, term)
        print("ready", flush=True)
        time.sleep(120)
    """)
    ns = env.track(h)
    env.wait_log(h, "ready")
    assert env.rt.poll(h) is None
    assert env.rt.stop(h, grace=20) == 0  # the task's own exit, within the grace
    assert "got term" in env.log_text(h)
    assert env.rt.poll(h) == 0
    wait_for(lambda: not ns_members(ns), what="the sandbox to be empty")
    for group in h.cgroups:
        assert not group.exists()


def test_stop_kills_after_the_grace(env: Env) -> None:
    h = env.run("""
        import signal, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("ready", flush=True)
        time.sleep(120)
    """)
    ns = env.track(h)
    env.wait_log(h, "ready")
    t0 = time.monotonic()
    assert env.rt.stop(h, grace=0.5) == -signal.SIGKILL
    assert time.monotonic() - t0 >= 0.5  # it waited for the grace
    assert gone(h.pid, h.start_time)
    wait_for(lambda: not ns_members(ns), what="the sandbox to be empty")


def test_stop_kills_everything_in_the_sandbox(env: Env) -> None:
    """Even a process that left the task's process group (setsid) and ignores SIGTERM:
    killing the sandbox's init ends its whole pid namespace, with or without cgroups."""
    h = env.run(f"""
        import os, signal, subprocess, time
        keep = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"
        subprocess.Popen([{PY!r}, "-c", keep])
        subprocess.Popen([{PY!r}, "-c", keep], start_new_session=True)
        print("ready", flush=True)
        time.sleep(120)
    """)
    ns = env.track(h)
    env.wait_log(h, "ready")
    # bwrap's init, the task and its two children
    wait_for(lambda: len(ns_members(ns)) == 4, what="the task's children")
    members = [(pid, int(st[19])) for pid in ns_members(ns) if (st := proc_stat(pid)) is not None]
    escaped = [pid for pid, _ in members if (st := proc_stat(pid)) and int(st[2]) != h.pgid]
    assert len(escaped) == 1
    code = env.rt.stop(h, grace=5)
    assert code == 128 + signal.SIGTERM  # the task died of the SIGTERM
    for pid, start in members:
        wait_for(lambda pid=pid, start=start: gone(pid, start), what=f"process {pid} to die")
    assert not ns_members(ns)


# --------------------------------------------------------------------- limits


def test_limits_apply_inside_the_sandbox(env: Env) -> None:
    h = env.run("""
        import json
        print("result=" + json.dumps({"cgroup": open("/proc/self/cgroup").read()}))
        import time; time.sleep(120)
    """, memory_mb=256)
    ns = env.track(h)
    res = env.result(h)
    inside = ns_members(ns)
    assert len(inside) == 2  # bwrap's init and the task
    mem = 256 * 1024 * 1024
    for pid in [h.pid, *inside]:
        core = next(ln for ln in Path(f"/proc/{pid}/limits").read_text().splitlines()
                    if ln.startswith("Max core file size"))
        assert core.split()[4:6] == ["0", "0"]
    if env.isolation == "rlimit":
        assert h.cgroup is None and h.cgroups == []
        for pid in [h.pid, *inside]:
            limits = Path(f"/proc/{pid}/limits").read_text().splitlines()
            line = next(ln for ln in limits if ln.startswith("Max address space"))
            assert line.split()[3:5] == [str(mem), str(mem)]
        return
    assert h.cgroup is not None
    limit = "memory.max" if env.isolation == "cgroup2" else "memory.limit_in_bytes"
    assert (h.cgroup / limit).read_text().split() == [str(mem)]
    # bwrap was put in the task's groups before it ran: so is everything in the sandbox
    for group in h.cgroups:
        procs = (group / "cgroup.procs").read_text().split()
        for pid in [h.pid, *inside]:
            assert str(pid) in procs, (group, pid)
    if "cgroup" in env.rt.namespaces:
        # its own cgroup namespace: its group is its root
        lines = [ln for ln in str(res["cgroup"]).splitlines()
                 if ln.startswith("0::") or ":memory:" in ln]
        assert lines
        for line in lines:
            assert line.endswith(":/"), line


def test_a_task_over_its_memory_limit_fails(env: Env) -> None:
    h = env.run("""
        blocks = []
        for _ in range(64):
            blocks.append(bytearray(16 * 1024 * 1024))
        print("survived", flush=True)
    """, memory_mb=128)
    code = env.wait_exit(h)
    assert code != 0
    assert "survived" not in env.log_text(h)


# --------------------------------------------------------------------- adopt


AGENT = """
import json, sys
from pathlib import Path
from plait.agent.sandbox import SandboxRuntime
rt = SandboxRuntime(Path(sys.argv[1]), isolation=sys.argv[2], task_user=sys.argv[6])
work = Path(sys.argv[1]) / "work"
h = rt.start(sys.argv[3], sys.argv[5], ["-u", "-c", sys.argv[4]],
             env={"PLAIT_DATA_DIR": str(work)}, cwd=work, cpu=0.5, memory_mb=256)
print(json.dumps(h.to_dict()))
"""

TASK = """
import os, signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
with open(os.path.join(os.environ["PLAIT_DATA_DIR"], "starts"), "a") as f:
    f.write("started\\n")
print("ready", flush=True)
time.sleep(120)
"""


def test_adopt_after_the_agent_restarts(env: Env) -> None:
    """The first agent (another process) starts a task and exits; a new runtime on the
    same data dir takes the running sandbox back, without restarting it, and stops it."""
    key = env.key()
    out = subprocess.run([sys.executable, "-c", AGENT, str(env.data_dir), env.isolation,
                          key, TASK, PY, TASK_USER],
                         capture_output=True, text=True, timeout=WAIT, check=True)
    saved = json.loads(out.stdout)
    rt2 = SandboxRuntime(env.data_dir, isolation=env.isolation)
    h = rt2.adopt(saved)
    assert h is not None
    env.handles.append((rt2, h))
    assert h.pid == saved["pid"] and h.key == key
    ns = env.track(h)
    env.wait_log(h, "ready")
    assert rt2.poll(h) is None
    assert (env.work / "starts").read_text() == "started\n"  # not restarted
    data, _ = rt2.read_log(h, 0)
    assert data == b"ready\n"
    if env.isolation != "rlimit":
        assert h.cgroup is not None
        assert str(h.pid) in (h.cgroup / "cgroup.procs").read_text().split()
    assert rt2.stop(h, grace=20) == EXIT_UNKNOWN
    assert gone(h.pid, h.start_time)
    wait_for(lambda: not ns_members(ns), what="the sandbox to be empty")
    assert rt2.poll(h) == EXIT_UNKNOWN
    for group in h.cgroups:
        assert not group.exists()


def test_adopt_of_a_dead_task_is_none(env: Env) -> None:
    h = env.run("print('bye')")
    assert env.wait_exit(h) == 0
    assert SandboxRuntime(env.data_dir, isolation=env.isolation).adopt(h.to_dict()) is None


# --------------------------------------------------------------------- start, logs, cleanup


def test_a_missing_command_is_refused(env: Env) -> None:
    for command in ("/nonexistent/cmd", "./nonexistent", "no-such-command-plait"):
        key = env.key()
        with pytest.raises(FileNotFoundError):
            env.rt.start(key, command, [], env=env.task_env(), cwd=env.work, cpu=1,
                         memory_mb=64)
        for parent in env.rt.cgroup_parents.values():
            assert not (parent / task_name(key)).exists()
    assert not list((env.data_dir / "logs").iterdir())


def test_logs_rotation_and_cleanup(env: Env) -> None:
    rt = SandboxRuntime(env.data_dir, isolation=env.isolation, max_log_bytes=1000)
    h = env.run("""
        import sys, time
        sys.stdout.write("a" * 1500 + "\\n")
        sys.stdout.flush()
        print("ready", flush=True)
        time.sleep(120)
    """, rt=rt)
    ns = env.track(h)
    env.wait_log(h, "ready")
    assert rt.rotate_logs() == [h.log_path.name]
    data, off = rt.read_log(h, 0)
    assert data.startswith(b"a" * 1500)
    assert off >= 1501
    rt.cleanup(h.key)  # a running task: killed, its logs removed
    assert gone(h.pid, h.start_time)
    wait_for(lambda: not ns_members(ns), what="the sandbox to be empty")
    assert not any(p.name.startswith(task_name(h.key)) for p in h.log_path.parent.iterdir())
    for group in h.cgroups:
        assert not group.exists()


def test_a_plain_process_handle_is_adopted_and_stopped_gracefully(env: Env) -> None:
    """A task the process runtime started (the agent switched runtimes while it ran):
    its SIGTERM goes to the process itself, which is not bwrap."""
    plain = ProcessRuntime(env.data_dir, isolation=env.isolation)
    h = env.run("""
        import signal, sys, time
        def term(*_):
            print("got term", flush=True)
            sys.exit(0)
        signal.signal(signal.SIGTERM, term)
        print("ready", flush=True)
        time.sleep(120)
    """, rt=plain, env={"PATH": os.environ.get("PATH", "")})
    env.wait_log(h, "ready")
    adopted = env.rt.adopt(h.to_dict())
    assert adopted == h
    env.handles.append((env.rt, h))
    # the test process is still its parent, so the real code can be had
    assert env.rt.stop(h, grace=20) in (0, EXIT_UNKNOWN)
    assert "got term" in env.log_text(h)
    assert gone(h.pid, h.start_time)


def test_a_data_dir_reached_through_a_symlink(env: Env, tmp_path: Path) -> None:
    real = tmp_path / "real-data"
    (real / "tasks" / "t").mkdir(parents=True)
    link = tmp_path / "link-data"
    link.symlink_to(real)
    rt = SandboxRuntime(link, isolation=env.isolation, task_user=TASK_USER)
    home = link / "tasks" / "t"
    h = rt.start(env.key(), PY, ["-c", textwrap.dedent("""
        import os
        with open(os.path.join(os.environ["PLAIT_DATA_DIR"], "out.txt"), "w") as f:
            f.write(os.getcwd())
    """)], env={"PLAIT_DATA_DIR": str(home)}, cwd=home, cpu=0.5, memory_mb=256)
    env.handles.append((rt, h))
    assert env.wait_exit(h, rt) == 0, env.log_text(h)
    assert (real / "tasks" / "t" / "out.txt").read_text() == str(real / "tasks" / "t")


def test_a_program_under_the_hosts_tmp_still_runs(env: Env) -> None:
    """The private /tmp hides the host's, but not the program the task runs from it
    (a checkout with its virtualenv under /tmp): that directory is bound read-only."""
    top = Path(tempfile.mkdtemp(prefix="plait-sandbox-prog-", dir="/tmp"))
    other = Path(tempfile.mkdtemp(prefix="plait-sandbox-other-", dir="/tmp"))
    try:
        program = top / "bin" / "task.sh"
        program.parent.mkdir()
        program.write_text(f"#!/bin/sh\necho ran; test -e {other} && echo other-visible; "
                           f"touch {top}/written 2>/dev/null && echo wrote; exit 0\n")
        program.chmod(0o755)
        top.chmod(0o755)  # (a checkout others may read, as the task's user is another)
        program.parent.chmod(0o755)
        h = env.start([str(program)])
        assert env.wait_exit(h) == 0, env.log_text(h)
        assert env.log_text(h).split() == ["ran"]  # /tmp's other files stay hidden
        assert not (top / "written").exists()  # and its own directory is read-only
    finally:
        shutil.rmtree(top, ignore_errors=True)
        shutil.rmtree(other, ignore_errors=True)


def test_hidden_directories_are_not_visible(env: Env, tmp_path: Path) -> None:
    """``plait up`` hides its whole data dir (the admin token, the store, the other
    agents' credentials): a sandboxed task sees an empty, read-only directory there."""
    secret_dir = tmp_path / "up-data"
    secret_dir.mkdir()
    (secret_dir / "admin-token").write_text("plait_secret")
    rt = SandboxRuntime(env.data_dir, isolation=env.isolation, hide=[secret_dir])
    h = env.start(["/bin/sh", "-c", f"echo listing; ls -A {secret_dir}; echo end; "
                                    f"cat {secret_dir}/admin-token 2>/dev/null; "
                                    f"touch {secret_dir}/x 2>/dev/null && echo wrote; exit 0"],
                  rt=rt)
    assert env.wait_exit(h, rt) == 0
    assert env.log_text(h).split() == ["listing", "end"]  # empty, unreadable, read-only
    assert (secret_dir / "admin-token").read_text() == "plait_secret"


def test_a_hidden_file_reads_as_empty(env: Env) -> None:
    """An agent hides its join token file from its tasks (with it a task could mint a
    credential for any machine): a file named in ``hide`` is /dev/null there (on a
    nodev mount: nothing to read), even one anyone could read, outside the private
    /tmp."""
    outside = Path(tempfile.mkdtemp(prefix="plait-sandbox-hide-", dir="/var/tmp"))
    try:
        outside.chmod(0o755)
        token = outside / "join-token"
        token.write_text("plait_join_secret")
        token.chmod(0o644)
        rt = SandboxRuntime(env.data_dir, isolation=env.isolation, hide=[token],
                            task_user=TASK_USER)
        h = env.start(["/bin/sh", "-c", f"echo before; cat {token} 2>/dev/null; echo after; "
                                        f"(echo x > {token}) 2>/dev/null && echo wrote; exit 0"],
                      rt=rt)
        assert env.wait_exit(h, rt) == 0
        assert env.log_text(h).split() == ["before", "after"]
        assert token.read_text() == "plait_join_secret"
    finally:
        shutil.rmtree(outside, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="tasks change user only under a root agent")
def test_a_data_dir_the_task_user_cannot_reach_is_refused_by_name() -> None:
    closed = Path(tempfile.mkdtemp(prefix="plait-sandbox-closed-", dir="/var/tmp"))  # 0700
    try:
        with pytest.raises(RuntimeError) as info:
            SandboxRuntime(closed / "agent", task_user="nobody")
        assert f"{closed} is closed to others" in str(info.value)
        assert "--task-user root" in str(info.value)
        with pytest.raises(RuntimeError, match="task user 'no-such-user' does not exist"):
            SandboxRuntime(closed / "agent", task_user="no-such-user")
        SandboxRuntime(closed / "agent", task_user="root")  # (as root: as before)
        # a closed directory the sandbox hides is bwrap's own there (`plait up` hides its
        # data dir, mode 0700, with its agents' dirs inside): nothing to refuse
        SandboxRuntime(closed / "agent", task_user="nobody", hide=[closed])
    finally:
        shutil.rmtree(closed, ignore_errors=True)


def test_the_tasks_environment_is_set_inside_the_sandbox_only(env: Env, tmp_path: Path) -> None:
    """bwrap starts with no environment of the task's: a loader variable in the job's
    spec (LD_PRELOAD) reaches the task's own processes, never bwrap itself, which
    holds every capability until the sandbox is made. A PATH in the spec names no host
    directory under /tmp to bind."""
    marker = tmp_path / "preloaded"
    host_dir = Path(tempfile.mkdtemp(prefix="plait-sandbox-path-", dir="/tmp"))
    (host_dir / "secret").write_text("host")
    try:
        task_env = {**env.task_env(), "LD_PRELOAD": f"{marker}.so", "X_SET": "yes",
                    "PATH": f"{host_dir}:{os.defpath}"}
        h = env.start(["/bin/sh", "-c", f"echo x=$X_SET pre=$LD_PRELOAD; "
                                        f"cat {host_dir}/secret 2>/dev/null; echo; echo done; "
                                        "sleep 30"],
                      env=task_env)
        env.wait_log(h, "done")
        lines = env.log_text(h).splitlines()
        # (the task's own programs get it: here ld.so says the file is missing)
        assert f"x=yes pre={marker}.so" in lines and "host" not in lines, lines
        environ = Path(f"/proc/{h.pid}/environ").read_bytes().split(b"\0")
        assert SandboxRuntime._is_bwrap(h.pid)
        assert [e for e in environ if e] == [f"PATH={os.defpath}".encode()]
    finally:
        shutil.rmtree(host_dir, ignore_errors=True)


def test_a_command_probe_runs_in_its_tasks_sandbox(env: Env) -> None:
    """A sandboxed task's command probe sees what the task sees: not the agent's
    data dir (its credential), nor the host's /tmp."""
    from plait.agent.probe import command_probe

    (env.data_dir / "agent.json").write_text('{"token": "machine-secret"}')
    key = env.key()
    h = env.start(["/bin/sh", "-c", "sleep 300"], key=key)
    argv, penv, setup = env.rt.probe_command(key, [
        "/bin/sh", "-c", f"cat {env.data_dir}/agent.json 2>/dev/null | grep -q secret && "
                         "exit 1; exit 0"], env.task_env(), env.work)
    assert argv[0] == env.rt.bwrap and "--clearenv" in argv
    assert command_probe(argv, penv, env.work, 10.0, setup)
    assert env.rt.poll(h) is None
