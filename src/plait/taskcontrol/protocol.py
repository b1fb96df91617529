"""The TaskControl API (paper section 2.5, Figure 8), exactly.

    TaskControlRequest  {job_handle, request: [TaskOp], completed: [TaskOp],
                         advance_notices: [AdvanceNotice], all_unhealthy_tasks: [TaskRef],
                         sequence_number}
    TaskControlResponse {ack: [op_id]}          (+ optional ask_again_after: seconds)

An application's TaskController approves (acks) a subset of the pending operations
on its tasks; the scheduler reports operations it completed on the next call, and
the sequence number increases on every call. Maintenance cannot be blocked forever:
advance notices carry a deadline (and, a plait addition, the window's ``end``, when
the machines are back), and per task the scheduler offers a ``move`` op
and a ``stop`` op; acking neither keeps the task running until the deadline.

The wire form is JSON with snake_case keys; ``to_wire``/``response_from_wire`` are
pure conversions (the HTTP transport lives in ``plait.taskcontrol.http`` and
``plait.taskcontrol.dispatch``). An answer that is not ``{"ack": [op ids]}``, with at
most the optional ``"ask_again_after": seconds`` beside it, is garbage, and garbage
acks nothing.

``ask_again_after`` is plait's one addition to the paper's response: a controller
that declines for a reason plait cannot see (a replica catching up, a shard
migrating) says when it wants to be asked again, instead of waiting for the
scheduler's default re-check (``SchedulerConfig.recheck_interval``, 30 s), at
least half a second and at most an hour later (``MIN_ASK_AGAIN_AFTER``,
``MAX_ASK_AGAIN_AFTER``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Protocol

from plait.errors import ValidationError
from plait.model.task import TaskRef


class OpKind(enum.StrEnum):
    UPDATE = "update"
    RESTART = "restart"
    MOVE = "move"
    STOP = "stop"


class NoticeKind(enum.StrEnum):
    MAINTENANCE = "maintenance"
    LOAN_REVOKE = "loan_revoke"


@dataclass(frozen=True, slots=True)
class TaskOp:
    op_id: str
    task: TaskRef
    kind: OpKind
    reason: str
    #: the machine the task is on when the operation is requested
    machine: str | None = None


# ``new_op``: the slots of TaskRef and TaskOp written through their descriptors (the
# generated ``__init__`` of a frozen dataclass looks ``object.__setattr__`` up and
# calls it for each field: about twice the cost)
_new = object.__new__
_ref_job, _ref_index = (TaskRef.__dict__[f].__set__ for f in ("job", "index"))
_op_id, _op_task, _op_kind, _op_reason, _op_machine = (
    TaskOp.__dict__[f].__set__ for f in ("op_id", "task", "kind", "reason", "machine"))


def new_op(op_id: str, job: str, index: int, kind: OpKind, reason: str,
           machine: str | None) -> TaskOp:
    """``TaskOp(op_id, TaskRef(job, index), kind, reason, machine)``, the same
    objects made faster: the scheduler makes 1,500 in one pass of a 15,000-task
    update (the fields are not checked by either)."""
    ref = _new(TaskRef)
    _ref_job(ref, job)
    _ref_index(ref, index)
    op = _new(TaskOp)
    _op_id(op, op_id)
    _op_task(op, ref)
    _op_kind(op, kind)
    _op_reason(op, reason)
    _op_machine(op, machine)
    return op


@dataclass(frozen=True, slots=True)
class AdvanceNotice:
    notice_id: str
    kind: NoticeKind
    machines: tuple[str, ...]
    tasks: tuple[TaskRef, ...]
    start: float
    #: the tasks must be off the machines by then (the maintenance's start)
    deadline: float
    #: when the maintenance window ends and the machines are back (None: not known)
    end: float | None = None


@dataclass(frozen=True, slots=True)
class TaskControlRequest:
    job_handle: str
    request: tuple[TaskOp, ...] = ()
    completed: tuple[TaskOp, ...] = ()
    advance_notices: tuple[AdvanceNotice, ...] = ()
    all_unhealthy_tasks: tuple[TaskRef, ...] = ()
    sequence_number: int = 0


#: the longest "ask again after" honoured (a larger one is taken as this)
MAX_ASK_AGAIN_AFTER = 3600.0
#: and the shortest: a controller answering 0 to every call had the job called back
#: to back (61 such jobs drew 1,100 calls a second); a smaller one is taken as this
MIN_ASK_AGAIN_AFTER = 0.5


@dataclass(frozen=True, slots=True)
class TaskControlResponse:
    ack: tuple[str, ...] = ()
    #: ask again after this many seconds even if nothing changed (None: the
    #: scheduler's default re-check)
    ask_again_after: float | None = None


class TaskController(Protocol):
    """An application's plugin: approves or delays operations on its own tasks.

    An in-process controller (the built-in ones) is called by the scheduler's pass
    itself; it must be pure and quick. A tenant's controller is a ``RemoteController``
    and is never called from the pass."""

    def process(self, request: TaskControlRequest) -> TaskControlResponse: ...


@dataclass(frozen=True, slots=True)
class RemoteController:
    """A tenant's controller behind a URL. The scheduler never calls it: each pass
    leaves the job's request in ``Scheduler.outbox``, the shell sends it (with a hard
    deadline and a reply-size cap, concurrently with other jobs' calls), and hands
    the answer back with ``Scheduler.answer``; the next pass applies it. So a slow
    or hung controller delays its own job's operations and nothing else."""

    url: str
    #: what the job's signing key is derived from (``signing.key_name``; "": the name)
    key_name: str = ""


@dataclass(frozen=True, slots=True)
class ControllerCall:
    """A request for a job's remote TaskController, left by a pass for the shell."""

    job: str
    url: str
    request: TaskControlRequest
    #: what the call's signing key is derived from (``signing.key_name``; "": ``job``)
    key_name: str = ""
    #: whose call it is (the job's owner): the calls of one tenant in flight at once
    #: are bounded apart from every other tenant's (``plait.taskcontrol.tenantcalls``)
    tenant: str = ""


@dataclass(frozen=True, slots=True)
class ControllerAnswer:
    """What became of a ``ControllerCall``: the controller's response, or why there
    is none (timeout, refused URL, oversized or malformed reply)."""

    job: str
    sequence_number: int
    response: TaskControlResponse | None = None
    error: str | None = None



# -- wire format -------------------------------------------------------------------------
def _ref(ref: TaskRef) -> dict[str, Any]:
    return {"job": ref.job, "index": ref.index}


def _op(op: TaskOp) -> dict[str, Any]:
    return {"op_id": op.op_id, "task": _ref(op.task), "kind": op.kind.value,
            "reason": op.reason, "machine": op.machine}


def to_wire(request: TaskControlRequest) -> dict[str, Any]:
    return {
        "job_handle": request.job_handle,
        "request": [_op(o) for o in request.request],
        "completed": [_op(o) for o in request.completed],
        "advance_notices": [
            {"notice_id": n.notice_id, "kind": n.kind.value, "machines": list(n.machines),
             "tasks": [_ref(t) for t in n.tasks], "start": n.start, "deadline": n.deadline,
             "end": n.end}
            for n in request.advance_notices
        ],
        "all_unhealthy_tasks": [_ref(t) for t in request.all_unhealthy_tasks],
        "sequence_number": request.sequence_number,
    }


def _ref_from(data: Any, field: str) -> TaskRef:
    if not isinstance(data, dict) or not isinstance(data.get("job"), str) or not isinstance(
            data.get("index"), int):
        raise ValidationError(field, "expected {job: str, index: int}")
    return TaskRef(data["job"], data["index"])


def _op_from(data: Any, field: str) -> TaskOp:
    if not isinstance(data, dict):
        raise ValidationError(field, "expected an object")
    try:
        kind = OpKind(str(data.get("kind")))
    except ValueError:
        raise ValidationError(f"{field}.kind", f"unknown kind {data.get('kind')!r}") from None
    op_id, reason, machine = data.get("op_id"), data.get("reason", ""), data.get("machine")
    if not isinstance(op_id, str) or not isinstance(reason, str) or not (
            machine is None or isinstance(machine, str)):
        raise ValidationError(field, "op_id and reason must be strings, machine a string or null")
    return TaskOp(op_id, _ref_from(data.get("task"), f"{field}.task"), kind, reason, machine)


def request_from_wire(data: Any) -> TaskControlRequest:
    """Parse a request (what a controller written in Python receives over HTTP)."""
    if not isinstance(data, dict):
        raise ValidationError("", "a TaskControlRequest must be an object")
    handle, seq = data.get("job_handle"), data.get("sequence_number")
    if not isinstance(handle, str):
        raise ValidationError("job_handle", "must be a string")
    if not isinstance(seq, int):
        raise ValidationError("sequence_number", "must be an integer")
    notices = []
    for k, n in enumerate(data.get("advance_notices", [])):
        f = f"advance_notices[{k}]"
        if not isinstance(n, dict):
            raise ValidationError(f, "expected an object")
        try:
            notices.append(AdvanceNotice(
                str(n["notice_id"]), NoticeKind(n["kind"]), tuple(map(str, n["machines"])),
                tuple(_ref_from(t, f"{f}.tasks") for t in n["tasks"]), float(n["start"]),
                float(n["deadline"]), None if n.get("end") is None else float(n["end"])))
        except (KeyError, ValueError, TypeError) as exc:
            raise ValidationError(f, f"malformed notice: {exc}") from None
    return TaskControlRequest(
        handle,
        tuple(_op_from(o, f"request[{k}]") for k, o in enumerate(data.get("request", []))),
        tuple(_op_from(o, f"completed[{k}]") for k, o in enumerate(data.get("completed", []))),
        tuple(notices),
        tuple(_ref_from(t, "all_unhealthy_tasks") for t in data.get("all_unhealthy_tasks", [])),
        seq,
    )


def response_from_wire(data: Any) -> TaskControlResponse:
    """Parse a controller's answer; anything but ``{"ack": [str, ...]}`` (with an
    optional ``"ask_again_after": seconds``) is refused."""
    if not isinstance(data, dict) or "ack" not in data or not set(data) <= {
            "ack", "ask_again_after"}:
        raise ValidationError("", "expected {\"ack\": [op ids]} and at most "
                                  "\"ask_again_after\": seconds")
    ack = data["ack"]
    if not isinstance(ack, list) or not all(isinstance(a, str) for a in ack):
        raise ValidationError("ack", "must be a list of op id strings")
    again = data.get("ask_again_after")
    if again is not None:
        if isinstance(again, bool) or not isinstance(again, int | float) or not (
                0 <= again < float("inf")):
            raise ValidationError("ask_again_after", "must be a number of seconds >= 0")
        again = min(max(float(again), MIN_ASK_AGAIN_AFTER), MAX_ASK_AGAIN_AFTER)
    return TaskControlResponse(tuple(ack), again)


def response_to_wire(response: TaskControlResponse) -> dict[str, Any]:
    wire: dict[str, Any] = {"ack": list(response.ack)}
    if response.ask_again_after is not None:
        wire["ask_again_after"] = response.ask_again_after
    return wire


def op_to_wire(op: TaskOp) -> dict[str, Any]:
    return _op(op)


def op_from_wire(data: Any, field: str = "op") -> TaskOp:
    return _op_from(data, field)
