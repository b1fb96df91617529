"""Tasks: one instance of a job, identified by (job, index)."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class TaskState(enum.StrEnum):
    PENDING = "pending"
    ALLOCATED = "allocated"
    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"
    STOPPED = "stopped"
    FAILED = "failed"
    LOST = "lost"
    #: a batch task that exited 0: finished for good, its machine given back
    SUCCEEDED = "succeeded"
    #: a batch task that exited non-zero with no retries left (or restart policy
    #: never): failed for good, its machine given back
    DEAD = "dead"


@dataclass(frozen=True, slots=True)
class TaskRef:
    job: str
    index: int

    def __str__(self) -> str:
        return f"{self.job}/{self.index}"


@dataclass(frozen=True, slots=True)
class Task:
    job: str
    index: int
    spec_version: int
    state: TaskState = TaskState.PENDING
    machine: str | None = None

    @property
    def ref(self) -> TaskRef:
        return TaskRef(self.job, self.index)
