"""The tasks' logs of the agent's process runtime (``plait.agent.runtime``): appended
to ``<data_dir>/logs/<name>.log``, rotated copy-then-truncate, read by offsets that
count every byte of a task's output since its log was created, across rotations."""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path
from typing import Protocol

log = logging.getLogger("plait.agent.runtime")

DEFAULT_MAX_LOG_BYTES = 10 * 1024 * 1024
#: rotated logs kept per task: <name>.log.1 (newest) .. <name>.log.3
OLD_LOGS = 3
#: a log this many times over ``max_log_bytes`` is a flood: only its last ``max_log_bytes``
#: are kept when it is rotated
FLOOD = 4


class Logged(Protocol):
    """What has a log (a runtime's ``Handle``)."""

    @property
    def log_path(self) -> Path: ...


class TaskLogs:
    """The log part of a runtime (a mixin of ``ProcessRuntime``: it sets ``log_dir``,
    ``max_log_bytes`` and ``_bases``)."""

    log_dir: Path
    max_log_bytes: int
    _bases: dict[str, int]

    def _base_path(self, name: str) -> Path:
        return self.log_dir / f"{name}.offset"

    def _base(self, name: str) -> int:
        """The logical offset of the task's current log file's first byte (its output
        rotated away before it), kept in memory once read: only ``_rotate`` changes it."""
        base = self._bases.get(name)
        if base is None:
            try:
                base = int(self._base_path(name).read_text())
            except (OSError, ValueError):
                base = 0
            self._bases[name] = base
        return base

    def _segments(self, log_path: Path) -> list[tuple[Path, int, int]]:
        """(file, logical start, size) of the task's log files, oldest first."""
        name = log_path.name[: -len(".log")]
        try:
            size = log_path.stat().st_size
        except FileNotFoundError:
            size = 0
        start = self._base(name)
        segs = [(log_path, start, size)]
        for i in range(1, OLD_LOGS + 1):
            old = log_path.with_name(f"{log_path.name}.{i}")
            try:
                osize = old.stat().st_size
            except FileNotFoundError:
                break
            start -= osize
            if start < 0:
                break
            segs.append((old, start, osize))
        segs.reverse()
        return segs

    def read_log(self, handle: Logged, offset: int, max_bytes: int = 1 << 20
                 ) -> tuple[bytes, int]:
        """Up to ``max_bytes`` of the task's output from ``offset`` (counted over its
        whole output, across rotations) and the offset after them. An offset older than
        the oldest kept file skips to that file's start."""
        path = handle.log_path
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            size = 0
        start = self._base(path.name[: -len(".log")])
        # a reader at or past the current file's start (every report of a task's
        # output but the first after a rotation) looks at no rotated file
        segs = [(path, start, size)] if offset >= start else self._segments(path)
        first, last = segs[0], segs[-1]
        end = last[1] + last[2]
        if offset >= end:
            return b"", end
        if offset < first[1]:
            offset = first[1]
        for path, seg_start, size in segs:
            if seg_start <= offset < seg_start + size:
                try:
                    with open(path, "rb") as f:
                        f.seek(offset - seg_start)
                        data = f.read(min(max_bytes, seg_start + size - offset))
                except FileNotFoundError:  # rotated away meanwhile: the caller retries
                    return b"", offset
                return data, offset + len(data)
        return b"", offset

    def rotate_logs(self) -> list[str]:
        """Rotate every task log over ``max_log_bytes`` (keeping .1 .. .3); the file
        names rotated."""
        rotated = []
        for path in sorted(self.log_dir.glob("*.log")):
            try:
                if path.stat().st_size > self.max_log_bytes:
                    self._rotate(path)
                    rotated.append(path.name)
            except OSError as e:
                log.warning("cannot rotate %s: %s", path, e.strerror)
        return rotated

    def _rotate(self, path: Path) -> None:
        """Move the log's bytes to ``.1`` (the older ones along) and empty it. The copy is
        bounded, whatever the task writes meanwhile: what the file held, and at most
        ``max_log_bytes`` more. A log many times over the bound (a task that floods its
        output) keeps only its last ``max_log_bytes``, and the older files go: the
        bytes between are dropped (their offsets are skipped)."""
        size = path.stat().st_size
        skipped = size - self.max_log_bytes if size > FLOOD * self.max_log_bytes else 0
        for i in range(OLD_LOGS - 1, 0, -1):
            src = path.with_name(f"{path.name}.{i}")
            if skipped:  # (before the gap: no reader could place them)
                with contextlib.suppress(FileNotFoundError):
                    src.unlink()
            elif src.exists():
                os.replace(src, path.with_name(f"{path.name}.{i + 1}"))
        if skipped:
            with contextlib.suppress(FileNotFoundError):
                path.with_name(f"{path.name}.{OLD_LOGS}").unlink()
        first = path.with_name(f"{path.name}.1")
        with open(path, "rb") as src_f, open(first, "wb") as dst_f:
            src_f.seek(skipped)
            budget = size - skipped + self.max_log_bytes
            while budget > 0:
                chunk = src_f.read(min(1 << 20, budget))
                if not chunk:
                    break
                dst_f.write(chunk)
                budget -= len(chunk)
            copied = dst_f.tell()
        os.truncate(path, 0)  # the task appends (O_APPEND): its next write lands at 0
        name = path.name[: -len(".log")]
        tmp = self._base_path(name).with_suffix(".offset.tmp")
        base = self._base(name) + skipped + copied
        tmp.write_text(str(base))
        os.replace(tmp, self._base_path(name))
        self._bases[name] = base
