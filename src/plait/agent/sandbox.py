"""The agent's ``sandbox`` runtime: each task in a lightweight container made by bubblewrap.

:class:`SandboxRuntime` is the process runtime (:mod:`plait.agent.runtime`) with one
difference: the task's command runs under ``bwrap`` (Debian's ``bubblewrap``
package), which gives it

* its own **pid** namespace (the task is pid 2, under bwrap's small init as pid 1, and
  sees only its own processes), **ipc** namespace (System V IPC, POSIX message queues),
  **uts** namespace (its hostname is made from its task key) and, where the kernel has
  them, **cgroup** namespace (its own cgroup is its ``/``);
* a private filesystem view: the host's root bound **read-only**, a fresh ``/proc``
  and ``/dev``, a private writable ``/tmp`` (a tmpfs), and the agent's data directory
  hidden behind an empty read-only tmpfs (other tasks' files, logs and the agent's
  credential are not visible), except for the task's own working directory and its
  ``PLAIT_DATA_DIR``, bound **read-write at the same paths**, so ``PLAIT_DATA_DIR``
  stays valid and what the task writes there is on the host (a ``PLAIT_DATA_DIR``
  that is relative or goes through a symlink is given the task as its real path, since
  the symlink may be where the sandbox does not show it, such as /tmp);
* when the agent runs as root, the task runs as an unprivileged user (``task_user``,
  ``nobody`` by default; util-linux's ``setpriv`` drops to it inside the sandbox, with
  no capability and no supplementary group), and its working directory and
  ``PLAIT_DATA_DIR`` are made that user's: the host's files are read as that user
  reads them (not ``/etc/shadow``, not another agent's credential, not a root-only
  socket under ``/run``). With ``task_user="root"`` the task keeps a reduced set of
  root's capabilities (:data:`TASK_CAPS`): no ``CAP_SYS_ADMIN`` (so the read-only
  mounts cannot be remounted), no ``CAP_NET_ADMIN``, ``CAP_NET_RAW``, ``CAP_MKNOD``,
  ``CAP_SYS_PTRACE``... bwrap also sets ``no_new_privs``, so no executable regains
  what was dropped;
* files and directories named in ``hide`` (the agent's join token file among them)
  are not visible: a directory behind an empty read-only tmpfs, a file behind
  ``/dev/null``.

The **network namespace is shared** with the host, on purpose: the task listens on its
``PLAIT_PORT`` on the host's interfaces (loopback included) and is reached there by
the health checks, the other tasks and the front ends, exactly as under the process
runtime. The hostname is not in /etc/hosts.

Everything else is the process runtime's, unchanged: the task's session, its log
(bwrap hands its stdout and stderr down to the task), its cgroup or rlimit limits (the
``bwrap`` process is put into the task's cgroups before it execs, and the sandbox's
processes are its descendants, so all of them are limited and counted), adoption after
an agent restart (the handle's pid is the outer ``bwrap`` process, which lives exactly
as long as the task's command; ``--die-with-parent`` is not used, so tasks outlive
the agent), stop and cleanup.

How the pieces relate: the runtime starts ``bwrap`` as the leader of a new session and
process group (``Handle.pid == Handle.pgid``). bwrap clones the sandbox's init, which
forks the task's command; both stay in that process group (``--new-session`` is not
used: the group is what :meth:`~SandboxRuntime.stop` signals, and the task has no
controlling terminal to protect, its stdin being /dev/null). bwrap exits when the
command does, with its exit code. Where this differs from the process runtime:

* the task's ``pids`` limit counts bwrap and the sandbox's init too;
* a command killed by signal *n* is reported as ``128 + n`` (bwrap's convention), not
  ``-n`` (``-9`` is still reported when :meth:`~SandboxRuntime.stop` kills bwrap
  itself after the grace);
* the outer bwrap does not pass signals on and would die of a SIGTERM, so the SIGTERM
  of a stop goes to every member of the task's process group *except* bwrap (the
  sandbox's init, being pid 1 of its namespace, ignores it); the SIGKILL after the
  grace goes to the whole group, and killing the sandbox's init makes the kernel kill
  every process in its pid namespace, so a stop leaves nothing of the task running,
  not even a process that left the group with ``setsid``, in every isolation mode.

A command that is not found is refused at :meth:`~SandboxRuntime.start` with
FileNotFoundError, as the process runtime does, by looking it up on the host first
(the sandbox sees the same files, except under /tmp and the agent's data directory).
bwrap sets ``PWD`` in the task's environment.
"""

from __future__ import annotations

import contextlib
import errno
import os
import pwd
import re
import shutil
import signal
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from plait.agent.runtime import CGROUP_ROOT, DEFAULT_MAX_LOG_BYTES, Handle, ProcessRuntime

MISSING_BWRAP = "the sandbox runtime needs bubblewrap (bwrap); install Debian's bubblewrap package"

#: capabilities a task keeps when the agent runs as root: those of an ordinary root
#: process on its own files (ownership, permission overrides, dropping to another user,
#: ports below 1024), none that reach past the sandbox
TASK_CAPS = (
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FOWNER",
    "CAP_FSETID",
    "CAP_KILL",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT",
    "CAP_AUDIT_WRITE",
)

#: bound on every bwrap run the runtime makes itself (version, probe)
_PROBE_TIMEOUT = 30.0
_HOST_NAME_MAX = 63


def sandbox_hostname(key: str) -> str:
    """The hostname of a task's sandbox: its key with every character other than
    letters, digits, ``-`` and ``.`` made ``-``, at most 63 characters."""
    name = re.sub(r"[^A-Za-z0-9.-]", "-", key)[:_HOST_NAME_MAX].strip("-.")
    return name or "plait-task"


def _namespaces() -> list[str]:
    names = ["pid", "ipc", "uts"]
    if os.path.exists("/proc/self/ns/cgroup"):
        names.append("cgroup")
    return names


def _host_tmp_dirs(command: str, env: Mapping[str, str], cwd: Path) -> list[Path]:
    """The top-level directories of the host's /tmp that hold the task's command or a
    directory of the agent's PATH."""
    tmp = Path("/tmp")
    candidates = [Path(cwd, command)] if "/" in command else []
    # (the agent's own PATH: a PATH in the job's spec names no host directory to bind)
    candidates += [Path(e) for e in os.environ.get("PATH", "").split(os.pathsep) if e]
    found: list[Path] = []
    for path in candidates:
        try:
            parts = Path(os.path.abspath(path)).relative_to(tmp).parts
        except ValueError:
            continue
        top = tmp / parts[0] if parts else None
        if top is not None and top.is_dir() and top not in found:
            found.append(top)
    return found


def _closed_to_others(path: Path, masked: Sequence[Path] = ()) -> Path | None:
    """The first directory on the way to ``path`` that others may not search, or None.
    Those in the sandbox's own /tmp, or in a directory the sandbox hides behind a tmpfs
    (``masked``: ``plait up`` hides its whole data dir, mode 0700), are not the host's
    there: bwrap makes them, searchable."""
    real = path.resolve()
    roots = [Path("/tmp"), *(m.resolve() for m in masked)]
    for up in reversed(real.parents):
        if any(_inside(up, r) for r in roots):
            break
        with contextlib.suppress(OSError):
            if not os.stat(up).st_mode & 0o001:
                return up
    return None


def _inside(path: Path, parent: Path) -> bool:
    """``path`` is ``parent`` or below it."""
    return path == parent or parent in path.parents


class SandboxRuntime(ProcessRuntime):
    """Runs a machine's tasks as the process runtime does, each inside bubblewrap's
    namespaces with a read-only view of the host and its own writable data directory
    (see the module's documentation; the network is shared with the host)."""

    def __init__(
        self,
        data_dir: Path,
        *,
        max_log_bytes: int = DEFAULT_MAX_LOG_BYTES,
        isolation: str | None = None,
        cgroup_root: Path = CGROUP_ROOT,
        bwrap: str | None = None,
        hide: Sequence[Path] = (),
        task_user: str = "nobody",
    ) -> None:
        """``bwrap`` is the bubblewrap executable (by default ``bwrap`` in PATH). Raises
        RuntimeError if it is missing or cannot make a sandbox on this machine.
        ``hide``: directories and files tasks must not see, besides the agent's data
        directory and the plait client configuration's (``plait up`` hides its whole
        data directory: tokens, the store, the other agents). ``task_user``: whom
        tasks run as when the agent runs as root (``root``: as root, with
        :data:`TASK_CAPS`); RuntimeError if there is no such user."""
        from plait.clientconfig import default_path

        self.hidden = [Path(p) for p in (*hide, default_path().parent)]
        found = shutil.which(bwrap or "bwrap")
        if found is None:
            raise RuntimeError(MISSING_BWRAP)
        self.bwrap = os.path.abspath(found)
        self.bwrap_version = self._version()
        self.namespaces = _namespaces()
        self._probe_bwrap()
        #: (uid, gid, setpriv) tasks drop to, or None: they run as the agent's user
        self.task_ids: tuple[int, int, str] | None = None
        if os.geteuid() == 0 and task_user != "root":
            try:
                entry = pwd.getpwnam(task_user)
            except KeyError:
                raise RuntimeError(f"the sandbox's task user {task_user!r} does not exist "
                                   "on this machine (--task-user)") from None
            setpriv = shutil.which("setpriv")
            if setpriv is None:
                raise RuntimeError("the sandbox runs tasks as an unprivileged user with "
                                   "setpriv: install Debian's util-linux")
            self.task_ids = (entry.pw_uid, entry.pw_gid, os.path.abspath(setpriv))
            closed = _closed_to_others(Path(data_dir), self.hidden)
            if closed is not None:
                raise RuntimeError(
                    f"sandboxed tasks run as {task_user}, who cannot reach the agent's data "
                    f"dir {data_dir}: {closed} is closed to others; use a data dir others "
                    "may reach, or --task-user root")
        self.task_user = task_user
        super().__init__(data_dir, max_log_bytes=max_log_bytes, isolation=isolation,
                         cgroup_root=cgroup_root)

    # ----------------------------------------------------------------- bwrap

    def _version(self) -> str:
        try:
            out = subprocess.run([self.bwrap, "--version"], capture_output=True, text=True,
                                 stdin=subprocess.DEVNULL, timeout=_PROBE_TIMEOUT)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise RuntimeError(f"{MISSING_BWRAP} ({self.bwrap} does not run: {e})") from e
        words = out.stdout.split()
        if out.returncode != 0 or not words:
            raise RuntimeError(f"{MISSING_BWRAP} ({self.bwrap} --version failed: "
                               f"{out.stderr.strip()})")
        return words[-1]

    def _base_argv(self, hostname: str) -> list[str]:
        """bwrap's options up to the task's own directories: namespaces, the read-only
        root, fresh /proc and /dev, a private /tmp, the capabilities."""
        argv = [self.bwrap, "--unshare-pid", "--unshare-ipc", "--unshare-uts",
                "--unshare-cgroup-try", "--hostname", hostname,
                "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
                "--tmpfs", "/tmp"]
        if os.geteuid() == 0:
            # bwrap keeps all of root's capabilities unless told otherwise
            argv += ["--cap-drop", "ALL"]
            for cap in TASK_CAPS:
                argv += ["--cap-add", cap]
        return argv

    def _probe_bwrap(self) -> None:
        """Make one empty sandbox now, rather than have every task fail later."""
        argv = [*self._base_argv("plait-probe"), "--", "true"]
        try:
            out = subprocess.run(argv, capture_output=True, text=True, cwd="/",
                                 stdin=subprocess.DEVNULL, env={"PATH": os.defpath},
                                 timeout=_PROBE_TIMEOUT)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise RuntimeError(f"bubblewrap ({self.bwrap}) cannot make a sandbox here: "
                               f"{e}") from e
        if out.returncode != 0:
            raise RuntimeError(f"bubblewrap ({self.bwrap}) cannot make a sandbox here: "
                               f"{(out.stderr or out.stdout).strip()}")

    def describe(self) -> str:
        who = (f"tasks as {self.task_user}" if self.task_ids is not None else
               "tasks as root with reduced capabilities" if os.geteuid() == 0 else
               "tasks as the agent's user")
        return (f"sandbox (bubblewrap {self.bwrap_version}: {'/'.join(self.namespaces)} "
                "namespaces, shared network, read-only root, private /tmp, the task's "
                f"data directory writable, {who}) + {super().describe()}")

    def _give(self, path: Path) -> None:
        """Make a task's directory (and what is in it) its user's, once: a task
        directory written by an earlier run as root is handed over whole."""
        assert self.task_ids is not None
        uid, gid, _ = self.task_ids
        if path.stat().st_uid == uid:
            return
        for root, dirs, files in os.walk(path):
            for name in (*dirs, *files):
                with contextlib.suppress(FileNotFoundError):
                    os.lchown(os.path.join(root, name), uid, gid)
        os.lchown(path, uid, gid)

    # ----------------------------------------------------------------- start

    @staticmethod
    def _check_command(command: str, env: Mapping[str, str], cwd: Path) -> None:
        """FileNotFoundError (or PermissionError) now for a command the sandbox could not
        run, as starting it as a plain process would raise."""
        if "/" in command:
            path = Path(cwd, command)
            if not path.is_file():
                raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), command)
            if not os.access(path, os.X_OK):
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), command)
        elif shutil.which(command, path=env.get("PATH", os.defpath)) is None:
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), command)

    def _argv(self, key: str, command: str, args: list[str], env: Mapping[str, str],
              cwd: Path) -> list[str]:
        self._check_command(command, env, cwd)
        # real paths: the sandbox sees the host's symlinks, and the comparisons below
        # must not be fooled by them
        workdir = Path(cwd).resolve()
        writable = [workdir]
        setenv: list[str] = []
        data = env.get("PLAIT_DATA_DIR")
        if data:
            path = (workdir / data).resolve()
            if path.is_dir() and path not in writable:
                writable.append(path)
            if str(path) != data:
                # the way there may be hidden (a symlink in /tmp): name the real path
                setenv = ["--setenv", "PLAIT_DATA_DIR", str(path)]
        # never the whole root read-write
        writable = [p for p in writable if p != Path("/")]
        if self.task_ids is not None:
            for w in writable:
                self._give(w)
        masked, masked_files = [], []
        for hidden in (self.data_dir, *self.hidden):
            path = hidden.resolve()
            if path == Path("/") or any(_inside(path, w) for w in writable):
                continue
            if path.is_dir() and path not in masked:
                masked.append(path)
            elif path.is_file() and path not in masked_files:
                masked_files.append(path)
        # outermost first, so that a directory inside another is mounted on top of it
        # (the task's directories are usually inside the masked agent directory)
        mounts: list[tuple[int, list[str]]] = [
            (len(w.parts), ["--bind", str(w), str(w)]) for w in writable]
        # the private /tmp hides the host's: programs the task runs from there (its
        # command, or its PATH: a virtualenv checked out under /tmp) stay visible,
        # read-only, with the top-level /tmp directory they are in
        mounts += [(len(p.parts), ["--ro-bind", str(p), str(p)])
                   for p in _host_tmp_dirs(command, env, workdir)]
        mounts += [(len(m.parts), ["--tmpfs", str(m)]) for m in masked]
        mounts += [(len(f.parts), ["--ro-bind", "/dev/null", str(f)]) for f in masked_files]
        mounts.sort(key=lambda m: m[0])
        argv = self._base_argv(sandbox_hostname(key))
        for _, opts in mounts:
            argv += opts
        if self.task_ids is not None:
            argv += self._traversable(writable + _host_tmp_dirs(command, env, workdir),
                                      masked)
        for m in masked:
            # read-only once the task's directories are bound inside it (not recursive)
            argv += ["--remount-ro", str(m)]
        # the task's environment is set inside the sandbox only: bwrap itself starts
        # with none of it (its loader would honour LD_PRELOAD and the like while it
        # still holds every capability)
        environment = ["--clearenv"]
        for name, value in env.items():
            environment += ["--setenv", name, value]
        run = [command, *args]
        if self.task_ids is not None:
            # the task as its unprivileged user: setresuid from root drops every
            # capability, and no_new_privs keeps any from coming back
            uid, gid, setpriv = self.task_ids
            run = [setpriv, f"--reuid={uid}", f"--regid={gid}", "--clear-groups",
                   "--inh-caps=-all", "--", *run]
        return [*argv, *environment, *setenv, "--chdir", str(workdir), "--", *run]

    @staticmethod
    def _traversable(bound: list[Path], masked: list[Path]) -> list[str]:
        """bwrap's options that let the task's user reach what is bound for it: bwrap
        makes the directories on the way to a bind inside a tmpfs (the private /tmp,
        a hidden directory) root's own, 0700; they are made 0755, and the private
        /tmp is made writable by all, as a /tmp is (1777)."""
        roots = [Path("/tmp"), *masked]
        opts = ["--chmod", "1777", "/tmp"]
        done: set[Path] = {Path("/tmp")}
        for path in bound:
            for up in reversed(path.parents):
                if up in done or not any(_inside(up, r) for r in roots):
                    continue
                done.add(up)
                opts += ["--chmod", "0755", str(up)]
        return opts

    def _exec_env(self, env: dict[str, str]) -> dict[str, str]:
        return {"PATH": os.defpath}

    # ----------------------------------------------------------------- stop

    @staticmethod
    def _is_bwrap(pid: int) -> bool:
        # by name: /proc/<pid>/exe would no longer match once bwrap is upgraded
        with contextlib.suppress(OSError):
            return Path(f"/proc/{pid}/comm").read_text().strip() == "bwrap"
        return False

    def _kill_group(self, handle: Handle, sig: int) -> None:
        if sig == signal.SIGKILL:
            # the whole group, bwrap and the sandbox's init included: the kernel then
            # kills everything left in the sandbox's pid namespace
            super()._kill_group(handle, sig)
            return
        # bwrap would die of it at once without passing it on (and so end the stop's
        # grace): only the sandbox's processes get it. The handle's pid is skipped only
        # while it is bwrap: a plain process handle (adopted from the process runtime)
        # is signalled as a whole.
        skip = handle.pid if self._is_bwrap(handle.pid) else None
        for pid in self._group_members(handle):
            if pid != skip:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)


__all__ = ["MISSING_BWRAP", "TASK_CAPS", "SandboxRuntime", "sandbox_hostname"]
