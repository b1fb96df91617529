"""Single-job creates carried to their shard in batches (``plait.frontend.batch``)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from starlette.types import Scope

from plait import requestid
from plait.frontend import batch
from plait.frontend.batch import plain_headers
from plait.frontend.replies import Refused
from plait.frontend.shardmap import Front


class Creates:
    """Single-job creates carried to their shard in batches (``plait.frontend.batch``).

    A create waits in its shard's queue. A batch leaves with every create queued then:
    at once when none of the shard's batches is on its way (so a quiet front end sends
    each create at once, and under load the batches grow: no timer, no added wait);
    while one is, only once ``more_at`` creates wait, and never more than ``in_flight``
    on their way. A batch costs the shard about as much CPU as four of its creates (the
    request, its commit: ``plait bench createcost``), so a second batch on its way is
    worth its cost only once it is that large; with 8 callers, a second batch of any
    size made batches of 2.4 and cost the shard more CPU per create than it saved in
    waiting, and waiting for four of them raised ``plait bench throughput --frontend``
    by about a tenth over one batch at a time. Each create is answered from its part
    of the batch's answer; a create the batch path does not answer (a refusal, an
    error, a token the shard has not cached) goes to the shard alone and gets the
    route's own answer. A batch the shard could not be asked fails each of its creates
    as a create sent alone would have (503 with a Retry-After)."""

    def __init__(self, router: Front, in_flight: int = 2, more_at: int = 4) -> None:
        self.router = router
        self.in_flight, self.more_at = in_flight, more_at
        self._queues: dict[int, list[tuple[batch.Item, asyncio.Future[Any]]]] = {}
        self._sending: dict[int, int] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        #: batches sent, and creates in them (read by the tests)
        self.batches = 0
        self.carried = 0

    async def create(self, shard: int, scope: Scope, body: bytes) -> Any:
        given = plain_headers(scope)  # (a repeated header or another JSON type: alone)
        if given is None or len(body) > batch.MAX_ITEM or scope.get("query_string"):
            return await self.router.to_shard(shard, scope, body)
        auth = given[0]
        rid = requestid.current.get() or requestid.new()
        waiting: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._queues.setdefault(shard, []).append(
            (batch.Item(auth.decode("latin-1"), rid, body), waiting))
        self._kick(shard)
        got = await waiting
        if got is None:  # (the route's own answer)
            return await self.router.to_shard(shard, scope, body)
        status, payload = got
        return status, payload, [(b"content-type", b"application/json")]

    def _kick(self, shard: int) -> None:
        queue = self._queues.get(shard)
        sending = self._sending.get(shard, 0)
        if not queue or sending >= self.in_flight or (sending and len(queue) < self.more_at):
            return
        taken, size = 0, 0
        for item, _ in queue:
            if taken and (taken >= batch.MAX_ITEMS or size + len(item.body) > batch.MAX_BYTES):
                break
            taken += 1
            size += len(item.body)
        sent, queue[:] = queue[:taken], queue[taken:]
        self._sending[shard] = self._sending.get(shard, 0) + 1
        task = asyncio.get_running_loop().create_task(self._send(shard, sent))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send(self, shard: int, sent: list[tuple[batch.Item, asyncio.Future[Any]]]
                    ) -> None:
        released = False

        def release() -> None:  # (once: this batch is no longer on its way)
            nonlocal released
            if not released:
                released = True
                self._sending[shard] -= 1
                self._kick(shard)

        try:
            items = [item for item, _ in sent]
            rid = items[0].request_id  # (the batch's: its first create's, in every log)
            scope = {"type": "http", "method": "POST", "path": batch.PATH,
                     "raw_path": batch.PATH.encode(), "query_string": b"",
                     "headers": [(b"authorization", items[0].authorization.encode("latin-1")),
                                 (b"content-type", batch.CONTENT_TYPE.encode()),
                                 (b"x-request-id", rid.encode())]}
            self.batches += 1
            self.carried += len(items)
            try:
                r = await self.router.to_shard(shard, scope, batch.encode(items))
            except Refused as exc:
                release()
                for _, waiting in sent:
                    if not waiting.done():
                        waiting.set_exception(exc)  # (its reply, for each caller)
                return
            # the next batch leaves before this one's callers are answered (each
            # answer is written to its caller's connection first otherwise)
            release()
            answers: list[tuple[int, bytes] | None] = [None] * len(sent)
            if r.status_code == 200 and r.headers.get("content-type") == batch.CONTENT_TYPE:
                # (an answer not in the form: each create alone, the route's answers)
                with contextlib.suppress(batch.BadBatch):
                    answers = batch.decode_answers(r.content, len(sent))
            for (_, waiting), got in zip(sent, answers, strict=True):
                if not waiting.done():
                    waiting.set_result(got)
        except BaseException as exc:
            for _, waiting in sent:
                if not waiting.done():
                    waiting.set_exception(exc)
            raise
        finally:
            release()

