"""The agent's process runtime with real processes.

Every test runs under the isolation this machine offers and, where that is a cgroup
mode, under ``rlimit`` too. Every wait is bounded; nothing asserts speed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from runtimeutil import MODES, PY, WAIT, RuntimeEnv, gone, wait_for

from plait.agent import EXIT_UNKNOWN, Handle, ProcessRuntime
from plait.agent.runtime import proc_start_time, task_name

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")

class Env(RuntimeEnv):
    """A runtime plus bookkeeping so every test leaves no process or cgroup behind."""

    def __init__(self, data_dir: Path, isolation: str) -> None:
        self.data_dir = data_dir
        self.isolation = isolation
        self.rt = ProcessRuntime(data_dir, isolation=isolation)
        self.handles: list[tuple[ProcessRuntime, Handle]] = []
        self.work = data_dir / "work"
        self.work.mkdir(exist_ok=True)

    def key(self) -> str:
        return f"t{uuid.uuid4().hex[:8]}/0"

    def run(self, script: str, key: str | None = None, rt: ProcessRuntime | None = None,
            env: dict[str, str] | None = None, memory_mb: int = 256) -> Handle:
        rt = rt or self.rt
        h = rt.start(key or self.key(), PY, ["-u", "-c", textwrap.dedent(script)],
                     env=env if env is not None else {"PATH": os.environ.get("PATH", "")},
                     cwd=self.work, cpu=0.5, memory_mb=memory_mb)
        self.handles.append((rt, h))
        return h


@pytest.fixture(params=MODES)
def env(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Env]:
    e = Env(tmp_path, request.param)
    yield e
    e.close()


def test_isolation_detected_and_described(tmp_path: Path) -> None:
    rt = ProcessRuntime(tmp_path)
    print(f"isolation on this machine: {rt.isolation}: {rt.describe()}")
    assert rt.isolation in ("cgroup2", "cgroup1", "rlimit")
    assert rt.describe().startswith(rt.isolation)
    assert "\n" not in rt.describe()
    assert ProcessRuntime(tmp_path, isolation="rlimit").isolation == "rlimit"
    with pytest.raises(ValueError):
        ProcessRuntime(tmp_path, isolation="sandbox")


def test_task_names_are_safe() -> None:
    assert task_name("job/3") == "job%2F3"
    assert task_name("..") == "%2E."
    assert "/" not in task_name("a/../../b")
    with pytest.raises(ValueError):
        task_name("")


def test_env_cwd_and_output_in_the_log(env: Env) -> None:
    h = env.run("""
        import os, sys
        print("foo=" + os.environ["FOO"])
        print("cwd=" + os.getcwd())
        print("keys=" + ",".join(sorted(os.environ)))
        print("oops", file=sys.stderr)
        sys.exit(3)
    """, env={"FOO": "bar baz", "PATH": "/usr/bin:/bin"})
    assert h.pid == h.pgid  # its own session and process group
    assert h.start_time == proc_start_time(h.pid) or env.rt.poll(h) is not None
    assert env.wait_exit(h) == 3
    text = env.log_text(h)
    assert "foo=bar baz" in text
    assert f"cwd={env.work}" in text
    assert "oops" in text
    # exactly the given environment (the interpreter may add LC_CTYPE)
    keys = next(line for line in text.splitlines() if line.startswith("keys="))[5:].split(",")
    assert {"FOO", "PATH"} <= set(keys) <= {"FOO", "PATH", "LC_CTYPE"}
    assert h.log_path == env.data_dir / "logs" / f"{task_name(h.key)}.log"


def test_read_log_in_pieces(env: Env) -> None:
    h = env.run("print('a' * 100); print('b' * 100)")
    env.wait_exit(h)
    data, off = env.rt.read_log(h, 0, max_bytes=50)
    assert (data, off) == (b"a" * 50, 50)
    rest, off2 = env.rt.read_log(h, off)
    assert data + rest == b"a" * 100 + b"\n" + b"b" * 100 + b"\n"
    assert env.rt.read_log(h, off2) == (b"", off2)
    assert env.rt.read_log(h, off2 + 1000) == (b"", off2)


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
    env.wait_log(h, "ready")
    assert env.rt.poll(h) is None
    assert env.rt.stop(h, grace=20) == 0
    assert "got term" in env.log_text(h)
    assert env.rt.poll(h) == 0
    for group in h.cgroups:
        assert not group.exists()


def test_stop_kills_after_the_grace(env: Env) -> None:
    h = env.run("""
        import signal, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("ready", flush=True)
        time.sleep(120)
    """)
    env.wait_log(h, "ready")
    t0 = time.monotonic()
    code = env.rt.stop(h, grace=0.5)
    elapsed = time.monotonic() - t0
    assert code == -signal.SIGKILL
    # it waited for the grace, and (generously) did not hang
    assert elapsed >= 0.5
    assert elapsed < 0.5 + 20
    assert gone(h.pid, h.start_time)


def test_stop_kills_the_whole_process_group(env: Env) -> None:
    h = env.run(f"""
        import signal, subprocess, sys, time
        child = subprocess.Popen([{PY!r}, "-c",
            "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"])
        print("child", child.pid, flush=True)
        time.sleep(120)
    """)
    env.wait_log(h, "child ")
    line = next(ln for ln in env.log_text(h).splitlines() if ln.startswith("child "))
    child = int(line.split()[1])
    child_start = proc_start_time(child)
    assert child_start is not None
    assert os.getpgid(child) == h.pgid
    assert env.rt.stop(h, grace=5) == -signal.SIGTERM
    wait_for(lambda: gone(child, child_start), what="the task's child to die")


def test_adopt_in_the_same_process(env: Env) -> None:
    h = env.run("""
        import signal, sys, time
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        print("ready", flush=True)
        time.sleep(120)
    """)
    env.wait_log(h, "ready")
    saved = json.loads(json.dumps(h.to_dict()))
    rt2 = ProcessRuntime(env.data_dir, isolation=env.isolation)
    h2 = rt2.adopt(saved)
    assert h2 == h
    assert h2 is not None
    env.handles.append((rt2, h2))
    assert rt2.poll(h2) is None
    data, _ = rt2.read_log(h2, 0)
    assert b"ready" in data
    # the test process is still its parent, so the real code can be had
    assert rt2.stop(h2, grace=20) in (0, EXIT_UNKNOWN)
    assert gone(h.pid, h.start_time)
    for group in h.cgroups:
        assert not group.exists()


AGENT = """
import json, sys
from pathlib import Path
from plait.agent import ProcessRuntime
rt = ProcessRuntime(Path(sys.argv[1]), isolation=sys.argv[2])
h = rt.start(sys.argv[3], sys.executable, ["-u", "-c", sys.argv[4]], env={}, cwd=Path("/"),
             cpu=0.5, memory_mb=256)
print(json.dumps(h.to_dict()))
"""

TASK = """
import signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
print("ready", flush=True)
time.sleep(120)
"""


def test_adopt_after_the_agent_restarts(env: Env) -> None:
    """The first agent (another process) starts a task and exits; the task is no longer
    our child, and a new runtime on the same data dir takes it back and stops it."""
    key = env.key()
    out = subprocess.run([PY, "-c", AGENT, str(env.data_dir), env.isolation, key, TASK],
                         capture_output=True, text=True, timeout=WAIT, check=True)
    saved = json.loads(out.stdout)
    rt2 = ProcessRuntime(env.data_dir, isolation=env.isolation)
    h = rt2.adopt(saved)
    assert h is not None
    env.handles.append((rt2, h))
    assert h.key == key
    assert h.log_path == env.data_dir / "logs" / f"{task_name(key)}.log"
    env.wait_log(h, "ready")
    assert rt2.poll(h) is None
    if env.isolation != "rlimit":
        assert h.cgroup is not None
        assert str(h.pid) in (h.cgroup / "cgroup.procs").read_text().split()
    assert rt2.stop(h, grace=20) == EXIT_UNKNOWN
    assert gone(h.pid, h.start_time)
    assert rt2.poll(h) == EXIT_UNKNOWN
    for group in h.cgroups:
        assert not group.exists()


def test_adopt_of_a_dead_or_reused_pid_is_none(env: Env) -> None:
    h = env.run("print('bye')")
    env.wait_exit(h)  # exited and reaped
    rt2 = ProcessRuntime(env.data_dir, isolation=env.isolation)
    assert rt2.adopt(h.to_dict()) is None
    me = os.getpid()
    start = proc_start_time(me)
    assert start is not None
    reused = Handle(key="x", pid=me, pgid=me, start_time=start + 1,
                    log_path=env.data_dir / "logs" / "x.log")
    assert rt2.adopt(reused.to_dict()) is None


def test_handle_round_trips() -> None:
    h = Handle("j/1", 10, 10, 1234, Path("/d/logs/j%2F1.log"), Path("/cg/a"),
               [Path("/cg/a"), Path("/cg/b")])
    assert Handle.from_dict(json.loads(json.dumps(h.to_dict()))) == h
    bare = Handle("j/1", 10, 10, 1234, Path("/d/logs/j%2F1.log"))
    assert Handle.from_dict(json.loads(json.dumps(bare.to_dict()))) == bare


def test_limits_are_applied(env: Env) -> None:
    h = env.run("""
        print(open("/proc/self/cgroup").read(), flush=True)
        print("ready", flush=True)
        import time; time.sleep(120)
    """, memory_mb=256)
    env.wait_log(h, "ready")
    mem = 256 * 1024 * 1024
    if env.isolation == "rlimit":
        assert h.cgroup is None and h.cgroups == []
        limits = Path(f"/proc/{h.pid}/limits").read_text().splitlines()
        line = next(ln for ln in limits if ln.startswith("Max address space"))
        assert line.split()[3:5] == [str(mem), str(mem)]
    elif env.isolation == "cgroup2":
        assert h.cgroup is not None
        assert (h.cgroup / "memory.max").read_text().split() == [str(mem)]
        assert (h.cgroup / "cpu.max").read_text().split() == ["50000", "100000"]
        assert (h.cgroup / "pids.max").read_text().split() == ["512"]
    else:
        assert h.cgroup is not None
        assert (h.cgroup / "memory.limit_in_bytes").read_text().strip() == str(mem)
        cpu = next(g for g in h.cgroups if (g / "cpu.cfs_quota_us").exists())
        assert (cpu / "cpu.cfs_quota_us").read_text().strip() == "50000"
        assert (cpu / "cpu.cfs_period_us").read_text().strip() == "100000"
        pids = [g for g in h.cgroups if (g / "pids.max").exists()]
        for g in pids:
            assert (g / "pids.max").read_text().strip() == "512"
    core = next(ln for ln in Path(f"/proc/{h.pid}/limits").read_text().splitlines()
                if ln.startswith("Max core file size"))
    assert core.split()[4:6] == ["0", "0"]
    if env.isolation != "rlimit":
        # the task was in its groups from its first instruction (placed before exec)
        first = env.log_text(h)
        name = task_name(h.key)
        for line in first.splitlines():
            if ":memory:" in line or line.startswith("0::"):
                if env.isolation == "cgroup1" and line.startswith("0::"):
                    continue
                assert line.endswith(f"/plait/{name}"), line
        for g in h.cgroups:
            assert str(h.pid) in (g / "cgroup.procs").read_text().split()


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


def test_a_kill_from_outside_is_told_from_out_of_memory(env: Env) -> None:
    """A SIGKILL someone sent is not an out-of-memory kill: the task's memory cgroup
    says which (``oom_killed``); without one, the runtime cannot tell (None)."""
    cgroups = env.isolation != "rlimit"
    h = env.run("import time; time.sleep(600)")
    os.kill(h.pid, signal.SIGKILL)
    assert env.wait_exit(h) == -signal.SIGKILL
    assert env.rt.oom_killed(h) is (False if cgroups else None)
    hog = env.run("""
        blocks = []
        for _ in range(64):
            blocks.append(bytearray(16 * 1024 * 1024))
    """, memory_mb=128)
    code = env.wait_exit(hog)
    if cgroups:
        assert code == -signal.SIGKILL and env.rt.oom_killed(hog) is True
    else:  # (RLIMIT_AS: an allocation fails, the process exits on its own)
        assert code != 0 and env.rt.oom_killed(hog) is None


def test_start_failure_leaves_nothing_behind(env: Env) -> None:
    key = env.key()
    with pytest.raises(FileNotFoundError):
        env.rt.start(key, "/nonexistent/cmd", [], env={}, cwd=env.work, cpu=1, memory_mb=64)
    for parent in env.rt.cgroup_parents.values():
        assert not (parent / task_name(key)).exists()
    with pytest.raises(ValueError):
        env.rt.start(key, PY, [], env={}, cwd=env.work, cpu=0, memory_mb=64)


def test_a_running_key_cannot_start_twice(env: Env) -> None:
    h = env.run("import time; time.sleep(120)")
    with pytest.raises(RuntimeError):
        env.run("print(1)", key=h.key)
    env.rt.stop(h, grace=0)
    h2 = env.run("print('again')", key=h.key)
    assert env.wait_exit(h2) == 0


def test_log_rotation_keeps_three_old_files(env: Env) -> None:
    rt = ProcessRuntime(env.data_dir, isolation=env.isolation, max_log_bytes=1000)
    key = env.key()
    total = b""
    for i in range(6):
        line = f"{i}" * 1499 + "\n"
        h = env.run(f"import sys; sys.stdout.write({line!r})", key=key, rt=rt)
        env.wait_exit(h, rt)
        total += line.encode()
        assert rt.rotate_logs() == [h.log_path.name]
        assert rt.rotate_logs() == []  # now empty: nothing to do
    logs = sorted(p.name for p in h.log_path.parent.iterdir()
                  if p.name.startswith(h.log_path.name))
    name = h.log_path.name
    assert logs == [name, f"{name}.1", f"{name}.2", f"{name}.3"]
    assert h.log_path.stat().st_size == 0
    assert Path(f"{h.log_path}.1").read_bytes() == b"5" * 1499 + b"\n"
    assert Path(f"{h.log_path}.3").read_bytes() == b"3" * 1499 + b"\n"
    # offsets count the whole output: reading from 0 skips what was rotated away
    data, off = rt.read_log(h, 0)
    assert data == b"3" * 1499 + b"\n"
    assert off == 4 * 1500
    rest = b""
    while True:
        chunk, off = rt.read_log(h, off)
        if not chunk:
            break
        rest += chunk
    assert data + rest == total[-3 * 1500 :]
    assert off == len(total)
    # output after the rotation continues the offsets
    h = env.run("print('after')", key=key, rt=rt)
    env.wait_exit(h, rt)
    assert rt.read_log(h, off) == (b"after\n", off + 6)
    rt.cleanup(key)
    assert not any(p.name.startswith(task_name(key)) for p in h.log_path.parent.iterdir())


def test_rotation_while_the_task_writes(env: Env) -> None:
    rt = ProcessRuntime(env.data_dir, isolation=env.isolation, max_log_bytes=2000)
    # one write per line (print may write a line and its newline apart, e.g. under
    # PYTHONUNBUFFERED, and copy-then-truncate can then fall between the two)
    h = env.run("""
        import os, time
        for i in range(100000):
            os.write(1, b"line %06d\\n" % i)
            time.sleep(0.0005)
    """, rt=rt)
    rotations = 0

    def rotated() -> bool:
        nonlocal rotations
        rotations += len(rt.rotate_logs())
        return rotations >= 5

    wait_for(rotated, WAIT, "five rotations of the growing log", poll=0.01)
    rt.stop(h, grace=5)
    olds = [p for p in h.log_path.parent.iterdir() if p.name.startswith(h.log_path.name + ".")]
    assert sorted(p.name[-1] for p in olds) == ["1", "2", "3"]
    # the live file holds only what came after the last rotation: whole lines, from 0
    text = h.log_path.read_text()
    assert "\x00" not in text
    assert text == "" or text.startswith("line ")


def test_a_task_that_floods_its_output_is_rotated_in_bounded_copies(env: Env) -> None:
    """A task writing as fast as it can never holds the rotation (and the agent's
    loop) on its file: each copy is at most what the file held and the bound again,
    and a file many times over the bound keeps its last ``max_log_bytes`` only, the
    bytes between skipped in the offsets."""
    bound = 100_000
    rt = ProcessRuntime(env.data_dir, isolation=env.isolation, max_log_bytes=bound)
    h = rt.start(env.key(), "/bin/sh", ["-c", "yes 0123456789abcdef"],
                 env={"PATH": os.defpath}, cwd=env.work, cpu=0.5, memory_mb=64)
    env.handles.append((rt, h))
    try:
        wait_for(lambda: h.log_path.stat().st_size > 10 * bound)
        assert rt.rotate_logs() == [h.log_path.name]
        first = h.log_path.with_name(h.log_path.name + ".1")
        assert bound <= first.stat().st_size <= 2 * bound
        assert not h.log_path.with_name(h.log_path.name + ".2").exists()
        # a reader from the start is moved to what is kept, whole lines of it on
        data, nxt = rt.read_log(h, 0, 1 << 20)
        assert nxt > 10 * bound and b"0123456789abcdef\n" in data
    finally:
        rt.stop(h, grace=1)


def test_cpu_seconds_count_the_task_and_never_a_process_that_reused_its_pid(env: Env) -> None:
    import dataclasses

    h = env.run("""
        import time
        end = time.process_time() + 0.3
        while time.process_time() < end:
            pass
        time.sleep(60)
    """)
    wait_for(lambda: (env.rt.cpu_seconds(h) or 0.0) >= 0.2)
    # (without a cgroup, the pid's own count: one of another start time is not ours)
    plain = dataclasses.replace(h, cgroup=None, cgroups=[])
    assert (env.rt.cpu_seconds(plain) or 0.0) >= 0.2
    assert env.rt.cpu_seconds(dataclasses.replace(plain, start_time=h.start_time + 1)) is None
    env.rt.stop(h, grace=5)


def test_a_restarted_runtime_reads_the_log_offsets_its_rotations_left(env: Env) -> None:
    rt = ProcessRuntime(env.data_dir, isolation=env.isolation, max_log_bytes=100)
    key = env.key()
    h = env.run("import sys; sys.stdout.write('a' * 150)", key=key, rt=rt)
    env.wait_exit(h, rt)
    assert rt.rotate_logs() == [h.log_path.name]
    h = env.run("import sys; sys.stdout.write('b' * 10)", key=key, rt=rt)
    env.wait_exit(h, rt)
    assert rt.read_log(h, 150) == (b"b" * 10, 160)
    assert rt.read_log(h, 160) == (b"", 160)  # (nothing new)
    again = ProcessRuntime(env.data_dir, isolation=env.isolation, max_log_bytes=100)
    assert again.read_log(h, 150) == (b"b" * 10, 160)
    assert again.read_log(h, 0) == (b"a" * 150, 150)  # (the rotated file, read first)
    rt.cleanup(key)


def test_a_command_probe_runs_in_its_tasks_cgroups_and_leaves_nothing(env: Env) -> None:
    """A command probe starts as its task does: in the task's cgroups (their limits
    hold it; the task's stop kills what it left), and its session is killed when it
    ends, whatever it started in the background."""
    from plait.agent.probe import command_probe

    key = env.key()
    h = env.rt.start(key, "sleep", ["300"], env={"PATH": os.defpath}, cwd=env.work,
                     cpu=0.5, memory_mb=64)
    env.handles.append((env.rt, h))
    out = env.work / "probe.txt"
    script = (f"cat /proc/self/cgroup > {out}; sleep 301 & echo $! >> {out}; "
              f"setsid sleep 302 & echo $! >> {out}; exit 0")
    argv, penv, setup = env.rt.probe_command(key, ["/bin/sh", "-c", script],
                                             {"PATH": os.defpath}, env.work)
    assert command_probe(argv, penv, env.work, 10.0, setup)
    *groups, background, detached = out.read_text().splitlines()
    wait_for(lambda: gone(int(background), None))  # (its session: killed at its end)
    if env.isolation != "rlimit":
        name = Path(h.cgroups[0]).name
        assert any(line.endswith("/" + name) for line in groups), groups
        env.rt.stop(h, grace=1)  # the task's stop takes what the probe left in its group
        wait_for(lambda: gone(int(detached), None))
    else:
        os.kill(int(detached), signal.SIGKILL)  # (rlimit: no group holds it)
