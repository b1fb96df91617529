"""The agent's wire (pure): what the control plane sends an agent (its machine's
desired set) and what the agent sends back (its report, the heartbeat, and its
tasks' output). Both ends use these models: the control plane builds and serializes
them (``plait.frontend``'s agent routes), the agent parses the desired set with them
and builds its reports with them (``plait.agent.daemon``), so neither restates the
other's rules or defaults.

The desired set's entries carry the job's whole ``JobSpec``: the agent reads the
spec's fields (command, resources, restart policy, health probe, fence, kill
timeout) as the model defines them. A desired set that does not validate is taken
as no answer (every task keeps running as it is).
"""

from __future__ import annotations

import functools
import types
import typing
from typing import Any

import pydantic

from plait.model.agentmachine import Phase
from plait.model.base import Input
from plait.model.job import MAX_TASKS, JobSpec

#: the longest name of a job, as the wire takes it
_NAME = 64


class Wire(pydantic.BaseModel):
    """What the control plane sends an agent: fields the agent does not know are
    left out (an older agent takes a newer control plane's sets)."""

    model_config = pydantic.ConfigDict(extra="ignore", allow_inf_nan=False, strict=True)


def _models(annotation: Any) -> list[type[pydantic.BaseModel]]:
    """The models a field's annotation names (``M``, ``M | None``, ``list[M]``,
    ``dict[str, M]``)."""
    if isinstance(annotation, type) and issubclass(annotation, pydantic.BaseModel):
        return [annotation]
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType, list, tuple, dict):
        return [m for arg in typing.get_args(annotation) for m in _models(arg)]
    return []


@functools.cache
def _shape(model: type[pydantic.BaseModel]) -> dict[str, tuple[type[pydantic.BaseModel] | None,
                                                                bool]]:
    """Per field of ``model``: the one model it holds (None: none, or several), and
    whether it holds it as a dict's values."""
    shape: dict[str, tuple[type[pydantic.BaseModel] | None, bool]] = {}
    for name, field in model.model_fields.items():
        inner = _models(field.annotation)
        shape[name] = (inner[0] if len(inner) == 1 else None,
                       typing.get_origin(field.annotation) is dict)
    return shape


def known_fields(model: type[pydantic.BaseModel], data: Any) -> Any:
    """``data`` without the keys ``model`` (and the models its fields hold) does not
    know: a spec from a newer control plane, as an older agent takes it (the model's
    own rules still apply to every field it knows)."""
    if not isinstance(data, dict):
        return data
    shape = _shape(model)
    kept = {}
    for key, value in data.items():
        found = shape.get(key)
        if found is None:
            continue
        inner, values = found
        if inner is not None:
            if isinstance(value, dict):
                value = ({k: known_fields(inner, v) for k, v in value.items()} if values
                         else known_fields(inner, value))
            elif isinstance(value, list):
                value = [known_fields(inner, v) for v in value]
        kept[key] = value
    return kept


class DesiredTask(Wire):
    """One task the machine must run."""

    job: str
    index: int = pydantic.Field(ge=0)
    #: the job's version, and its revision (agents restart a task only when this
    #: changes: versions that differ only in task count share one)
    version: int = pydantic.Field(default=1, ge=1)
    revision: int = pydantic.Field(ge=1)
    spec: JobSpec
    #: the id of the API request that caused the assignment (None: no request did)
    request_id: str | None = None
    #: the task's own credential (``signing.task_credential``), which its agent sets
    #: as its ``PLAIT_TASK_CREDENTIAL`` (None: none, and left off the wire)
    credential: str | None = pydantic.Field(default=None, exclude_if=lambda v: v is None)

    @pydantic.field_validator("spec", mode="before")
    @classmethod
    def _known_spec(cls, value: Any) -> Any:
        return known_fields(JobSpec, value)

    @property
    def key(self) -> str:
        return f"{self.job}.{self.index}"


class StoppingTask(Wire):
    """A task that left the machine's desired set (its agent stops it)."""

    job: str
    index: int = pydantic.Field(ge=0)
    #: the id of the request that last changed its job (None: no request did)
    request_id: str | None = None


class ProfileTarget(Wire):
    """The host profile the machine must carry (``HostProfile.wire``), and whether
    its agent may switch to it once idle (not while a roll holds the machine)."""

    name: str
    version: int = pydantic.Field(ge=1)
    settings: dict[str, Any] = pydantic.Field(default_factory=dict)
    switch: bool = True

    @property
    def ref(self) -> tuple[str, int]:
        return self.name, self.version


class DesiredSet(Wire):
    """A machine's desired set. ``profile``: absent from a control plane that knows
    no host profiles (nothing switched, nothing held back); null when it names one
    the control plane does not know (yet): nothing starts (``profile_unknown``)."""

    machine: str = ""
    generation: int | None = None
    tasks: list[DesiredTask]
    stopping: list[StoppingTask] = pydantic.Field(default_factory=list)
    profile: ProfileTarget | None = None

    @property
    def profile_unknown(self) -> bool:
        return "profile" in self.model_fields_set and self.profile is None


class TaskReport(Input):
    """One task of an agent's report."""

    job: str = pydantic.Field(min_length=1, max_length=_NAME)
    index: int = pydantic.Field(ge=0, le=MAX_TASKS - 1)
    revision: int = pydantic.Field(ge=1)
    phase: Phase
    healthy: bool = True
    exit_code: int | None = pydantic.Field(default=None, ge=-1024, le=1024)
    #: the agent will not start the task again (a finished batch task)
    final: bool = False
    #: SIGKILLed from outside: neither by its agent nor out of memory
    killed: bool = False
    #: host:port the task listens on (its PLAIT_PORT), for service discovery
    endpoint: str | None = pydantic.Field(default=None, max_length=300)
    #: the cores it used since the agent's last report (an autoscaler's ``cpu`` metric)
    cpu: float | None = pydantic.Field(default=None, ge=0, le=100_000)


class ProfileReport(Input):
    """The host profile an agent has applied (name None: none yet), and why its last
    switch failed."""

    name: str | None = pydantic.Field(default=None, max_length=64)
    version: int = pydantic.Field(default=0, ge=0, le=2**31)
    error: str | None = pydantic.Field(default=None, max_length=1000)
    failures: int = pydantic.Field(default=0, ge=0, le=2**31)


class Report(Input):
    """An agent's report of the tasks on its machine (its heartbeat)."""

    tasks: list[TaskReport] = pydantic.Field(default_factory=list, max_length=10_000)
    profile: ProfileReport | None = None


class OutputChunk(Input):
    job: str = pydantic.Field(min_length=1, max_length=_NAME)
    index: int = pydantic.Field(ge=0, le=100_000)
    data: str = pydantic.Field(max_length=256 * 1024)


class Output(Input):
    """What an agent's tasks printed (the control plane keeps a tail per task)."""

    chunks: list[OutputChunk] = pydantic.Field(max_length=10_000)


def dump(model: pydantic.BaseModel) -> dict[str, Any]:
    """A report's JSON form as an agent sends it (what is unset is left out)."""
    return model.model_dump(mode="json", exclude_none=True)
