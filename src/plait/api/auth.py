"""Authentication and the owner rule, written once for every route and hot path.

``Gate`` (one per app, in its state) reads the bearer token (``bearer_token``), checks
it, and records refusals (a burst, then one now and then: anyone can send one). The
owner rule is ``may_touch``: an admin touches every object; an owner only those of
its own entitlements, and another owner's are answered as missing ones (404; a 422
when a request body names it), the refusal recorded. The routes take the caller as a
dependency (``Who``: any valid token; ``User``: an admin's or owner's; ``Admin``).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request, Security
from fastapi.concurrency import run_in_threadpool
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.types import Scope

from plait import requestid
from plait.errors import NAME_TAKEN, Conflict, NotFound, ValidationError
from plait.server.auth import AuthError, Principal, Role, bearer_token, may_touch
from plait.server.controlplane.facade import PlaneApi
from plait.server.events import Budget

#: the one answer to every token that is not valid (malformed, unknown, revoked, or
#: with a wrong secret): why is recorded as an auth event, not told to the caller
INVALID_TOKEN = "invalid token"
#: refused requests recorded as events: a burst of this many, then one each 10 s (with
#: how many were left out); a flood from anyone, with no token, then takes at most a
#: fifth of an event a second of the retained events
REFUSALS_BURST = 20
REFUSALS_PER_SECOND = 0.1

bearer = HTTPBearer(auto_error=False, scheme_name="token", description=(
    "A plait token (plait_<id>_<secret>): the admin token written at first start, an "
    "owner's from plait token create, or a machine's from /v1/agents/join."))


class Gate:
    """Who calls, and what they may touch, over one control plane."""

    def __init__(self, plane: PlaneApi) -> None:
        self.plane = plane
        self.refusals = Budget(REFUSALS_BURST, REFUSALS_PER_SECOND)

    def refuse(self, request: Request, status: int, reason: str,
               answer: str | None = None) -> AuthError:
        """The refusal to raise; recorded (a burst of refusals is, a flood only now and
        then, so that it does not push everything else out of the retained events;
        those left out are counted with the next one recorded)."""
        skipped = self.refusals.take(self.plane.clock())
        if skipped is not None:
            if skipped:
                self.plane.record("auth", "refusals_suppressed",
                                  f"{skipped} more refusals not recorded")
            self.plane.record("auth", "unauthorized" if status == 401 else "forbidden",
                              f"{request.method} {request.url.path}: {reason}")
        return AuthError(status, reason if answer is None else answer)

    # -- who calls -----------------------------------------------------------------------
    async def principal(self, request: Request) -> Principal:
        token = bearer_token(request.headers.get("authorization", ""))
        if token is None:
            raise self.refuse(request, 401,
                              "missing bearer token (Authorization: Bearer <token>)")
        try:
            # the cached record needs no store read; otherwise read it off the event loop
            who = self.plane.verify_cached(token)
            if who is None:
                who = await run_in_threadpool(self.plane.verify, token)
        except AuthError as exc:  # (why is recorded; every bad token gets one answer)
            raise self.refuse(request, 401, exc.reason, answer=INVALID_TOKEN) from None
        request.state.principal = who
        requestid.actor.set(str(who))  # the events this request records name it
        return who

    def cached(self, authorization: bytes | None) -> Principal | None:
        """The caller a hot path may answer: a bearer token whose record is cached and
        valid; None otherwise (the route answers, refusing a bad token)."""
        token = None if authorization is None else bearer_token(
            authorization.decode("latin-1"))
        if token is None:
            return None
        try:
            return self.plane.verify_cached(token)
        except AuthError:  # (the route's 401, recorded there)
            return None

    @staticmethod
    def adopt(scope: Scope, who: Principal) -> None:
        """A hot path's caller, as ``principal`` keeps it (the access log, events)."""
        scope.setdefault("state", {})["principal"] = who
        requestid.actor.set(str(who))

    # -- the owner rule ------------------------------------------------------------------
    def owns(self, who: Principal, entitlement: str) -> bool:
        return may_touch(who, self.plane.entitlement_owner(entitlement))

    def owned(self, who: Principal) -> set[str] | None:
        """The entitlements a principal may see (None: all)."""
        if who.role is Role.ADMIN:
            return None
        return self.plane.entitlements_of(who.name)

    def may_entitlement(self, request: Request, who: Principal, name: str,
                        named_in_body: bool = False) -> None:
        """An owner may use only its own entitlements; another owner's is answered as
        one that does not exist (no probing for names), and the refusal recorded.
        ``named_in_body``: a field of the request names it (a 422, as for an unknown
        one), not the path (a 404)."""
        if self.owns(who, name):
            return
        self.refuse(request, 403, f"{who} does not own entitlement {name!r}")
        if named_in_body:
            raise ValidationError("entitlement", f"entitlement {name!r} does not exist")
        raise NotFound("entitlement", name)

    def may_job(self, request: Request, who: Principal, job: str) -> None:
        if who.role is Role.ADMIN:
            return
        try:
            self.may_job_in(request, who, job, self.plane.job(job).entitlement)
        except NotFound:
            raise NotFound("job", job) from None

    def may_job_in(self, request: Request, who: Principal, job: str,
                   entitlement: str) -> None:
        """``may_job`` for the job record the caller read (its entitlement)."""
        try:
            self.may_entitlement(request, who, entitlement)
        except NotFound:
            raise NotFound("job", job) from None

    def name_free_for(self, request: Request, who: Principal, job: str,
                      entitlement: str) -> None:
        """A spec naming job ``job`` (stored, in ``entitlement``) is the caller's to
        change; another owner's job is a name taken (job names are region-wide), as a
        create says, and that is all it says (not its entitlement nor its spec)."""
        try:
            self.may_job_in(request, who, job, entitlement)
        except NotFound:
            raise Conflict(f"job {job}", "a free name", NAME_TAKEN) from None


async def gate(request: Request) -> Gate:
    found: Gate = request.app.state.gate
    return found


Guard = Annotated[Gate, Depends(gate)]


async def principal(request: Request, guard: Guard, declared: Annotated[
        HTTPAuthorizationCredentials | None, Security(bearer)] = None) -> Principal:
    # (``bearer`` declares the scheme in the OpenAPI document; the header is read by
    # the gate, so every refusal has plait's shape and is recorded)
    return await guard.principal(request)


Who = Annotated[Principal, Depends(principal)]


async def admin(request: Request, who: Who, guard: Guard) -> Principal:
    if who.role is not Role.ADMIN:
        raise guard.refuse(request, 403, f"{who} may not do this (admin only)")
    return who


Admin = Annotated[Principal, Depends(admin)]


async def user(request: Request, who: Who, guard: Guard) -> Principal:
    if who.role not in (Role.ADMIN, Role.OWNER):
        raise guard.refuse(request, 403,
                           f"{who} may not do this (admin or owner tokens only)")
    return who


User = Annotated[Principal, Depends(user)]
