"""The agent's runtimes, by name (``plait agent --runtime``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from plait.agent.runtime import ProcessRuntime

#: the runtimes :func:`create_runtime` makes
RUNTIMES = ("process", "sandbox")


def create_runtime(name: str, data_dir: Path, hide: Sequence[Path] = (),
                   task_user: str = "nobody") -> ProcessRuntime:
    """The agent runtime called ``name`` on ``data_dir``: ``process`` (plain processes,
    :class:`ProcessRuntime`) or ``sandbox`` (the same, each task inside bubblewrap
    namespaces: :class:`plait.agent.sandbox.SandboxRuntime`, which raises RuntimeError
    where bwrap is missing)."""
    if name == "process":
        return ProcessRuntime(data_dir)
    if name == "sandbox":
        from plait.agent.sandbox import SandboxRuntime  # only loaded when asked for

        return SandboxRuntime(data_dir, hide=hide, task_user=task_user)
    raise ValueError(f"unknown agent runtime {name!r}: use one of {', '.join(RUNTIMES)}")
