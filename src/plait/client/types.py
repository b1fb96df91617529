"""The API's answers as typed dicts: the server declares them as its response models
(so the OpenAPI document types every answer) and the SDK returns them. Only
``typing`` is imported: a client pays nothing to use them.

Every one allows keys it does not name (``__pydantic_config__`` below): an answer
is never cut down to what its type lists, and a newer server may add fields."""

from __future__ import annotations

from typing import Any, Literal, NotRequired

from typing_extensions import TypedDict


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
    #: what the operator should know (a ZooKeeper store without credentials)
    warnings: list[str]


class AutoscaleView(TypedDict, total=False):
    """A job's autoscaling: its policy, how often it decides, the last load pushed and
    when it last decided."""

    job: str
    policy: dict[str, Any]
    interval_seconds: float
    load: dict[str, float] | None
    decided_at: float | None


class OwnerLimitsView(TypedDict):
    """An owner's limits on jobs and tasks (the region's defaults unless set), those
    an admin set, and what it holds."""

    owner: str
    jobs: int
    tasks: int
    set: dict[str, int]
    used: dict[str, int]


class OwnerLimitsList(TypedDict):
    """The region's default limits per owner, and every owner's."""

    defaults: dict[str, int]
    owners: list[OwnerLimitsView]


class LoadAck(TypedDict):
    job: str
    time: float
    value: float


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
    #: (a deploy of a job that exists) true when its spec was the job's current one:
    #: nothing was stored
    unchanged: bool


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
    #: the last operation of the job's log applied by the scheduler (an
    #: acknowledgement's ``operation`` is applied once this reaches it)
    applied_operation: int
    #: every operation stored is applied and carried out: all tasks run the latest
    #: version, healthy, with nothing wanted or under way
    settled: bool


#: ``continue``: the token of the next page, null at the end (only when the request
#: gave ``limit`` or ``continue``: ``plait.paging``)
JobList = TypedDict("JobList", {"jobs": list[JobView], "continue": NotRequired[str | None]})


class TaskView(TypedDict):
    index: int
    state: str
    version: int
    machine: str | None
    #: where its machine is: {"dc", "msb", "rack"}
    fault_domain: NotRequired[dict[str, str] | None]
    serving: bool
    healthy: bool
    exit_code: int | None
    operation: str | None
    #: the maintenance (event id) it was stopped for at the deadline: it starts again
    #: on its machine when the window ends (absent when not parked)
    parked: NotRequired[str]


TaskList = TypedDict("TaskList", {"job": str, "tasks": list[TaskView],
                                   "continue": NotRequired[str | None]})


class JobHistory(TypedDict):
    name: str
    #: the latest version's number
    versions: int
    #: the versions the job's record keeps (``keep_versions``, and those tasks run)
    kept: list[int]
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
    #: a lender's unused machines are loaned to elastic entitlements
    lends: bool
    #: an elastic entitlement's loan terms (min_notice_seconds,
    #: max_reclaim_fraction_per_minute)
    elastic: dict[str, float] | None
    #: the pool of loans, for a lender or an elastic entitlement: lendable, on_loan,
    #: revoking
    loans: dict[str, int]
    #: how many surge tasks its jobs may run at once (the shared surge buffer)
    surge_buffer: int
    #: a canary entitlement: the entitlement whose job's host-profile canary it holds
    canary_of: str | None
    #: the host profiles its host-profile canaries may use (besides its own; admin-set)
    canary_host_profiles: list[str]
    machines: int
    rru: float
    jobs: list[str]
    #: a deleted entitlement's answer: true, and the machines that went back to the
    #: free pool
    deleted: bool
    released: list[str]
    #: (the answer to a create or change only) what the region cannot give it: a
    #: quota above the region, quotas adding up to more than the region
    warnings: list[str]


EntitlementList = TypedDict("EntitlementList", {"entitlements": list[EntitlementView],
                                                 "continue": NotRequired[str | None]})


class MachineView(TypedDict, total=False):
    id: str
    state: str
    cordoned: bool
    #: target, applied (NAME@VERSION), switching, error, failures, rolling
    host_profile: dict[str, Any] | None
    #: borrower, since, revoking, deadline, due_back (None: not on loan)
    loan: dict[str, Any] | None
    entitlement: str | None
    fault_domain: dict[str, str]
    type: str
    cpu: float
    memory_gb: float
    tasks: int
    events: list[str]
    assigned: list[str]


class MachineCell(TypedDict):
    dc: str
    msb: str
    state: str
    entitlement: str | None
    machines: int


class MachineSummary(TypedDict):
    cells: list[MachineCell]
    total: int


#: ``continue``: the token of the page after this one (null at the end)
MachineList = TypedDict("MachineList", {"machines": list[MachineView], "total": int,
                                        "offset": int, "continue": NotRequired[str | None]})


class WhoAmI(TypedDict):
    token_id: str
    role: str
    name: str


class EventView(TypedDict):
    seq: int
    time: float
    source: str
    kind: str
    message: str
    job: str | None
    entitlement: str | None
    machine: str | None
    #: who did it (``owner:alice``, ``admin:ops``, or a component: scheduler, health)
    actor: NotRequired[str | None]
    #: the task (index in ``job``) it is about, and the operation on it
    task: NotRequired[int | None]
    op: NotRequired[str | None]
    reason: NotRequired[str | None]
    #: the TaskControl decision behind it
    decision: NotRequired[str | None]
    #: the API request that caused it
    request: NotRequired[str | None]


class EventPage(TypedDict):
    events: list[EventView]
    #: the cursor of the next page (None: the end)
    next: int | None
    last_seq: int


class Plan(TypedDict, total=False):
    """A dry run: what deploying a spec would change, and where its tasks would go."""

    job: str
    #: create, update or none
    action: str
    changes: dict[str, Any]
    tasks_added: int
    tasks_removed: int
    tasks_updated: int
    #: None: no cap (a TaskController paces alone; without one, 1 at a time)
    max_unavailable: int | None
    #: whether a TaskController paces the job's operations
    task_controller: bool
    placement: dict[str, Any]


class JobSpecView(TypedDict, total=False):
    """A job spec as stored (see plait.model.JobSpec for every field)."""

    name: str
    entitlement: str
    task_count: int
    command: str
    args: list[str]
    resources: dict[str, Any]


class TaskLogs(TypedDict):
    job: str
    index: int
    machine: str | None
    data: str
    #: ask again with after=next for what follows
    next: int
    skipped: bool


class MachineEvent(TypedDict):
    machine: str
    #: the unavailability event raised
    event: str


class MachineRepair(TypedDict):
    machine: str
    #: the events ended
    ended: list[str]


class MaintenanceCreated(TypedDict):
    event: str


class MaintenanceCancelled(TypedDict):
    event: str
    #: cancelled (it had not started: its notices withdrawn) or ended (early)
    state: Literal["cancelled", "ended"]
    machines: list[str]


class MaintenanceView(TypedDict):
    id: str
    kind: str
    machines: list[str]
    start: float
    end: float | None
    reason: str


class MaintenanceList(TypedDict):
    events: list[MaintenanceView]


class ShardHandoff(TypedDict):
    entitlement: str
    shard: int
    jobs: int


class ShardReload(TypedDict):
    shard: int | None
    entitlements: int


class TokenView(TypedDict, total=False):
    id: str
    role: str
    name: str
    created: float
    revoked: bool
    description: str
    #: the token itself: shown once, when made
    token: str


TokenList = TypedDict("TokenList", {"tokens": list[TokenView],
                                     "continue": NotRequired[str | None]})


class Joined(TypedDict):
    machine: str
    #: the machine's own credential
    token: str
    id: str


class DesiredTask(TypedDict):
    job: str
    index: int
    version: int
    revision: int
    spec: dict[str, Any]
    #: the id of the API request that caused the assignment (None: no request did)
    request_id: NotRequired[str | None]
    #: the task's own credential (``signing.task_credential``), which its agent sets
    #: as its ``PLAIT_TASK_CREDENTIAL``
    credential: NotRequired[str]


class StoppingTask(TypedDict):
    """A task that left the machine's desired set (its agent stops it)."""

    job: str
    index: int
    #: the id of the request that last changed its job (None: no request did)
    request_id: str | None


class DesiredSet(TypedDict):
    machine: str
    generation: int
    tasks: list[DesiredTask]
    stopping: NotRequired[list[StoppingTask]]


class OutputAck(TypedDict):
    machine: str
    accepted: int
    refused: int


class StatusAck(TypedDict):
    machine: str
    accepted: int
    #: the generation of the machine's desired set now: an agent whose long-poll has
    #: not brought it yet pulls the set at once
    generation: NotRequired[int]



class HostProfileView(TypedDict, total=False):
    """One version of a host profile (paper section 2.6)."""

    name: str
    version: int
    created: float
    description: str
    sysctls: dict[str, str]
    cgroup_controllers: list[str]
    turbo: bool | None
    hugepages_2m: int
    hugepages_1g: int
    fs_label: str | None
    nic: dict[str, str]
    user: dict[str, Any]
    #: the entitlements that name it (on reads of one profile)
    entitlements: list[str]
    #: machines carrying it / switching to it (on reads of one profile)
    machines: int


class HostProfileList(TypedDict):
    profiles: list[HostProfileView]


class HostProfileVersions(TypedDict):
    name: str
    versions: list[HostProfileView]


class HostProfileChange(TypedDict):
    setting: str
    old: Any
    new: Any


class HostProfileDeleted(TypedDict):
    name: str
    deleted: bool


HostProfileDiff = TypedDict("HostProfileDiff", {"from": dict[str, Any], "to": dict[str, Any],
                                                "changes": list[HostProfileChange]})


for _view in list(globals().values()):
    if isinstance(_view, type) and issubclass(_view, dict) and _view is not dict:
        _view.__pydantic_config__ = {"extra": "allow"}  # type: ignore[attr-defined]


class PushView(TypedDict, total=False):
    """A job's push: its intent (spec, stages, soak, gate), where it stands (version,
    stage, phase, message, tasks wanted and ready) and the share it holds now."""

    job: str
    intent: dict[str, Any]
    status: dict[str, Any]
    actor: str | None
    created: float
    percent: int


class SizingView(TypedDict, total=False):
    """A job's sizing intent and the size it gives (its count clamped into [min, max])."""

    job: str
    intent: dict[str, Any]
    actor: str | None
    time: float
    size: int


class CanaryView(TypedDict, total=False):
    job: str
    name: str
    intent: dict[str, Any]
    version: int | None
    #: a host-profile canary's canary entitlement (its machines carry the profile)
    entitlement: str | None
    actor: str | None
    started: float
    until: float


class IntentsView(TypedDict, total=False):
    """Every intent of a job and the unified spec they make: per task, its role
    (stable, push, canary:NAME) and version."""

    job: str
    job_intent: dict[str, Any]
    push: dict[str, Any] | None
    sizing: dict[str, Any] | None
    canaries: dict[str, Any]
    unified: dict[str, Any]
    conflicts: list[str]
