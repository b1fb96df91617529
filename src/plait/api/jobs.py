"""``/v1/jobs``: a job's spec and operations, its history, tasks and logs, and
``/v1/discovery``. Every route is an admin's or an owner's (of the job's
entitlement); a job operation is acknowledged once stored (``common.ack``)."""

import asyncio
import json
from typing import Annotated, Any

from fastapi import Body, Query, Request, Response
from fastapi.concurrency import run_in_threadpool

from plait import paging
from plait.api.auth import Gate, Guard, User
from plait.api.bodies import Move, Resize, Restart, Rollback
from plait.api.common import Continue, Limit, Plane, TaskIndex, ack, resource
from plait.client import types as t
from plait.errors import NAME_TAKEN, Conflict, NotFound, ValidationError
from plait.model import JobSpec
from plait.model.redact import shown_spec
from plait.model.task import TaskState
from plait.server.auth import Principal
from plait.server.controlplane.facade import JOB_STATES, PlaneApi, parse_states

TASK_STATES = tuple(s.value for s in TaskState)

router = resource()


async def store_create(api: PlaneApi, guard: Gate, who: Principal, spec: JobSpec
                       ) -> tuple[dict[str, Any], bool]:
    """A create stored (its acknowledgement, and whether it made the job): the route's
    and the hot path's (``fastpaths``) one way to make one, once the caller may use
    the spec's entitlement. Stored with the creates of other requests (group commit);
    a TaskController URL's name is resolved off the event loop."""
    answer = (api.submit_create(spec) if spec.task_controller is None
              else await run_in_threadpool(api.submit_create, spec))
    try:
        doc, created = await asyncio.wrap_future(answer)
    except Conflict:
        # job names are region-wide: the name of another owner's job is taken, and that
        # is all its create says (not whether it is being deleted, nor its spec)
        mine = guard.owned(who)
        if mine is not None and await run_in_threadpool(
                lambda: spec.name in api.job_names_cached()
                and api.job(spec.name).entitlement not in mine):
            raise Conflict(f"job {spec.name}", "a free name", NAME_TAKEN) from None
        raise
    return ack(doc, created), created


@router.post("/v1/jobs", response_model=t.JobAck | t.Plan, tags=["jobs"], status_code=201,
             responses={200: {"model": t.JobAck | t.Plan,
                              "description": "The same spec again, or a dry run's plan"}})
async def create_job(spec: JobSpec, who: User, request: Request, response: Response,
                     api: Plane, guard: Guard, dry_run: bool = False) -> dict[str, Any]:
    """Create a job from a spec. Acknowledged once stored; tasks are placed
    asynchronously. The same spec again returns 200 and changes nothing; another spec
    under the same name is a 409. ``dry_run`` returns the plan only."""
    guard.may_entitlement(request, who, spec.entitlement, named_in_body=True)
    if dry_run:
        response.status_code = 200

        def plan() -> dict[str, Any]:  # (it diffs against the job's spec: the caller's?)
            return api.plan(spec, lambda ent: guard.name_free_for(request, who, spec.name,
                                                                  ent))
        return await run_in_threadpool(plan)
    body, created = await store_create(api, guard, who, spec)
    if not created:
        response.status_code = 200
    return body


@router.get("/v1/jobs", response_model=t.JobList, tags=["jobs"])
def list_jobs(who: User, api: Plane, guard: Guard, entitlement: str | None = None,
              state: Annotated[str | None, Query(description=(
                  "the job's status, one of " + ", ".join(JOB_STATES)
                  + " (several: comma-separated)"))] = None,
              limit: Limit = None, cont: Continue = None) -> Response:
    """The jobs the caller may see, by name. Without ``limit`` and ``continue``: every
    one (``{"jobs": [...]}``); with them, a page and the token of the next
    (``"continue"``: null at the end). Filters: ``entitlement``, ``state``. Served
    from memory: a record is read again only once it changed."""
    win = paging.window(limit, cont, paging.scope_of("jobs", entitlement=entitlement,
                                                     state=state))
    states = parse_states(state, JOB_STATES)
    mine = guard.owned(who)
    if entitlement is not None:
        mine = {entitlement} if mine is None or entitlement in mine else set()
    items, nxt = api.job_page(win, mine, states)
    tail = b',"continue":' + json.dumps(nxt).encode() if win.paged else b""
    return Response(b'{"jobs":[' + b",".join(items) + b"]" + tail + b"}",
                    media_type="application/json")


@router.get("/v1/jobs/{name}", response_model=t.JobView, tags=["jobs"])
def get_job(name: str, who: User, request: Request, api: Plane,
            guard: Guard) -> dict[str, Any]:
    guard.may_job(request, who, name)
    return api.job_view(name)


@router.put("/v1/jobs/{name}", response_model=t.JobAck | t.Plan, tags=["jobs"],
            responses={201: {"model": t.JobAck,
                             "description": "The job did not exist: created"}})
def update_job(name: str, spec: JobSpec, who: User, request: Request, response: Response,
               api: Plane, guard: Guard, dry_run: bool = False) -> dict[str, Any]:
    """The job's spec: a new version, rolled out at the pace of its update policy (the
    same spec again changes nothing); a job that does not exist is created (201), so
    ``PUT`` deploys in one call."""
    if spec.name != name:
        raise ValidationError("name", f"the spec names job {spec.name!r}, the path {name!r}")
    guard.may_entitlement(request, who, spec.entitlement, named_in_body=True)
    if dry_run:
        return api.plan(spec, lambda ent: guard.name_free_for(request, who, name, ent))
    try:
        stored = api.job(name)
    except NotFound:
        doc, created = api.create_job(spec)
        response.status_code = 201 if created else 200
        return ack(doc, created)
    guard.name_free_for(request, who, name, stored.entitlement)
    doc = api.update_job(spec)
    return ack(doc, False, unchanged=doc.seq == stored.seq)


@router.post("/v1/jobs/{name}/resize", response_model=t.JobAck, tags=["jobs"])
def resize_job(name: str, body: Resize, who: User, request: Request, api: Plane,
               guard: Guard) -> dict[str, Any]:
    guard.may_job(request, who, name)
    sizing = api.sizing_of(name)
    if sizing is not None and sizing.intent.size != body.task_count:
        # (the Job Control Plane would put the intent's size back at once)
        raise Conflict(f"job {name}'s size: a sizing intent of {sizing.intent.size} "
                       f"tasks (by {sizing.actor or 'jcp'}) sizes it; change or remove "
                       "the intent (plait job intents), or its autoscaling",
                       body.task_count, sizing.intent.size)
    return ack(api.resize_job(name, body.task_count))


@router.post("/v1/jobs/{name}/rollback", response_model=t.JobAck, tags=["jobs"])
def rollback_job(name: str, body: Rollback, who: User, request: Request, api: Plane,
                 guard: Guard) -> dict[str, Any]:
    guard.may_job(request, who, name)
    return ack(api.rollback_job(name, body.version))


@router.post("/v1/jobs/{name}/move", response_model=t.JobAck, tags=["jobs"])
def move_job(name: str, body: Move, who: User, request: Request, api: Plane,
             guard: Guard) -> dict[str, Any]:
    """Move the job to another entitlement: every task is stopped and placed again on
    that entitlement's machines, paced like an update and through TaskControl. The
    caller must own both entitlements. Refused (nothing changes) for an unknown
    entitlement or the job's own (422), or one without room for the job (409)."""
    guard.may_job(request, who, name)
    guard.may_entitlement(request, who, body.entitlement, named_in_body=True)
    return ack(api.move_job(name, body.entitlement))


@router.post("/v1/jobs/{name}/restart", response_model=t.JobAck, tags=["jobs"])
def restart_job(name: str, who: User, request: Request, api: Plane, guard: Guard,
                body: Annotated[Restart | None, Body()] = None) -> dict[str, Any]:
    """Restart every task (or one, with ``index``), paced like an update."""
    guard.may_job(request, who, name)
    return ack(api.restart_job(name, body.index if body else None))


@router.post("/v1/jobs/{name}/resume", response_model=t.JobAck, tags=["jobs"])
def resume_job(name: str, who: User, request: Request, api: Plane,
               guard: Guard) -> dict[str, Any]:
    """Resume a halted rollout."""
    guard.may_job(request, who, name)
    return ack(api.resume_job(name))


@router.delete("/v1/jobs/{name}", response_model=t.JobAck, tags=["jobs"], status_code=202)
def delete_job(name: str, who: User, request: Request, api: Plane,
               guard: Guard) -> dict[str, Any]:
    """Stop every task, then forget the job."""
    guard.may_job(request, who, name)
    return ack(api.delete_job(name))


@router.get("/v1/jobs/{name}/history", response_model=t.JobHistory, tags=["jobs"])
def job_history(name: str, who: User, request: Request, api: Plane,
                guard: Guard) -> dict[str, Any]:
    guard.may_job(request, who, name)
    doc = api.job(name)
    return {"name": name, "versions": doc.version, "kept": sorted(doc.kept),
            "operations": doc.log}


@router.get("/v1/jobs/{name}/versions/{version}", response_model=t.JobSpecView, tags=["jobs"])
def job_version(name: str, version: int, who: User, request: Request, api: Plane,
                guard: Guard) -> dict[str, Any]:
    guard.may_job(request, who, name)
    doc = api.job(name)
    if version not in doc.kept:
        raise NotFound("version", f"{name} version {version}", doc.missing(version))
    return shown_spec(doc.spec_of(version).model_dump(mode="json"))


@router.get("/v1/jobs/{name}/controller-key", response_model=t.ControllerKey, tags=["jobs"])
def controller_key(name: str, who: User, request: Request, api: Plane,
                   guard: Guard) -> dict[str, Any]:
    """The key this region signs the job's TaskControl calls with (header
    ``Plait-Signature: t=<seconds>,v1=<hex HMAC-SHA256(key, "<t>." + body)>``); the
    job's controller verifies each call with it (``plait.taskcontrol.signing``)."""
    guard.may_job(request, who, name)
    api.job(name)
    return {"job": name, "key": api.controller_key(name),
            "header": "Plait-Signature", "algorithm": "HMAC-SHA256"}


@router.get("/v1/jobs/{name}/tasks", response_model=t.TaskList, tags=["tasks"])
def job_tasks(name: str, who: User, request: Request, api: Plane, guard: Guard,
              state: Annotated[str | None, Query(description=(
                  "the task's state, one of " + ", ".join(TASK_STATES)
                  + " (several: comma-separated)"))] = None,
              limit: Limit = None, cont: Continue = None) -> dict[str, Any]:
    """The job's tasks by index; in pages with ``limit`` and ``continue``."""
    guard.may_job(request, who, name)
    win = paging.window(limit, cont, paging.scope_of(f"tasks/{name}", state=state))
    states = parse_states(state, TASK_STATES)
    tasks = {task["index"]: task for task in api.tasks_view(name)}
    found, nxt = paging.page(sorted(tasks), win, lambda i: tasks[int(i)] if (
        states is None or tasks[int(i)]["state"] in states) else None)
    return {"job": name, "tasks": found, **({"continue": nxt} if win.paged else {})}


@router.post("/v1/jobs/{name}/tasks/{index}/restart", response_model=t.JobAck,
             tags=["tasks"])
def restart_task(name: str, index: TaskIndex, who: User, request: Request, api: Plane,
                 guard: Guard) -> dict[str, Any]:
    guard.may_job(request, who, name)
    return ack(api.restart_job(name, index))


@router.get("/v1/jobs/{name}/tasks/{index}/logs", response_model=t.TaskLogs, tags=["tasks"])
def task_logs(name: str, index: TaskIndex, who: User, request: Request, api: Plane,
              guard: Guard, after: Annotated[int, Query(ge=0, le=1 << 62)] = 0,
              limit: Annotated[int, Query(ge=1, le=1 << 20)] = 1 << 16) -> dict[str, Any]:
    """The tail of a task's output (the agent keeps the whole log); follow it by asking
    again with ``after`` = the ``next`` of the last answer."""
    guard.may_job(request, who, name)
    text, nxt, skipped, machine = api.task_logs(name, index, after, limit)
    return {"job": name, "index": index, "machine": machine, "data": text, "next": nxt,
            "skipped": skipped}


@router.get("/v1/discovery/{job}", response_model=t.Discovery, tags=["discovery"])
def discovery(job: str, who: User, request: Request, api: Plane,
              guard: Guard) -> dict[str, Any]:
    """The tasks enabled in service discovery: at most one entry per task index."""
    guard.may_job(request, who, job)
    return {"job": job, "endpoints": api.discovery(job)}
