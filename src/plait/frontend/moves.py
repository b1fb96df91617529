"""Moving an entitlement between scheduler shards (``POST
/v1/admin/entitlements/{E}/move``; ``plait.frontend.router`` tells how)."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
from starlette.concurrency import run_in_threadpool
from starlette.types import Scope

from plait.errors import Conflict
from plait.frontend.replies import Refused, json_object, reply
from plait.frontend.shardmap import Front
from plait.store.shard import shard_prefix

#: how long a move waits for the shards' leaders to answer
MOVE_ATTEMPTS = 20


async def move(front: Front, scope: Scope, name: str, body: bytes) -> Any:
    await front.admin(scope)
    spec = json_object(body)
    to = spec.get("shard")
    shards = await run_in_threadpool(front.map.shards)
    if not isinstance(to, int) or isinstance(to, bool) or to not in shards:
        raise Refused(422, "invalid", f"shard: {to!r} is not a scheduler shard of this "
                                      f"region (shards: {shards})")
    started = time.monotonic()
    found = await run_in_threadpool(front.map.entry, name)
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
                front.map.ns.set, f"/entitlements/{name}", json.dumps(entry).encode(),
                version)
        except Conflict:
            raise Refused(409, "conflict", f"entitlement {name!r} changed meanwhile: "
                                           "retry", retry=True) from None
    jobs = 0
    try:
        handed = await ask(front, source, scope, f"/v1/shard/entitlements/{name}/handoff",
                           json.dumps({"shard": to}).encode())
    except Refused:
        handed = None
    if handed is not None and handed.status_code == 200:
        jobs = int(handed.json()["jobs"])
    else:
        # whatever the answer (a refusal, an error after the records moved, none):
        # the store says whether the records are still the old shard's
        held = f"{shard_prefix(source)}/allocator/entitlements/{name}"
        if await run_in_threadpool(front.store.exists, held):
            back = {k: v for k, v in entry.items() if k != "moving_to"}
            await run_in_threadpool(front.map.ns.set, f"/entitlements/{name}",
                                    json.dumps(back).encode(), version)
            if handed is None:
                raise Refused(503, "unavailable", f"scheduler shard {source} did not "
                                                  "hand the entitlement over: retry",
                              retry=True)
            return handed
    loaded = await ask(front, to, scope, "/v1/shard/reload",
                       json.dumps({"entitlement": name}).encode())
    if loaded.status_code != 200:
        return loaded  # (the map still says moving: run the move again to finish)
    done = {k: v for k, v in entry.items() if k != "moving_to"} | {"shard": to}
    await run_in_threadpool(front.map.ns.set, f"/entitlements/{name}",
                            json.dumps(done).encode(), version)
    return reply(200, {"entitlement": name, "from_shard": source, "to_shard": to,
                       "jobs": jobs, "unavailable_s": round(time.monotonic() - started, 3)})


async def ask(front: Front, shard: int, scope: Scope, path: str, body: bytes
             ) -> httpx.Response:
    """POST to a shard's leader, waiting (a while) for one to be elected."""
    for attempt in range(MOVE_ATTEMPTS):
        try:
            r = await front.to_shard(shard, {**scope, "query_string": b""}, body,
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
