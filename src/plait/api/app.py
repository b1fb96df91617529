"""The REST API (FastAPI) over one control plane: ``create_app`` builds the app from
one router module per resource (``jobs``, ``intents``, ``entitlements``,
``hostprofiles``, ``machines``, ``events``, ``tokens``, ``agents``, ``admin``,
``health``), one authentication dependency (``auth.Gate``: the token read once, the
owner rule written once), and the hot paths (``fastpaths``); every call into the
control plane goes through its facade (``PlaneApi``).

Every endpoint but ``/healthz`` needs a bearer token. Errors are JSON
``{"error": kind, "message": ..., "field": ...}`` with a 4xx status (``errors``): 401
without a valid token (one answer for every bad token: "invalid token"), 403 outside
the token's role (both recorded as events with the reason), 404 for an unknown name
(and for another owner's entitlement or job: an owner cannot tell them from missing
ones; the refusal is recorded), 409 for a conflict (another spec under the same job
name, a job being deleted), 413 for a body over the limit, 422 for a malformed
request (the field is named). A job operation is acknowledged once it is durably
stored; the scheduler applies it asynchronously, and its progress shows in the job's
status and events.
"""

import inspect
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles
from swagger_ui_bundle import swagger_ui_path

from plait import __version__, tracing
from plait.api import (
    admin,
    agents,
    entitlements,
    errors,
    events,
    fastpaths,
    health,
    hostprofiles,
    intents,
    jobs,
    machines,
    tokens,
)
from plait.api.auth import Gate
from plait.api.fastcreate import FastCreate
from plait.api.jsonbody import Utf8Route
from plait.frontend.proxy import FollowerProxy
from plait.frontend.requestlog import RequestLog
from plait.metrics import HttpMetrics
from plait.server.controlplane import ControlPlane
from plait.server.controlplane.facade import PlaneApi
from plait.server.leader import Leadership
from plait.store.backup import store_warnings
from plait.ui.app import Ui, WithUi

#: FastAPI's own OpenTelemetry instrumentation (FastAPI 0.160 and later) off: plait
#: traces its requests itself (``plait.tracing``), and FastAPI would otherwise check
#: the global providers on every request (a few microseconds) and, were one set,
#: record a second span of each request
NO_NATIVE_TELEMETRY: dict[str, Any] = (
    {"telemetry": {"tracing": False, "metrics": False, "logs": False}}
    if "telemetry" in inspect.signature(FastAPI.__init__).parameters else {})

#: the routers, in the order their routes are matched
ROUTERS = (health, tokens, entitlements, hostprofiles, fastpaths, jobs, intents, machines,
           admin, events, agents)


def create_app(cp: ControlPlane, run_loop: bool = True, close_store: bool = False,
               leadership: Leadership | None = None) -> FastAPI:
    """The API over a control plane; with ``run_loop`` the app starts and stops the
    control plane's loop with its own lifespan (and with ``close_store`` closes the
    store at shutdown). With ``leadership`` the replica campaigns instead: its loop runs
    while it leads, and while it follows every request goes to the leader."""
    api = PlaneApi(cp)
    ui = Ui()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if leadership is not None:
            leadership.start()
        elif run_loop:
            api.start()
        yield
        await ui.close()
        if leadership is not None:
            leadership.stop()
        elif run_loop:
            api.stop()
        if close_store:
            api.close_store()

    app = FastAPI(title="plait", version=__version__, lifespan=lifespan,
                  responses=errors.ERRORS,
                  description="The plait control plane: entitlements, jobs, tasks, machines, "
                              "maintenance, events and service discovery. Every call but "
                              "/healthz takes a bearer token (Authorize, above).",
                  docs_url=None, redoc_url=None, **NO_NATIVE_TELEMETRY)
    app.router.route_class = Utf8Route  # (bodies are UTF-8 JSON: the others refused)
    gate = Gate(api)
    paths = fastpaths.FastPaths(api, gate)
    app.state.plane, app.state.gate, app.state.fastpaths = api, gate, paths
    app.state.leadership = leadership
    # (how the store is secured does not change while the app runs)
    app.state.warnings = store_warnings(api.store)
    # /docs from the Swagger UI files of the swagger-ui-bundle package: it works on a
    # machine without internet (FastAPI's default page loads them from a CDN)
    app.mount(health.DOCS_STATIC, StaticFiles(directory=swagger_ui_path), name="docs-static")
    errors.install(app)
    for module in ROUTERS:
        # the routes themselves, not their router: FastAPI (0.165) matches an included
        # router's routes through it, a few dependency-free lookups more per request
        # (a routed create took about a seventh more CPU); these routers add no
        # prefix, tag or dependency of their own, so the routes are the same
        app.router.routes.extend(module.router.routes)

    # innermost: a follower forwards creates, and bodies over the limit never get here
    app.add_middleware(FastCreate, create=paths.create, batch=paths.batch,
                       report=paths.report)
    if leadership is not None:
        app.add_middleware(FollowerProxy, leadership=leadership)
    app.add_middleware(errors.BodyLimit)
    # the web UI, a client of this very app (a follower serves it too; its reads go
    # to the leader like any other request)
    app.add_middleware(WithUi, ui=ui)
    # outermost: every request counted, a follower's forwarded ones too
    app.add_middleware(HttpMetrics, metrics=api.metrics)
    tracing.instrument(app)  # (a span per request, the front end's child)
    app.add_middleware(RequestLog, api="controlplane")  # (outermost: the request's id)
    ui.api = app
    if leadership is not None:  # (plait_leader: 0 while this replica follows)
        api.follow_leadership(lambda: leadership.leading)
    return app
