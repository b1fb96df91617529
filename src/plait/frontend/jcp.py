"""The Job Control Plane's resources (``plait.server.controlplane.jcp``): a job's push,
sizing and canary intents, each its own resource written by its own actor, and the
unified spec they make. An owner reaches only its own jobs' intents."""

from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any

import pydantic
from fastapi import Body, FastAPI, Request

from plait.client import types as t
from plait.errors import ValidationError
from plait.jcp.intents import PER_TASK, CanaryIntent, PushIntent, SizingIntent
from plait.model.policy import Name
from plait.server.auth import Principal

if TYPE_CHECKING:
    from plait.server.controlplane.core import ControlPlane


class GateVerdict(pydantic.BaseModel):
    """An external gate's answer for the stage being gated."""

    model_config = pydantic.ConfigDict(extra="forbid", allow_inf_nan=False)
    passed: bool
    message: str = pydantic.Field(default="", max_length=2000)


def add_routes(app: FastAPI, cp: "ControlPlane", user: Any,
               may_job: Callable[[Request, Principal, str], None]) -> None:
    """The routes; ``user`` is the app's token dependency, ``may_job`` its check that
    the caller may touch the job (an owner's other jobs answer 404 like missing ones)."""
    jcp = cp.jcp

    @app.get("/v1/jobs/{name}/intents", response_model=t.IntentsView, tags=["intents"])
    def get_intents(name: str, who: user, request: Request) -> dict[str, Any]:
        """Every intent of the job and the unified spec they make."""
        may_job(request, who, name)
        return jcp.intents(name)

    @app.put("/v1/jobs/{name}/push", response_model=t.PushView, tags=["intents"])
    def put_push(name: str, body: PushIntent, who: user, request: Request) -> dict[str, Any]:
        """Push a spec to the job in stages (percentages of its tasks), each gated once
        its tasks are healthy and soaked; a failing gate rolls back. A push replaces
        the one under way."""
        may_job(request, who, name)
        return jcp.put_push(name, body)

    @app.get("/v1/jobs/{name}/push", response_model=t.PushView, tags=["intents"])
    def get_push(name: str, who: user, request: Request) -> dict[str, Any]:
        may_job(request, who, name)
        return jcp.push_view(name)

    @app.post("/v1/jobs/{name}/push/abort", response_model=t.PushView, tags=["intents"])
    def abort_push(name: str, who: user, request: Request) -> dict[str, Any]:
        """Stop the push: its tasks go back to the job's spec."""
        may_job(request, who, name)
        return jcp.abort_push(name)

    @app.post("/v1/jobs/{name}/push/gate", response_model=t.PushView, tags=["intents"])
    def push_gate(name: str, body: GateVerdict, who: user, request: Request) -> dict[str, Any]:
        """An external gate's verdict on the stage being gated (``plait push
        --gate-command``): passed, the next stage; failed, a rollback."""
        may_job(request, who, name)
        return jcp.gate_verdict(name, body.passed, body.message)

    @app.put("/v1/jobs/{name}/sizing", response_model=t.SizingView, tags=["intents"])
    def put_sizing(name: str, body: SizingIntent, who: user, request: Request
                   ) -> dict[str, Any]:
        """How many tasks the job runs, within [min, max] (the autoscaler writes this
        too); while it is set, it sizes the job."""
        may_job(request, who, name)
        return jcp.put_sizing(name, body)

    @app.get("/v1/jobs/{name}/sizing", response_model=t.SizingView, tags=["intents"])
    def get_sizing(name: str, who: user, request: Request) -> dict[str, Any]:
        may_job(request, who, name)
        return jcp.sizing_view(name)

    @app.delete("/v1/jobs/{name}/sizing", response_model=t.SizingView, tags=["intents"])
    def delete_sizing(name: str, who: user, request: Request) -> dict[str, Any]:
        """The job's spec sizes it again (its size stays as it is)."""
        may_job(request, who, name)
        return jcp.delete_sizing(name)

    @app.put("/v1/jobs/{name}/canaries/{canary}", response_model=t.CanaryView,
             tags=["intents"])
    def put_canary(name: str, canary: Name, body: CanaryIntent, who: user,
                   request: Request) -> dict[str, Any]:
        """Run a spec on some of the job's tasks for a while (on machines of a type,
        with ``hardware``; on machines of their own switched to a host profile, with
        ``host_profile``: a code + config + host-profile canary); never on the push's
        tasks."""
        may_job(request, who, name)
        return jcp.put_canary(name, canary, body)

    @app.get("/v1/jobs/{name}/canaries/{canary}", response_model=t.CanaryView,
             tags=["intents"])
    def get_canary(name: str, canary: str, who: user, request: Request) -> dict[str, Any]:
        may_job(request, who, name)
        return jcp.canary_view(name, canary)

    @app.delete("/v1/jobs/{name}/canaries/{canary}", response_model=t.CanaryView,
                tags=["intents"])
    def delete_canary(name: str, canary: str, who: user, request: Request) -> dict[str, Any]:
        """End the canary now: its tasks go back."""
        may_job(request, who, name)
        return jcp.delete_canary(name, canary)

    @app.put("/v1/jobs/{name}/tasks/{index}/spec", response_model=t.JobAck,
             tags=["intents"])
    def put_task_spec(name: str, index: int, who: user, request: Request,
                      body: Annotated[Any, Body()] = None) -> dict[str, Any]:
        """Per-task customization: refused, always, with a 422 that points to Shard
        Manager (Table 1's last row)."""
        may_job(request, who, name)
        raise ValidationError("index", PER_TASK)
