"""``/healthz`` (no token), ``/metrics`` (admin) and ``/docs`` (the Swagger UI, from
files this server serves: it works on a machine without internet)."""

from typing import Any

from fastapi import Request, Response
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse

from plait import __version__
from plait.api.auth import Admin
from plait.api.common import Plane, resource
from plait.client import types as t
from plait.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE

#: where /docs finds the Swagger UI files
DOCS_STATIC = "/docs/static"

router = resource()


@router.get("/docs", include_in_schema=False)
async def docs() -> HTMLResponse:
    return get_swagger_ui_html(
        openapi_url="/openapi.json", title="plait API",
        swagger_js_url=f"{DOCS_STATIC}/swagger-ui-bundle.js",
        swagger_css_url=f"{DOCS_STATIC}/swagger-ui.css",
        swagger_favicon_url=f"{DOCS_STATIC}/favicon-32x32.png")


@router.get("/metrics", include_in_schema=False)
def metrics(who: Admin, api: Plane) -> Response:
    """This process's Prometheus metrics (``plait.metrics``), for an admin token
    (Prometheus: ``authorization: {credentials_file: ...}``). A follower answers with
    its own."""
    return Response(api.metrics.exposition(), media_type=METRICS_CONTENT_TYPE)


@router.get("/healthz", response_model=t.Health, tags=["health"])
def healthz(request: Request, response: Response, api: Plane) -> dict[str, Any]:
    """Health; needs no token. 503 when the control-plane loop has stopped passing
    (acknowledged operations would not be applied)."""
    ok, why = api.health()
    if not ok:
        response.status_code = 503
    leadership = request.app.state.leadership
    role = {} if leadership is None else {
        "role": "leader" if leadership.leading else "follower",
        "leader": leadership.leader(), "replica": leadership.identity}
    steps, failures = api.passes()
    return {"ok": ok, "status": why, "version": __version__, "steps": steps,
            "failed_passes": failures, **role, "warnings": request.app.state.warnings}
