"""The hot paths (``fastcreate.FastCreate``): a plain create, the front end's batch of
creates, and an agent's report, answered without FastAPI's routing.

Each calls the functions its route calls (the gate's token check and owner rule,
``jobs.store_create``, ``agents.take_report``) and answers only what they take. A
request that is not plain (a token not cached, a body the model refuses, another
owner's entitlement) or that the control plane refuses (a ``PlaitError``: nothing
was stored) goes to the route, which answers it word for word and records the
refusal; any other exception propagates, as it would from the route.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import threading
from typing import Annotated, Any

import pydantic
from fastapi import Depends, Request, Response
from starlette.types import Scope

from plait import fastjson, requestid
from plait.api.agents import acts_for, take_report
from plait.api.auth import Gate, User
from plait.api.common import ack, resource
from plait.api.errors import error_bytes
from plait.api.jobs import store_create
from plait.errors import PlaitError
from plait.frontend import batch
from plait.frontend.batch import headers_once, plain_headers
from plait.model import JobSpec
from plait.model.agentwire import Report
from plait.server.auth import Principal, Role
from plait.server.controlplane.facade import PlaneApi

JSON = b"application/json"


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


def _prepare_as(api: PlaneApi, rid: str, who: Principal, spec: JobSpec) -> Any:
    requestid.current.set(rid)
    requestid.actor.set(str(who))
    return api.prepare_create(spec)


class FastPaths:
    """The hot paths over one control plane, checked by its gate."""

    def __init__(self, api: PlaneApi, gate: Gate) -> None:
        self.api, self.gate = api, gate

    def user(self, authorization: bytes | None) -> Principal | None:
        """A cached admin's or owner's token (None: the route's to check)."""
        who = self.gate.cached(authorization)
        return who if who is not None and who.role in (Role.ADMIN, Role.OWNER) else None

    def plain(self, who: Principal | None, body: bytes,
              controller: bool = True) -> JobSpec | None:
        """The spec of a plain create by ``who``: a JSON spec the model takes (with a
        TaskController only if ``controller``), of an entitlement the caller may use;
        None for anything else (the route's to answer)."""
        if who is None:
            return None
        try:
            spec = JobSpec.model_validate(fastjson.loads(body))
        except ValueError:  # (not JSON, or not a spec: the route's 422 names the field)
            return None
        if (spec.task_controller is not None and not controller) or not self.gate.owns(
                who, spec.entitlement):
            return None
        return spec

    async def create(self, scope: Scope, body: bytes) -> tuple[int, bytes] | None:
        """``POST /v1/jobs`` for a plain create: the status and JSON body of its answer,
        or None for the route to answer."""
        given = plain_headers(scope)
        who = None if given is None else self.user(given[0])
        spec = self.plain(who, body)
        if spec is None:
            return None
        assert who is not None
        self.gate.adopt(scope, who)
        try:
            answer, created = await store_create(self.api, self.gate, who, spec)
        except PlaitError:  # (refused, nothing stored: the route answers it, and why)
            return None
        return (201 if created else 200), fastjson.dumps(answer)

    async def batch(self, scope: Scope, body: bytes) -> tuple[int, bytes, bytes] | None:
        """``POST /v1/shard/creates`` (``plait.frontend.batch``) from a request whose own
        token (given once) is a cached owner's or admin's, as the front end sends it;
        None for anything else, which the route (``shard_creates``) answers, refusing a
        token as every route does. The answer: (status, body, content type)."""
        given = headers_once(scope)
        who = None if given is None else self.user(given[0])
        if who is None:
            return None
        assert given is not None
        scope.setdefault("state", {})["principal"] = who
        return await self.answer_batch(given[1] or b"", body)

    async def answer_batch(self, content_type: bytes, body: bytes
                           ) -> tuple[int, bytes, bytes]:
        """The front end's creates for this shard, each checked as ``create`` checks it,
        under its own token and request id, and stored together (group commit); the
        request's own token was checked by the caller. A create not answered here
        (status 0) the front end sends alone, for the route's answer."""
        if content_type != batch.CONTENT_TYPE.encode():
            return 415, error_bytes("invalid", f"a batch of creates is sent as "
                                               f"{batch.CONTENT_TYPE}"), JSON
        try:
            items = batch.decode(body)
        except batch.BadBatch as exc:
            return 422, error_bytes("invalid", f"batch of creates: {exc}"), JSON
        futures: list[concurrent.futures.Future[Any] | None] = []
        prepared: list[Any] = []
        for item in items:
            who = self.user(item.authorization.encode("latin-1", "replace"))
            # (a TaskController's URL is resolved on a thread: such a create goes alone)
            spec = self.plain(who, item.body, controller=False)
            if who is None or spec is None:
                futures.append(None)
                continue
            try:  # (each in its own context: its id and caller, in its record and log)
                pending = contextvars.copy_context().run(
                    _prepare_as, self.api, requestid.accept(item.request_id), who, spec)
            except PlaitError:  # (refused: sent alone, for the route's answer)
                futures.append(None)
                continue
            prepared.append(pending)
            futures.append(pending.answer)
        # one transaction for the batch: here, when it would wait for nothing else
        if not self.api.commit_creates(prepared):
            await all_done([f for f in futures if f is not None])
        answers = [None if f is None else self.acked(f) for f in futures]
        return 200, batch.encode_answers(answers), batch.CONTENT_TYPE.encode()

    @staticmethod
    def acked(done: concurrent.futures.Future[Any]) -> tuple[int, bytes] | None:
        """A stored create's answer; None for one refused (sent alone, for the route's
        answer). Any other failure is raised."""
        failed = done.exception()
        if isinstance(failed, PlaitError):
            return None
        if failed is not None:
            raise failed
        doc, created = done.result()
        return (201 if created else 200), fastjson.dumps(ack(doc, created))

    async def report(self, scope: Scope, machine: str, body: bytes
                     ) -> tuple[int, bytes] | None:
        """``POST /v1/machines/{machine}/status`` for an agent's plain report: a cached
        credential of this machine (or an admin's), a body the ``Report`` model takes;
        None for anything else, and for a report the control plane refuses (an unknown
        machine, another shard's): the route answers it."""
        given = plain_headers(scope)
        who = None if given is None else self.gate.cached(given[0])
        if who is None or not acts_for(who, machine):
            return None
        try:
            report = Report.model_validate_json(body)
        except pydantic.ValidationError:  # (the route's 422 names the field)
            return None
        self.gate.adopt(scope, who)
        try:
            return 200, fastjson.dumps(take_report(self.api, machine, report))
        except PlaitError:
            return None


router = resource()


async def fast_paths(request: Request) -> FastPaths:
    found: FastPaths = request.app.state.fastpaths
    return found


@router.post(batch.PATH, include_in_schema=False)
async def shard_creates(who: User, request: Request,
                        paths: Annotated[FastPaths, Depends(fast_paths)]) -> Response:
    """A batch of creates the hot path did not take (``FastPaths.batch``): its token
    checked as every route checks one (an owner's or admin's, like the creates it
    carries), then answered the same way."""
    status, payload, content_type = await paths.answer_batch(
        request.headers.get("content-type", "").encode("latin-1"), await request.body())
    return Response(payload, status_code=status, media_type=content_type.decode())
