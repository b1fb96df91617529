"""The Shard Manager service (shell): owns each sharded application's shard map,
calls ``add_shard``/``drop_shard`` on its tasks, publishes the map, and is the
application's TaskController for plait.

```
  task (client library) --register/heartbeat--> POST /v1/apps/A/tasks
  reconcile (a thread, every 0.5 s and after every change), per application:
     layout = assign(shards, replication, registered tasks but evacuated ones)  (pure)
              then rebalance (at most REBALANCE_MOVES replicas a round)
     adds:  a replica the layout wants and no task serves yet -> POST task/sm/add
            (peers: the shard's ready replicas), ready once it answers
     drops: a replica the layout no longer wants -> POST task/sm/drop, only once every
            replica the layout wants for that shard is ready (add first, drop second)
  plait's scheduler --signed TaskControlRequest--> POST /v1/apps/A/taskcontrol
     tasks it reports unhealthy lose their ready replicas (a restarted task starts
     empty and is loaded again when it registers anew); ShardController (pure)
     answers from the ready map; the tasks it wants emptied are left out of the layout
  clients --> GET /v1/apps/A/map?after=G&wait=S   (long poll: ready replicas per shard)
```

Two processes of one task index (plait replaced a task whose machine failed or was
cut off, and the first runs on, an orphan) both register: the one that started later
is plait's, and the other's registrations are refused (409) from then on, so the
published map never flips between them (``register``).

Who may do what (``credentials``): the service's token defines applications and
reads their state; an application's tasks sign their registrations with a key of
their own process, derived from the task's own credential (``PLAIT_TASK_CREDENTIAL``,
which Shard Manager derives from the job's controller key; an application without
one: from the application's task secret), never sent, and Shard Manager signs its
calls to them with the same key; its clients read the map with a read-only token.
A registration names an index under the job's task count (``AppSpec.tasks``), its
own endpoint when the application has a controller key (the one its credential is
bound to: the host:port plait's discovery has for it, its ``PLAIT_TASK_ENDPOINT``), an
endpoint the address policy allows (``--task-networks``;
never a cloud metadata address, nor this service), and a start time no later than
``START_SKEW`` past this clock. The TaskControl route needs plait's signature with
the job's controller key (``plait job controller-key JOB``), given when the
application is defined, within ``TASKCONTROL_TOLERANCE`` of this clock, and a
sequence number greater than the last one accepted (a replay is refused).

Each application has a lock of its own (one application's layout never holds up
another's map), and its map is serialized once a generation, off the event loop. An
application holds at most ``MAX_REPLICAS`` replicas (shards x replication), and has
at most ``CALLS_PER_APP`` calls under way or queued. Calls to tasks are made off the
locks, each within ``CALL_TIMEOUT`` and ``CALL_BYTES``, and
applied as each answers; a task that does not answer is called again after a
backoff (doubling to ``BACKOFF_CAP``), and its failures are logged at most once per
``LOG_EVERY``.

The maps are saved to ``DATA_DIR/shardmanager.json`` (written whole, mode 0600, then
renamed) at most once a second, and the acked operations to ``in-flight.json``
before plait hears of them, so a restarted service goes on with the replicas its
tasks hold and still counts the tasks it let go as going down. Generations are
reserved ``GENERATION_BLOCK`` at a time in ``generations.json`` before they are
published, and an application's generation starts at least at the clock in
milliseconds: a restarted service never publishes a map older than one a client
holds. A restored task's replicas are published only once it confirms them (asked
at once with ``GET /sm/shards``, or at its next registration).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import json
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Annotated, Any

import pydantic
from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response

from plait import logconfig
from plait.errors import ValidationError
from plait.model.policy import Name
from plait.shardmanager import credentials
from plait.shardmanager.apps import (
    BACKOFF_CAP,
    EVERY,
    GENERATION_BLOCK,
    LOG_EVERY,
    MAX_REGISTRATION,
    MAX_REPLICAS,
    MAX_SHARDS,
    MAX_TASKCONTROL,
    TASKCONTROL_TOLERANCE,
    App,
    AppSpec,
    Registration,
    app_token,
    failed,
    going_down,
    map_of,
    plan,
    view_of,
)
from plait.shardmanager.controller import ShardController, ShardView
from plait.shardmanager.credentials import read_token, task_secret
from plait.shardmanager.registration import Registrar
from plait.shardmanager.statefile import StateFile
from plait.shardmanager.taskcalls import TaskCaller
from plait.taskcontrol.protocol import (
    op_to_wire,
    request_from_wire,
    response_to_wire,
)
from plait.taskcontrol.signing import JOB_HEADER, SIGNATURE_HEADER, verify
from plait.taskcontrol.urlpolicy import EVERYWHERE, LOOPBACK, UrlPolicy, networks, own_addresses

log = logconfig.get("plait.shardmanager")

__all__ = ["BACKOFF_CAP", "LOG_EVERY", "MAX_REPLICAS", "AppSpec", "Registration", "ShardManager",
           "app_token", "create_app", "serve"]

class ShardManager:
    def __init__(self, token: str, data_dir: str | Path | None = None,
                 clock: Callable[[], float] = time.time,
                 task_networks: Sequence[str] | None = None) -> None:
        self.token = token
        self.clock = clock
        self.apps: dict[str, App] = {}
        #: held to add or replace an application (before any application's lock)
        self.lock = threading.RLock()
        self.files = StateFile(None if data_dir is None else Path(data_dir) / "shardmanager.json")
        #: where task endpoints may be (``start`` adds loopback on a loopback host)
        self.task_networks = None if task_networks is None else networks(task_networks)
        self.caller = TaskCaller(token, UrlPolicy(self.task_networks or EVERYWHERE), clock)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(max_workers=16, thread_name_prefix="sm-call")
        self.registrar = Registrar(token, clock, self.apps, self.hold, self._changed,
                                   self.caller, self.files)
        self._thread: threading.Thread | None = None
        #: the server's event loop (set at its first watch) and the event watchers wait on
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tick = asyncio.Event()
        self.server: Any = None
        self.url = ""
        self._load()

    # -- applications ------------------------------------------------------------------------
    def _make(self, name: str, spec: AppSpec) -> App:
        app: App

        def view() -> ShardView:
            return app.view()
        app = App(name, spec, spec.names(), ShardController(
            view, max_down=spec.max_down, short_maintenance=spec.short_maintenance_seconds))
        # (at least the clock in milliseconds: a service that lost its data dir still
        # publishes maps newer than those of its previous run)
        app.generation = int(self.clock() * 1000)
        return app

    def define(self, name: str, spec: AppSpec) -> App:
        with self.lock:
            app = self.apps.get(name)
            if app is not None and app.spec.job != spec.job:
                raise ValidationError("job", f"application {name} serves job "
                                             f"{app.spec.job}; its job does not change")
            if app is None:
                app = self._make(name, spec)
                with app.lock:
                    self.apps[name] = app
                    self._changed(app)
                return app
            old = app
            with old.lock:
                app = self._make(name, spec)
                app.lock = old.lock
                app.tasks, app.layout, app.load = old.tasks, old.layout, old.load
                app.superseded, app.reserved = old.superseded, old.reserved
                app.restored = old.restored
                app.ready = {s: ts for s, ts in old.ready.items() if s in app.shard_set}
                app.generation = max(old.generation, app.generation)
                if spec.controller_key == old.spec.controller_key:
                    app.sequence = old.sequence  # (a new key: a new job, numbered anew)
                app.controller.in_flight = old.controller.in_flight
                app.controller.evacuate = old.controller.evacuate
                app.in_flight_wire = old.in_flight_wire
                self.apps[name] = app
                self._changed(app)
        return app

    def app(self, name: str) -> App:
        app = self.apps.get(name)
        if app is None:
            raise HTTPException(404, f"application {name!r} not found")
        return app

    @contextlib.contextmanager
    def hold(self, name: str) -> Iterator[App]:
        """The application, under its lock (the one current once the lock is held: a
        define may replace it meanwhile)."""
        while True:
            app = self.app(name)
            with app.lock:
                if self.apps.get(name) is app:
                    yield app
                    return

    def register_signed(self, name: str, body: bytes, signature: str | None) -> dict[str, Any]:
        """A registration as sent (``Registrar.register_signed``)."""
        return self.registrar.register_signed(name, body, signature)

    def register(self, name: str, reg: Registration, signed: int = 0, verified: bool = False,
                 controller_key: str | None = None) -> dict[str, Any]:
        return self.registrar.register(name, reg, signed, verified, controller_key)



    def taskcontrol(self, name: str, body: bytes, job: str | None,
                    signature: str | None) -> dict[str, Any]:
        with self.hold(name) as app:
            key = app.spec.controller_key
            wanted = app.spec.job
        if key is None:
            raise HTTPException(403, f"application {name} has no controller_key: it is "
                                     "not the TaskController of its job")
        if job != wanted:
            raise HTTPException(403, f"{JOB_HEADER}: this is the controller of job {wanted}")
        verify(key, signature, body, self.clock(), tolerance=TASKCONTROL_TOLERANCE)
        try:
            request = request_from_wire(json.loads(body))
        except ValueError as exc:
            raise ValidationError("body", f"not a TaskControl request: {exc}") from None
        with self.hold(name) as app:
            if app.spec.controller_key != key:
                raise HTTPException(409, f"application {name} was defined again meanwhile")
            if request.job_handle != app.spec.job:
                raise ValidationError("job_handle", f"this is the controller of job "
                                                    f"{app.spec.job}")
            if request.sequence_number <= app.sequence:
                raise ValidationError("sequence_number", f"{request.sequence_number} is not "
                                      f"past {app.sequence}, the last accepted (a replay)")
            app.sequence = request.sequence_number
            self.files.dirty = True
            changed = False
            for ref in request.all_unhealthy_tasks:
                for tasks in app.ready.values():
                    if ref.index in tasks:
                        tasks.discard(ref.index)
                        changed = True
            before = dict(app.controller.in_flight)
            response = app.controller.process(request)
            if app.controller.in_flight != before:
                # (what is acked is on disk before plait hears of it: a restarted
                # service still counts those tasks as going down)
                app.in_flight_wire = [op_to_wire(op)
                                      for op in app.controller.in_flight.values()]
                self.files.save_in_flight(self.apps)
            # a task acked away is out of the published map at once (clients stop
            # sending it requests); it is loaded again when it comes back
            acked = set(response.ack)
            for op in request.request:
                if op.op_id in acked:
                    for tasks in app.ready.values():
                        if op.task.index in tasks:
                            tasks.discard(op.task.index)
                            changed = True
            if changed or app.controller.evacuate:
                self._changed(app)
        return response_to_wire(response)

    async def watch(self, name: str, after: int, wait: float) -> bytes:
        """``map_view`` (as JSON) once the application's generation is past ``after``,
        or after ``wait`` seconds: a watcher holds no thread while it waits (woken by
        ``_changed`` through the event loop)."""
        deadline = time.monotonic() + wait
        while True:  # (no lock on the event loop: plain reads of two attributes)
            tick = self._tick
            if self.app(name).generation > after or self._stop.is_set():
                break
            left = deadline - time.monotonic()
            if left <= 0:
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(tick.wait(), left)
        from starlette.concurrency import run_in_threadpool

        # (the map is built under the application's lock and serialized there, once a
        # generation: never on the event loop, which every request goes through)
        return await run_in_threadpool(self.map_json, name)

    def map_json(self, name: str) -> bytes:
        with self.hold(name) as app:
            cached = app.map_cache
            if cached is None or cached[0] != app.generation:
                cached = app.map_cache = (app.generation, json.dumps(
                    map_of(app), separators=(",", ":")).encode())
            return cached[1]

    def map_view(self, name: str) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self.map_json(name))
        return data


    def app_view(self, name: str) -> dict[str, Any]:
        with self.hold(name) as app:
            return view_of(app)

    def set_load(self, name: str, load: dict[str, float]) -> dict[str, Any]:
        with self.hold(name) as app:
            known = app.shard_set
            bad = [s for s in load if s not in known]
            if bad:
                raise ValidationError("load", f"no shard {bad[0]!r} in application {name}")
            app.load.update(load)
            self._changed(app)
            return {"app": name, "shards": len(load)}

    def _changed(self, app: App) -> None:
        """(Under the app's lock.) A new generation: reserved on disk first."""
        app.generation += 1
        if app.generation > app.reserved:
            app.reserved = app.generation + GENERATION_BLOCK
            self.files.save_generations(self.apps)
        self.files.dirty = True
        self._wake.set()
        if self._loop is not None:  # (the watchers wait on the server's event loop)
            with contextlib.suppress(RuntimeError):  # (a loop that has closed)
                self._loop.call_soon_threadsafe(self._ring, self._tick)

    def _ring(self, tick: asyncio.Event) -> None:
        """(On the event loop, where watchers read ``_tick``.) Wake every watcher; the
        next ones wait on a new event."""
        if self._tick is tick:
            self._tick = asyncio.Event()
        tick.set()

    # -- the reconciler ---------------------------------------------------------------------
    def reconcile(self) -> None:
        """One round over every application: lay it out, then start its adds and drops
        (each applied when its task answers: a round never waits for a slow task)."""
        calls: list[tuple[str, str, int, str, list[str]]] = []
        for name in list(self.apps):
            with self.hold(name) as app:
                calls += self._plan(app, self.clock())
        for call in calls:
            self._pool.submit(self._call, *call).add_done_callback(
                functools.partial(self._answered, call))
        self._save()

    def _answered(self, call: tuple[str, str, int, str, list[str]],
                  fut: Future[tuple[bool, str, Any]]) -> None:
        name, shard, task, op, _ = call
        try:
            ok, incarnation, said = fut.result()
        except Exception as exc:  # (never left busy: the next round tries again)
            ok, incarnation, said = False, "", f"{type(exc).__name__}: {exc}"
        app = self.apps.get(name)
        if app is None:
            return
        with self.hold(name) as app:
            app.busy.discard((shard, task))
            info = app.tasks.get(task)
            if info is None:
                return
            now = self.clock()
            if not ok:
                failed(app, task, info, op, shard, str(said), now)
                return
            if info.failures:
                log.info("task answers again", app=name, task=task, failures=info.failures)
            info.failures, info.next_try, info.quiet = 0, 0.0, 0
            if info.incarnation != incarnation:
                return  # (answered by a process that has been replaced)
            if op == "probe":
                if task in app.restored:
                    shards = said.get("shards") if isinstance(said, dict) else None
                    self.registrar.confirm(
                        app, task, [s for s in shards or () if isinstance(s, str)])
                return
            if op == "add":
                if task in going_down(app):
                    return  # (acked away meanwhile: it is going down)
                app.ready.setdefault(shard, set()).add(task)
            else:
                app.ready.get(shard, set()).discard(task)
            self._changed(app)



    def _plan(self, app: App, now: float) -> list[tuple[str, str, int, str, list[str]]]:
        """(Under the app's lock.) The layout, and the adds and drops it asks for
        (``apps.plan``)."""
        return plan(app, now, self._changed)



    def _call(self, name: str, shard: str, task: int, op: str,
              peers: list[str]) -> tuple[bool, str, Any]:
        """One call to a task (``TaskCaller.call``), off the locks."""
        return self.caller.call(self.apps.get(name), shard, task, op, peers)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(EVERY)
            self._wake.clear()
            try:
                self.reconcile()
            except Exception as exc:  # (a round that failed is tried again)
                log.warning("reconcile failed", error=f"{type(exc).__name__}: {exc}")

    # -- the saved maps ---------------------------------------------------------------------
    def _save(self, force: bool = False) -> None:
        self.files.save(self.apps, self.hold, force)



    def _load(self) -> None:
        for app in self.files.read(self._make, self.clock()):
            self.apps[app.name] = app
        for app in self.apps.values():
            with app.lock:
                self._changed(app)

    # -- serving ----------------------------------------------------------------------------
    def start(self, host: str = "127.0.0.1", port: int = 0) -> ShardManager:
        from plait.server.serve import AsgiServer

        self.server = AsgiServer(create_app(self), host=host, port=port).start()
        self.url = self.server.url
        allow = self.task_networks
        if allow is None:  # (a service on loopback calls tasks on its own host)
            literal = self.caller.policy.literal(host)
            allow = (*EVERYWHERE, *(LOOPBACK if host == "localhost" or (
                literal is not None and (literal.is_loopback or literal.is_unspecified))
                else ()))
        self.caller.policy = UrlPolicy(allow, own_addresses([self.url]))
        self._thread = threading.Thread(target=self._run, name="sm-reconcile", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._loop is not None:
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._ring, self._tick)
        if self.server is not None:
            self.server.stop()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._save(force=True)
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.caller.http.close()


async def _body(request: Request, limit: int, what: str) -> bytes:
    """The request's body, at most ``limit`` bytes (413 past it)."""
    if int(request.headers.get("Content-Length") or 0) > limit:
        raise HTTPException(413, f"{what} is at most {limit} B")
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise HTTPException(413, f"{what} is at most {limit} B")
    return body


def create_app(sm: ShardManager) -> FastAPI:
    api = FastAPI(title="plait Shard Manager", version="1")

    def authorized(request: Request) -> None:
        given = request.headers.get("Authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {sm.token}".encode()):
            raise HTTPException(401, "a valid token is required (Authorization: Bearer ...)")

    auth = [Depends(authorized)]

    def reader(request: Request, app: str) -> None:
        """The service's token, or the application's read token (``read_token``)."""
        given = request.headers.get("Authorization", "").encode()
        if not (hmac.compare_digest(given, f"Bearer {sm.token}".encode())
                or hmac.compare_digest(given, f"Bearer {read_token(sm.token, app)}".encode())):
            raise HTTPException(401, f"the service's token or application {app}'s read "
                                     "token (plait shardmanager token APP --reader) is "
                                     "required (Authorization: Bearer ...)")

    @api.exception_handler(ValidationError)
    def _invalid(request: Request, exc: ValidationError) -> JSONResponse:
        return JSONResponse({"error": str(exc)}, status_code=422)

    @api.exception_handler(RequestValidationError)
    def _malformed(request: Request, exc: RequestValidationError) -> JSONResponse:
        # FastAPI's own answer echoes each refused value, and one that is not JSON
        # (NaN, 1e400) made it a 500: where and why, without the value
        return JSONResponse({"detail": [
            {"loc": list(e.get("loc", ())), "msg": str(e.get("msg", "invalid")),
             "type": str(e.get("type", ""))} for e in exc.errors()[:20]]}, status_code=422)

    @api.get("/healthz")
    def healthz() -> dict[str, Any]:
        return {"ok": True, "apps": len(sm.apps)}

    @api.put("/v1/apps/{app}", dependencies=auth)
    def put_app(app: Name, spec: AppSpec) -> dict[str, Any]:
        sm.define(app, spec)
        return sm.app_view(app)

    @api.get("/v1/apps/{app}", dependencies=auth)
    def get_app(app: str) -> dict[str, Any]:
        return sm.app_view(app)

    @api.get("/v1/apps/{app}/map", dependencies=[Depends(reader)])
    async def get_map(app: str, after: int = -1,
                      wait: Annotated[float, Query(ge=0, le=60)] = 0.0) -> Response:
        if sm._loop is None:
            sm._loop = asyncio.get_running_loop()
        return Response(await sm.watch(app, after, wait), media_type="application/json")

    @api.get("/v1/apps/{app}/token", dependencies=auth)
    def get_token(app: str) -> dict[str, Any]:
        """The application's task secret (``PLAIT_SM_TOKEN`` of its tasks) and its read
        token (its clients')."""
        sm.app(app)
        return {"app": app, "token": task_secret(sm.token, app),
                "read_token": read_token(sm.token, app)}

    @api.post("/v1/apps/{app}/tasks")
    async def register(app: str, request: Request) -> dict[str, Any]:
        body = await _body(request, MAX_REGISTRATION, "a registration")
        from starlette.concurrency import run_in_threadpool

        result: dict[str, Any] = await run_in_threadpool(
            sm.register_signed, app, body,
            request.headers.get(credentials.SIGNATURE_HEADER))
        return result

    @api.post("/v1/apps/{app}/load", dependencies=auth)
    def load(app: str, body: dict[str, Annotated[float, pydantic.Field(ge=0, le=1e9)]]
             ) -> dict[str, Any]:
        if len(body) > MAX_SHARDS:
            raise ValidationError("load", f"at most {MAX_SHARDS} shards")
        return sm.set_load(app, body)

    @api.post("/v1/apps/{app}/taskcontrol")
    async def taskcontrol(app: str, request: Request) -> dict[str, Any]:
        body = await _body(request, MAX_TASKCONTROL, "a TaskControl request")
        from starlette.concurrency import run_in_threadpool

        try:
            result: dict[str, Any] = await run_in_threadpool(
                sm.taskcontrol, app, body, request.headers.get(JOB_HEADER),
                request.headers.get(SIGNATURE_HEADER))
        except ValidationError as exc:
            status = 401 if exc.field == SIGNATURE_HEADER else 422
            raise HTTPException(status, str(exc)) from None
        return result

    return api


def serve(token: str, host: str, port: int, data_dir: str | None,
          task_networks: Sequence[str] | None = None) -> None:
    """``plait shardmanager serve``: until SIGINT or SIGTERM (handled explicitly: a
    background job of a non-interactive shell starts with SIGINT ignored), then a clean
    stop (the maps saved)."""
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    sm = ShardManager(token, data_dir, task_networks=task_networks).start(host, port)
    print(f"plait Shard Manager on {sm.url}", flush=True)
    try:
        while not stop.wait(3600):
            pass
    finally:
        sm.stop()
        log.info("stopped")
