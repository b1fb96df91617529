"""The REST API (FastAPI): validation, authentication, authorization, and the calls
into the control plane.

Every endpoint but ``/healthz`` needs a bearer token. Errors are JSON
``{"error": kind, "message": ..., "field": ...}`` with a 4xx status: 401 without a
valid token (one answer for every bad token: "invalid token"), 403 outside the
token's role (both recorded as events with the reason), 404 for an unknown name (and
for another owner's entitlement or job: an owner cannot tell them from missing ones;
the refusal is recorded), 409 for a conflict (another spec under the same job name, a job being
deleted), 413 for a body over the limit, 422 for a malformed request (the field is
named). A job operation is acknowledged once it is durably stored; the scheduler
applies it asynchronously, and its progress shows in the job's status and events.
"""


import asyncio
import concurrent.futures
import contextlib
import contextvars
import functools
import inspect
import json
import threading
import urllib.parse
from typing import Annotated, Any, Literal

import pydantic
from fastapi import Body, Depends, FastAPI, Path, Query, Request, Response, Security
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Receive, Scope, Send
from swagger_ui_bundle import swagger_ui_path

from plait import __version__, fastjson, paging, requestid, tracing
from plait.client import types as t
from plait.errors import (
    NAME_TAKEN,
    Conflict,
    NotFound,
    PlaitError,
    Taken,
    TooLarge,
    TransientError,
    ValidationError,
)
from plait.frontend import batch, hostprofiles, jcp
from plait.frontend.fastcreate import FastCreate, headers_once, is_json, plain_headers
from plait.frontend.jsonbody import Utf8Route
from plait.frontend.proxy import MAX_BODY, FollowerProxy, read_body, replaying
from plait.frontend.requestlog import RequestLog
from plait.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from plait.metrics import HttpMetrics
from plait.model import Entitlement, JobSpec, Resources
from plait.model.agentwire import Output, Report
from plait.model.base import Input
from plait.model.job import MAX_TASKS
from plait.model.machine import FaultDomain, Machine, MachineState
from plait.model.redact import shown_spec
from plait.model.task import TaskState
from plait.paging import BadRequest
from plait.scheduler.records import TaskStatus
from plait.server.auth import AuthError, Principal, Role
from plait.server.controlplane import ControlPlane
from plait.server.controlplane.autoscaling import JobAutoscale
from plait.server.controlplane.gateway import desired_wire
from plait.server.controlplane.listing import JOB_STATES, parse_states
from plait.server.controlplane.owners import LimitsBody
from plait.server.events import Budget, Event
from plait.server.leader import Leadership
from plait.sidekick.book import Applied
from plait.store.backup import store_warnings
from plait.ui.app import Ui, WithUi

#: the largest request body accepted (a job spec is a few KB)

NAME = Annotated[str, pydantic.StringConstraints(pattern=r"^[a-z0-9]([a-z0-9._-]{0,62}[a-z0-9])?$")]

#: a list's page size and the token of its next page (``plait.paging``); a
#: bad one is a 400 naming it
Limit = Annotated[str | None, Query(description=(
    f"items per page, 1 to {paging.MAX_LIMIT}: the answer then carries `continue`, the "
    "token of the next page (null at the end); without it (and without `continue`) "
    "every item"))]
Continue = Annotated[str | None, Query(alias="continue", description=(
    "the `continue` of the previous page, as it is (bound to the list and its filters)"))]
TASK_STATES = tuple(s.value for s in TaskState)


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
    def _whole(self) -> "Join":
        given = [self.fault_domain, self.cpu, self.memory_gb, self.type]
        if any(v is not None for v in given) and not all(v is not None for v in given):
            missing = [n for n, v in zip(("fault_domain", "cpu", "memory_gb", "type"), given,
                                         strict=True) if v is None]
            raise ValueError(f"a machine description needs {', '.join(missing)} too")
        return self


class ErrorBody(pydantic.BaseModel):
    """The body of every error response."""

    error: str = pydantic.Field(description="the kind: unauthorized, forbidden, not_found, "
                                "conflict, too_large, invalid, rejected, unavailable")
    message: str
    field: str | None = pydantic.Field(default=None, description="the offending field, for "
                                       "invalid (a dotted path)")


#: the error responses, documented on every operation
ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorBody, "description": "Refused by the control plane"},
    401: {"model": ErrorBody, "description": "No valid bearer token"},
    403: {"model": ErrorBody, "description": "Outside the token's rights"},
    404: {"model": ErrorBody, "description": "No such object (or path)"},
    409: {"model": ErrorBody, "description": "Conflicts with the current state"},
    413: {"model": ErrorBody, "description": f"Request body over {MAX_BODY} bytes"},
    422: {"model": ErrorBody, "description": "Malformed request; the field is named"},
    503: {"model": ErrorBody, "description": "Store unavailable; retry after Retry-After"},
}

#: the one answer to every token that is not valid (malformed, unknown, revoked, or
#: with a wrong secret): why is recorded as an auth event, not told to the caller
INVALID_TOKEN = "invalid token"
#: problems of a malformed request named in its answer at most
MAX_PROBLEMS = 10
#: refused requests recorded as events: a burst of this many, then one each 10 s (with
#: how many were left out); a flood from anyone, with no token, then takes at most a
#: fifth of an event a second of the retained events
REFUSALS_BURST = 20
REFUSALS_PER_SECOND = 0.1
#: a task's index in a path (a job has at most ``MAX_TASKS``)
TaskIndex = Annotated[int, Path(ge=0, le=MAX_TASKS - 1)]

_HTTP_KINDS = {400: "invalid", 401: "unauthorized", 403: "forbidden", 404: "not_found",
               405: "method_not_allowed", 413: "too_large"}


def _error(status: int, kind: str, message: str, field: str | None = None,
           headers: dict[str, str] | None = None) -> JSONResponse:
    body: dict[str, Any] = {"error": kind, "message": message}
    if field:
        body["field"] = field
    return JSONResponse(body, status_code=status, headers=headers)


class BodyLimit:
    """Refuse bodies over ``MAX_BODY`` with a 413: by their Content-Length, before a
    byte of them is read; a chunked body (no length) is read up to the limit here,
    then handed on whole, or refused as soon as it passes the limit (plain ASGI:
    cheaper than an HTTP middleware on every request)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        size = dict(scope["headers"]).get(b"content-length")
        if size is not None:
            if not size.isdigit() or int(size) > MAX_BODY:
                await _too_large()(scope, receive, send)
                return
            await self.app(scope, receive, send)
            return
        body = await read_body(receive, MAX_BODY)
        if body is None:
            await _too_large()(scope, receive, send)
            return
        await self.app(scope, replaying(body, receive), send)


def _too_large() -> JSONResponse:
    return _error(413, "too_large", f"request body over {MAX_BODY} bytes")


def _error_bytes(kind: str, message: str) -> bytes:
    return json.dumps({"error": kind, "message": message}).encode()


def _event(e: Event) -> dict[str, Any]:
    return {"seq": e.seq, "time": e.time, "source": e.source, "kind": e.kind,
            "message": e.message, "job": e.job, "entitlement": e.entitlement,
            "machine": e.machine, "actor": e.actor, "task": e.task, "op": e.op,
            "reason": e.reason, "decision": e.decision, "request": e.request}


@functools.lru_cache(maxsize=4096)
def spec_wire(spec: JobSpec) -> dict[str, Any]:
    """A spec's JSON form, made once per spec (every agent of a job's tasks is sent
    the same version; the result is only serialized, never changed)."""
    return spec.model_dump(mode="json")


#: FastAPI's own OpenTelemetry instrumentation (FastAPI 0.160 and later) off: plait
#: traces its requests itself (``plait.tracing``), and FastAPI would otherwise check
#: the global providers on every request (a few microseconds) and, were one set,
#: record a second span of each request
NO_NATIVE_TELEMETRY: dict[str, Any] = (
    {"telemetry": {"tracing": False, "metrics": False, "logs": False}}
    if "telemetry" in inspect.signature(FastAPI.__init__).parameters else {})

#: where /docs finds the Swagger UI files
DOCS_STATIC = "/docs/static"
bearer = HTTPBearer(auto_error=False, scheme_name="token", description=(
    "A plait token (plait_<id>_<secret>): the admin token written at first start, an "
    "owner's from plait token create, or a machine's from /v1/agents/join."))


async def all_done(futures: list[concurrent.futures.Future[Any]]) -> None:
    """Wait until every one of ``futures`` (answered on another thread: the create
    committer's) is done, woken once for all of them: a wrapped future each would cost
    a wake-up of the event loop (a system call) and a callback chain per create."""
    if not futures:
        return
    loop = asyncio.get_running_loop()
    woken: asyncio.Future[None] = loop.create_future()
    left = len(futures)
    lock = threading.Lock()

    def one_done(_: concurrent.futures.Future[Any]) -> None:
        nonlocal left
        with lock:
            left -= 1
            last = left == 0
        if last:
            # (a loop closed meanwhile, as the server stopped: nobody waits any more)
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_wake, woken)

    for f in futures:
        f.add_done_callback(one_done)
    await woken


def _wake(woken: asyncio.Future[None]) -> None:
    if not woken.done():  # (the request may have been cancelled meanwhile)
        woken.set_result(None)


def create_app(cp: ControlPlane, run_loop: bool = True, close_store: bool = False,
               leadership: Leadership | None = None) -> FastAPI:
    """The API over a control plane; with ``run_loop`` the app starts and stops the
    control plane's loop with its own lifespan (and with ``close_store`` closes the
    store at shutdown). With ``leadership`` the replica campaigns instead: its loop runs
    while it leads, and while it follows every request goes to the leader."""
    from contextlib import asynccontextmanager

    @asynccontextmanager
    async def lifespan(app: FastAPI):  # type: ignore[no-untyped-def]
        if leadership is not None:
            leadership.start()
        elif run_loop:
            cp.loop.start()
        yield
        await ui.close()
        if leadership is not None:
            leadership.stop()
        elif run_loop:
            cp.loop.stop()
        if close_store:
            cp.store.close()

    app = FastAPI(title="plait", version=__version__, lifespan=lifespan, responses=ERRORS,
                  description="The plait control plane: entitlements, jobs, tasks, machines, "
                              "maintenance, events and service discovery. Every call but "
                              "/healthz takes a bearer token (Authorize, above).",
                  docs_url=None, redoc_url=None, **NO_NATIVE_TELEMETRY)
    app.router.route_class = Utf8Route  # (bodies are UTF-8 JSON: the others refused)
    # /docs from the Swagger UI files of the swagger-ui-bundle package: it works on a
    # machine without internet (FastAPI's default page loads them from a CDN)
    app.mount(DOCS_STATIC, StaticFiles(directory=swagger_ui_path), name="docs-static")

    @app.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url="/openapi.json", title="plait API",
            swagger_js_url=f"{DOCS_STATIC}/swagger-ui-bundle.js",
            swagger_css_url=f"{DOCS_STATIC}/swagger-ui.css",
            swagger_favicon_url=f"{DOCS_STATIC}/favicon-32x32.png")

    # -- errors ----------------------------------------------------------------------------
    @app.exception_handler(AuthError)
    async def _auth(request: Request, exc: AuthError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
        return _error(exc.status, "unauthorized" if exc.status == 401 else "forbidden",
                      exc.reason, headers=headers)

    @app.exception_handler(ValidationError)
    async def _invalid(request: Request, exc: ValidationError) -> JSONResponse:
        return _error(422, "invalid", str(exc), exc.field)

    @app.exception_handler(BadRequest)
    async def _bad_page(request: Request, exc: BadRequest) -> JSONResponse:
        return _error(400, "invalid", str(exc), exc.field)

    @app.exception_handler(NotFound)
    async def _missing(request: Request, exc: NotFound) -> JSONResponse:
        return _error(404, "not_found", str(exc))

    @app.exception_handler(Conflict)
    async def _conflict(request: Request, exc: Conflict) -> JSONResponse:
        answer = _error(409, "conflict", str(exc))
        if isinstance(exc, Taken) and exc.details:
            body = {**json.loads(bytes(answer.body)), **exc.details}
            return JSONResponse(body, status_code=409)
        return answer

    @app.exception_handler(TooLarge)
    async def _too_large(request: Request, exc: TooLarge) -> JSONResponse:
        return _error(413, "too_large", str(exc))

    @app.exception_handler(TransientError)
    async def _transient(request: Request, exc: TransientError) -> JSONResponse:
        return _error(503, "unavailable", str(exc),
                      headers={"Retry-After": str(max(1, round(exc.retry_after)))})

    @app.exception_handler(PlaitError)
    async def _plait(request: Request, exc: PlaitError) -> JSONResponse:
        return _error(400, "rejected", str(exc))

    @app.exception_handler(HTTPException)
    async def _http(request: Request, exc: HTTPException) -> JSONResponse:
        """The framework's own errors (unknown path, wrong method, unreadable body) in
        the same shape as ours."""
        if exc.status_code == 400 and exc.detail == "There was an error parsing the body":
            # not even text (FastAPI reads JSON errors as 422 already)
            return _error(422, "invalid", "the request body is not valid JSON (UTF-8)")
        kind = _HTTP_KINDS.get(exc.status_code, "error")
        raw = request.scope.get("raw_path") or b""
        if exc.status_code == 404 and b"%2f" in raw.lower():
            # (a name with a '/' in it, escaped: the path is read unescaped, and names
            # another path; no object can be named so)
            named = [urllib.parse.unquote(p) for p in raw.decode("latin-1").split("/")
                     if "%2f" in p.lower()]
            return _error(404, kind, f"no object is named {named[0][:128]!r}: a name has "
                                     "no '/' (1-64 of a-z 0-9 . _ -, starting and ending "
                                     "with a letter or digit)")
        return _error(exc.status_code, kind, str(exc.detail),
                      headers=dict(exc.headers) if exc.headers else None)

    @app.exception_handler(RequestValidationError)
    async def _malformed(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        first = errors[0] if errors else {}
        if first.get("type") == "json_invalid":
            reason = first.get("ctx", {}).get("error", "JSON decode error")
            if "UTF-8" in reason:  # (fastjson.NotUtf8: the encoding named, no position)
                return _error(422, "invalid", f"the request body is not valid JSON (UTF-8): "
                                              f"{reason}")
            return _error(422, "invalid", f"the request body is not valid JSON: {reason} "
                                          f"(at character {first['loc'][-1]})")
        # every problem, not the first alone: a misspelt field is both a required one
        # missing and an unknown one given, and the second says which
        said = []
        for e in errors[:MAX_PROBLEMS]:
            where = ".".join(str(p) for p in e.get("loc", ())
                             if p not in ("body", "query", "path"))
            msg = str(e.get("msg", "invalid")).removeprefix("Value error, ")  # (a validator's)
            if not where and tuple(e.get("loc", ())) == ("body",) and e.get("type") == "missing":
                msg = "the request body is empty: a JSON object is required"
            said.append(f"{where}: {msg}" if where else msg)
        if len(errors) > MAX_PROBLEMS:
            said.append(f"and {len(errors) - MAX_PROBLEMS} more")
        field = ".".join(str(p) for p in first.get("loc", ())
                         if p not in ("body", "query", "path"))
        return _error(422, "invalid", "; ".join(said), field)

    # innermost: a follower forwards creates, and bodies over the limit never get here
    app.add_middleware(FastCreate, create=lambda scope, body: create_plain(scope, body),
                       batch=lambda scope, body: create_batch(scope, body),
                       report=lambda scope, machine, body: report_plain(scope, machine, body))
    if leadership is not None:
        app.add_middleware(FollowerProxy, leadership=leadership)
    app.add_middleware(BodyLimit)
    # the web UI, a client of this very app (a follower serves it too; its reads go
    # to the leader like any other request)
    ui = Ui()
    app.add_middleware(WithUi, ui=ui)
    # outermost: every request counted, a follower's forwarded ones too
    app.add_middleware(HttpMetrics, metrics=cp.metrics)
    tracing.instrument(app)  # (a span per request, the front end's child)
    app.add_middleware(RequestLog, api="controlplane")  # (outermost: the request's id)
    ui.api = app
    if leadership is not None:  # (plait_leader: 0 while this replica follows)
        cp.leading = lambda: leadership.leading

    # -- authentication and authorization --------------------------------------------------
    refusals = Budget(REFUSALS_BURST, REFUSALS_PER_SECOND)

    def refuse(request: Request, status: int, reason: str,
               answer: str | None = None) -> AuthError:
        # a burst of refusals is recorded, a flood only now and then (anyone can send
        # one, with no token: they must not push everything else out of the retained
        # events); those left out are counted with the next one recorded
        skipped = refusals.take(cp.clock())
        if skipped is not None:
            if skipped:
                cp.record("auth", "refusals_suppressed",
                          f"{skipped} more refusals not recorded")
            cp.record("auth", "unauthorized" if status == 401 else "forbidden",
                      f"{request.method} {request.url.path}: {reason}")
        return AuthError(status, reason if answer is None else answer)

    async def principal(request: Request, declared: Annotated[
            HTTPAuthorizationCredentials | None, Security(bearer)] = None) -> Principal:
        # (``bearer`` declares the scheme in the OpenAPI document; the header is read
        # here, so every refusal has plait's shape and is recorded)
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise refuse(request, 401, "missing bearer token (Authorization: Bearer <token>)")
        try:
            # the cached record needs no store read; otherwise read it off the event loop
            who = cp.tokens.verify_cached(token.strip())
            if who is None:
                who = await run_in_threadpool(cp.tokens.verify, token.strip())
        except AuthError as exc:  # (why is recorded; every bad token gets one answer)
            raise refuse(request, 401, exc.reason, answer=INVALID_TOKEN) from None
        request.state.principal = who
        requestid.actor.set(str(who))  # the events this request records name it
        return who

    Who = Annotated[Principal, Depends(principal)]

    async def admin(request: Request, who: Who) -> Principal:
        if who.role is not Role.ADMIN:
            raise refuse(request, 403, f"{who} may not do this (admin only)")
        return who

    Admin = Annotated[Principal, Depends(admin)]

    async def user(request: Request, who: Who) -> Principal:
        if who.role not in (Role.ADMIN, Role.OWNER):
            raise refuse(request, 403, f"{who} may not do this (admin or owner tokens only)")
        return who

    User = Annotated[Principal, Depends(user)]

    def owned(who: Principal) -> set[str] | None:
        """The entitlements a principal may see (None: all)."""
        if who.role is Role.ADMIN:
            return None
        return {e.name for e in list(cp.allocator.entitlements.values()) if e.owner == who.name}

    def may_entitlement(request: Request, who: Principal, name: str,
                        named_in_body: bool = False) -> None:
        """An owner may use only its own entitlements; another owner's is answered as
        one that does not exist (no probing for names), and the refusal recorded.
        ``named_in_body``: a field of the request names it (a 422, as for an unknown
        one), not the path (a 404)."""
        if who.role is Role.ADMIN:
            return
        ent = cp.entitlement(name) if name in cp.allocator.entitlements else None
        if ent is None or ent.owner != who.name:
            refuse(request, 403, f"{who} does not own entitlement {name!r}")
            if named_in_body:
                raise ValidationError("entitlement", f"entitlement {name!r} does not exist")
            raise NotFound("entitlement", name)

    def may_job(request: Request, who: Principal, job: str) -> None:
        if who.role is Role.ADMIN:
            return
        try:
            may_entitlement(request, who, cp.jobs.get(job).entitlement)
        except NotFound:
            raise NotFound("job", job) from None

    def may_job_in(request: Request, who: Principal, job: str, entitlement: str) -> None:
        """``may_job`` for the job record the caller read (its entitlement)."""
        if who.role is Role.ADMIN:
            return
        try:
            may_entitlement(request, who, entitlement)
        except NotFound:
            raise NotFound("job", job) from None

    def name_free_for(request: Request, who: Principal, job: str, entitlement: str) -> None:
        """A spec naming job ``job`` (stored, in ``entitlement``) is the caller's to
        change; another owner's job is a name taken (job names are region-wide), as a
        create says, and that is all it says (not its entitlement nor its spec)."""
        try:
            may_job_in(request, who, job, entitlement)
        except NotFound:
            raise Conflict(f"job {job}", "a free name", NAME_TAKEN) from None

    @app.get("/v1/whoami", response_model=t.WhoAmI, tags=["tokens"])
    def whoami(who: Who) -> dict[str, Any]:
        """The token's own identity: its id, role and name (what the web UI shows)."""
        return {"token_id": who.token_id, "role": who.role.value, "name": who.name}

    # -- health ----------------------------------------------------------------------------
    @app.get("/metrics", include_in_schema=False)
    def metrics(who: Admin) -> Response:
        """This process's Prometheus metrics (``plait.metrics``), for an admin token
        (Prometheus: ``authorization: {credentials_file: ...}``). A follower answers
        with its own."""
        return Response(cp.metrics.exposition(), media_type=METRICS_CONTENT_TYPE)

    # (how the store is secured does not change while the app runs)
    warnings = store_warnings(cp.store)

    @app.get("/healthz", response_model=t.Health, tags=["health"])
    def healthz(response: Response) -> dict[str, Any]:
        """Health; needs no token. 503 when the control-plane loop has stopped passing
        (acknowledged operations would not be applied)."""
        ok, why = cp.loop.health()
        if not ok:
            response.status_code = 503
        role = {} if leadership is None else {
            "role": "leader" if leadership.leading else "follower",
            "leader": leadership.leader(), "replica": leadership.identity}
        return {"ok": ok, "status": why, "version": __version__, "steps": cp.steps,
                "failed_passes": cp.failures, **role, "warnings": warnings}

    # -- entitlements ----------------------------------------------------------------------
    @app.post("/v1/entitlements", response_model=t.EntitlementView, tags=["entitlements"],
              status_code=201,
              responses={200: {"model": t.EntitlementView,
                                   "description": "An existing entitlement, changed or the "
                                                  "same"}})
    def create_entitlement(ent: Entitlement, who: Admin, response: Response) -> dict[str, Any]:
        """Create an entitlement, or change its quota and settings (admin). A quota the
        region cannot give is accepted (capacity grows) and said in ``warnings`` and in
        the event."""
        if not cp.commands.define_entitlement(ent):
            response.status_code = 200
        view = cp.views.entitlement_view(ent.name)
        warnings = cp.commands.quota_warnings(ent)
        if warnings:
            view["warnings"] = warnings
        return view

    @app.get("/v1/entitlements", response_model=t.EntitlementList, tags=["entitlements"])
    def list_entitlements(who: User, limit: Limit = None, cont: Continue = None
                          ) -> dict[str, Any]:
        """The entitlements the caller may see, by name; in pages with ``limit`` and
        ``continue`` (then the answer carries ``continue``)."""
        win = paging.window(limit, cont, paging.scope_of("entitlements"))
        mine = owned(who)
        names = sorted(n for n in list(cp.allocator.entitlements) if mine is None or n in mine)

        def view(name: str | int) -> dict[str, Any] | None:
            try:
                return cp.views.entitlement_view(str(name))
            except NotFound:
                return None  # (gone meanwhile)
        found, nxt = paging.page(names, win, view)
        return {"entitlements": found, **({"continue": nxt} if win.paged else {})}

    @app.get("/v1/entitlements/{name}", response_model=t.EntitlementView, tags=["entitlements"])
    def get_entitlement(name: str, who: User, request: Request) -> dict[str, Any]:
        cp.entitlement(name)
        may_entitlement(request, who, name)
        return cp.views.entitlement_view(name)

    @app.delete("/v1/entitlements/{name}", response_model=t.EntitlementView,
                tags=["entitlements"])
    def delete_entitlement(name: str, who: Admin) -> dict[str, Any]:
        """Delete an entitlement that no job uses (a 409 names the jobs that do): the
        machines it holds go back to the region's free pool, and its canary
        entitlements go with it (admin, as its creation)."""
        return cp.commands.delete_entitlement(name)

    hostprofiles.add_routes(app, cp, Admin, User)

    # -- jobs ------------------------------------------------------------------------------
    def ack(doc: Any, created: bool | None = None,
            unchanged: bool | None = None) -> dict[str, Any]:
        body = {"name": doc.name, "entitlement": doc.entitlement, "version": doc.target,
                "operation": doc.seq, "deleting": doc.deleting}
        if created is not None:
            body["created"] = created
        if unchanged is not None:
            body["unchanged"] = unchanged
        return body

    def cached_caller(authorization: bytes, content_type: bytes) -> Principal | None:
        """The caller of a plain request the hot paths answer (``FastCreate``): a JSON
        body and a bearer token whose record is cached; None otherwise (the route
        answers, refusals and all)."""
        scheme, _, token = authorization.decode("latin-1").partition(" ")
        if scheme.lower() != "bearer" or not is_json(content_type):
            return None
        try:
            return cp.tokens.verify_cached(token.strip())
        except Exception:  # (a bad token: the route's 401)
            return None

    def plain(authorization: bytes, content_type: bytes, body: bytes
              ) -> tuple[Principal, JobSpec] | None:
        """Who asks and what, for a plain create: a cached owner's or admin's token, a
        JSON spec with no TaskController, of the caller's own entitlement (an admin:
        any); None for anything else."""
        who = cached_caller(authorization, content_type)
        if who is None:
            return None
        try:
            spec = JobSpec.model_validate(fastjson.loads(body))
        except Exception:  # (any refusal is the route's to make, with its answer)
            return None
        if who.role not in (Role.ADMIN, Role.OWNER) or (
                spec.task_controller is not None):
            return None
        if who.role is not Role.ADMIN:
            ent = cp.entitlement(spec.entitlement) if (
                spec.entitlement in cp.allocator.entitlements) else None
            if ent is None or ent.owner != who.name:
                return None
        return who, spec

    def acked(result: tuple[Any, bool]) -> tuple[int, bytes]:
        doc, created = result
        return (201 if created else 200), fastjson.dumps(ack(doc, created))

    async def create_plain(scope: Scope, body: bytes) -> tuple[int, bytes] | None:
        """``create_job`` for a plain create (``FastCreate``): the status and JSON body
        of its answer, or None for anything else, which the route answers: a token not
        in the cache or not an owner's or admin's, a body that is not a JSON spec,
        another owner's entitlement or an unknown one, a TaskController (its URL is
        checked off the event loop), a create refused (stored nothing; the route tries
        it once more and answers the error)."""
        given = plain_headers(scope)
        asked = None if given is None else plain(*given, body)
        if asked is None:
            return None
        who, spec = asked
        scope.setdefault("state", {})["principal"] = who  # (as the route's ``principal``)
        requestid.actor.set(str(who))
        try:
            return acked(await asyncio.wrap_future(cp.commands.submit_create(spec)))
        except PlaitError:
            return None

    def prepare_as(rid: str, who: Principal, spec: JobSpec) -> Any:
        requestid.current.set(rid)
        requestid.actor.set(str(who))
        return cp.commands.prepare_create(spec)

    async def create_batch(scope: Scope, body: bytes) -> tuple[int, bytes, bytes] | None:
        """``POST /v1/shard/creates`` (``plait.frontend.batch``) on the hot path: a
        request whose own token (given once) is a cached owner's or admin's, as the
        front end sends it; None for anything else, which the route (``shard_creates``)
        answers, refusing a token as every route does. The answer: (status, body,
        content type)."""
        given = headers_once(scope)
        if given is None:
            return None
        auth, ctype = given
        scheme, _, token = (auth or b"").decode("latin-1").partition(" ")
        if scheme.lower() != "bearer":
            return None
        try:
            who = cp.tokens.verify_cached(token.strip())
        except Exception:  # (a bad token: the route's 401)
            return None
        if who is None or who.role not in (Role.ADMIN, Role.OWNER):
            return None
        scope.setdefault("state", {})["principal"] = who
        return await answer_batch(ctype or b"", body)

    async def answer_batch(content_type: bytes, body: bytes) -> tuple[int, bytes, bytes]:
        """The front end's creates for this shard, each checked as ``create_plain``
        checks it, under its own token and request id, and stored together (group
        commit); the request's own token was checked by the caller."""
        if content_type != batch.CONTENT_TYPE.encode():
            return 415, _error_bytes("invalid", f"a batch of creates is sent as "
                                                f"{batch.CONTENT_TYPE}"), b"application/json"
        try:
            items = batch.decode(body)
        except batch.BadBatch as exc:
            return 422, _error_bytes("invalid", f"batch of creates: {exc}"), b"application/json"
        json_type = b"application/json"
        futures: list[Any] = []
        prepared: list[Any] = []
        for item in items:
            asked = plain(item.authorization.encode("latin-1", "replace"), json_type,
                          item.body)
            if asked is None:
                futures.append(None)
                continue
            try:  # (each in its own context: its id and caller, in its record and log)
                pending = contextvars.copy_context().run(
                    prepare_as, requestid.accept(item.request_id), *asked)
            except Exception:  # (refused: the front end sends it alone, for its answer)
                futures.append(None)
                continue
            prepared.append(pending)
            futures.append(pending.answer)
        # one transaction for the batch: here, when it would wait for nothing else
        if not cp.creates.commit_here(prepared):
            cp.commands.submit_prepared([p for p in prepared if not p.answer.done()])
            await all_done([f for f in futures if f is not None])
        answers: list[tuple[int, bytes] | None] = []
        for f in futures:
            got = None if f is None else (f.exception() or f.result())
            # (a refusal or a failure: the front end sends that create alone)
            answers.append(None if got is None or isinstance(got, BaseException)
                           else acked(got))
        return 200, batch.encode_answers(answers), batch.CONTENT_TYPE.encode()

    @app.post(batch.PATH, include_in_schema=False)
    async def shard_creates(who: User, request: Request) -> Response:
        """A batch of creates the hot path did not take (``create_batch``): its token
        checked as every route checks one (an owner's or admin's, like the creates it
        carries), then answered the same way."""
        status, payload, content_type = await answer_batch(
            request.headers.get("content-type", "").encode("latin-1"), await request.body())
        return Response(payload, status_code=status, media_type=content_type.decode())

    @app.post("/v1/jobs", response_model=t.JobAck | t.Plan, tags=["jobs"], status_code=201,
              responses={200: {"model": t.JobAck | t.Plan,
                                   "description": "The same spec again, or a dry run's plan"}})
    async def create_job(spec: JobSpec, who: User, request: Request, response: Response,
                         dry_run: bool = False) -> dict[str, Any]:
        """Create a job from a spec. Acknowledged once stored; tasks are placed
        asynchronously. The same spec again returns 200 and changes nothing; another
        spec under the same name is a 409. ``dry_run`` returns the plan only."""
        may_entitlement(request, who, spec.entitlement, named_in_body=True)
        if dry_run:
            response.status_code = 200

            def plan() -> dict[str, Any]:  # (it diffs against the job's spec: the caller's?)
                return cp.views.plan(spec, lambda ent: name_free_for(request, who, spec.name,
                                                                     ent))
            return await run_in_threadpool(plan)
        # stored with the creates of other requests (group commit); the controller
        # URL's name, if any, is resolved off the event loop
        submit = cp.commands.submit_create
        answer = (submit(spec) if spec.task_controller is None
                  else await run_in_threadpool(submit, spec))
        try:
            doc, created = await asyncio.wrap_future(answer)
        except Conflict:
            # job names are region-wide: the name of another owner's job is taken, and
            # that is all its create says (not whether it is being deleted, nor its spec)
            mine = owned(who)
            if mine is not None and await run_in_threadpool(
                    lambda: spec.name in cp.jobs.names_cached()
                    and cp.jobs.get(spec.name).entitlement not in mine):
                raise Conflict(f"job {spec.name}", "a free name", NAME_TAKEN) from None
            raise
        if not created:
            response.status_code = 200
        return ack(doc, created)

    @app.get("/v1/jobs", response_model=t.JobList, tags=["jobs"])
    def list_jobs(who: User, entitlement: str | None = None,
                  state: Annotated[str | None, Query(description=(
                      "the job's status, one of " + ", ".join(JOB_STATES)
                      + " (several: comma-separated)"))] = None,
                  limit: Limit = None, cont: Continue = None) -> Response:
        """The jobs the caller may see, by name. Without ``limit`` and ``continue``:
        every one (``{"jobs": [...]}``); with them, a page and the token of the next
        (``"continue"``: null at the end). Filters: ``entitlement``, ``state``.
        Served from memory: a record is read again only once it changed."""
        win = paging.window(limit, cont, paging.scope_of("jobs", entitlement=entitlement,
                                                         state=state))
        states = parse_states(state, JOB_STATES)
        mine = owned(who)
        if entitlement is not None:
            mine = {entitlement} if mine is None or entitlement in mine else set()
        items, nxt = cp.views.index.page(win, mine, states)
        tail = b',"continue":' + json.dumps(nxt).encode() if win.paged else b""
        return Response(b'{"jobs":[' + b",".join(items) + b"]" + tail + b"}",
                        media_type="application/json")

    @app.get("/v1/jobs/{name}", response_model=t.JobView, tags=["jobs"])
    def get_job(name: str, who: User, request: Request) -> dict[str, Any]:
        may_job(request, who, name)
        return cp.views.job_view(name)

    @app.put("/v1/jobs/{name}", response_model=t.JobAck | t.Plan, tags=["jobs"],
             responses={201: {"model": t.JobAck,
                                  "description": "The job did not exist: created"}})
    def update_job(name: str, spec: JobSpec, who: User, request: Request,
                   response: Response, dry_run: bool = False) -> dict[str, Any]:
        """The job's spec: a new version, rolled out at the pace of its update policy
        (the same spec again changes nothing); a job that does not exist is created
        (201), so ``PUT`` deploys in one call."""
        if spec.name != name:
            raise ValidationError("name", f"the spec names job {spec.name!r}, the path {name!r}")
        may_entitlement(request, who, spec.entitlement, named_in_body=True)
        if dry_run:
            return cp.views.plan(spec, lambda ent: name_free_for(request, who, name, ent))
        try:
            stored = cp.jobs.get(name)
        except NotFound:
            doc, created = cp.commands.create_job(spec)
            response.status_code = 201 if created else 200
            return ack(doc, created)
        name_free_for(request, who, name, stored.entitlement)
        doc = cp.commands.update_job(spec)
        return ack(doc, False, unchanged=doc.seq == stored.seq)

    @app.post("/v1/jobs/{name}/resize", response_model=t.JobAck, tags=["jobs"])
    def resize_job(name: str, body: Resize, who: User, request: Request) -> dict[str, Any]:
        may_job(request, who, name)
        sizing = cp.jcp.record(name).sizing
        if sizing is not None and sizing.intent.size != body.task_count:
            # (the Job Control Plane would put the intent's size back at once)
            raise Conflict(f"job {name}'s size: a sizing intent of {sizing.intent.size} "
                           f"tasks (by {sizing.actor or 'jcp'}) sizes it; change or remove "
                           "the intent (plait job intents), or its autoscaling",
                           body.task_count, sizing.intent.size)
        return ack(cp.commands.resize_job(name, body.task_count))

    @app.post("/v1/jobs/{name}/rollback", response_model=t.JobAck, tags=["jobs"])
    def rollback_job(name: str, body: Rollback, who: User, request: Request) -> dict[str, Any]:
        may_job(request, who, name)
        return ack(cp.commands.rollback_job(name, body.version))

    @app.post("/v1/jobs/{name}/move", response_model=t.JobAck, tags=["jobs"])
    def move_job(name: str, body: Move, who: User, request: Request) -> dict[str, Any]:
        """Move the job to another entitlement: every task is stopped and placed again
        on that entitlement's machines, paced like an update and through TaskControl.
        The caller must own both entitlements. Refused (nothing changes) for an unknown
        entitlement or the job's own (422), or one without room for the job (409)."""
        may_job(request, who, name)
        may_entitlement(request, who, body.entitlement, named_in_body=True)
        return ack(cp.commands.move_job(name, body.entitlement))

    @app.post("/v1/jobs/{name}/restart", response_model=t.JobAck, tags=["jobs"])
    def restart_job(name: str, who: User, request: Request,
                    body: Annotated[Restart | None, Body()] = None) -> dict[str, Any]:
        """Restart every task (or one, with ``index``), paced like an update."""
        may_job(request, who, name)
        return ack(cp.commands.restart_job(name, body.index if body else None))

    @app.post("/v1/jobs/{name}/resume", response_model=t.JobAck, tags=["jobs"])
    def resume_job(name: str, who: User, request: Request) -> dict[str, Any]:
        """Resume a halted rollout."""
        may_job(request, who, name)
        return ack(cp.commands.resume_job(name))

    @app.delete("/v1/jobs/{name}", response_model=t.JobAck, tags=["jobs"], status_code=202)
    def delete_job(name: str, who: User, request: Request) -> dict[str, Any]:
        """Stop every task, then forget the job."""
        may_job(request, who, name)
        return ack(cp.commands.delete_job(name))

    @app.put("/v1/jobs/{name}/autoscale", response_model=t.AutoscaleView, tags=["jobs"])
    def put_autoscale(name: str, body: JobAutoscale, who: User, request: Request
                      ) -> dict[str, Any]:
        """Autoscale the job: its size follows the load pushed to ``/load``, within
        the policy's bounds (the autoscaler writes resizes, actor ``autoscaler``)."""
        may_job(request, who, name)
        return cp.autoscaling.put(name, body)

    @app.get("/v1/jobs/{name}/autoscale", response_model=t.AutoscaleView, tags=["jobs"])
    def get_autoscale(name: str, who: User, request: Request) -> dict[str, Any]:
        may_job(request, who, name)
        return cp.autoscaling.view(name)

    @app.delete("/v1/jobs/{name}/autoscale", response_model=t.AutoscaleView, tags=["jobs"])
    def delete_autoscale(name: str, who: User, request: Request) -> dict[str, Any]:
        """Stop autoscaling the job (its size stays as it is); the policy removed."""
        may_job(request, who, name)
        removed = cp.autoscaling.view(name)
        cp.autoscaling.delete(name)
        return removed

    @app.post("/v1/jobs/{name}/load", response_model=t.LoadAck, tags=["jobs"])
    def push_load(name: str, body: Load, who: User, request: Request) -> dict[str, Any]:
        """The job's load now, for its autoscaler (an external series)."""
        may_job(request, who, name)
        return cp.autoscaling.push_load(name, body.value)

    jcp.add_routes(app, cp, User, may_job)

    @app.get("/v1/jobs/{name}/history", response_model=t.JobHistory, tags=["jobs"])
    def job_history(name: str, who: User, request: Request) -> dict[str, Any]:
        may_job(request, who, name)
        doc = cp.jobs.get(name)
        return {"name": name, "versions": doc.version, "kept": sorted(doc.kept),
                "operations": doc.log}

    @app.get("/v1/jobs/{name}/versions/{version}", response_model=t.JobSpecView, tags=["jobs"])
    def job_version(name: str, version: int, who: User, request: Request) -> dict[str, Any]:
        may_job(request, who, name)
        doc = cp.jobs.get(name)
        if version not in doc.kept:
            raise NotFound("version", f"{name} version {version}", doc.missing(version))
        return shown_spec(doc.spec_of(version).model_dump(mode="json"))

    @app.get("/v1/jobs/{name}/controller-key", response_model=t.ControllerKey, tags=["jobs"])
    def controller_key(name: str, who: User, request: Request) -> dict[str, Any]:
        """The key this region signs the job's TaskControl calls with (header
        ``Plait-Signature: t=<seconds>,v1=<hex HMAC-SHA256(key, "<t>." + body)>``); the
        job's controller verifies each call with it (``plait.taskcontrol.signing``)."""
        may_job(request, who, name)
        cp.jobs.get(name)
        return {"job": name, "key": cp.controllers.controller_key(name),
                "header": "Plait-Signature", "algorithm": "HMAC-SHA256"}

    @app.get("/v1/jobs/{name}/tasks", response_model=t.TaskList, tags=["tasks"])
    def job_tasks(name: str, who: User, request: Request,
                  state: Annotated[str | None, Query(description=(
                      "the task's state, one of " + ", ".join(TASK_STATES)
                      + " (several: comma-separated)"))] = None,
                  limit: Limit = None, cont: Continue = None) -> dict[str, Any]:
        """The job's tasks by index; in pages with ``limit`` and ``continue``."""
        may_job(request, who, name)
        win = paging.window(limit, cont, paging.scope_of(f"tasks/{name}", state=state))
        states = parse_states(state, TASK_STATES)
        tasks = {task["index"]: task for task in cp.views.tasks_view(name)}
        found, nxt = paging.page(sorted(tasks), win, lambda i: tasks[int(i)] if (
            states is None or tasks[int(i)]["state"] in states) else None)
        return {"job": name, "tasks": found, **({"continue": nxt} if win.paged else {})}

    @app.post("/v1/jobs/{name}/tasks/{index}/restart", response_model=t.JobAck, tags=["tasks"])
    def restart_task(name: str, index: TaskIndex, who: User, request: Request) -> dict[str, Any]:
        may_job(request, who, name)
        return ack(cp.commands.restart_job(name, index))

    @app.get("/v1/jobs/{name}/tasks/{index}/logs", response_model=t.TaskLogs, tags=["tasks"])
    def task_logs(name: str, index: TaskIndex, who: User, request: Request,
                  after: Annotated[int, Query(ge=0, le=1 << 62)] = 0,
                  limit: Annotated[int, Query(ge=1, le=1 << 20)] = 1 << 16) -> dict[str, Any]:
        """The tail of a task's output (the agent keeps the whole log); follow it by
        asking again with ``after`` = the ``next`` of the last answer."""
        may_job(request, who, name)
        text, nxt, skipped, machine = cp.gateway.task_logs(name, index, after, limit)
        return {"job": name, "index": index, "machine": machine, "data": text, "next": nxt,
                "skipped": skipped}

    @app.get("/v1/discovery/{job}", response_model=t.Discovery, tags=["discovery"])
    def discovery(job: str, who: User, request: Request) -> dict[str, Any]:
        """The tasks enabled in service discovery: at most one entry per task index."""
        may_job(request, who, job)
        return {"job": job, "endpoints": cp.views.discovery(job)}

    # -- machines and maintenance (admin) --------------------------------------------------
    @app.get("/v1/machines", response_model=t.MachineList, tags=["machines"])
    def list_machines(who: Admin, state: str | None = None, entitlement: str | None = None,
                      loaned: bool = False,
                      offset: Annotated[int, Query(ge=0)] = 0,
                      limit: Annotated[int, Query(ge=1, le=1000)] = 100,
                      cont: Continue = None) -> dict[str, Any]:
        """Machines in the region's order (generated, then registered), ``limit`` at a
        time: the next page from ``continue`` (the token of the last; null at the
        end), or at ``offset``. ``total``: every machine that passes the filters
        (``loaned``: only machines on loan to elastic entitlements)."""
        scope = paging.scope_of("machines", state=state, entitlement=entitlement,
                                loaned="1" if loaned else None)
        after = None if not cont else str(paging.decode(cont, scope))
        if after is not None and offset:
            raise BadRequest("offset", "give either offset or continue")
        states = parse_states(state, tuple(s.value for s in MachineState))
        found, total, last = cp.views.machines(states, entitlement, offset, limit, after,
                                               loaned)
        return {"machines": found, "total": total, "offset": offset,
                "continue": None if last is None else paging.encode(last, scope)}

    @app.get("/v1/machines/summary", response_model=t.MachineSummary, tags=["machines"])
    def machine_summary(who: Admin) -> dict[str, Any]:
        """Machines counted by data center, MSB, state and entitlement (null: free),
        read without walking the machines one by one (the web UI's region page)."""
        return cp.views.machine_summary()

    @app.get("/v1/machines/{machine}", response_model=t.MachineView, tags=["machines"])
    def get_machine(machine: str, who: Admin) -> dict[str, Any]:
        return cp.views.machine(machine)

    @app.post("/v1/machines/{machine}/fail", response_model=t.MachineEvent, tags=["machines"])
    def fail_machine(machine: str, who: Admin) -> dict[str, Any]:
        """Mark a machine failed (as the health check would): its tasks move."""
        return {"machine": machine, "event": cp.machine_ops.fail_machine(machine)}

    @app.post("/v1/machines/{machine}/repair", response_model=t.MachineRepair, tags=["machines"])
    def repair_machine(machine: str, who: Admin) -> dict[str, Any]:
        return {"machine": machine, "ended": cp.machine_ops.repair_machine(machine)}

    @app.post("/v1/machines/{machine}/cordon", response_model=t.MachineView, tags=["machines"])
    def cordon(machine: str, who: Admin) -> dict[str, Any]:
        """No new tasks on the machine; the ones there keep running."""
        return cp.machine_ops.cordon(machine, True)

    @app.post("/v1/machines/{machine}/uncordon", response_model=t.MachineView, tags=["machines"])
    def uncordon(machine: str, who: Admin) -> dict[str, Any]:
        return cp.machine_ops.cordon(machine, False)

    @app.post("/v1/machines/{machine}/drain", response_model=t.MachineEvent, tags=["machines"])
    def drain(machine: str, who: Admin,
              body: Annotated[Drain | None, Body()] = None) -> dict[str, Any]:
        """Cordon, then move the tasks off through TaskControl; at the deadline what is
        left is stopped. Once empty, the machine goes back to the free pool (``to:
        free``) or stays out of service until uncordoned (``maintenance``, the
        default)."""
        return {"machine": machine, "event": cp.machine_ops.drain(
            machine, body.deadline_seconds if body else None,
            body.to if body else "maintenance")}

    @app.post("/v1/maintenance", response_model=t.MaintenanceCreated, tags=["maintenance"],
              status_code=201)
    def schedule_maintenance(body: Maintenance, who: Admin) -> dict[str, Any]:
        start = cp.clock() if body.start is None else body.start
        return {"event": cp.machine_ops.schedule_maintenance(
            body.machines, start, body.duration_seconds, body.reason)}

    @app.get("/v1/maintenance", response_model=t.MaintenanceList, tags=["maintenance"])
    def list_maintenance(who: Admin) -> dict[str, Any]:
        return {"events": cp.machine_ops.maintenance()}

    @app.delete("/v1/maintenance/{event}", response_model=t.MaintenanceCancelled,
                tags=["maintenance"])
    def cancel_maintenance(event: str, who: Admin) -> dict[str, Any]:
        """Cancel a planned maintenance: not started, it is withdrawn (its notices
        stop, its machines' cordons are lifted; ``state`` cancelled); under way, it
        ends now (its machines are back in service; ``state`` ended)."""
        return cp.machine_ops.cancel_maintenance(event)

    # -- a scheduler shard's part in moving an entitlement (called by the front end) -------
    @app.post("/v1/shard/entitlements/{name}/handoff", response_model=t.ShardHandoff,
              tags=["shards"])
    def handoff(name: str, body: ShardMove, who: Admin) -> dict[str, Any]:
        """Hand an entitlement's records to another scheduler shard and stop managing
        them (its tasks are untouched)."""
        jobs = cp.membership.handoff(name, body.shard)
        return {"entitlement": name, "shard": body.shard, "jobs": jobs}

    @app.post("/v1/shard/reload", response_model=t.ShardReload, tags=["shards"])
    def reload(who: Admin, body: Annotated[ShardReload | None, Body()] = None
               ) -> dict[str, Any]:
        """Read this shard's records again (an entitlement was handed to it: 503
        until its records are seen here)."""
        cp.membership.reload(body.entitlement if body else None)
        return {"shard": cp.config.shard, "entitlements": len(cp.allocator.entitlements)}

    # -- events ----------------------------------------------------------------------------
    @app.get("/v1/events", response_model=t.EventPage, tags=["events"])
    def events(who: User, after: Annotated[int, Query(ge=0)] = 0,
               limit: Annotated[int, Query(ge=1, le=1000)] = 100, job: str | None = None,
               kind: str | None = None, source: str | None = None,
               entitlement: str | None = None, machine: str | None = None,
               since: Annotated[float | None, Query(ge=0)] = None,
               task: Annotated[int | None, Query(ge=0)] = None, actor: str | None = None,
               request: Annotated[str | None, Query(alias="request_id")] = None,
               ) -> Response:
        """Events oldest first; page with ``after`` = the ``next`` of the last page.
        Filters: a job's ``task`` (its index), the ``actor`` (``owner:alice``,
        ``scheduler``), the API request that caused them (``request_id``)."""
        found, cursor = cp.events.query(after, limit, job, kind, source, entitlement, machine,
                                        since, owned(who), task=task, actor=actor,
                                        request=request)
        # (written as the model says, not checked against it again: a poll of the
        # log, from the UI or a watcher, costs what reading the events does)
        return Response(fastjson.dumps({"events": [_event(e) for e in found],
                                        "next": cursor, "last_seq": cp.events.last_seq}),
                        media_type="application/json")

    # -- tokens (admin) --------------------------------------------------------------------
    def token_view(info: Any, token: str | None = None) -> dict[str, Any]:
        body = {"id": info.id, "role": info.role.value, "name": info.name,
                "created": info.created, "revoked": info.revoked,
                "description": info.description}
        if token is not None:
            body["token"] = token
        return body

    @app.post("/v1/tokens", response_model=t.TokenView, tags=["tokens"], status_code=201)
    def create_token(body: TokenRequest, who: Admin) -> dict[str, Any]:
        """A new token; the secret is returned once and stored only as a hash."""
        if body.role is Role.MACHINE:
            raise ValidationError("role", "machine credentials come from /v1/agents/join")
        info, token = cp.tokens.create(body.role, body.name, cp.clock(), body.description)
        cp.record("auth", "token_created", f"{info.role.value} token {info.id} for {info.name}")
        return token_view(info, token)

    # -- limits per owner ---------------------------------------------------------------
    @app.get("/v1/owners/limits", response_model=t.OwnerLimitsList, tags=["owners"])
    def list_owner_limits(who: Admin) -> dict[str, Any]:
        """The default limits per owner and each owner's (with an entitlement or a
        limit set): at most so many jobs and tasks in all its entitlements."""
        return cp.owners.views()

    @app.get("/v1/owners/{owner}/limits", response_model=t.OwnerLimitsView, tags=["owners"])
    def get_owner_limits(owner: str, who: User) -> dict[str, Any]:
        """An owner's limits and what it holds: an admin's view of any owner, an
        owner's of its own (another's is a 404)."""
        if who.role is not Role.ADMIN and who.name != owner:
            raise NotFound("owner", owner)
        return cp.owners.view(owner)

    @app.put("/v1/owners/{owner}/limits", response_model=t.OwnerLimitsView, tags=["owners"])
    def set_owner_limits(owner: str, body: LimitsBody, who: Admin) -> dict[str, Any]:
        """Set an owner's limits (null: the region's default). A lower limit takes
        nothing away: the owner's jobs stay, and it cannot grow until under it."""
        return cp.owners.set(owner, body)

    @app.get("/v1/tokens", response_model=t.TokenList, tags=["tokens"])
    def list_tokens(who: Admin, limit: Limit = None, cont: Continue = None
                    ) -> dict[str, Any]:
        """Every token by id; in pages with ``limit`` and ``continue``."""
        win = paging.window(limit, cont, paging.scope_of("tokens"))
        by_id = {info.id: info for info in cp.tokens.list()}
        found, nxt = paging.page(sorted(by_id), win, lambda i: token_view(by_id[str(i)]))
        return {"tokens": found, **({"continue": nxt} if win.paged else {})}

    @app.delete("/v1/tokens/{token_id}", response_model=t.TokenView, tags=["tokens"])
    def revoke_token(token_id: str, who: Admin) -> dict[str, Any]:
        info = cp.tokens.revoke(token_id)
        cp.record("auth", "token_revoked", f"token {token_id} ({info.role.value} {info.name})")
        return token_view(info)

    @app.post("/v1/tokens/{token_id}/rotate", response_model=t.TokenView, tags=["tokens"])
    def rotate_token(token_id: str, who: Admin) -> dict[str, Any]:
        info, token = cp.tokens.rotate(token_id, cp.clock())
        cp.record("auth", "token_rotated", f"token {token_id} replaced by {info.id}")
        return token_view(info, token)

    # -- agents ----------------------------------------------------------------------------
    @app.post("/v1/agents/join", response_model=t.Joined, tags=["agents"], status_code=201)
    def join(body: Join, who: Who, request: Request) -> dict[str, Any]:
        """Trade the cluster join token for this machine's own credential."""
        if who.role is not Role.JOIN:
            raise refuse(request, 403, f"{who} is not a join token")
        try:
            cp.machine_index(body.machine)
        except NotFound:
            pass
        else:
            # (a machine's agent is heard by the shard that manages it: another shard
            # answers 503, and the front end asks again where the map now says)
            cp.membership.check_owned(body.machine)
            ago = cp.gateway.heard_ago(body.machine)
            if ago is not None:  # (the join token does not make its holder that machine)
                raise Taken(f"machine {body.machine}", (
                    f"machine {body.machine} has a live agent (heard {ago:.1f}s ago): a "
                    "second agent cannot join as it. Stop that agent first (a machine "
                    f"silent for {cp.config.heartbeat_timeout:g}s may be joined again), or "
                    "start this one with that agent's data dir, which holds the "
                    "machine's credential"), heard_seconds_ago=round(ago, 3))
        if body.fault_domain is not None:
            assert body.cpu is not None and body.memory_gb is not None and body.type
            cp.machine_ops.register(Machine(
                id=body.machine, type=body.type, fault_domain=FaultDomain.parse(body.fault_domain),
                resources=Resources(cpu=body.cpu, memory_gb=body.memory_gb,
                                    disk_gb=body.disk_gb)))
        else:
            try:
                cp.machine_index(body.machine)
            except NotFound:
                raise ValidationError(
                    "machine", f"machine {body.machine!r} is not in the region: start its agent "
                    "with --fault-domain, --cpu, --memory-gb and --type to register it") from None
        info, token, replaced = cp.tokens.issue_machine(body.machine, cp.clock(),
                                                        f"joined with {who.token_id}")
        cp.record("auth", "machine_joined", f"{body.machine} (credential {info.id}"
                  + (f", replacing {replaced}, now revoked)" if replaced else ")"),
                  machine=body.machine)
        cp.gateway.joined(body.machine)
        return {"machine": body.machine, "token": token, "id": info.id}

    def machine_only(request: Request, who: Principal, machine: str) -> None:
        if who.role is Role.ADMIN or (who.role is Role.MACHINE and who.name == machine):
            return
        raise refuse(request, 403, f"{who} may not act for machine {machine}")

    @app.get("/v1/machines/{machine}/desired", response_model=t.DesiredSet, tags=["agents"])
    async def desired(machine: str, who: Who, request: Request,
                      wait: Annotated[float, Query(ge=0, le=60)] = 0.0,
                      since: Annotated[int | None, Query(ge=0)] = None) -> Response:
        """The machine's desired task set, which its agent converges to. A long-poll:
        with ``since`` (the ``generation`` of the set the agent has) and ``wait``, the
        answer comes when the set changes, or after ``wait`` seconds."""
        machine_only(request, who, machine)
        cp.machine_index(machine)
        if wait and since is not None:
            # woken by the pass when the set changes (registered before the generation
            # is read: no change is missed), no timer while it waits
            loop = asyncio.get_running_loop()
            deadline = loop.time() + wait
            waiters = cp.gateway.waiters
            with waiters.waiting(machine) as changed:
                while (not waiters.closed and cp.leading()
                       and cp.gateway.desired_generation(machine) == since):
                    left = deadline - loop.time()
                    if left <= 0:
                        break
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(changed.wait(), left)
                    changed.clear()
            if not cp.leading():  # (a set this replica kept may be stale by now)
                raise TransientError("this replica stopped leading while the request "
                                     "waited: ask again")
        # (the generation is read first: never newer than the tasks)
        generation = cp.gateway.desired_generation(machine)
        tasks = cp.gateway.desired_kept(machine)
        if tasks is None:  # not kept yet: read under the control plane's lock
            tasks = await run_in_threadpool(cp.gateway.desired, machine)
        profile = cp.gateway.profile_kept(machine)
        # each task's own credential (its PLAIT_TASK_CREDENTIAL), made as it is served
        credentials = (cp.gateway.credentials(tasks) if cp.controllers.secret_read()
                       else await run_in_threadpool(cp.gateway.credentials, tasks))
        return Response(desired_wire(machine, generation, tasks, credentials,
                                     cp.gateway.stops_kept(machine), profile
                                     ).model_dump_json(), media_type="application/json")

    @app.post("/v1/machines/{machine}/output", response_model=t.OutputAck, tags=["agents"])
    def output(machine: str, body: Output, who: Who, request: Request) -> dict[str, Any]:
        """An agent sends what its tasks printed (kept as a tail per task)."""
        machine_only(request, who, machine)
        taken = cp.gateway.task_output(machine, [(c.job, c.index, c.data) for c in body.chunks])
        return {"machine": machine, "accepted": taken, "refused": len(body.chunks) - taken}

    def take_report(machine: str, body: Report) -> dict[str, Any]:
        cp.gateway.report(machine, [TaskStatus(t.job, t.index, t.revision, t.phase, t.healthy,
                                               t.exit_code, t.final, t.killed)
                                    for t in body.tasks],
                          {(t.job, t.index): t.endpoint for t in body.tasks if t.endpoint},
                          None if body.profile is None else Applied(
                              body.profile.name, body.profile.version, body.profile.error,
                              body.profile.failures),
                          {(t.job, t.index): t.cpu for t in body.tasks if t.cpu is not None})
        return {"machine": machine, "accepted": len(body.tasks),
                "generation": cp.gateway.desired_generation(machine)}

    @app.post("/v1/machines/{machine}/status", response_model=t.StatusAck, tags=["agents"])
    async def status(machine: str, body: Report, who: Who,
                     request: Request) -> dict[str, Any]:
        """An agent's report of the tasks on its machine (taken at once, never
        blocking: applied by the next pass)."""
        machine_only(request, who, machine)
        return take_report(machine, body)

    async def report_plain(scope: Scope, machine: str, body: bytes
                           ) -> tuple[int, bytes] | None:
        """``status`` for an agent's plain report (``FastCreate``): a cached machine
        credential of this machine (or an admin's), a JSON body the ``Report`` model
        takes, a machine this control plane has; None for anything else (the route
        answers it, refusals and all)."""
        given = plain_headers(scope)
        who = None if given is None else cached_caller(*given)
        if who is None or not (who.role is Role.ADMIN or (
                who.role is Role.MACHINE and who.name == machine)):
            return None
        try:
            report = Report.model_validate_json(body)
            scope.setdefault("state", {})["principal"] = who  # (as the route's)
            requestid.actor.set(str(who))
            return 200, fastjson.dumps(take_report(machine, report))
        except Exception:  # (an unknown machine, a malformed body: the route's answer)
            return None

    return app
