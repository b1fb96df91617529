"""The web UI at ``/ui``: the region at a glance, entitlements, jobs, a job's ops chart,
machines and a live events stream, rendered on the server (Jinja2, no build step, no
CDN: the CSS and the one script are files of this package).

The UI is a client of the region's own API: each page calls it in-process (an ASGI
transport, no socket) with the token the user logged in with, so it shows exactly
what that token may see: an owner sees its entitlements and jobs and nothing of
another owner's; machines are for admins. The token stays on the server, in a session
of this process (``Sessions``); the browser holds the session's random id in an
HttpOnly, SameSite=Strict cookie scoped to ``/ui``, and logging out ends the session
here. Logging in and out are taken only from a page of this origin (``_same_origin``).
The UI only reads; it changes nothing.
"""

from __future__ import annotations

import collections
import re
import secrets
import time
import urllib.parse
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import jinja2
import pydantic
from starlette.applications import Starlette
from starlette.datastructures import MutableHeaders
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Receive, Scope, Send

from plait.model.entitlement import Quota
from plait.ui import gantt

PREFIX = "/ui"
COOKIE = "plait_ui_session"
#: a session ends this long after its login (the cookie's own lifetime too)
SESSION_SECONDS = 12 * 3600
#: owners' sessions a process holds at most (past it, the oldest of the owner holding
#: the most ends first)
MAX_SESSIONS = 10_000
#: one owner's sessions at most (its oldest ends first): one owner's logins end only
#: its own sessions
MAX_SESSIONS_PER_OWNER = 50
#: admins' sessions at most, apart from the owners' (no owner's logins end one)
MAX_ADMIN_SESSIONS = 1_000
#: the most a login form may send
MAX_FORM = 8192
#: machines on one page of the machines list
MACHINES_PAGE = 1000
#: pages read at most this many events (1,000 per API call)
MAX_EVENTS = 20_000
_HERE = Path(__file__).parent
_SECURITY = {
    "content-security-policy": "default-src 'self'; script-src 'self'; style-src 'self'; "
                               "img-src 'self' data:; frame-ancestors 'none'; "
                               "form-action 'self'",
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",
    "cache-control": "no-store",
}

#: what a job's or an entitlement's name may be (``plait.model.entitlement.NAME_RE``),
#: and a machine's (``Join.machine``): anything else is no page
_NAME = re.compile(r"^[a-z0-9]([a-z0-9._-]{0,62}[a-z0-9])?\Z")
_MACHINE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}\Z")

_env = jinja2.Environment(loader=jinja2.FileSystemLoader(_HERE / "templates"),
                          autoescape=True, trim_blocks=True, lstrip_blocks=True)


def _ago(t: float | None, now: float) -> str:
    if t is None:
        return ""
    d = max(now - t, 0.0)
    if d < 90:
        return f"{d:.0f}s ago"
    if d < 5400:
        return f"{d / 60:.0f}m ago"
    return f"{d / 3600:.1f}h ago"


def _quota(quota: dict[str, Any] | None) -> str:
    """A quota as people write it ("12 machines", "200 RRU"): the model's own words
    for it; what the model would not take is shown as given, its empty fields left out
    (never Python's ``None``)."""
    if not quota:
        return ""
    try:
        return str(Quota.model_validate(quota))
    except pydantic.ValidationError:
        return ", ".join(f"{k} {v}" for k, v in quota.items() if v is not None)


_env.filters["ago"] = _ago
_env.filters["quota"] = _quota
_env.filters["clock"] = lambda t: time.strftime("%H:%M:%S", time.localtime(t)) if t else ""


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class Sessions:
    """The UI's sessions in this process: a random id for each login, mapped to its
    token until it ends (``lifetime`` after the login, or at logout). The cookie holds
    the id, so a copied cookie is no API credential and dies with its session.

    Bounded per owner (``per_owner``: an owner's new login ends its own oldest), in
    all for owners (``most``: past it, the oldest session of the owner holding the
    most ends), and apart for admins (``admins``, their oldest first): no owner's
    volume ends another owner's sessions below its share, nor an admin's."""

    def __init__(self, lifetime: float = SESSION_SECONDS, most: int | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 per_owner: int | None = None, admins: int | None = None) -> None:
        self.lifetime, self.clock = lifetime, clock
        self.most = MAX_SESSIONS if most is None else most
        self.per_owner = MAX_SESSIONS_PER_OWNER if per_owner is None else per_owner
        self.admins = MAX_ADMIN_SESSIONS if admins is None else admins
        #: id -> (token, when it ends, whose: an owner's name, or None: an admin's),
        #: oldest first
        self._held: dict[str, tuple[str, float, str | None]] = {}
        #: each owner's sessions (and the admins', under None), oldest first
        self._of: dict[str | None, dict[str, None]] = {}

    def open(self, token: str, owner: str | None = "") -> str:
        """A session of ``token``, an owner's (its name) or an admin's (None)."""
        now = self.clock()
        expired = []
        for sid, (_, ends, _) in self._held.items():  # (in the order of their ends)
            if ends > now:
                break
            expired.append(sid)
        for sid in expired:
            self.close(sid)
        mine = self._of.get(owner, {})
        while mine and len(mine) >= (self.admins if owner is None else self.per_owner):
            self.close(next(iter(mine)))
        if owner is not None:
            while self._owned() >= self.most:
                largest = max((o for o in self._of if o is not None),
                              key=lambda o: len(self._of[o]))
                self.close(next(iter(self._of[largest])))
        sid = secrets.token_urlsafe(32)
        self._held[sid] = (token, now + self.lifetime, owner)
        self._of.setdefault(owner, {})[sid] = None
        return sid

    def _owned(self) -> int:
        return len(self._held) - len(self._of.get(None, ()))

    def token(self, sid: str | None) -> str | None:
        """The session's token, None if there is no such session (any more)."""
        held = self._held.get(sid) if sid else None
        if held is None:
            return None
        if held[1] <= self.clock():
            self.close(sid)
            return None
        return held[0]

    def close(self, sid: str | None) -> None:
        held = self._held.pop(sid, None) if sid else None
        if held is not None:
            mine = self._of[held[2]]
            del mine[sid]  # type: ignore[arg-type]
            if not mine:
                del self._of[held[2]]

    def __len__(self) -> int:
        return len(self._held)


class Ui:
    """The UI as an ASGI app; ``api`` is the region's API app it reads from (the front
    end, or a replica's app), set once that app exists."""

    def __init__(self, api: ASGIApp | None = None) -> None:
        self.api = api
        self._client: httpx.AsyncClient | None = None
        self.sessions = Sessions()
        page = self._page
        self.app = Starlette(routes=[
            Route(PREFIX, page(self.overview)),
            Route(PREFIX + "/", page(self.overview)),
            Route(PREFIX + "/login", self.login, methods=["GET", "POST"]),
            Route(PREFIX + "/logout", self.logout, methods=["POST"]),
            Route(PREFIX + "/entitlements", page(self.entitlements)),
            Route(PREFIX + "/jobs", page(self.jobs)),
            Route(PREFIX + "/jobs/{name}", page(self.job)),
            Route(PREFIX + "/jobs/{name}/gantt", page(self.gantt)),
            Route(PREFIX + "/machines", page(self.machines)),
            Route(PREFIX + "/machines/{machine}", page(self.machine)),
            Route(PREFIX + "/events", page(self.events)),
            Route(PREFIX + "/events.json", self.events_json),
            Mount(PREFIX + "/static", StaticFiles(directory=_HERE / "static"), name="static"),
        ])

    @staticmethod
    def serves(path: str) -> bool:
        return path == PREFIX or path.startswith(PREFIX + "/")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def secured(message: Any) -> None:
            # every answer of the UI carries its security headers: static files,
            # Starlette's own 404s and 405s too
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in _SECURITY.items():
                    if name not in headers:
                        headers.append(name, value)
            await send(message)
        await self.app(scope, receive, secured)

    @property
    def client(self) -> httpx.AsyncClient:
        if self._client is None:
            assert self.api is not None, "the UI's API app is not set"
            self._client = httpx.AsyncClient(transport=httpx.ASGITransport(app=self.api),
                                             base_url="http://plait", timeout=30.0)
        return self._client

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    # -- reading the API ------------------------------------------------------------------
    async def get(self, token: str, path: str, **params: Any) -> Any:
        query = {k: v for k, v in params.items() if v is not None}
        r = await self.client.get(path, params=query,
                                  headers={"authorization": f"Bearer {token}"})
        if r.status_code != 200:
            try:
                answer = r.json()
                message = str(answer.get("message") or answer.get("error") or r.text)
            except (ValueError, AttributeError):
                message = r.text[:200]
            raise ApiError(r.status_code, message)
        return r.json()

    async def all_events(self, token: str, **filters: Any) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        after = 0
        while len(found) < MAX_EVENTS:
            page = await self.get(token, "/v1/events", after=after, limit=1000, **filters)
            found.extend(page["events"])
            if page.get("next") is None:
                break
            after = page["next"]
        return found

    # -- pages ----------------------------------------------------------------------------
    def _page(self, handler: Callable[[Request, str], Awaitable[dict[str, Any]]]
              ) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            sid = request.cookies.get(COOKIE)
            token = self.sessions.token(sid)
            if token is None:
                response = self._to_login(request)
                if sid is not None:
                    response.delete_cookie(COOKIE, path=PREFIX)
                return response
            try:
                context = await handler(request, token)
            except ApiError as exc:
                if exc.status == 401:  # (revoked or expired since the login)
                    self.sessions.close(sid)
                    response = self._to_login(request)
                    response.delete_cookie(COOKIE, path=PREFIX)
                    return response
                context = {"template": "error.html", "status": exc.status,
                           "message": exc.message, "title": "error"}
            return self.render(request, context, token)
        return endpoint

    def render(self, request: Request, context: dict[str, Any], token: str | None,
               status: int | None = None) -> Response:
        template = _env.get_template(context.pop("template"))
        code = status or int(context.get("status", 200))
        body = template.render(prefix=PREFIX, path=request.url.path, now=time.time(),
                               signed_in=token is not None, **context)
        return HTMLResponse(body, status_code=code, headers=_SECURITY)

    @staticmethod
    def _to_login(request: Request) -> Response:
        here = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        target = urllib.parse.quote(here, safe="/")
        return RedirectResponse(f"{PREFIX}/login?next={target}", status_code=303,
                                headers=_SECURITY)

    async def login(self, request: Request) -> Response:
        if request.method == "GET":
            return self.render(request, {"template": "login.html", "title": "log in",
                                         "next": _safe_next(request.query_params.get("next"))},
                               None)
        if not _same_origin(request):
            return self.render(request, {"template": "login.html", "title": "log in",
                                         "error": "a login must come from this site's own "
                                                  "login page", "next": PREFIX + "/"},
                               None, status=403)
        body = b""
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_FORM:
                return self.render(request, {"template": "login.html", "title": "log in",
                                             "error": "the form is too large", "next": ""},
                                   None, status=413)
        form = urllib.parse.parse_qs(body.decode(errors="replace"))
        token = (form.get("token") or [""])[0].strip()
        target = _safe_next((form.get("next") or [""])[0])
        who: dict[str, Any] | None = None
        if not token:
            error = "paste a token (plait token create, or the admin token of plait up)"
        elif not (token.isascii() and token.isprintable()):
            error = ("that token is not valid (a token is printable ASCII: was a space or "
                     "a quote pasted with it?)")
        else:
            try:
                who = await self.get(token, "/v1/whoami")
            except ApiError as exc:
                error = ("that token is not valid (unknown, revoked or expired)"
                         if exc.status == 401 else
                         "that token may not use the UI (admin or owner tokens only)"
                         if exc.status == 403 else f"the region answered: {exc.message}")
            else:
                error = "that token may not use the UI (admin or owner tokens only)"
            if who is not None and who.get("role") in ("admin", "owner"):
                self.sessions.close(request.cookies.get(COOKIE))
                response = RedirectResponse(target, status_code=303, headers=_SECURITY)
                sid = self.sessions.open(token, None if who["role"] == "admin"
                                         else str(who.get("name", "")))
                response.set_cookie(COOKIE, sid, httponly=True,
                                    samesite="strict", path=PREFIX,
                                    secure=request.url.scheme == "https",
                                    max_age=SESSION_SECONDS)
                return response
        return self.render(request, {"template": "login.html", "title": "log in",
                                     "error": error, "next": target}, None, status=401)

    async def logout(self, request: Request) -> Response:
        if not _same_origin(request):
            return self.render(request, {"template": "error.html", "status": 403,
                                         "title": "error", "message": "a logout must come "
                                         "from a page of this site"}, None)
        self.sessions.close(request.cookies.get(COOKIE))
        response = RedirectResponse(f"{PREFIX}/login", status_code=303, headers=_SECURITY)
        response.delete_cookie(COOKIE, path=PREFIX)
        return response

    async def overview(self, request: Request, token: str) -> dict[str, Any]:
        who = await self.get(token, "/v1/whoami")
        ents = (await self.get(token, "/v1/entitlements"))["entitlements"]
        jobs = (await self.get(token, "/v1/jobs"))["jobs"]
        domains: dict[tuple[str, str], collections.Counter[str]] = {}
        pools: collections.Counter[str] = collections.Counter()
        states: collections.Counter[str] = collections.Counter()
        total = 0
        if who["role"] == "admin":
            summary = await self.get(token, "/v1/machines/summary")
            total = int(summary["total"])
            for c in summary["cells"]:
                n = int(c["machines"])
                cell = domains.setdefault((c["dc"], c["msb"]), collections.Counter())
                cell["machines"] += n
                cell[c["state"]] += n
                cell["free" if c["entitlement"] is None else "entitled"] += n
                pools[c["entitlement"] or "(free pool)"] += n
                states[c["state"]] += n
        unavailable = sorted((j for j in jobs if j.get("unavailable")),
                             key=lambda j: -int(j["unavailable"]))
        return {"template": "overview.html", "title": "region", "who": who,
                "entitlements": ents, "jobs": jobs, "domains": sorted(domains.items()),
                "pools": sorted(pools.items()), "states": sorted(states.items()),
                "machines_total": total,
                "unavailable": unavailable,
                "unavailable_total": sum(int(j["unavailable"]) for j in unavailable),
                "tasks_total": sum(int(j.get("task_count", 0)) for j in jobs)}

    async def entitlements(self, request: Request, token: str) -> dict[str, Any]:
        ents = (await self.get(token, "/v1/entitlements"))["entitlements"]
        return {"template": "entitlements.html", "title": "entitlements", "entitlements": ents}

    async def jobs(self, request: Request, token: str) -> dict[str, Any]:
        jobs = (await self.get(token, "/v1/jobs",
                               entitlement=request.query_params.get("entitlement")))["jobs"]
        return {"template": "jobs.html", "title": "jobs", "jobs": jobs}

    async def job(self, request: Request, token: str) -> dict[str, Any]:
        name = _named(request, "name", _NAME, "job")
        job = await self.get(token, f"/v1/jobs/{_q(name)}")
        tasks = (await self.get(token, f"/v1/jobs/{_q(name)}/tasks"))["tasks"]
        history = await self.get(token, f"/v1/jobs/{_q(name)}/history")
        by_dc: collections.Counter[str] = collections.Counter()
        by_msb: collections.Counter[str] = collections.Counter()
        for task in tasks:
            fd = task.get("fault_domain")
            if fd:
                by_dc[fd["dc"]] += 1
                by_msb[f"{fd['dc']}/{fd['msb']}"] += 1
        return {"template": "job.html", "title": f"job {name}", "job": job, "tasks": tasks,
                "history": history, "by_dc": sorted(by_dc.items()),
                "by_msb": sorted(by_msb.items())}

    async def gantt(self, request: Request, token: str) -> dict[str, Any]:
        name = _named(request, "name", _NAME, "job")
        job = await self.get(token, f"/v1/jobs/{_q(name)}")
        events = await self.all_events(token, job=name)
        rows = gantt.bars(events)
        now = time.time()
        latest = max((float(e["time"]) for e in events), default=now)
        if abs(now - latest) > 30 * 86400:  # a simulated region's clock is not this one's
            now = latest
        job_events = [e for e in events if e.get("task") is None][-50:]
        return {"template": "gantt.html", "title": f"ops chart: {name}", "job": job,
                "chart": gantt.svg(rows, now), "bars": sum(len(b) for b in rows.values()),
                "tasks_charted": len(rows), "colours": gantt.COLOURS,
                "job_events": job_events}

    async def machines(self, request: Request, token: str) -> dict[str, Any]:
        state = request.query_params.get("state") or None
        entitlement = request.query_params.get("entitlement") or None
        page = await self.get(token, "/v1/machines", state=state, entitlement=entitlement,
                              limit=MACHINES_PAGE,
                              offset=_int(request.query_params.get("offset")))
        return {"template": "machines.html", "title": "machines", "machines": page["machines"],
                "total": page["total"], "offset": int(page.get("offset", 0)), "state": state,
                "entitlement": entitlement, "page_size": MACHINES_PAGE}

    async def machine(self, request: Request, token: str) -> dict[str, Any]:
        name = _named(request, "machine", _MACHINE, "machine")
        machine = await self.get(token, f"/v1/machines/{_q(name)}")
        if not isinstance(machine, dict) or machine.get("id") != name:
            # (a name the API routes elsewhere: ``summary``)
            raise ApiError(404, f"machine {name!r} not found")
        events = (await self.all_events(token, machine=name))[-100:]
        return {"template": "machine.html", "title": f"machine {name}", "machine": machine,
                "events": events}

    async def events(self, request: Request, token: str) -> dict[str, Any]:
        job = request.query_params.get("job") or None
        page = await self.get(token, "/v1/events", after=0, limit=1, job=job)
        last = int(page.get("last_seq", 0))
        events = await self.recent(token, job)
        cursor = events[-1]["seq"] if events else last
        return {"template": "events.html", "title": "events", "events": events[::-1],
                "cursor": cursor, "job": job}

    async def recent(self, token: str, job: str | None) -> list[dict[str, Any]]:
        """The latest 200 events (the last hour's, or the oldest retained if none)."""
        found: list[dict[str, Any]] = []
        after = 0
        since = time.time() - 3600
        for _ in range(MAX_EVENTS // 1000):
            page = await self.get(token, "/v1/events", after=after, limit=1000, job=job,
                                  since=since)
            found = (found + page["events"])[-200:]
            if page.get("next") is None:
                break
            after = page["next"]
        if not found:
            page = await self.get(token, "/v1/events", after=0, limit=200, job=job)
            found = page["events"]
        return found

    async def events_json(self, request: Request) -> Response:
        """New events after ``after`` for the live stream (polled by ui.js)."""
        sid = request.cookies.get(COOKIE)
        token = self.sessions.token(sid)
        if token is None:
            return JSONResponse({"error": "log in first", "login": f"{PREFIX}/login"},
                                status_code=401, headers=_SECURITY)
        try:
            page = await self.get(token, "/v1/events",
                                  after=_int(request.query_params.get("after")), limit=200,
                                  job=request.query_params.get("job") or None)
        except ApiError as exc:
            if exc.status == 401:  # (revoked or expired since the login)
                self.sessions.close(sid)
                return JSONResponse({"error": "log in again", "login": f"{PREFIX}/login"},
                                    status_code=401, headers=_SECURITY)
            return JSONResponse({"error": exc.message}, status_code=exc.status,
                                headers=_SECURITY)
        events = page["events"]
        cursor = events[-1]["seq"] if events else _int(request.query_params.get("after"))
        keep = ("seq", "time", "source", "kind", "message", "job", "machine", "task", "actor",
                "reason", "decision")
        return JSONResponse({"events": [{k: e.get(k) for k in keep} for e in events],
                             "cursor": cursor, "more": page.get("next") is not None},
                            headers=_SECURITY)


class WithUi:
    """ASGI: ``/ui`` to the UI, everything else to the API app."""

    def __init__(self, app: ASGIApp, ui: Ui) -> None:
        self.app, self.ui = app, ui

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and Ui.serves(str(scope["path"])):
            await self.ui(scope, receive, send)
        else:
            await self.app(scope, receive, send)


def _named(request: Request, param: str, rule: re.Pattern[str], what: str) -> str:
    """The object a page's path names; a name no object may have is no page (a 404, not
    a call of the API with ``.``, ``..`` or another route's name)."""
    name = str(request.path_params[param])
    if not rule.match(name) or name in (".", ".."):
        raise ApiError(404, f"{what} {name[:80]!r} not found")
    return name


def _same_origin(request: Request) -> bool:
    """Did a page of this site send this form? A browser names the page's origin in
    ``Origin`` (or at least ``Referer``) on every POST; a page of another site that
    posts a login or a logout here is refused. A request with neither is not a
    browser's form (a script's, which could send either header anyway)."""
    origin = request.headers.get("origin") or request.headers.get("referer")
    if origin is None:
        return True
    if origin == "null":
        return False
    return urllib.parse.urlsplit(origin).netloc.lower() == request.headers.get(
        "host", "").lower()


def _q(name: str) -> str:
    return urllib.parse.quote(name, safe="")


def _int(value: str | None) -> int:
    try:
        return max(int(value or 0), 0)
    except ValueError:
        return 0


def _safe_next(value: str | None) -> str:
    """Where to go after logging in: a page of the UI, never another site."""
    if value and Ui.serves(value.split("?", 1)[0]) and "//" not in value and "\\" not in value:
        return value
    return PREFIX + "/"
