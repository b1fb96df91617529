"""The front end of a sharded region (``plait frontend``): one API over many scheduler
shards, so users and agents see one control plane and never name a shard.

It holds no state of its own; everything it needs is in the store:

    /frontend/shards/{S}               a shard that has started (``plait serve --shard S``)
    /frontend/entitlements/{E}         {"shard": S, "machines": quota, "moving_to": S2?}
    /shards/{S}/scheduler/jobs/{J}     where a job's record is: that shard manages it
    /broker/machines/{M}               a machine's entitlement: its shard answers its agent
    /_elections/shard-{S}              each shard's leader (its API URL)

A request goes to the leader of the shard that owns what it names: an entitlement by
the map (a new one to the shard with the least quota mapped to it), a job by where
its record is, a machine by its entitlement (free machines: shard 0). Lists and the
event log are asked of every shard and merged. Tokens, agents joining and
maintenance windows are the region's and go to shard 0 (every shard reads the same
tokens and brokers' records).

Moving an entitlement between shards (``POST /v1/admin/entitlements/{E}/move``) marks
it moving in the map, so its jobs' writes get a 409 with a Retry-After; has the old
shard hand its records to the new one in one transaction (its machines' agents are
answered by the old shard until then, and by neither, with a 503, until the map
points at the new one: they keep their tasks and ask again); has the new one read
them; and points the map at the new shard. Whether a failed handoff is undone is
decided by the store: the map goes back only while the old shard still holds the
records. No task is stopped: the placements move with the
records, and the new shard's desired sets are the old one's.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import json
import time
from typing import Any

import httpx
from starlette.concurrency import run_in_threadpool
from starlette.types import Receive, Scope, Send

from plait import __version__, fastjson, paging, requestid, tracing
from plait.errors import NAME_TAKEN, Conflict, NotFound, ValidationError
from plait.frontend import batch
from plait.frontend.fastcreate import plain_headers
from plait.frontend.hop import Hop
from plait.frontend.proxy import (
    FORWARDED,
    MAX_BODY,
    answer,
    call,
    declared_too_large,
    forward_headers,
    read_body,
)
from plait.frontend.requestlog import RequestLog
from plait.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from plait.metrics import HttpMetrics, HttpOnly, api_route
from plait.model import RegionSpec, parse
from plait.model.entitlement import CANARY_NAME, NAME_RE, Quota, place_on_shard, shard_weight
from plait.server.auth import AuthError, Principal, Role, TokenStore
from plait.store.protocol import Namespace, Store
from plait.store.shard import shard_prefix
from plait.tls import verify as tls_verify
from plait.ui.app import Ui

#: seconds a shard's leader, once read, is trusted before it is read again
LEADER_TTL = 0.5
#: how long a move waits for the shards' leaders to answer
MOVE_ATTEMPTS = 20
#: a request that finds no leader (an election settling) is tried again this many
#: times, a quarter second apart
RETRIES = 4

#: agents' calls about their own machine (answered 503 while it is moving: they keep
#: their tasks and ask again)
_AGENT_PARTS = ("desired", "status", "output")


def _json(status: int, body: dict[str, Any],
          headers: list[tuple[bytes, bytes]] | None = None) -> tuple[int, bytes, list[Any]]:
    data = json.dumps(body).encode()
    return status, data, [(b"content-type", b"application/json"), *(headers or [])]


async def _send(send: Send, status: int, data: bytes, headers: list[Any]) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [*headers, (b"content-length", str(len(data)).encode())]})
    await send({"type": "http.response.body", "body": data})


def _error(status: int, kind: str, message: str, retry: bool = False,
           field: str | None = None) -> tuple[int, bytes, list[Any]]:
    body = {"error": kind, "message": message} | ({"field": field} if field else {})
    return _json(status, body, [(b"retry-after", b"1")] if retry else None)


class Refused(Exception):
    def __init__(self, status: int, kind: str, message: str, retry: bool = False,
                 field: str | None = None) -> None:
        super().__init__(message)
        self.reply = _error(status, kind, message, retry, field)


def _count(query: dict[str, str], key: str, default: int) -> int:
    """A query parameter that is a whole number >= 0 (as the shards take it), or its
    default when absent; anything else (an empty value too) is refused naming it."""
    raw = query.get(key)
    if raw is None:
        return default
    # ("¹" is a digit to isdigit; int() refuses thousands of digits, and an events
    # cursor of many shards has a few hundred at most)
    if not (raw.strip().isascii() and raw.strip().isdigit() and len(raw.strip()) <= 400):
        raise Refused(422, "invalid", f"{key}: {raw[:40]!r} is not a whole number >= 0",
                      field=key)
    return int(raw)


class ShardMap:
    """The region's shards, its entitlement-to-shard map, and where jobs and
    machines are: read from the store (blocking calls: run off the event loop)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.ns = Namespace(store, "/frontend")
        #: the region's mean machine size (milli-RRU), read at the first RRU quota
        self._machine_milli_rru: int | None = None
        self._leaders: dict[int, tuple[float, str | None]] = {}

    def shards(self) -> list[int]:
        try:
            return sorted(int(s) for s in self.ns.children("/shards") if s.isdigit())
        except NotFound:
            return []

    def leader(self, shard: int) -> str | None:
        now = time.monotonic()
        at, who = self._leaders.get(shard, (0.0, None))
        if now - at > LEADER_TTL or who is None:
            try:
                who = self.store.leader_of(f"shard-{shard}")  # type: ignore[attr-defined]
            except Exception:
                who = None
            self._leaders[shard] = (now, who)
        return who

    def cached_leader(self, shard: int) -> tuple[bool, str | None]:
        """(True, the leader) when it was read within ``LEADER_TTL`` (no store read:
        the caller need not leave the event loop), else (False, None)."""
        at, who = self._leaders.get(shard, (0.0, None))
        if who is None or time.monotonic() - at > LEADER_TTL:
            return False, None
        return True, who

    def forget(self, shard: int) -> None:
        self._leaders.pop(shard, None)

    def entry(self, entitlement: str) -> tuple[dict[str, Any], int] | None:
        if not NAME_RE.match(entitlement):
            return None  # no entitlement has such a name (shard 0 answers for it)
        try:
            value, version = self.ns.get(f"/entitlements/{entitlement}")
        except NotFound:
            return None
        return fastjson.loads(value), version

    def route(self, entitlement: str) -> tuple[dict[str, Any], int] | None:
        """``entry``, or for a canary entitlement that the map does not hold (the Job
        Control Plane makes them on a shard: decision 103) the entry of the
        entitlement it is a canary of, whose shard it lives on."""
        found = self.entry(entitlement)
        if found is None and (match := CANARY_NAME.match(entitlement)) is not None:
            found = self.entry(match.group("parent"))
        return found

    def entries(self) -> dict[str, dict[str, Any]]:
        try:
            names = self.ns.children("/entitlements")
        except NotFound:
            return {}
        found = self.ns.get_many([f"/entitlements/{n}" for n in names])
        return {k.rsplit("/", 1)[1]: json.loads(v) for k, (v, _) in found.items()}

    def weight(self, quota: Any) -> int:
        """The shard weight of an entitlement's quota (``shard_weight``: an RRU quota
        in machines of the region's mean type); 0 for a malformed quota (the shard's
        answer names the field)."""
        try:
            parsed = parse(Quota, quota)
        except ValidationError:
            return 0
        if self._machine_milli_rru is None:
            try:
                spec = parse(RegionSpec, json.loads(self.store.get("/region/spec")[0]))
                total = sum(t.weight for t in spec.types)
                self._machine_milli_rru = round(sum(
                    t.weight * t.resources.to_units()[0] for t in spec.types) / total)
            except (NotFound, ValidationError, ValueError):
                return parsed.machines or 0
        return shard_weight(parsed, self._machine_milli_rru)

    def place(self, entitlement: str, machines: int, loans: bool = False) -> dict[str, Any]:
        """The entry of ``entitlement``; a new one goes to the shard with the least
        weight (``shard_weight``) mapped to it. One that lends or borrows (``loans``)
        goes where the region's other lenders and borrowers are: loans are counted per
        scheduler shard (decision 94), so they must share one."""
        for _ in range(10):
            found = self.entry(entitlement)
            if found is not None:
                return found[0]
            shards = self.shards()
            if not shards:
                raise Refused(503, "unavailable", "no scheduler shard has started: retry",
                              retry=True)
            load = dict.fromkeys(shards, 0)
            entries = self.entries()
            for e in entries.values():
                if e["shard"] in load:
                    load[e["shard"]] += int(e.get("machines", 0))
            shard = place_on_shard(load, loans, {
                name: e["shard"] for name, e in entries.items() if e.get("loans")})
            entry = {"shard": shard, "machines": machines, **({"loans": True} if loans else {})}
            try:
                self.ns.create(f"/entitlements/{entitlement}", json.dumps(entry).encode())
                return entry
            except Conflict:
                continue  # another front end placed it meanwhile
        raise Refused(503, "unavailable", f"entitlement {entitlement!r}: could not be placed "
                                          "on a shard (contended): retry", retry=True)

    def create_target(self, entitlement: str, job: str
                      ) -> tuple[tuple[dict[str, Any], int] | None, tuple[int, str] | None]:
        """A create's two questions in one read: ``entry(entitlement)`` and
        ``job(job)``."""
        if not NAME_RE.match(entitlement) or not NAME_RE.match(job):
            return self.entry(entitlement), self.job(job)
        shards = self.shards()
        ent_key = f"/frontend/entitlements/{entitlement}"
        job_keys = {s: f"{shard_prefix(s)}/scheduler/jobs/{job}" for s in shards}
        found = self.store.get_many([ent_key, *job_keys.values()])
        entry = None
        if ent_key in found:
            value, version = found[ent_key]
            entry = fastjson.loads(value), version
        for s in shards:
            got = found.get(job_keys[s])
            if got is not None:
                return entry, (s, str(fastjson.loads(got[0])["entitlement"]))
        return entry, None

    def job(self, name: str) -> tuple[int, str] | None:
        """(shard, entitlement) of the job's record, if it is stored."""
        if not NAME_RE.match(name):
            return None
        shards = self.shards()
        found = self.store.get_many([f"{shard_prefix(s)}/scheduler/jobs/{name}"
                                     for s in shards])
        for s in shards:
            got = found.get(f"{shard_prefix(s)}/scheduler/jobs/{name}")
            if got is not None:
                return s, str(fastjson.loads(got[0])["entitlement"])
        return None

    def owner(self, entitlement: str, entry: dict[str, Any]) -> str | None:
        """The owner of ``entitlement``, as the shard its map ``entry`` names stored it
        (None: not stored there)."""
        try:
            value, _ = self.store.get(f"{shard_prefix(int(entry['shard']))}/allocator/"
                                      f"entitlements/{entitlement}")
            return str(fastjson.loads(value).get("owner"))
        except (NotFound, ValidationError, ValueError, KeyError, TypeError):
            return None

    def machine(self, machine: str) -> str | None:
        """The entitlement the machine is bound to (None: free or unknown)."""
        try:
            value, _ = self.store.get(f"/broker/machines/{machine}")
        except (NotFound, ValidationError):  # (a name that cannot be a key: unknown)
            return None
        ent = json.loads(value).get("entitlement")
        return str(ent) if ent is not None else None


def _pack(cursors: dict[int, int]) -> int:
    """Per-shard event cursors as one (each below 2**40)."""
    return sum(c << (40 * s) for s, c in cursors.items())


def _unpack(cursor: int, shards: list[int]) -> dict[int, int]:
    return {s: (cursor >> (40 * s)) & ((1 << 40) - 1) for s in shards}


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

    def __init__(self, router: ShardRouter, in_flight: int = 2, more_at: int = 4) -> None:
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


class ShardRouter:
    """The front end as a plain ASGI app."""

    def __init__(self, store: Store, identity: str = "frontend",
                 ca_file: str | None = None) -> None:
        self.store = store
        self.map = ShardMap(store)
        self.tokens = TokenStore(store)
        self.identity = identity
        self.ca_file = ca_file
        self._client: Hop | None = None
        #: creates carried to their shard in batches
        self.creates = Creates(self)
        #: the store's reads are quick and local (SQLite): the create path makes them
        #: on the event loop instead of handing them to a thread (ZooKeeper's are
        #: network round trips: handed to a thread)
        self._inline_reads = bool(getattr(store, "local_reads", False))
        #: the web UI, reading the region through this front end
        self.ui = Ui(self)
        #: the front end's own metrics: every request by route template and status
        self.metrics = HttpOnly()
        # outermost: the request's id and access line, then its span
        self._counted = RequestLog(tracing.asgi(HttpMetrics(
            self._serve, self.metrics, route=lambda scope: api_route(str(scope["path"])))),
            api="frontend")

    @property
    def client(self) -> Hop:
        if self._client is None:
            self._client = Hop(tls_verify(self.ca_file))
        return self._client

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._counted(scope, receive, send)

    async def _serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await self.ui.close()
                    if self._client is not None:
                        await self._client.aclose()
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        if Ui.serves(str(scope["path"])):
            await self.ui(scope, receive, send)
            return
        try:
            # a body is read only within the limit, and only from a caller with a valid
            # token (the shard checks what the token may do)
            if declared_too_large(scope):
                raise Refused(413, "too_large", f"request body over {MAX_BODY} bytes")
            if scope["method"] not in ("GET", "HEAD") and scope["path"] != "/healthz":
                await self.authenticated(scope)
            body = await read_body(receive, MAX_BODY)
            if body is None:
                raise Refused(413, "too_large", f"request body over {MAX_BODY} bytes")
            reply = await self.route(scope, body)
        except Refused as exc:
            reply = exc.reply
        except ValidationError as exc:  # (a name that cannot be a key in the store)
            reply = _error(422, "invalid", str(exc))
        except Conflict as exc:  # (two moves of one entitlement, say)
            reply = _error(409, "conflict", f"{exc}: retry", retry=True)
        except Exception as exc:  # the store unreachable: nothing was done here
            reply = _error(503, "unavailable", f"the front end cannot read the store "
                                               f"({type(exc).__name__}): retry", retry=True)
        if isinstance(reply, httpx.Response):
            await answer(send, reply)
        else:
            await _send(send, *reply)

    # -- routing ---------------------------------------------------------------------------
    async def route(self, scope: Scope, body: bytes) -> Any:
        path, method = scope["path"], scope["method"]
        parts = [p for p in path.split("/") if p]
        if "." in parts or ".." in parts:
            # (routed here as written, but the hop to a shard would resolve them to
            # another path: a request reaches only what its own path names)
            raise Refused(404, "not_found", f"{path}: a path with '.' or '..' segments "
                                            "is not served")
        m = self.map
        if path == "/healthz":
            return await self.health()
        if path == "/metrics" and method == "GET":  # the front end's own, for an admin
            await self.admin(scope)
            return 200, self.metrics.exposition(), [(b"content-type",
                                                     METRICS_CONTENT_TYPE.encode())]
        if parts[:3] == ["v1", "admin", "entitlements"] and len(parts) == 5 \
                and parts[4] == "move" and method == "POST":
            return await self.move(scope, parts[3], body)
        if parts[:2] == ["v1", "entitlements"]:
            if len(parts) == 2 and method == "GET":
                return await self.fan_out(scope, body, "entitlements")
            if len(parts) == 2 and method == "POST":
                spec = self._body(body)
                name = str(spec.get("name", ""))
                if not NAME_RE.match(name):
                    return await self.to_shard(0, scope, body)  # (its 422 names the field)
                await self.admin(scope)  # placed only for whoever may create it
                weight = await run_in_threadpool(m.weight, spec.get("quota"))
                loans = bool(spec.get("lends")) or bool(spec.get("elastic"))
                entry = await run_in_threadpool(m.place, name, weight, loans)
                await self._writable(scope, name, entry)
                return await self.to_shard(entry["shard"], scope, body)
            if len(parts) == 2:  # another method: shard 0 answers 405
                return await self.to_shard(0, scope, body)
            found = await run_in_threadpool(m.route, parts[2])
            if found is None:
                return await self.to_shard(0, scope, body)  # (its 404)
            if method != "GET":
                await self._writable(scope, parts[2], found[0])
            return await self.to_shard(found[0]["shard"], scope, body)
        if parts[:2] == ["v1", "jobs"]:
            if len(parts) == 2 and method == "GET":
                return await self.fan_out(scope, body, "jobs")
            if len(parts) == 2 and method != "POST":  # shard 0 answers 405
                return await self.to_shard(0, scope, body)
            if len(parts) == 2:  # a create names its entitlement
                spec = self._body(body)
                ent, name = str(spec.get("entitlement", "")), str(spec.get("name", ""))
                # (one store read; off the event loop unless it is a local one)
                found, have = (m.create_target(ent, name) if self._inline_reads
                               else await run_in_threadpool(m.create_target, ent, name))
                if found is None or not NAME_RE.match(name):
                    return await self.to_shard(0, scope, body)  # (its 422 names it)
                await self._writable(scope, ent, found[0])
                if have is not None and have[0] != found[0]["shard"]:
                    if not await self._may_change(scope, ent, found[0]):
                        # (the shard refuses it as for an entitlement that does not
                        # exist: whether this one does is not the caller's to learn)
                        return await self.to_shard(found[0]["shard"], scope, body)
                    # (the job's entitlement is not named: it may be another owner's)
                    raise Refused(409, "conflict", f"job {spec['name']}: expected 'a free "
                                                   f"name', found {NAME_TAKEN!r}")
                return await self.creates.create(found[0]["shard"], scope, body)
            return await self.to_job(scope, body, parts[2], write=method != "GET",
                                     moving=parts[3:] == ["move"])
        if parts[:2] == ["v1", "discovery"] and len(parts) == 3:
            return await self.to_job(scope, body, parts[2], write=False)
        if parts[:2] == ["v1", "machines"]:
            if len(parts) == 2:
                return await self.fan_out(scope, body, "machines")
            bound = await run_in_threadpool(m.machine, parts[2])
            if bound is None:
                return await self.to_shard(0, scope, body)
            found = await run_in_threadpool(m.route, bound)
            if found is None:
                return await self.to_shard(0, scope, body)
            entry = found[0]
            agent = len(parts) == 4 and parts[3] in _AGENT_PARTS
            if entry.get("moving_to") is not None and method != "GET" and not agent and (
                    await self._may_change(scope, bound, entry)):
                raise Refused(409, "conflict", f"machine {parts[2]}'s entitlement {bound!r} "
                                               f"is moving to scheduler shard "
                                               f"{entry['moving_to']}: retry", retry=True)
            # (an agent goes on with the shard the map names: the old one until its
            # records are handed over, which then answers 503 until the map moves)
            return await self.to_shard(entry["shard"], scope, body)
        if parts[:2] == ["v1", "shard"]:  # a shard's own part in a move: not for callers
            raise Refused(404, "not_found", f"{path}: not served by the front end (use "
                                            "/v1/admin/entitlements/{name}/move)")
        if parts[:2] == ["v1", "events"] and method == "GET":
            return await self.events(scope, body)
        if parts == ["v1", "agents", "join"] and method == "POST":
            # (to the shard that hears the machine's agent: it refuses a second agent
            # joining as a machine whose agent is alive; a free or new machine, or a
            # body that names none, to shard 0)
            machine = self._body(body).get("machine")
            bound = (await run_in_threadpool(m.machine, machine)
                     if isinstance(machine, str) and machine else None)
            found = await run_in_threadpool(m.route, bound) if bound is not None else None
            return await self.to_shard(found[0]["shard"] if found is not None else 0,
                                       scope, body)
        return await self.to_shard(0, scope, body)  # tokens, maintenance

    @staticmethod
    def _body(body: bytes) -> dict[str, Any]:
        try:
            data = fastjson.loads(body or b"{}")
        except ValueError:  # (nested too deeply too: the shard's answer names it)
            return {}
        return data if isinstance(data, dict) else {}

    async def _writable(self, scope: Scope, entitlement: str, entry: dict[str, Any]) -> None:
        """Refuse (409, retry) a change to an entitlement that is moving between shards,
        for a caller who may change it. Anyone else is not told that it moves (nor that
        it exists): the request goes on to the shard, which refuses it as it refuses
        whatever the caller may not touch."""
        if entry.get("moving_to") is None or not await self._may_change(scope, entitlement,
                                                                          entry):
            return
        raise Refused(409, "conflict", f"entitlement {entitlement!r} is moving to scheduler "
                                       f"shard {entry['moving_to']}: its jobs accept no "
                                       "changes until it has moved; retry", retry=True)

    async def _may_change(self, scope: Scope, entitlement: str, entry: dict[str, Any]) -> bool:
        """Is the caller an admin, or the owner of ``entitlement``?"""
        try:
            who = await self.authenticated(scope)
        except Refused:
            return False
        if who.role is Role.ADMIN:
            return True
        if who.role is not Role.OWNER:
            return False
        return bool(await run_in_threadpool(self.map.owner, entitlement, entry) == who.name)

    async def to_job(self, scope: Scope, body: bytes, job: str, write: bool,
                     moving: bool = False) -> Any:
        found = await run_in_threadpool(self.map.job, job)
        if found is None and scope["method"] == "PUT" and len(
                [p for p in scope["path"].split("/") if p]) == 3:
            # a PUT of a job that does not exist creates it: on its entitlement's shard
            ent = str(self._body(body).get("entitlement", ""))
            entry = await run_in_threadpool(self.map.entry, ent)
            if entry is not None:
                await self._writable(scope, ent, entry[0])
                return await self.to_shard(entry[0]["shard"], scope, body)
        if found is None:
            return await self.to_shard(0, scope, body)  # (its 404)
        shard, ent = found
        if write:
            entry = await run_in_threadpool(self.map.entry, ent)
            if entry is not None:
                await self._writable(scope, ent, entry[0])
            if moving:  # a job moves between entitlements of one shard
                target = str(self._body(body).get("entitlement", ""))
                other = await run_in_threadpool(self.map.entry, target)
                if other is not None:
                    await self._writable(scope, target, other[0])
                if other is not None and other[0]["shard"] != shard and (
                        entry is not None and await self._may_change(scope, ent, entry[0])
                        and await self._may_change(scope, target, other[0])):
                    # (said only to whoever may change both: anyone else is answered by
                    # the job's shard, as for a job or an entitlement that does not exist)
                    raise Refused(422, "invalid", f"entitlement {target!r} is managed by "
                                                  f"scheduler shard {other[0]['shard']}, job "
                                                  f"{job} by shard {shard}: move one "
                                                  "entitlement to the other's shard first "
                                                  "(plait admin entitlement move)")
            elif scope["method"] == "PUT" and len([p for p in scope["path"].split("/")
                                                    if p]) == 3 and entry is not None:
                # an update naming another shard's entitlement: that shard does not know
                # the job, this one not the entitlement. Say what one control plane
                # says (an update does not move a job), to whoever may see the job
                target = str(self._body(body).get("entitlement", ""))
                if not await self._may_change(scope, ent, entry[0]):
                    # another owner's job: a name taken, to whoever may change the
                    # entitlement the spec names (as a create says, and a shard);
                    # anyone else is answered by the job's shard
                    mine = await run_in_threadpool(self.map.route, target) if target else None
                    if mine is not None and await self._may_change(scope, target, mine[0]):
                        raise Refused(409, "conflict", f"job {job}: expected 'a free name', "
                                                       f"found {NAME_TAKEN!r}")
                    return await self.to_shard(shard, scope, body)
                other = await run_in_threadpool(self.map.route, target) if (
                    target and target != ent) else None
                if other is not None and other[0]["shard"] != shard:
                    raise Refused(422, "invalid", f"job {job} runs in entitlement {ent!r}; "
                                                  "update cannot move it (move it to another "
                                                  "entitlement with a move)",
                                  field="entitlement")
        return await self.to_shard(shard, scope, body)

    async def to_shard(self, shard: int, scope: Scope, body: bytes,
                       path: str | None = None, method: str | None = None) -> httpx.Response:
        """The request answered by the shard's leader. A leader that changed meanwhile
        (a replica answering 503: it applied nothing) or cannot be connected to is
        looked up again, a few times within about a second."""
        headers = [*forward_headers(scope), (FORWARDED, self.identity)]
        if method is not None:
            scope = {**scope, "method": method, "query_string": b""}
        for attempt in range(RETRIES + 1):
            last = attempt == RETRIES
            fresh, leader = self.map.cached_leader(shard)
            if not fresh:
                leader = await run_in_threadpool(self.map.leader, shard)
            if leader is None:
                if last:
                    raise Refused(503, "unavailable", f"scheduler shard {shard} has no "
                                                      "leader elected (yet): retry", retry=True)
            else:
                try:
                    r = await call(self.client, leader, scope, body, headers, path)
                    if r.status_code != 503 or last:
                        return r
                except httpx.ConnectError as exc:
                    if last:
                        self.map.forget(shard)
                        raise Refused(503, "unavailable", f"scheduler shard {shard}'s leader "
                                                          f"{leader} did not answer "
                                                          f"({type(exc).__name__}): retry",
                                      retry=True) from None
                except httpx.HTTPError as exc:  # (it may have been applied: not retried)
                    self.map.forget(shard)
                    raise Refused(503, "unavailable", f"scheduler shard {shard}'s leader "
                                                      f"{leader} did not answer "
                                                      f"({type(exc).__name__}): retry",
                                  retry=True) from None
            self.map.forget(shard)
            await asyncio.sleep(0.25)
        raise AssertionError("unreachable")

    async def fan_out(self, scope: Scope, body: bytes, key: str) -> Any:
        shards = await run_in_threadpool(self.map.shards)
        replies = await asyncio.gather(*(self.to_shard(s, scope, body) for s in shards))
        for r in replies:
            if r.status_code != 200:
                return r  # (a refusal is every shard's: the token's)
        pages = [r.json() for r in replies]
        query = dict(httpx.QueryParams(scope.get("query_string", b"").decode()))
        if key == "machines" and query.get("loaned", "").lower() in ("1", "true", "yes"):
            # each shard lists the loans of its own elastic entitlements (in a region
            # they share one shard: ``ShardMap.place``): every shard's first page,
            # with the total of them all (not paged further through the front end)
            mine = {m["id"]: m for page in pages for m in page["machines"]}
            found = [mine[k] for k in sorted(mine)]
            return _json(200, {"machines": found, "offset": 0, "continue": None,
                               "total": sum(int(page.get("total", 0)) for page in pages)})
        if key == "machines":  # every shard lists every machine; tasks and the host
            merged = pages[0]  # profile are the owner's
            for page in pages[1:]:
                theirs = {m["id"]: m for m in page["machines"]}
                for mine in merged["machines"]:
                    other = theirs.get(mine["id"], {})
                    mine["tasks"] += other.get("tasks", 0)
                    if mine.get("host_profile") is None:
                        mine["host_profile"] = other.get("host_profile")
                    if mine.get("loan") is None:
                        mine["loan"] = other.get("loan")
            return _json(200, merged)
        # one order across shards (by name): each shard answered the same window,
        # merged here by name (``plait.paging``)
        filters = {k: query.get(k) for k in ("entitlement", "state")} if key == "jobs" else {}
        try:
            win = paging.window(query.get("limit"), query.get("continue"),
                                paging.scope_of(key, **filters))
        except paging.BadRequest as exc:  # (every shard refused it already)
            raise Refused(400, "invalid", str(exc), field=exc.field) from None
        items, nxt = paging.merged(pages, key, lambda x: str(x.get("name")), win)
        return _json(200, {key: items, **({"continue": nxt} if win.paged else {})})

    async def events(self, scope: Scope, body: bytes) -> Any:
        """Every shard's events merged oldest first; ``after``, ``next`` and each
        event's ``seq`` carry one cursor per shard (packed in one integer)."""
        shards = await run_in_threadpool(self.map.shards)
        query = dict(httpx.QueryParams(scope.get("query_string", b"").decode()))
        after = _count(query, "after", 0)
        limit = _count(query, "limit", 100)
        if shards and after >> (40 * (max(shards) + 1)):  # (bits of no shard: not ours)
            raise Refused(422, "invalid", "after: not an events cursor of this region (pass "
                                          "the `next` or an event's `seq` as it is)",
                          field="after")
        cursors = _unpack(after, shards)

        async def one(s: int) -> httpx.Response:
            q = httpx.QueryParams({**query, "after": str(cursors[s])})
            return await self.to_shard(s, {**scope, "query_string": str(q).encode()}, body)

        replies = await asyncio.gather(*(one(s) for s in shards))
        for r in replies:
            if r.status_code != 200:
                return r
        pages = [r.json() for r in replies]
        # each shard's page stays in its own order (seq), interleaved by time: a
        # cursor past an event is then past every earlier event of that shard
        merged = list(heapq.merge(*([(e["time"], s, e["seq"], e) for e in page["events"]]
                                    for s, page in zip(shards, pages, strict=True)),
                                  key=lambda x: x[0]))
        kept, dropped = merged[:limit], {x[1] for x in merged[limit:]}
        # each event's ``seq`` is the cursor just past it (so ``after=seq`` goes on
        # from there, as with one control plane); ``shard_seq`` is its shard's number
        events = []
        for _, s, seq, e in kept:
            cursors[s] = seq
            events.append({**e, "seq": _pack(cursors), "shard": s, "shard_seq": seq})
        more = bool(dropped) or any(page["next"] is not None for page in pages)
        last = {s: int(page["last_seq"]) for s, page in zip(shards, pages, strict=True)}
        return _json(200, {"events": events, "next": _pack(cursors) if more else None,
                           "last_seq": _pack(last)})

    async def health(self) -> Any:
        shards = await run_in_threadpool(self.map.shards)
        leaders = {str(s): await run_in_threadpool(self.map.leader, s) for s in shards}
        ok = bool(shards) and all(leaders.values())
        return _json(200 if ok else 503, {
            "ok": ok, "role": "frontend", "version": __version__, "shards": leaders,
            "status": "ok" if ok else "a shard has no leader (or none has started)"})

    # -- moving an entitlement between shards ----------------------------------------------
    async def authenticated(self, scope: Scope) -> Principal:
        """The caller's principal; 401 without a valid token (one answer for every
        bad token, as the shards give)."""
        # (the first Authorization, as the shards and Starlette read it)
        token = next((v for k, v in forward_headers(scope) if k.lower() == "authorization"),
                     "")
        scheme, _, secret = token.partition(" ")
        if scheme.lower() != "bearer" or not secret.strip():
            raise Refused(401, "unauthorized", "missing bearer token (Authorization: Bearer "
                                               "<token>)")
        try:
            who = self.tokens.verify_cached(secret.strip())
            if who is None:
                who = await run_in_threadpool(self.tokens.verify, secret.strip())
        except AuthError:
            raise Refused(401, "unauthorized", "invalid token") from None
        scope.setdefault("state", {})["principal"] = who  # (for the access log)
        return who

    async def admin(self, scope: Scope) -> None:
        """Refuse (401/403) a request without an admin token."""
        who = await self.authenticated(scope)
        if who.role is not Role.ADMIN:
            raise Refused(403, "forbidden", f"{who} may not do this (admin only)")

    async def move(self, scope: Scope, name: str, body: bytes) -> Any:
        await self.admin(scope)
        spec = self._body(body)
        to = spec.get("shard")
        shards = await run_in_threadpool(self.map.shards)
        if not isinstance(to, int) or isinstance(to, bool) or to not in shards:
            raise Refused(422, "invalid", f"shard: {to!r} is not a scheduler shard of this "
                                          f"region (shards: {shards})")
        started = time.monotonic()
        found = await run_in_threadpool(self.map.entry, name)
        if found is None:
            raise Refused(404, "not_found", f"entitlement {name!r} not found")
        entry, version = found
        source = int(entry["shard"])
        if entry.get("moving_to") not in (None, to):
            raise Refused(409, "conflict", f"entitlement {name!r} is moving to shard "
                                           f"{entry['moving_to']}: retry when it has moved",
                          retry=True)
        if source == to:
            raise Refused(409, "conflict", f"entitlement {name!r} is on shard {to} already")
        if entry.get("moving_to") is None:  # (else: a move left unfinished, resumed)
            entry = {**entry, "moving_to": to}
            try:
                version = await run_in_threadpool(
                    self.map.ns.set, f"/entitlements/{name}", json.dumps(entry).encode(),
                    version)
            except Conflict:
                raise Refused(409, "conflict", f"entitlement {name!r} changed meanwhile: "
                                               "retry", retry=True) from None
        jobs = 0
        try:
            handed = await self._ask(source, scope, f"/v1/shard/entitlements/{name}/handoff",
                                     json.dumps({"shard": to}).encode())
        except Refused:
            handed = None
        if handed is not None and handed.status_code == 200:
            jobs = int(handed.json()["jobs"])
        else:
            # whatever the answer (a refusal, an error after the records moved, none):
            # the store says whether the records are still the old shard's
            held = f"{shard_prefix(source)}/allocator/entitlements/{name}"
            if await run_in_threadpool(self.store.exists, held):
                back = {k: v for k, v in entry.items() if k != "moving_to"}
                await run_in_threadpool(self.map.ns.set, f"/entitlements/{name}",
                                        json.dumps(back).encode(), version)
                if handed is None:
                    raise Refused(503, "unavailable", f"scheduler shard {source} did not "
                                                      "hand the entitlement over: retry",
                                  retry=True)
                return handed
        loaded = await self._ask(to, scope, "/v1/shard/reload",
                                 json.dumps({"entitlement": name}).encode())
        if loaded.status_code != 200:
            return loaded  # (the map still says moving: run the move again to finish)
        done = {k: v for k, v in entry.items() if k != "moving_to"} | {"shard": to}
        await run_in_threadpool(self.map.ns.set, f"/entitlements/{name}",
                                json.dumps(done).encode(), version)
        return _json(200, {"entitlement": name, "from_shard": source, "to_shard": to,
                           "jobs": jobs, "unavailable_s": round(time.monotonic() - started, 3)})

    async def _ask(self, shard: int, scope: Scope, path: str, body: bytes) -> httpx.Response:
        """POST to a shard's leader, waiting (a while) for one to be elected."""
        for attempt in range(MOVE_ATTEMPTS):
            try:
                r = await self.to_shard(shard, {**scope, "query_string": b""}, body,
                                        path=path, method="POST")
            except Refused:
                if attempt == MOVE_ATTEMPTS - 1:
                    raise
                await asyncio.sleep(0.25)
                continue
            if r.status_code != 503:
                return r
            await asyncio.sleep(0.25)
        return r
