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

The parts: ``shardmap`` (where things are), ``creates`` (creates carried in
batches), ``gather`` (lists and events of every shard), ``moves`` (a move), and
``ShardRouter`` here, which routes each request.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
from starlette.concurrency import run_in_threadpool
from starlette.types import Receive, Scope, Send

from plait import tracing
from plait.errors import NAME_TAKEN, Conflict, ValidationError
from plait.frontend import gather, moves
from plait.frontend.creates import Creates
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
from plait.frontend.replies import Refused, error_reply, json_object, send_reply
from plait.frontend.requestlog import RequestLog
from plait.frontend.shardmap import ShardMap
from plait.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from plait.metrics import HttpMetrics, HttpOnly, api_route
from plait.model.entitlement import NAME_RE
from plait.server.auth import AuthError, Principal, Role, TokenStore, bearer_token, may_touch
from plait.store.protocol import Store
from plait.tls import verify as tls_verify
from plait.ui.app import Ui

__all__ = ["Refused", "ShardMap", "ShardRouter"]

#: a request that finds no leader (an election settling) is tried again this many
#: times, a quarter second apart
RETRIES = 4

#: agents' calls about their own machine (answered 503 while it is moving: they keep
#: their tasks and ask again)
_AGENT_PARTS = ("desired", "status", "output")


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
            reply = error_reply(422, "invalid", str(exc))
        except Conflict as exc:  # (two moves of one entitlement, say)
            reply = error_reply(409, "conflict", f"{exc}: retry", retry=True)
        except Exception as exc:  # the store unreachable: nothing was done here
            reply = error_reply(503, "unavailable", f"the front end cannot read the store "
                                                    f"({type(exc).__name__}): retry", retry=True)
        if isinstance(reply, httpx.Response):
            await answer(send, reply)
        else:
            await send_reply(send, *reply)

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

    _body = staticmethod(json_object)

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
        """Is the caller an admin, or the owner of ``entitlement`` (the owner rule,
        ``may_touch``)?"""
        try:
            who = await self.authenticated(scope)
        except Refused:
            return False
        if who.role is not Role.OWNER:
            return may_touch(who, None)
        return may_touch(who, await run_in_threadpool(self.map.owner, entitlement, entry))

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

    # -- answers of every shard, and moves (``gather``, ``moves``) -------------------------
    async def fan_out(self, scope: Scope, body: bytes, key: str) -> Any:
        return await gather.fan_out(self, scope, body, key)

    async def events(self, scope: Scope, body: bytes) -> Any:
        return await gather.events(self, scope, body)

    async def health(self) -> Any:
        return await gather.health(self)

    async def move(self, scope: Scope, name: str, body: bytes) -> Any:
        return await moves.move(self, scope, name, body)

    # -- moving an entitlement between shards ----------------------------------------------
    async def authenticated(self, scope: Scope) -> Principal:
        """The caller's principal; 401 without a valid token (one answer for every
        bad token, as the shards give)."""
        # (the first Authorization, as the shards and Starlette read it)
        header = next((v for k, v in forward_headers(scope) if k.lower() == "authorization"),
                      "")
        token = bearer_token(header)
        if token is None:
            raise Refused(401, "unauthorized", "missing bearer token (Authorization: Bearer "
                                               "<token>)")
        try:
            who = self.tokens.verify_cached(token)
            if who is None:
                who = await run_in_threadpool(self.tokens.verify, token)
        except AuthError:
            raise Refused(401, "unauthorized", "invalid token") from None
        scope.setdefault("state", {})["principal"] = who  # (for the access log)
        return who

    async def admin(self, scope: Scope) -> None:
        """Refuse (401/403) a request without an admin token."""
        who = await self.authenticated(scope)
        if who.role is not Role.ADMIN:
            raise Refused(403, "forbidden", f"{who} may not do this (admin only)")
