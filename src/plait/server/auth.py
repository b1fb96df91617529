"""Bearer tokens, stored only as hashes.

A token reads ``plait_<id>_<secret>``: the id finds the record, the secret is checked
against its SHA-256 (tokens are 256 random bits, so a fast hash is enough; a slow
password hash protects guessable secrets, which these are not). Records live in the
``/auth`` namespace:

    /auth/tokens/{id}   {"schema": 1, "id", "role", "name", "hash", "created", "revoked"}

Roles:

* ``admin``: everything;
* ``owner``: the entitlements whose owner is ``name``, and the jobs in them;
* ``join``: only joins a machine to the cluster (``POST /v1/agents/join``);
* ``machine``: the credential a joined agent uses, for machine ``name`` only.
"""

from __future__ import annotations

import contextlib
import enum
import hashlib
import hmac
import json
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

from plait.errors import Conflict, NotFound, ValidationError
from plait.model.entitlement import check_name
from plait.store.protocol import Namespace, Store

SCHEMA = 1
PREFIX = "plait_"


class Role(enum.StrEnum):
    ADMIN = "admin"
    OWNER = "owner"
    JOIN = "join"
    MACHINE = "machine"


@dataclass(frozen=True)
class Principal:
    token_id: str
    role: Role
    name: str

    def __str__(self) -> str:
        return f"{self.role.value}:{self.name}"


@dataclass(frozen=True)
class TokenInfo:
    id: str
    role: Role
    name: str
    created: float
    revoked: bool
    description: str = ""


class AuthError(Exception):
    """A request without a valid token (401) or outside its rights (403)."""

    def __init__(self, status: int, reason: str) -> None:
        self.status = status
        self.reason = reason
        super().__init__(reason)


def bearer_token(authorization: str) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header (None: not one): the one
    reading of the header, for every route and hot path of the API and the front end."""
    scheme, _, token = authorization.partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def may_touch(who: Principal, owner: str | None) -> bool:
    """The owner rule: an admin touches every object; an owner only those of its own
    entitlements (``owner``: the object's entitlement's, None when there is none). The
    caller answers anything else as missing (404), so another owner's objects cannot
    be told from ones that do not exist."""
    if who.role is Role.ADMIN:
        return True
    return who.role is Role.OWNER and owner is not None and owner == who.name


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


class TokenStore:
    def __init__(self, store: Store, cache_seconds: float = 2.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ns = Namespace(store, "/auth")
        #: token id -> (info, hash, read at): most requests read no store; a token
        #: revoked by another process is refused within ``cache_seconds``
        self._cache: dict[str, tuple[TokenInfo, str, float]] = {}
        self.cache_seconds = cache_seconds
        self._clock = clock

    def create(self, role: Role | str, name: str, now: float,
               description: str = "") -> tuple[TokenInfo, str]:
        """A new token; returns its record and the token itself (shown once)."""
        role = Role(role)
        if role is not Role.MACHINE:
            try:
                check_name(name)
            except ValueError as exc:
                raise ValidationError("name", str(exc)) from None
        token_id = secrets.token_hex(8)
        secret = secrets.token_urlsafe(32)
        info = TokenInfo(token_id, role, name, now, False, description)
        self.ns.create(f"/tokens/{token_id}", json.dumps({
            "schema": SCHEMA, "id": token_id, "role": role.value, "name": name,
            "hash": _hash(secret), "created": now, "revoked": False,
            "description": description}).encode())
        return info, f"{PREFIX}{token_id}_{secret}"

    def issue_machine(self, machine: str, now: float,
                      description: str = "") -> tuple[TokenInfo, str, str | None]:
        """A machine's credential, which replaces the one its last join issued (that
        one is revoked: a machine has one live credential, its current agent's).
        Returns the new record, the token (shown once) and the replaced token's id
        (None: none was on record). Two joins of one machine at once: the one that
        records its credential second is refused (Conflict), its token revoked."""
        key = f"/machines/{machine}"
        try:
            value, version = self.ns.get(key)
            before: str | None = str(json.loads(value)["token"])
        except NotFound:
            before, version = None, None
        info, token = self.create(Role.MACHINE, machine, now, description)
        pointer = json.dumps({"schema": SCHEMA, "token": info.id}).encode()
        try:
            if version is None:
                self.ns.create(key, pointer)
            else:
                self.ns.set(key, pointer, version)
        except Conflict:
            self.revoke(info.id)
            raise Conflict(f"machine {machine}", "one agent joining",
                           "another join of it at the same time: retry") from None
        if before is not None and before != info.id:
            # (a record other writers keep changing: the old credential is left live,
            # the new one stands)
            with contextlib.suppress(NotFound, Conflict):
                self.revoke(before)
        return info, token, before

    def _read(self, token_id: str) -> tuple[TokenInfo, str, int]:
        try:
            value, version = self.ns.get(f"/tokens/{token_id}")
        except NotFound:
            raise NotFound("token", token_id) from None
        data = json.loads(value)
        return (TokenInfo(data["id"], Role(data["role"]), data["name"], float(data["created"]),
                          bool(data["revoked"]), data.get("description", "")),
                data["hash"], version)

    def verify_cached(self, token: str) -> Principal | None:
        """``verify`` without reading the store: None when the token's record is not
        cached (then call ``verify``)."""
        token_id, secret = self._split(token)
        cached = self._cache.get(token_id)
        if cached is None or self._clock() - cached[2] > self.cache_seconds:
            return None
        return self._check(token_id, secret, cached[0], cached[1])

    @staticmethod
    def _split(token: str) -> tuple[str, str]:
        if not token.startswith(PREFIX) or token.count("_") < 2:
            raise AuthError(401, "malformed token (expected plait_<id>_<secret>)")
        token_id, secret = token[len(PREFIX):].split("_", 1)
        return token_id, secret

    @staticmethod
    def _check(token_id: str, secret: str, info: TokenInfo, digest: str) -> Principal:
        if not hmac.compare_digest(digest, _hash(secret)):
            raise AuthError(401, "wrong token secret")
        if info.revoked:
            raise AuthError(401, f"token {token_id} was revoked")
        return Principal(token_id, info.role, info.name)

    def verify(self, token: str) -> Principal:
        """The principal a token stands for; AuthError(401) with the reason if none."""
        token_id, secret = self._split(token)
        cached = self._cache.get(token_id)
        now = self._clock()
        if cached is None or now - cached[2] > self.cache_seconds:
            try:
                info, digest, _ = self._read(token_id)
            except (NotFound, ValueError, ValidationError):  # (an id no key can hold)
                raise AuthError(401, "unknown token") from None
            if len(self._cache) > 10_000:
                self._cache.clear()
            self._cache[token_id] = (info, digest, now)
        else:
            info, digest, _ = cached
        return self._check(token_id, secret, info, digest)

    def list(self) -> list[TokenInfo]:
        found = []
        for token_id in sorted(self.ns.children("/tokens")):
            found.append(self._read(token_id)[0])
        return found

    def revoke(self, token_id: str) -> TokenInfo:
        for _ in range(10):
            info, digest, version = self._read(token_id)
            data = {"schema": SCHEMA, "id": info.id, "role": info.role.value, "name": info.name,
                    "hash": digest, "created": info.created, "revoked": True,
                    "description": info.description}
            try:
                self.ns.set(f"/tokens/{token_id}", json.dumps(data).encode(), version)
            except Conflict:
                continue
            self._cache.pop(token_id, None)
            return self._read(token_id)[0]
        raise Conflict(f"token {token_id}", "a quiet record", "too many concurrent writers")

    def rotate(self, token_id: str, now: float) -> tuple[TokenInfo, str]:
        """Revoke a token and issue a new one with the same role and name. A revoked
        token is not rotated (that would bring its rights back)."""
        if self._read(token_id)[0].revoked:
            raise Conflict(f"token {token_id}", "a live token", "revoked")
        info = self.revoke(token_id)
        made, token = self.create(info.role, info.name, now, info.description)
        if info.role is Role.MACHINE:  # (the machine's credential, if it was: this one now)
            key = f"/machines/{info.name}"
            with contextlib.suppress(NotFound, Conflict):
                value, version = self.ns.get(key)
                if json.loads(value).get("token") == token_id:
                    self.ns.set(key, json.dumps({"schema": SCHEMA, "token": made.id}).encode(),
                                version)
        return made, token

    def forget(self) -> None:
        """Drop cached records (another process may have revoked a token)."""
        self._cache.clear()
