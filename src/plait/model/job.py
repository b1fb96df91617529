"""Job specs: a named group of identical tasks bound to one entitlement."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from fractions import Fraction
from typing import Annotated, Literal

import pydantic

from plait.model.base import Value
from plait.model.entitlement import check_name
from plait.model.policy import AllocationPolicy
from plait.model.redact import redact_url
from plait.model.resources import Resources

#: the most tasks a job may have
MAX_TASKS = 100_000
#: an argument or an environment value: at most 64 KiB
LongText = Annotated[str, pydantic.StringConstraints(max_length=65_536)]

_PERCENT = re.compile(r"^(\d+(?:\.\d+)?)%\Z")


class UpdatePolicy(Value):
    """How fast planned operations may proceed.

    ``max_unavailable`` is a task count (``3``) or a share of the task count
    (``"10%"``), rounded down with a minimum of 1.
    """

    #: tasks that may be unavailable at once, for any reason: a count (1 to 100,000)
    #: or a share like "10%"; ``None``: no cap, only with a TaskController (which then
    #: paces alone; without one, the built-in policy uses 1)
    max_unavailable: int | str | None = 1
    #: a rollout halts by itself once this many tasks of the new version failed to
    #: become healthy, or max_unavailable of them if that is fewer (the failed tasks
    #: are down: a bad version never takes more down than the pacing allows)
    halt_after_failures: int = pydantic.Field(default=3, ge=1, le=100_000)
    #: a restarted task counts as healthy (its operation complete) only after
    #: running healthy this long
    min_ready_seconds: float = pydantic.Field(default=0.0, ge=0, le=86_400)
    #: a task that was serving and fails its health probe still counts as serving
    #: this long: planned operations take it down only within max_unavailable (it
    #: may be recovering: a leader election, a compaction); after that it is free to
    #: replace, as an exited or lost task is
    serving_grace_seconds: float = pydantic.Field(default=60.0, ge=0, le=86_400)
    #: a task of a rollout's new version that runs but has not passed its health
    #: probe after this long failed to become healthy (it counts toward
    #: ``halt_after_failures``, as a task that exits does)
    ready_timeout_seconds: float = pydantic.Field(default=120.0, gt=0, le=86_400)
    #: make before break: before a serving task is updated, restarted or moved for
    #: maintenance, a surge task of the new version starts on the entitlement's
    #: shared surge buffer (``Entitlement.surge_buffer``) and serves in its place
    #: until it is back; with no room in the buffer the operation waits. For
    #: single-task high-availability jobs (the built-in pacing only: a job with a
    #: TaskController paces itself)
    surge: bool = False

    @pydantic.field_validator("max_unavailable", mode="before")
    @classmethod
    def _check(cls, value: object) -> int | str | None:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | str):
            raise ValueError(f"expected a count or a percentage like '10%', got {value!r}")
        if isinstance(value, int):
            if not 1 <= value <= MAX_TASKS:
                raise ValueError(f"must be between 1 and {MAX_TASKS}")
            return value
        match = _PERCENT.match(value.strip())
        if not match or not 0 < float(match.group(1)) <= 100:
            raise ValueError(f"expected a count or a percentage like '10%', got {value!r}")
        return value.strip()

    def resolve(self, task_count: int) -> int | None:
        """The number of tasks that may be unavailable at once (``None``: no cap)."""
        if self.max_unavailable is None:
            return None
        if isinstance(self.max_unavailable, int):
            return self.max_unavailable
        share = Fraction(self.max_unavailable[:-1]) / 100  # exact: "29%" of 100 is 29
        return max(1, math.floor(task_count * share))


class RestartPolicy(Value):
    """What the agent does when a task's process exits on its own.

    ``always`` (services): start it again, with backoff, whatever its exit code.
    ``on-failure`` (batch): an exit code of 0 finishes the task for good; any other
    code starts it again, with backoff, at most ``max_retries`` times, after which
    the task has failed for good. ``never`` (batch): the first exit finishes it.
    Retries are counted on the machine the task runs on; a task moved elsewhere
    (its machine failed) starts with ``max_retries`` again.
    """

    #: always: a service; on-failure or never: a batch job, done once its tasks exit 0
    policy: Literal["always", "on-failure", "never"] = "always"
    #: on-failure: how many times a task that exits non-zero is started again
    max_retries: int = pydantic.Field(default=3, ge=0, le=1000)

    @property
    def batch(self) -> bool:
        """Tasks that may finish: the job completes once they all exited 0."""
        return self.policy != "always"

    def after_exit(self, code: int, restarts: int) -> float | None:
        """``restart_after`` for this policy."""
        return restart_after(self.policy, self.max_retries, code, restarts)


#: the longest wait before a crashed task is started again
MAX_RESTART_BACKOFF = 30.0


def restart_after(policy: str, max_retries: int, code: int, restarts: int) -> float | None:
    """What an agent does when a task it has started ``restarts`` times before exits
    with ``code``: None, it is not started again (final); else the seconds to wait
    before starting it again (1, 2, 4 ... at most ``MAX_RESTART_BACKOFF``). The real
    agent and the simulated one both follow this."""
    if policy == "never" or (policy == "on-failure" and (code == 0 or restarts >= max_retries)):
        return None
    return min(MAX_RESTART_BACKOFF, 2.0 ** restarts)


class HealthProbe(Value):
    """How the agent checks that a running task is healthy. Without a probe, a task
    is healthy while its process runs. With one, it is unhealthy from its start until
    the probe first passes, and again after ``failure_threshold`` failures in a row;
    only healthy tasks are enabled in service discovery (readiness), an update moves
    on only once the updated task is healthy, and with ``restart_after_seconds`` a
    task failing its probe that long is restarted (liveness).

    ``http``: a path, fetched with GET from ``http://ADDRESS:PLAIT_PORT/path``; any
    2xx or 3xx answer within ``timeout_seconds`` passes. ``command``: run with the
    task's environment in its data directory; exit code 0 within the timeout passes.
    """

    #: a URL path on the task's port (PLAIT_PORT): a 2xx or 3xx answer passes
    http: str | None = pydantic.Field(default=None, max_length=2048)
    #: or a command run in the task's data dir with its environment: exit 0 passes
    command: tuple[str, ...] = pydantic.Field(default=(), max_length=64)
    #: seconds between two probes
    interval_seconds: float = pydantic.Field(default=1.0, ge=0.1, le=3600)
    #: a probe that has not passed within this long failed
    timeout_seconds: float = pydantic.Field(default=1.0, ge=0.05, le=600)
    #: failures in a row that make a healthy task unhealthy
    failure_threshold: int = pydantic.Field(default=3, ge=1, le=100)
    #: liveness: a running task failing its probe this long is restarted, as a
    #: planned operation within max_unavailable (None: never; the probe then only
    #: gates service discovery, as a readiness probe does)
    restart_after_seconds: float | None = pydantic.Field(default=None, ge=1, le=86_400)

    @pydantic.field_validator("http")
    @classmethod
    def _path(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"^/[\x21-\x7e]*\Z", value):
            raise ValueError(f"{value!r} is not a URL path (it starts with '/'; printable "
                             "ASCII, no spaces)")
        return value

    @pydantic.field_validator("command")
    @classmethod
    def _argv(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if any("\x00" in arg or len(arg) > 4096 for arg in value):
            raise ValueError("arguments hold no NUL character and at most 4096 characters")
        return value

    @pydantic.model_validator(mode="after")
    def _one(self) -> HealthProbe:
        if (self.http is None) == (not self.command):
            raise ValueError("give exactly one of 'http' (a path) or 'command' (a list)")
        return self


class Fence(Value):
    """At most one copy of each task, even while its machine's agent is cut off from
    the control plane or frozen (for a replicated store's member, a shard's owner:
    anything reached at an address of its own). The task's machine stops it by
    itself (SIGTERM, then SIGKILL 1 s later) once its agent has not reached the
    control plane for ``seconds``, even if the agent process itself is stopped (a
    fence keeper process of the agent's does it); it starts again only once the
    agent has heard the control plane and the task is still assigned there. The
    control plane takes a task off a failed machine's desired set at once and
    places it elsewhere only ``seconds`` + 3 s after the machine's last heartbeat,
    so the two copies never overlap. A TaskController still decides when the move
    may happen (it happens no sooner). A machine failed by an operator while its
    agent still heartbeats has it stop such a task, which is placed elsewhere only
    once that agent goes silent: drain the machine to move it instead. Changing the
    fence restarts the tasks, as a rollout."""

    #: seconds without reaching the control plane after which the task's machine
    #: stops it; a task moves off a failed machine this long plus 3 s after the
    #: machine's last heartbeat. Give its agent a few heartbeats (one a second by
    #: default) of room: a lease shorter than the time between two stops the task
    seconds: float = pydantic.Field(ge=3, le=3600)


class JobSpec(Value):
    """A job: a named group of identical tasks, bound to an entitlement (its quota and
    pseudo-cluster), not to a physical cluster. Every change is a new version, rolled
    out at the pace of ``update`` and through the job's TaskController."""

    #: the job's name, unique in the region: lowercase letters, digits, '.', '_' and
    #: '-', 1 to 64 characters, starting and ending with a letter or digit
    name: str
    #: the entitlement whose quota and machines the tasks run on (a change moves the
    #: job there, as a rollout)
    entitlement: str
    #: how many tasks (indices 0..task_count-1); a change only is a resize
    task_count: int = pydantic.Field(ge=0, le=MAX_TASKS)
    #: what each task reserves on its machine
    resources: Resources
    #: the program each task runs (found on the PATH of its machine)
    command: str = pydantic.Field(min_length=1, max_length=4096)
    #: the program's arguments
    args: tuple[LongText, ...] = pydantic.Field(default=(), max_length=1024)
    #: environment variables of each task (plait adds PLAIT_PORT, PLAIT_JOB,
    #: PLAIT_TASK_INDEX, PLAIT_MACHINE, PLAIT_DATA_DIR, the task's endpoint as
    #: discovery has it, PLAIT_TASK_ENDPOINT, and its own PLAIT_TASK_CREDENTIAL,
    #: bound to that endpoint; no spec sets those two; of the agent's own
    #: environment a task gets only PATH, HOME, USER, LOGNAME, LANG, LC_ALL, LC_CTYPE
    #: and TZ)
    env: Mapping[str, LongText] = pydantic.Field(default_factory=dict, max_length=1024)
    #: where tasks may go (requirements) and where they should go (preferences)
    policy: AllocationPolicy = AllocationPolicy()
    #: how fast a new version rolls out, and when it halts
    update: UpdatePolicy = UpdatePolicy()
    #: URL of the job's TaskController (``http(s)://...``), called with the paper's
    #: TaskControl API; none: the built-in policy paces
    task_controller: str | None = pydantic.Field(default=None, max_length=2048)
    #: what happens when a task exits on its own; ``on-failure``/``never`` make a
    #: batch job
    restart: RestartPolicy = RestartPolicy()
    #: how a running task is checked (none: healthy while its process runs)
    health: HealthProbe | None = None
    #: seconds between the SIGTERM that stops a task and the SIGKILL of whatever is
    #: left (the agent stops tasks in the background: its heartbeats keep their pace)
    kill_timeout_seconds: float = pydantic.Field(default=10.0, ge=0, le=3600)
    #: how many of the job's latest versions its record keeps for rollback and
    #: `plait job history` (like a Deployment's revisionHistoryLimit); versions that
    #: tasks still run are kept too, and fewer are kept when they would not fit in
    #: one stored record
    keep_versions: int = pydantic.Field(default=10, ge=1, le=100)
    #: at most one copy of each task at any time, even while its machine is cut off
    #: (none: a task on a failed machine is replaced at once, and its copy there runs
    #: on until its agent hears the control plane again)
    fence: Fence | None = None

    _names = pydantic.field_validator("name", "entitlement")(check_name)

    @pydantic.field_validator("resources")
    @classmethod
    def _nonzero(cls, value: Resources) -> Resources:
        if value.to_units()[0] < 1:
            raise ValueError("a task must ask for some cpu (at least 0.001 RRU)")
        return value

    @pydantic.field_validator("task_controller")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"^https?://[^\s/]+(/\S*)?\Z", value):
            raise ValueError(f"{redact_url(value)!r} is not an http(s) URL")
        return value

    @pydantic.field_validator("env")
    @classmethod
    def _env_names(cls, value: Mapping[str, str]) -> Mapping[str, str]:
        for key in value:
            if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*\Z", key):
                raise ValueError(f"{key!r} is not a valid environment variable name")
        return value

    def __hash__(self) -> int:
        return hash((self.name, self.entitlement, self.task_count, self.resources, self.command,
                     self.args, tuple(sorted(self.env.items())), self.policy, self.update,
                     self.task_controller, self.restart, self.health, self.fence))


def spans(numbers: list[int]) -> str:
    """``[1, 2, 3, 7, 9, 10]`` as ``1..3, 7, 9..10``."""
    out: list[tuple[int, int]] = []
    for n in numbers:
        if out and out[-1][1] == n - 1:
            out[-1] = (out[-1][0], n)
        else:
            out.append((n, n))
    return ", ".join(str(a) if a == b else f"{a}..{b}" for a, b in out)
