"""A job's intents: its autoscaling and load, and the Job Control Plane's resources
(``plait.server.controlplane.jcp``): push, sizing and canary intents, each its own
resource written by its own actor, and the unified spec they make. An owner reaches
only its own jobs' intents (another owner's answer 404, as missing ones)."""

from typing import Annotated, Any

from fastapi import Body, Request

from plait.api.auth import Guard, User
from plait.api.bodies import GateVerdict, Load
from plait.api.common import Plane, resource
from plait.client import types as t
from plait.errors import ValidationError
from plait.jcp.intents import PER_TASK, CanaryIntent, PushIntent, SizingIntent
from plait.model.policy import Name
from plait.server.controlplane.facade import JobAutoscale

router = resource()


# -- autoscaling ---------------------------------------------------------------------------
@router.put("/v1/jobs/{name}/autoscale", response_model=t.AutoscaleView, tags=["jobs"])
def put_autoscale(name: str, body: JobAutoscale, who: User, request: Request, api: Plane,
                  guard: Guard) -> dict[str, Any]:
    """Autoscale the job: its size follows the load pushed to ``/load``, within the
    policy's bounds (the autoscaler writes resizes, actor ``autoscaler``)."""
    guard.may_job(request, who, name)
    return api.put_autoscale(name, body)


@router.get("/v1/jobs/{name}/autoscale", response_model=t.AutoscaleView, tags=["jobs"])
def get_autoscale(name: str, who: User, request: Request, api: Plane,
                  guard: Guard) -> dict[str, Any]:
    guard.may_job(request, who, name)
    return api.autoscale_view(name)


@router.delete("/v1/jobs/{name}/autoscale", response_model=t.AutoscaleView, tags=["jobs"])
def delete_autoscale(name: str, who: User, request: Request, api: Plane,
                     guard: Guard) -> dict[str, Any]:
    """Stop autoscaling the job (its size stays as it is); the policy removed."""
    guard.may_job(request, who, name)
    removed = api.autoscale_view(name)
    api.delete_autoscale(name)
    return removed


@router.post("/v1/jobs/{name}/load", response_model=t.LoadAck, tags=["jobs"])
def push_load(name: str, body: Load, who: User, request: Request, api: Plane,
              guard: Guard) -> dict[str, Any]:
    """The job's load now, for its autoscaler (an external series)."""
    guard.may_job(request, who, name)
    return api.push_load(name, body.value)


# -- the Job Control Plane's intents -------------------------------------------------------
@router.get("/v1/jobs/{name}/intents", response_model=t.IntentsView, tags=["intents"])
def get_intents(name: str, who: User, request: Request, api: Plane,
                guard: Guard) -> dict[str, Any]:
    """Every intent of the job and the unified spec they make."""
    guard.may_job(request, who, name)
    return api.intents(name)


@router.put("/v1/jobs/{name}/push", response_model=t.PushView, tags=["intents"])
def put_push(name: str, body: PushIntent, who: User, request: Request, api: Plane,
             guard: Guard) -> dict[str, Any]:
    """Push a spec to the job in stages (percentages of its tasks), each gated once its
    tasks are healthy and soaked; a failing gate rolls back. A push replaces the one
    under way."""
    guard.may_job(request, who, name)
    return api.put_push(name, body)


@router.get("/v1/jobs/{name}/push", response_model=t.PushView, tags=["intents"])
def get_push(name: str, who: User, request: Request, api: Plane,
             guard: Guard) -> dict[str, Any]:
    guard.may_job(request, who, name)
    return api.push_view(name)


@router.post("/v1/jobs/{name}/push/abort", response_model=t.PushView, tags=["intents"])
def abort_push(name: str, who: User, request: Request, api: Plane,
               guard: Guard) -> dict[str, Any]:
    """Stop the push: its tasks go back to the job's spec."""
    guard.may_job(request, who, name)
    return api.abort_push(name)


@router.post("/v1/jobs/{name}/push/gate", response_model=t.PushView, tags=["intents"])
def push_gate(name: str, body: GateVerdict, who: User, request: Request, api: Plane,
              guard: Guard) -> dict[str, Any]:
    """An external gate's verdict on the stage being gated (``plait push
    --gate-command``): passed, the next stage; failed, a rollback."""
    guard.may_job(request, who, name)
    return api.gate_verdict(name, body.passed, body.message)


@router.put("/v1/jobs/{name}/sizing", response_model=t.SizingView, tags=["intents"])
def put_sizing(name: str, body: SizingIntent, who: User, request: Request, api: Plane,
               guard: Guard) -> dict[str, Any]:
    """How many tasks the job runs, within [min, max] (the autoscaler writes this too);
    while it is set, it sizes the job."""
    guard.may_job(request, who, name)
    return api.put_sizing(name, body)


@router.get("/v1/jobs/{name}/sizing", response_model=t.SizingView, tags=["intents"])
def get_sizing(name: str, who: User, request: Request, api: Plane,
               guard: Guard) -> dict[str, Any]:
    guard.may_job(request, who, name)
    return api.sizing_view(name)


@router.delete("/v1/jobs/{name}/sizing", response_model=t.SizingView, tags=["intents"])
def delete_sizing(name: str, who: User, request: Request, api: Plane,
                  guard: Guard) -> dict[str, Any]:
    """The job's spec sizes it again (its size stays as it is)."""
    guard.may_job(request, who, name)
    return api.delete_sizing(name)


@router.put("/v1/jobs/{name}/canaries/{canary}", response_model=t.CanaryView,
            tags=["intents"])
def put_canary(name: str, canary: Name, body: CanaryIntent, who: User, request: Request,
               api: Plane, guard: Guard) -> dict[str, Any]:
    """Run a spec on some of the job's tasks for a while (on machines of a type, with
    ``hardware``; on machines of their own switched to a host profile, with
    ``host_profile``: a code + config + host-profile canary); never on the push's
    tasks."""
    guard.may_job(request, who, name)
    return api.put_canary(name, canary, body)


@router.get("/v1/jobs/{name}/canaries/{canary}", response_model=t.CanaryView,
            tags=["intents"])
def get_canary(name: str, canary: str, who: User, request: Request, api: Plane,
               guard: Guard) -> dict[str, Any]:
    guard.may_job(request, who, name)
    return api.canary_view(name, canary)


@router.delete("/v1/jobs/{name}/canaries/{canary}", response_model=t.CanaryView,
               tags=["intents"])
def delete_canary(name: str, canary: str, who: User, request: Request, api: Plane,
                  guard: Guard) -> dict[str, Any]:
    """End the canary now: its tasks go back."""
    guard.may_job(request, who, name)
    return api.delete_canary(name, canary)


@router.put("/v1/jobs/{name}/tasks/{index}/spec", response_model=t.JobAck,
            tags=["intents"])
def put_task_spec(name: str, index: int, who: User, request: Request, guard: Guard,
                  body: Annotated[Any, Body()] = None) -> dict[str, Any]:
    """Per-task customization: refused, always, with a 422 that points to Shard
    Manager (Table 1's last row)."""
    guard.may_job(request, who, name)
    raise ValidationError("index", PER_TASK)
