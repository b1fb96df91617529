"""The SDK's client: transport (failover, retries) and the API's resources.

Only the standard library is imported here at module level: ``httpx`` at the first
request, ``stamina`` at the first retry, so ``plait`` commands start fast.

Retries (``stamina``, exponential backoff with jitter, ``Retry-After`` honoured):

* a request that could not be sent (connection refused or timed out before
  connecting) goes to the next URL at once; when every URL has failed, the round
  is tried again after a backoff;
* a 503 (a replica without a leader during an election, a shard being moved) is
  retried the same way: the request was not applied;
* for requests that are idempotent (GET, PUT, DELETE), also a read timeout or a
  connection lost mid-request, and a 502 or 504 from a proxy in between.

A POST whose answer was lost is not sent again: the caller cannot know whether it
was applied (creating the same job again is safe, and says so with 200).

Each call carries an ``X-Request-Id`` (the same on every retry of it): the API's log
lines, and the effects of the call, name it; an ``ApiError`` says it.
"""

from __future__ import annotations

import builtins
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

import plait.client.types as t
from plait import requestid

if TYPE_CHECKING:
    import httpx

_IDEMPOTENT = frozenset({"GET", "PUT", "DELETE", "HEAD"})
#: items per page of the lists the SDK reads page by page (the server's most: 5000)
PAGE = 500


class ApiError(Exception):
    """The API answered with an error: ``status`` (HTTP), ``kind`` (``not_found``,
    ``conflict``, ``invalid``, ...), ``message`` and, for invalid input, ``field``."""

    def __init__(self, status: int, kind: str, message: str,
                 field: str | None = None, request_id: str | None = None) -> None:
        self.status, self.kind, self.message, self.field = status, kind, message, field
        #: the id of the request (what the API's logs name it by)
        self.request_id = request_id
        said = f"HTTP {status}" + (f", request {request_id}" if request_id else "")
        super().__init__(f"{message} ({said})")


class Unreachable(Exception):
    """No URL of the client answered (after the retries)."""


class _Retry(Exception):
    """One round over the URLs failed in a way worth trying again."""

    def __init__(self, cause: str, retry_after: float | None = None) -> None:
        self.cause, self.retry_after = cause, retry_after
        super().__init__(cause)


def _backoff(exc: BaseException) -> bool | float:
    """stamina's hook: retry rounds that failed, after Retry-After when given."""
    if isinstance(exc, _Retry):
        return True if exc.retry_after is None else max(0.0, min(exc.retry_after, 30.0))
    return False


class Client:
    def __init__(self, urls: str | Sequence[str], token: str | None = None,
                 ca_file: str | None = None, timeout: float = 30.0, attempts: int = 6,
                 retry_timeout: float = 30.0, transport: str = "httpx",
                 quiet: bool = False) -> None:
        """``urls``: one URL or several (replicas, front ends), tried in order, the
        one that answered last first; ``attempts``/``retry_timeout`` bound the
        rounds of retries. ``transport``: ``httpx`` (connection pooling, HTTP/1.1
        keep-alive; for programs), or ``stdlib`` (``http.client``: a command that
        makes one or two calls starts 70 ms sooner without importing httpx).
        ``quiet``: retries are not logged (a command says what failed, once)."""
        if transport not in ("httpx", "stdlib"):
            raise ValueError(f"transport must be httpx or stdlib, not {transport!r}")
        self.transport = transport
        self.urls = [u.rstrip("/") for u in ([urls] if isinstance(urls, str) else urls)]
        if not self.urls:
            raise ValueError("a client needs at least one URL")
        self.token, self.ca_file, self.timeout = token, ca_file, timeout
        self.attempts, self.retry_timeout = attempts, retry_timeout
        self.quiet = quiet
        self._http: httpx.Client | _Stdlib | None = None
        self._current = 0
        self.jobs = Jobs(self)
        self.entitlements = Entitlements(self)
        self.machines = Machines(self)
        self.tokens = Tokens(self)
        self.events = Events(self)
        self.maintenance = MaintenanceApi(self)

    @property
    def url(self) -> str:
        """The URL that answered last (the first, before any request)."""
        return self.urls[self._current]

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._http is not None:
            self._http.close()
            self._http = None

    # -- transport -----------------------------------------------------------------------
    def _client(self) -> httpx.Client | _Stdlib:
        if self._http is None:
            secure = any(u.startswith("https:") for u in self.urls)
            headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
            if self.transport == "stdlib":
                self._http = _Stdlib(headers, self.timeout, self.ca_file if secure else None,
                                     secure)
                return self._http
            import httpx

            from plait.tls import verify as tls_verify

            # plain http: no TLS context to build (loading the system's authorities
            # costs a tenth of a second)
            verify = tls_verify(self.ca_file, self.urls[0]) if secure else False
            self._http = httpx.Client(headers=headers, timeout=self.timeout, verify=verify,
                                      trust_env=False)
        return self._http

    def request(self, method: str, path: str, json: Any = None,
                params: Mapping[str, Any] | None = None) -> Any:
        """One API call; the decoded JSON answer. Raises ``ApiError`` for an error
        answer, ``Unreachable`` when no URL answered within the retries."""
        query = {k: v for k, v in (params or {}).items() if v is not None}
        # (a program's own request being handled, if any, or a new one; kept across
        # the retries, so the API's logs show them as one request)
        rid = requestid.current.get() or requestid.new()
        try:
            return self._round(method, path, json, query, rid)
        except _Retry as first:
            if self.attempts <= 1:
                raise Unreachable(first.cause) from None
            # (stamina runs its first attempt at once: the first wait is here)
            time.sleep(_backoff(first) if first.retry_after is not None else 0.2)
        import stamina

        if self.quiet:  # (stamina logs each retry it schedules, by default)
            stamina.instrumentation.set_on_retry_hooks([])
        try:
            for attempt in stamina.retry_context(
                    on=_backoff, attempts=self.attempts - 1, timeout=self.retry_timeout,
                    wait_initial=0.2, wait_max=3.0, wait_jitter=0.3):
                with attempt:
                    return self._round(method, path, json, query, rid)
        except _Retry as last:
            raise Unreachable(last.cause) from None
        raise AssertionError("unreachable")  # (stamina raises or returns)

    def _round(self, method: str, path: str, body: Any, query: dict[str, Any],
               rid: str) -> Any:
        """Try each URL once, starting with the one that answered last."""
        http = self._client()
        if isinstance(http, _Stdlib):
            connect_errors: tuple[type[BaseException], ...] = (_NotSent,)
            transport_errors: tuple[type[BaseException], ...] = (OSError,)
        else:
            import httpx

            connect_errors = (httpx.ConnectError, httpx.ConnectTimeout)
            transport_errors = (httpx.TransportError,)
        causes: list[str] = []
        retry_after: float | None = None
        permanent = 0
        n = len(self.urls)
        for k in range(n):
            i = (self._current + k) % n
            url = self.urls[i]
            try:
                reply = http.request(method, url + path, json=body, params=query,
                                     headers={requestid.HEADER: rid})
            except connect_errors as exc:
                causes.append(f"{url}: cannot connect ({exc})")
                permanent += bool(getattr(exc, "permanent", False) or _permanent(exc))
                continue
            except transport_errors as exc:
                if method in _IDEMPOTENT:
                    causes.append(f"{url}: {type(exc).__name__}: {exc}")
                    continue
                raise Unreachable(f"{url}: {type(exc).__name__}: {exc} (the request may "
                                  "have been applied; it is not sent again)") from None
            status = reply.status_code
            if status == 503 or (status in (502, 504) and method in _IDEMPOTENT):
                causes.append(f"{url}: HTTP {status} {_message(reply)}")
                after = reply.headers.get("retry-after")
                if after is not None and after.replace(".", "", 1).isdigit():
                    retry_after = float(after) if retry_after is None else min(
                        retry_after, float(after))
                continue
            self._current = i
            if status >= 400:
                raise _error(reply, rid)
            return reply.json() if reply.content else None
        if permanent == n:  # (no URL can be reached by trying again: said at once)
            raise Unreachable("; ".join(causes))
        raise _Retry("; ".join(causes), retry_after)

    def get(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params=params)

    def post(self, path: str, body: Any = None, **params: Any) -> Any:
        return self.request("POST", path, json=body, params=params)

    def put(self, path: str, body: Any, **params: Any) -> Any:
        return self.request("PUT", path, json=body, params=params)

    def delete(self, path: str) -> Any:
        return self.request("DELETE", path)

    def pages(self, path: str, field: str, limit: int = PAGE,
              **params: Any) -> Iterator[builtins.list[Any]]:
        """Each page of a list (its ``field``), following the ``continue`` token of
        each answer until the last (``plait.paging``). A server that does not page
        answers the whole list at once: one page."""
        token: str | None = None
        while True:
            body = self.get(path, limit=limit, **params, **({"continue": token}
                                                            if token else {}))
            yield body[field]
            token = body.get("continue")
            if not token:
                return

    # -- small resources -----------------------------------------------------------------
    def health(self) -> t.Health:
        return cast(t.Health, self.get("/healthz"))

    def discovery(self, job: str) -> t.Discovery:
        """The job's tasks enabled in service discovery, with their endpoints."""
        return cast(t.Discovery, self.get(f"/v1/discovery/{job}"))


class _NotSent(OSError):
    """The connection could not be made: the request was not sent. ``permanent``: no
    retry will make it (a name that resolves to nothing, a TLS handshake that failed)."""

    def __init__(self, message: str, permanent: bool = False) -> None:
        super().__init__(message)
        self.permanent = permanent


def _permanent(exc: BaseException) -> bool:
    """Is this failure to connect one no retry mends: a name that is no host's, or TLS
    that failed (not a timeout)? It may sit under the exception httpx raises."""
    import socket
    import ssl

    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            return False
        if (isinstance(seen, socket.gaierror) and seen.errno != socket.EAI_AGAIN) or (
                isinstance(seen, ssl.SSLError) and not isinstance(seen, TimeoutError)):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


class _Reply:
    """What ``_Stdlib`` answers: the part of ``httpx.Response`` the client reads."""

    def __init__(self, status: int, reason: str, headers: Any, content: bytes) -> None:
        self.status_code, self.reason_phrase, self.content = status, reason, content
        self.headers = {k.lower(): v for k, v in headers.items()}

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")

    def json(self) -> Any:
        import json

        return json.loads(self.content)


class _Stdlib:
    """``http.client`` with one kept-alive connection per URL."""

    def __init__(self, headers: dict[str, str], timeout: float, ca_file: str | None,
                 secure: bool) -> None:
        self.headers, self.timeout = headers, timeout
        self._context: Any = None
        if secure:
            import ssl

            try:
                self._context = ssl.create_default_context(cafile=ca_file)
            except (OSError, ssl.SSLError) as exc:  # (the error alone names no file)
                raise OSError(getattr(exc, "errno", None) or 0,
                              f"the CA file {ca_file}: {getattr(exc, 'strerror', None) or exc}"
                              ) from None
        self._conns: dict[str, Any] = {}

    def request(self, method: str, url: str, json: Any = None,
                params: Mapping[str, Any] | None = None,
                headers: Mapping[str, str] | None = None) -> _Reply:
        import http.client
        import json as jsonlib
        from urllib.parse import urlencode, urlsplit

        parts = urlsplit(url)
        base = f"{parts.scheme}://{parts.netloc}"
        target = parts.path + (f"?{urlencode(params)}" if params else "")
        headers = {**self.headers, **(headers or {}), "Accept": "application/json"}
        payload = None
        if json is not None:
            payload = jsonlib.dumps(json).encode()
            headers["Content-Type"] = "application/json"
        for attempt in (0, 1):
            conn = self._conns.get(base)
            fresh = conn is None
            if conn is None:
                conn = (http.client.HTTPSConnection(parts.netloc, timeout=self.timeout,
                                                    context=self._context)
                        if parts.scheme == "https" else
                        http.client.HTTPConnection(parts.netloc, timeout=self.timeout))
                try:
                    conn.connect()
                except OSError as exc:
                    raise _NotSent(str(exc), _permanent(exc)) from None
                self._conns[base] = conn
            try:
                conn.request(method, target, body=payload, headers=headers)
                reply = conn.getresponse()
                content = reply.read()
            except (http.client.RemoteDisconnected, BrokenPipeError,
                    ConnectionResetError) as exc:
                conn.close()
                del self._conns[base]
                if fresh or attempt:
                    raise OSError(f"{type(exc).__name__}: {exc}") from None
                continue  # a kept-alive connection the server had closed: once more
            except http.client.HTTPException as exc:  # (a malformed answer)
                conn.close()
                del self._conns[base]
                raise OSError(f"{type(exc).__name__}: {exc}") from None
            if reply.getheader("connection", "").lower() == "close":
                conn.close()
                del self._conns[base]
            return _Reply(reply.status, reply.reason, reply.headers, content)
        raise AssertionError("unreachable")

    def close(self) -> None:
        for conn in self._conns.values():
            conn.close()
        self._conns.clear()


def _message(reply: httpx.Response | _Reply) -> str:
    try:
        body = reply.json()
    except ValueError:
        return reply.text.strip()[:200]
    if isinstance(body, dict):
        return str(body.get("message") or body.get("detail") or body)
    return str(body)[:200]


def _error(reply: httpx.Response | _Reply, sent: str | None = None) -> ApiError:
    # (the id the API answered with: the one sent, unless it replaced an unsafe one)
    rid = reply.headers.get(requestid.HEADER.lower()) or sent
    try:
        body = reply.json()
    except ValueError:
        body = None
    if isinstance(body, dict):
        return ApiError(reply.status_code, str(body.get("error", "error")),
                        str(body.get("message") or body.get("detail") or reply.text),
                        body.get("field"), rid)
    return ApiError(reply.status_code, "error", reply.text.strip() or reply.reason_phrase,
                    request_id=rid)


def _body(value: Any) -> Any:
    """A model (pydantic) as its JSON form; anything else as it is."""
    dump = getattr(value, "model_dump", None)
    return dump(mode="json") if callable(dump) else value


class _Resource:
    def __init__(self, client: Client) -> None:
        self.c = client


class Jobs(_Resource):
    def create(self, spec: Any, dry_run: bool = False) -> t.JobAck:
        """Store a new job (a ``JobSpec`` or its JSON form); the same spec again is
        a no-op (``created`` false)."""
        return cast(t.JobAck, self.c.post("/v1/jobs", _body(spec),
                                          dry_run="true" if dry_run else None))

    def update(self, spec: Any, dry_run: bool = False) -> t.JobAck:
        name = _body(spec)["name"]
        return cast(t.JobAck, self.c.put(f"/v1/jobs/{name}", _body(spec),
                                         dry_run="true" if dry_run else None))

    def get(self, name: str) -> t.JobView:
        return cast(t.JobView, self.c.get(f"/v1/jobs/{name}"))

    def iter(self, entitlement: str | None = None, state: str | None = None,
             page: int = PAGE) -> Iterator[t.JobView]:
        """The jobs the caller may see, by name, read ``page`` at a time; filtered
        on the server by ``entitlement`` and ``state`` (a status of
        ``plait.client.status.JOB_STATES``, or several comma-separated)."""
        for found in self.c.pages("/v1/jobs", "jobs", page, entitlement=entitlement,
                                  state=state):
            yield from cast(builtins.list[t.JobView], found)

    def list(self, entitlement: str | None = None,
             state: str | None = None) -> builtins.list[t.JobView]:
        return builtins.list(self.iter(entitlement, state))

    def tasks(self, name: str, state: str | None = None) -> builtins.list[t.TaskView]:
        """The job's tasks by index (``state``: of those states only)."""
        return [task for found in self.c.pages(f"/v1/jobs/{name}/tasks", "tasks", PAGE,
                                               state=state)
                for task in cast(builtins.list[t.TaskView], found)]

    def history(self, name: str) -> t.JobHistory:
        return cast(t.JobHistory, self.c.get(f"/v1/jobs/{name}/history"))

    def version(self, name: str, version: int) -> dict[str, Any]:
        return cast(dict[str, Any], self.c.get(f"/v1/jobs/{name}/versions/{version}"))

    def resize(self, name: str, task_count: int) -> t.JobAck:
        return cast(t.JobAck, self.c.post(f"/v1/jobs/{name}/resize",
                                          {"task_count": task_count}))

    def restart(self, name: str, index: int | None = None) -> t.JobAck:
        return cast(t.JobAck, self.c.post(f"/v1/jobs/{name}/restart",
                                          None if index is None else {"index": index}))

    def rollback(self, name: str, version: int) -> t.JobAck:
        return cast(t.JobAck, self.c.post(f"/v1/jobs/{name}/rollback", {"version": version}))

    def move(self, name: str, entitlement: str) -> t.JobAck:
        return cast(t.JobAck, self.c.post(f"/v1/jobs/{name}/move",
                                          {"entitlement": entitlement}))

    def resume(self, name: str) -> t.JobAck:
        return cast(t.JobAck, self.c.post(f"/v1/jobs/{name}/resume"))

    def delete(self, name: str) -> t.JobAck:
        return cast(t.JobAck, self.c.delete(f"/v1/jobs/{name}"))

    def controller_key(self, name: str) -> str:
        """The key the job's TaskController verifies plait's calls with."""
        return str(self.c.get(f"/v1/jobs/{name}/controller-key")["key"])

    def logs(self, name: str, index: int, after: int = 0,
             limit: int | None = None) -> dict[str, Any]:
        return cast(dict[str, Any], self.c.get(f"/v1/jobs/{name}/tasks/{index}/logs",
                                               after=after, limit=limit))


class Entitlements(_Resource):
    def create(self, entitlement: Any) -> t.EntitlementView:
        return cast(t.EntitlementView, self.c.post("/v1/entitlements", _body(entitlement)))

    def get(self, name: str) -> t.EntitlementView:
        return cast(t.EntitlementView, self.c.get(f"/v1/entitlements/{name}"))

    def delete(self, name: str) -> t.EntitlementView:
        """Delete an entitlement no job uses (admin): its machines go back to the free
        pool (``released``); an ``ApiError`` (409) names the jobs that use it."""
        return cast(t.EntitlementView, self.c.delete(f"/v1/entitlements/{name}"))

    def list(self) -> builtins.list[t.EntitlementView]:
        return [e for found in self.c.pages("/v1/entitlements", "entitlements")
                for e in cast(builtins.list[t.EntitlementView], found)]


class Machines(_Resource):
    def list(self, state: str | None = None, entitlement: str | None = None,
             limit: int | None = None, offset: int | None = None) -> t.MachineList:
        return cast(t.MachineList, self.c.get("/v1/machines", state=state,
                                              entitlement=entitlement, limit=limit,
                                              offset=offset))

    def iter(self, state: str | None = None, entitlement: str | None = None,
             page: int = 1000) -> Iterator[t.MachineView]:
        """Every machine that passes the filters, in the region's order, ``page`` at
        a time (at most 1000)."""
        for found in self.c.pages("/v1/machines", "machines", page, state=state,
                                  entitlement=entitlement):
            yield from cast(builtins.list[t.MachineView], found)

    def get(self, machine: str) -> dict[str, Any]:
        return cast(dict[str, Any], self.c.get(f"/v1/machines/{machine}"))

    def _op(self, machine: str, op: str, body: Any = None) -> dict[str, Any]:
        return cast(dict[str, Any], self.c.post(f"/v1/machines/{machine}/{op}", body))

    def fail(self, machine: str) -> dict[str, Any]:
        return self._op(machine, "fail")

    def repair(self, machine: str) -> dict[str, Any]:
        return self._op(machine, "repair")

    def cordon(self, machine: str) -> dict[str, Any]:
        return self._op(machine, "cordon")

    def uncordon(self, machine: str) -> dict[str, Any]:
        return self._op(machine, "uncordon")

    def drain(self, machine: str, deadline_seconds: float | None = None) -> dict[str, Any]:
        return self._op(machine, "drain", None if deadline_seconds is None else {
            "deadline_seconds": deadline_seconds})


class MaintenanceApi(_Resource):
    def schedule(self, machines: builtins.list[str], start: float | str,
                 duration_seconds: float, reason: str | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"machines": machines, "start": start,
                                "duration_seconds": duration_seconds}
        if reason:
            body["reason"] = reason
        return cast(dict[str, Any], self.c.post("/v1/maintenance", body))

    def list(self) -> builtins.list[dict[str, Any]]:
        return cast(builtins.list[dict[str, Any]], self.c.get("/v1/maintenance")["events"])

    def cancel(self, event: str) -> t.MaintenanceCancelled:
        """Cancel a maintenance not started yet (``state`` cancelled: its notices are
        withdrawn, its machines' cordons lifted), or end one under way (ended)."""
        return cast(t.MaintenanceCancelled, self.c.delete(f"/v1/maintenance/{event}"))


class Tokens(_Resource):
    def create(self, role: str, name: str, description: str | None = None) -> dict[str, Any]:
        body = {"role": role, "name": name, **({"description": description}
                                              if description else {})}
        return cast(dict[str, Any], self.c.post("/v1/tokens", body))

    def list(self) -> builtins.list[dict[str, Any]]:
        return [info for found in self.c.pages("/v1/tokens", "tokens")
                for info in cast(builtins.list[dict[str, Any]], found)]

    def revoke(self, token_id: str) -> dict[str, Any]:
        return cast(dict[str, Any], self.c.delete(f"/v1/tokens/{token_id}"))

    def rotate(self, token_id: str) -> dict[str, Any]:
        return cast(dict[str, Any], self.c.post(f"/v1/tokens/{token_id}/rotate"))


class Events(_Resource):
    def page(self, after: int = 0, limit: int = 100, **filters: Any) -> t.EventPage:
        return cast(t.EventPage, self.c.get("/v1/events", after=after, limit=limit,
                                            **filters))

    def all(self, **filters: Any) -> Iterator[t.EventView]:
        """Every event matching the filters, page by page."""
        after = 0
        while True:
            page = self.page(after=after, limit=1000, **filters)
            yield from page["events"]
            if page["next"] is None:
                return
            after = page["next"]


def from_config(context: str | None = None, url: str | None = None,
                token: str | None = None, **options: Any) -> Client:
    """A client for a context of the client configuration (``plait context``), or
    PLAIT_URL/PLAIT_TOKEN/PLAIT_CA_FILE; ``url`` may list several, comma-separated."""
    from plait.clientconfig import ClientConfig

    ctx = ClientConfig.load().resolve(context, url, token)
    return Client(ctx.urls, ctx.token, ctx.ca_file, **options)
