"""HTTP metrics of a plait process that serves the API: an ASGI wrapper counting and
timing requests by route template (``HttpMetrics``), into the registry of a
``plait.metrics.HttpOnly`` (or ``Metrics``); and the route template of a path
(``api_route``), which the traces name their spans by too."""

from __future__ import annotations

from collections.abc import Callable
from time import perf_counter
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Message, Receive, Scope, Send


class _Labelled(Protocol):
    def labels(self, *values: str) -> Any: ...


class Served(Protocol):
    """What ``HttpMetrics`` counts into (``plait.metrics.HttpOnly``)."""

    @property
    def enabled(self) -> bool: ...

    @property
    def http_requests(self) -> _Labelled: ...

    @property
    def http_seconds(self) -> _Labelled: ...


class HttpMetrics:
    """An ASGI wrapper counting requests by route template (``/v1/jobs/{name}``: a
    label per route, not per job), method and status, and timing them. ``route``
    names the template of a path (None: the path as is, for a fixed set of paths)."""

    def __init__(self, app: ASGIApp, metrics: Served,
                 route: Callable[[Scope], str] | None = None) -> None:
        self.app, self.metrics, self.route = app, metrics, route
        self.enabled = metrics.enabled

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.enabled:
            await self.app(scope, receive, send)
            return
        started = perf_counter()
        status = {"code": 500}

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            route = self.route(scope) if self.route is not None else _template(scope)
            method = str(scope.get("method", ""))
            self.metrics.http_requests.labels(route, method, str(status["code"])).inc()
            self.metrics.http_seconds.labels(route, method).observe(
                perf_counter() - started)


def _template(scope: Scope) -> str:
    """The route template FastAPI matched (``/v1/jobs/{name}``), else the path's
    (a request a follower forwarded, or one no route takes)."""
    route: Any = scope.get("route")
    path = getattr(route, "path_format", None) or getattr(route, "path", None)
    return str(path) if path else api_route(str(scope.get("path", "")))


def api_route(path: str) -> str:
    """A path of the API as its route template, for a process that does not route it
    itself (the front end): names in it become ``{name}``."""
    parts = [p for p in path.split("/") if p]
    if parts[:1] == ["ui"]:  # the web UI's pages: one label
        return "/ui"
    if not parts or parts[0] != "v1":
        return path if path in ("/healthz", "/metrics", "/openapi.json", "/docs") \
            else "other"
    named = {"jobs": "name", "entitlements": "name", "machines": "machine",
             "tokens": "token_id", "discovery": "name", "tasks": "index",
             "versions": "version"}
    out: list[str] = []
    for part in parts:  # a part after a collection's name is a name (the template's)
        before = out[-1] if out else ""
        out.append("{" + named[before] + "}" if before in named else part)
    return "/" + "/".join(out)
