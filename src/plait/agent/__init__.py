"""The per-machine agent: runs the tasks the control plane places on its machine."""

from plait.agent.runtime import EXIT_UNKNOWN, Handle, ProcessRuntime

__all__ = ["EXIT_UNKNOWN", "Handle", "ProcessRuntime"]
