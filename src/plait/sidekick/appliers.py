"""Appliers: what switches the machine an agent runs on to a host profile.

An applier gets a profile in its wire form (``HostProfile.wire()``: name, version,
settings) and the wire form of the profile applied before it (None when there was
none or it is unknown), and either switches the machine or raises ``ApplyError``,
whose one line says why (the agent shows it in an event). Three kinds:

* ``record`` (the default) changes nothing on the host: it writes the profile to
  ``STATE_DIR/host-profile.json`` so what the machine is meant to carry is on record.
* ``sysctl`` writes the profile's ``sysctls`` under /proc/sys and restores on leave:
  the first time it sets a key it saves the key's original value
  (``STATE_DIR/sysctl-saved.json``, which outlives the agent process), and when it
  switches to a profile that no longer sets that key it writes the original back
  and forgets it, so switching to ``default`` (which sets nothing) undoes everything
  it did. A switch is all or nothing: when a key cannot be set, the keys the switch
  changed already are written back as they were. The other settings (cgroup
  controllers, turbo, hugepages, filesystem label, NIC, user) are not applied by it:
  they are on record only.
* ``script`` runs an admin's command, ``CMD apply PATH``, PATH a JSON file holding
  the profile's wire form and ``previous``; exit 0 means applied. The command runs
  in a session of its own with stdin from /dev/null, the last 4 KiB of its output
  kept, and all of its process group is killed when it overruns its time.

Every kind writes the record file after a switch that succeeded.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import shlex
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Protocol

#: the profile last switched to, in its wire form
RECORD_FILE = "host-profile.json"
#: the original values of the sysctls the ``sysctl`` applier set, by key
SYSCTL_SAVED_FILE = "sysctl-saved.json"

KINDS = ("record", "sysctl", "script")

OUTPUT_KEPT = 4096  # bytes of a script's output kept (its last)
LAST_LINE = 200  # characters of that output an error shows
_READ_MAX = 64 * 1024  # bytes read of one /proc/sys file (values are a line)


class ApplyError(Exception):
    """A switch that failed; str() is one line saying why (shown in an event)."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(message.split()))


class Applier(Protocol):
    #: "record" | "sysctl" | "script"
    name: str

    def apply(self, profile: dict[str, Any], previous: dict[str, Any] | None) -> None:
        """Switch to ``profile`` (the wire form: name, version, settings); ``previous``
        is the wire form of the profile applied before (None if none/unknown).
        Raises ApplyError."""
        ...


def make(kind: str, state_dir: Path, *, script: str | None = None,
         timeout: float = 300.0, proc_sys: Path = Path("/proc/sys")) -> Applier:
    """The applier of a kind; ``state_dir`` is where it keeps its files (made when
    first written). ValueError for an unknown kind, or a ``script`` applier without a
    command."""
    if kind == "record":
        return RecordApplier(state_dir)
    if kind == "sysctl":
        return SysctlApplier(state_dir, proc_sys)
    if kind == "script":
        if not script or not shlex.split(script):
            raise ValueError("the script applier needs a command")
        if timeout <= 0:
            raise ValueError(f"a script's timeout is positive, not {timeout}")
        return ScriptApplier(state_dir, script, timeout)
    raise ValueError(f"unknown profile applier {kind!r} (one of {', '.join(KINDS)})")


def _write_json(path: Path, data: Any) -> None:
    """Write ``data`` to ``path`` whole or not at all: a new private file beside it
    (mode 0600), synced, renamed over the old one. ApplyError naming the path."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(data, f, sort_keys=True)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as e:
        raise ApplyError(f"cannot write {path}: {e.strerror or e}") from e


def _record(state_dir: Path, profile: dict[str, Any]) -> None:
    _write_json(state_dir / RECORD_FILE, profile)


class RecordApplier:
    """Applies nothing to the host: the profile is on record only."""

    name = "record"

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir

    def apply(self, profile: dict[str, Any], previous: dict[str, Any] | None) -> None:
        _record(self.state_dir, profile)


class SysctlApplier:
    """Writes a profile's sysctls under ``proc_sys`` and restores the original value
    of a key it set when it switches to a profile that no longer sets that key. The
    other settings are not applied (on record only)."""

    name = "sysctl"

    def __init__(self, state_dir: Path, proc_sys: Path = Path("/proc/sys")) -> None:
        self.state_dir = state_dir
        self.proc_sys = proc_sys

    @property
    def saved_path(self) -> Path:
        return self.state_dir / SYSCTL_SAVED_FILE

    def saved(self) -> dict[str, str]:
        """The original value of every key this applier has set, as saved before its
        first write of the key."""
        try:
            data = json.loads(self.saved_path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as e:
            raise ApplyError(f"cannot read {self.saved_path}: {e}") from e
        saved = data.get("saved") if isinstance(data, dict) else None
        if not isinstance(saved, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in saved.items()):
            raise ApplyError(f"cannot read {self.saved_path}: not a map of saved sysctls")
        return saved

    def _save(self, saved: dict[str, str]) -> None:
        _write_json(self.saved_path, {"saved": saved})

    def path(self, key: str) -> Path:
        """The file of a key (``net.core.somaxconn``: ``net/core/somaxconn``);
        ApplyError for a key that would name a file elsewhere."""
        parts = key.split(".")
        if any(p in ("", ".", "..") or "/" in p or "\0" in p for p in parts):
            raise ApplyError(f"sysctl {key!r}: not a sysctl name")
        return self.proc_sys.joinpath(*parts)

    def _read(self, key: str) -> str:
        try:
            fd = os.open(self.path(key), os.O_RDONLY)
            try:
                value = os.read(fd, _READ_MAX)
            finally:
                os.close(fd)
        except OSError as e:
            raise ApplyError(f"cannot read sysctl {key}: {e.strerror or e}") from e
        return value.decode(errors="replace").rstrip("\n")

    def _write(self, key: str, value: str) -> None:
        # (no O_CREAT: a key the kernel does not have is an error, not a new file)
        try:
            fd = os.open(self.path(key), os.O_WRONLY | os.O_TRUNC)
            try:
                os.write(fd, value.encode())
            finally:
                os.close(fd)
        except OSError as e:
            raise ApplyError(f"cannot set sysctl {key} to {value!r}: "
                             f"{e.strerror or e}") from e

    def apply(self, profile: dict[str, Any], previous: dict[str, Any] | None) -> None:
        wanted: dict[str, str] = {str(k): str(v) for k, v in
                                  (profile.get("settings", {}).get("sysctls") or {}).items()}
        for key in wanted:
            self.path(key)  # every name checked before anything changes
        start = self.saved()
        saved = dict(start)
        changed: list[tuple[str, str]] = []  # (key, its value before this switch)
        try:
            # leave: the keys this applier set that the profile no longer sets get
            # their original back
            for key in sorted(set(saved) - set(wanted)):
                try:
                    now = self._read(key)
                except ApplyError as e:
                    if isinstance(e.__cause__, FileNotFoundError):
                        del saved[key]  # (the kernel has no such key now: nothing to restore)
                        continue
                    raise
                changed.append((key, now))  # (a write that failed is set back too)
                self._write(key, saved[key])
                del saved[key]
            # switch: the original of a key is saved before its first write
            for key, value in sorted(wanted.items()):
                now = self._read(key)
                if key not in saved:
                    saved[key] = now
                    self._save(saved)
                changed.append((key, now))
                self._write(key, value)
            if saved != start:
                self._save(saved)
            _record(self.state_dir, profile)
        except ApplyError as e:
            stuck = self._undo(changed)
            # the originals of keys left changed stay saved, so a later switch restores them
            kept = dict(start) | {k: saved[k] for k in stuck if k in saved}
            with contextlib.suppress(ApplyError):
                self._save(kept)
            if stuck:
                raise ApplyError(f"{e}; and could not set back {', '.join(stuck)}") from e
            raise

    def _undo(self, changed: list[tuple[str, str]]) -> list[str]:
        """Write back the values a switch changed, last first; the keys that could not
        be written back."""
        stuck = []
        for key, value in reversed(changed):
            try:
                with contextlib.suppress(ApplyError):
                    if self._read(key) == value:
                        continue  # (its write failed before changing it)
                self._write(key, value)
            except ApplyError:
                stuck.append(key)
        return stuck


class ScriptApplier:
    """Runs ``CMD apply PATH``; exit 0 within ``timeout`` seconds is a switch."""

    name = "script"

    def __init__(self, state_dir: Path, script: str, timeout: float = 300.0) -> None:
        self.state_dir = state_dir
        self.argv = shlex.split(script)
        self.timeout = timeout

    def apply(self, profile: dict[str, Any], previous: dict[str, Any] | None) -> None:
        try:
            self.state_dir.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.state_dir, prefix=".profile-apply.",
                                       suffix=".json")
        except OSError as e:
            raise ApplyError(f"cannot write the profile for the script in {self.state_dir}: "
                             f"{e.strerror or e}") from e
        try:
            try:
                with os.fdopen(fd, "w") as f:
                    json.dump({**profile, "previous": previous}, f, sort_keys=True)
            except OSError as e:
                raise ApplyError(f"cannot write {tmp}: {e.strerror or e}") from e
            failed, output = run([*self.argv, "apply", tmp], self.timeout)
        finally:
            Path(tmp).unlink(missing_ok=True)
        if failed is not None:
            last = last_line(output)
            raise ApplyError(f"profile script {failed}" + (f": {last}" if last else ""))
        _record(self.state_dir, profile)


def last_line(output: bytes) -> str:
    """The last line of output that is not blank, at most ``LAST_LINE`` characters."""
    lines = [ln.strip() for ln in output.decode(errors="replace").splitlines()]
    lines = [ln for ln in lines if ln]
    return lines[-1][:LAST_LINE] if lines else ""


def run(argv: list[str], timeout: float) -> tuple[str | None, bytes]:
    """Run a command in a session of its own, stdin from /dev/null, for at most
    ``timeout`` seconds; its whole process group is killed when it overruns. Returns
    why it failed (None when it exited 0) and the last ``OUTPUT_KEPT`` bytes of its
    stdout and stderr together."""
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True)
    except OSError as e:
        return f"could not start {argv[0]}: {e.strerror or e}", b""
    assert proc.stdout is not None
    out = proc.stdout.fileno()
    kept = bytearray()
    deadline = time.monotonic() + timeout
    timed_out = False

    def read() -> bool:
        chunk = os.read(out, 65536)
        kept.extend(chunk)
        del kept[:-OUTPUT_KEPT]
        return bool(chunk)

    with selectors.DefaultSelector() as sel, proc.stdout:
        sel.register(out, selectors.EVENT_READ)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            if proc.poll() is not None:
                # it exited; a child of its may hold the pipe open: take what is there
                # now, never wait for more
                while time.monotonic() < deadline and sel.select(0) and read():
                    pass
                break
            # (woken at least every 0.1 s to see whether it exited)
            if sel.select(min(left, 0.1)) and not read():
                try:  # end of output: it exits now, or it is timed out
                    proc.wait(max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    timed_out = True
                break
    if timed_out:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return f"timed out after {timeout:g}s", bytes(kept)
    code = proc.returncode
    if code == 0:
        return None, bytes(kept)
    if code < 0:
        try:
            sig = signal.Signals(-code).name
        except ValueError:
            sig = str(-code)
        return f"killed by {sig}", bytes(kept)
    return f"exited with status {code}", bytes(kept)
