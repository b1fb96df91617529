"""The API's answers as typed dicts: the server declares them as its response models
(so the OpenAPI document types every answer) and the SDK returns them. Only
``typing`` is imported: a client pays nothing to use them."""

from __future__ import annotations

from typing import Any, TypedDict


class Health(TypedDict, total=False):
    ok: bool
    status: str
    version: str
    steps: int
    failed_passes: int
    #: with replicas: leader or follower, the leader's URL, this replica's
    role: str
    leader: str | None
    replica: str


class JobAck(TypedDict, total=False):
    """A job operation, stored: acknowledged (applied asynchronously)."""

    name: str
    entitlement: str
    version: int
    #: the operation's sequence number in the job's log
    operation: int
    deleting: bool
    #: (create) false when the same spec was stored already
    created: bool


class JobView(TypedDict):
    name: str
    entitlement: str
    #: the latest spec version stored, and the one the scheduler applies
    version: int
    applied_version: int
    spec: dict[str, Any]
    deleting: bool
    task_count: int
    #: tasks per state
    tasks: dict[str, int]
    serving: int
    updated: int
    halted: str | None
    rollout_active: bool
    moving_from: str | None
    on_entitlement: int
    unplaced_reason: str | None
    error: str | None
    unavailable: int
    batch: bool
    phase: str
    succeeded: int
    failed: int
    running: int
    settled: bool


class JobList(TypedDict):
    jobs: list[JobView]


class TaskView(TypedDict):
    index: int
    state: str
    version: int
    machine: str | None
    serving: bool
    healthy: bool
    exit_code: int | None
    operation: str | None


class TaskList(TypedDict):
    job: str
    tasks: list[TaskView]


class JobHistory(TypedDict):
    name: str
    versions: int
    operations: list[dict[str, Any]]


class ControllerKey(TypedDict):
    job: str
    key: str
    header: str
    algorithm: str


class Endpoint(TypedDict):
    index: int
    machine: str
    endpoint: str | None


class Discovery(TypedDict):
    job: str
    endpoints: list[Endpoint]


class EntitlementView(TypedDict, total=False):
    name: str
    owner: str
    quota: dict[str, Any]
    host_profile: str
    default_preferences: list[dict[str, Any]]
    machines: int
    rru: float
    jobs: list[str]


class EntitlementList(TypedDict):
    entitlements: list[EntitlementView]


class MachineView(TypedDict, total=False):
    id: str
    state: str
    cordoned: bool
    entitlement: str | None
    fault_domain: dict[str, str]
    type: str
    cpu: float
    memory_gb: float
    tasks: int
    events: list[str]
    assigned: list[str]


class MachineList(TypedDict):
    machines: list[MachineView]
    total: int
    offset: int


class EventView(TypedDict):
    seq: int
    time: float
    source: str
    kind: str
    message: str
    job: str | None
    entitlement: str | None
    machine: str | None


class EventPage(TypedDict):
    events: list[EventView]
    #: the cursor of the next page (None: the end)
    next: int | None
    last_seq: int
