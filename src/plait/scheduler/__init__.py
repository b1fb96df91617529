"""The scheduler: job and task lifecycle, pacing, TaskControl, failures, maintenance."""

from plait.scheduler.lifecycle import TRANSITIONS, Event, advance
from plait.scheduler.ratelimit import TokenBucket
from plait.scheduler.records import (
    Assignment,
    JobRecord,
    Phase,
    SchedulerEvent,
    TaskRecord,
    TaskStatus,
)
from plait.scheduler.scheduler import Scheduler, SchedulerConfig

__all__ = [
    "TRANSITIONS",
    "Assignment",
    "Event",
    "JobRecord",
    "Phase",
    "Scheduler",
    "SchedulerConfig",
    "SchedulerEvent",
    "TaskRecord",
    "TaskStatus",
    "TokenBucket",
    "advance",
]
