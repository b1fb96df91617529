"""``/v1/tokens`` (admin) and ``/v1/whoami``: API tokens, their secrets returned once
and stored only as hashes. A machine's credential comes from ``/v1/agents/join``."""

from typing import Any

from plait import paging
from plait.api.auth import Admin, Who
from plait.api.bodies import TokenRequest
from plait.api.common import Continue, Limit, Plane, resource
from plait.client import types as t
from plait.errors import ValidationError
from plait.server.auth import Role, TokenInfo

router = resource(["tokens"])


def token_view(info: TokenInfo, token: str | None = None) -> dict[str, Any]:
    body = {"id": info.id, "role": info.role.value, "name": info.name,
            "created": info.created, "revoked": info.revoked,
            "description": info.description}
    if token is not None:
        body["token"] = token
    return body


@router.get("/v1/whoami", response_model=t.WhoAmI)
def whoami(who: Who) -> dict[str, Any]:
    """The token's own identity: its id, role and name (what the web UI shows)."""
    return {"token_id": who.token_id, "role": who.role.value, "name": who.name}


@router.post("/v1/tokens", response_model=t.TokenView, status_code=201)
def create_token(body: TokenRequest, who: Admin, api: Plane) -> dict[str, Any]:
    """A new token; the secret is returned once and stored only as a hash."""
    if body.role is Role.MACHINE:
        raise ValidationError("role", "machine credentials come from /v1/agents/join")
    info, token = api.create_token(body.role, body.name, body.description)
    return token_view(info, token)


@router.get("/v1/tokens", response_model=t.TokenList)
def list_tokens(who: Admin, api: Plane, limit: Limit = None,
                cont: Continue = None) -> dict[str, Any]:
    """Every token by id; in pages with ``limit`` and ``continue``."""
    win = paging.window(limit, cont, paging.scope_of("tokens"))
    by_id = {info.id: info for info in api.tokens()}
    found, nxt = paging.page(sorted(by_id), win, lambda i: token_view(by_id[str(i)]))
    return {"tokens": found, **({"continue": nxt} if win.paged else {})}


@router.delete("/v1/tokens/{token_id}", response_model=t.TokenView)
def revoke_token(token_id: str, who: Admin, api: Plane) -> dict[str, Any]:
    return token_view(api.revoke_token(token_id))


@router.post("/v1/tokens/{token_id}/rotate", response_model=t.TokenView)
def rotate_token(token_id: str, who: Admin, api: Plane) -> dict[str, Any]:
    info, token = api.rotate_token(token_id)
    return token_view(info, token)
