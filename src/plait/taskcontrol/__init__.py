"""TaskControl: applications approve or delay operations on their own tasks."""

from plait.taskcontrol.controllers import (
    DefaultController,
    LeaderLast,
    OneAtATime,
    PacingController,
    ReplicaAware,
)
from plait.taskcontrol.protocol import (
    AdvanceNotice,
    NoticeKind,
    OpKind,
    RemoteController,
    TaskController,
    TaskControlRequest,
    TaskControlResponse,
    TaskOp,
    request_from_wire,
    response_from_wire,
    response_to_wire,
    to_wire,
)

__all__ = [
    "AdvanceNotice",
    "DefaultController",
    "LeaderLast",
    "NoticeKind",
    "OneAtATime",
    "OpKind",
    "PacingController",
    "RemoteController",
    "ReplicaAware",
    "TaskControlRequest",
    "TaskControlResponse",
    "TaskController",
    "TaskOp",
    "request_from_wire",
    "response_from_wire",
    "response_to_wire",
    "to_wire",
]
