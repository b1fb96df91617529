"""The bodies of the API's requests (pydantic models): each field bounded, the
unknown ones refused (``plait.model.base.Input``). A job's spec, an entitlement, a
host profile and the Job Control Plane's intents are the model's own
(``plait.model``, ``plait.jcp.intents``)."""

from __future__ import annotations

from typing import Literal

import pydantic

from plait.api.common import NAME
from plait.model.base import Input
from plait.server.auth import Role


class Resize(Input):
    task_count: int = pydantic.Field(ge=0, le=100_000)


class Load(Input):
    """A measurement of a job's load, in tasks' worth of work (tasks x utilization)."""

    value: float = pydantic.Field(ge=0, le=1e7)


class Rollback(Input):
    version: int = pydantic.Field(ge=1)


class Restart(Input):
    index: int | None = pydantic.Field(default=None, ge=0)


class Move(Input):
    #: the entitlement to move the job to
    entitlement: NAME


class Drain(Input):
    deadline_seconds: float | None = pydantic.Field(default=None, ge=0, le=30 * 86400)
    #: once empty: back to the free pool, or out of service until uncordoned
    to: Literal["free", "maintenance"] = "maintenance"


class ShardMove(Input):
    shard: int = pydantic.Field(ge=0)


class ShardReload(Input):
    entitlement: str | None = None


class Maintenance(Input):
    machines: list[str] = pydantic.Field(min_length=1, max_length=100_000)
    #: unix time; default: now
    start: float | None = pydantic.Field(default=None, ge=0, le=1e11)
    duration_seconds: float = pydantic.Field(gt=0, le=365 * 86400)
    reason: str = pydantic.Field(default="maintenance", max_length=200)


class TokenRequest(Input):
    role: Role = Role.OWNER
    #: the owner (role owner), or a label for admin and join tokens
    name: NAME
    description: str = pydantic.Field(default="", max_length=200)


class Join(Input):
    """An agent joining. With a description (all of fault_domain, cpu, memory_gb and
    type), the machine is registered, or checked against the region's record of it."""

    machine: str = pydantic.Field(min_length=1, max_length=128,
                                  pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    #: region/dc/msb/row/rack
    fault_domain: str | None = pydantic.Field(default=None, max_length=512)
    cpu: float | None = pydantic.Field(default=None, gt=0, le=1e6)
    memory_gb: float | None = pydantic.Field(default=None, gt=0, le=1e6)
    disk_gb: float = pydantic.Field(default=0, ge=0, le=1e9)
    type: str | None = pydantic.Field(default=None, min_length=1, max_length=64,
                                      pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")

    @pydantic.model_validator(mode="after")
    def _whole(self) -> Join:
        given = [self.fault_domain, self.cpu, self.memory_gb, self.type]
        if any(v is not None for v in given) and not all(v is not None for v in given):
            missing = [n for n, v in zip(("fault_domain", "cpu", "memory_gb", "type"), given,
                                         strict=True) if v is None]
            raise ValueError(f"a machine description needs {', '.join(missing)} too")
        return self


class GateVerdict(pydantic.BaseModel):
    """An external gate's answer for the stage being gated."""

    model_config = pydantic.ConfigDict(extra="forbid", allow_inf_nan=False)
    passed: bool
    message: str = pydantic.Field(default="", max_length=2000)
