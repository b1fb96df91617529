"""The front end's answers gathered from every shard: lists merged in one order, the
event log merged oldest first (one cursor per shard, packed in one), the region's
health."""

from __future__ import annotations

import asyncio
import heapq
from typing import Any

import httpx
from starlette.concurrency import run_in_threadpool
from starlette.types import Scope

from plait import __version__, paging
from plait.frontend.replies import Refused, reply, whole
from plait.frontend.shardmap import Front


def _pack(cursors: dict[int, int]) -> int:
    """Per-shard event cursors as one (each below 2**40)."""
    return sum(c << (40 * s) for s, c in cursors.items())


def _unpack(cursor: int, shards: list[int]) -> dict[int, int]:
    return {s: (cursor >> (40 * s)) & ((1 << 40) - 1) for s in shards}


async def fan_out(front: Front, scope: Scope, body: bytes, key: str) -> Any:
    shards = await run_in_threadpool(front.map.shards)
    replies = await asyncio.gather(*(front.to_shard(s, scope, body) for s in shards))
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
        return reply(200, {"machines": found, "offset": 0, "continue": None,
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
        return reply(200, merged)
    # one order across shards (by name): each shard answered the same window,
    # merged here by name (``plait.paging``)
    filters = {k: query.get(k) for k in ("entitlement", "state")} if key == "jobs" else {}
    try:
        win = paging.window(query.get("limit"), query.get("continue"),
                            paging.scope_of(key, **filters))
    except paging.BadRequest as exc:  # (every shard refused it already)
        raise Refused(400, "invalid", str(exc), field=exc.field) from None
    items, nxt = paging.merged(pages, key, lambda x: str(x.get("name")), win)
    return reply(200, {key: items, **({"continue": nxt} if win.paged else {})})

async def events(front: Front, scope: Scope, body: bytes) -> Any:
    """Every shard's events merged oldest first; ``after``, ``next`` and each
    event's ``seq`` carry one cursor per shard (packed in one integer)."""
    shards = await run_in_threadpool(front.map.shards)
    query = dict(httpx.QueryParams(scope.get("query_string", b"").decode()))
    after = whole(query, "after", 0)
    limit = whole(query, "limit", 100)
    if shards and after >> (40 * (max(shards) + 1)):  # (bits of no shard: not ours)
        raise Refused(422, "invalid", "after: not an events cursor of this region (pass "
                                      "the `next` or an event's `seq` as it is)",
                      field="after")
    cursors = _unpack(after, shards)

    async def one(s: int) -> httpx.Response:
        q = httpx.QueryParams({**query, "after": str(cursors[s])})
        return await front.to_shard(s, {**scope, "query_string": str(q).encode()}, body)

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
    return reply(200, {"events": events, "next": _pack(cursors) if more else None,
                       "last_seq": _pack(last)})

async def health(front: Front) -> Any:
    shards = await run_in_threadpool(front.map.shards)
    leaders = {str(s): await run_in_threadpool(front.map.leader, s) for s in shards}
    ok = bool(shards) and all(leaders.values())
    return reply(200 if ok else 503, {
        "ok": ok, "role": "frontend", "version": __version__, "shards": leaders,
        "status": "ok" if ok else "a shard has no leader (or none has started)"})
