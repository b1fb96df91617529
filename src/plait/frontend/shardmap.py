"""Where a sharded region's objects are (``ShardMap``): its shards and their leaders,
the entitlement-to-shard map, and the shard of a job or a machine, read from the
store (``plait.frontend.router`` has the store's layout)."""

from __future__ import annotations

import json
import time
from typing import Any, Protocol

import httpx
from starlette.types import Scope

from plait import fastjson
from plait.errors import Conflict, NotFound, ValidationError
from plait.frontend.replies import Refused
from plait.model import RegionSpec, parse
from plait.model.entitlement import CANARY_NAME, NAME_RE, Quota, place_on_shard, shard_weight
from plait.store.protocol import Namespace, Store
from plait.store.shard import shard_prefix

#: seconds a shard's leader, once read, is trusted before it is read again
LEADER_TTL = 0.5


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



class Front(Protocol):
    """What the front end's parts (``gather``, ``moves``, ``creates``) ask of the
    router: the map, the store, an admin's check, and a request sent to a shard."""

    store: Store
    map: ShardMap

    async def admin(self, scope: Scope) -> None: ...

    async def to_shard(self, shard: int, scope: Scope, body: bytes,
                       path: str | None = None, method: str | None = None
                       ) -> httpx.Response: ...
