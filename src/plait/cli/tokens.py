"""plait token: API tokens (admin)."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from plait.cli.client import EXIT_INVALID, CliError, q
from plait.cli.common import Output, _when, api, emit, err, guarded, rows

# -- tokens --------------------------------------------------------------------------------
token_app = typer.Typer(help="API tokens (admin).", no_args_is_help=True)


@token_app.command("create")
@guarded
def token_create(
    owner: Annotated[str | None, typer.Option(help="an owner token for this owner")] = None,
    role: Annotated[str, typer.Option(help="owner, admin or join")] = "owner",
    name: Annotated[str | None, typer.Option(help="label (admin and join tokens)")] = None,
    description: str = "",
    output: Output = "table",
) -> None:
    """Create a token; it is printed once (the server keeps only its hash)."""
    label = owner or name
    if label is None:
        raise CliError("give --owner O (or --role admin|join --name N)", EXIT_INVALID)
    if owner and role != "owner":
        raise CliError(f"--owner makes an owner token; not with --role {role}", EXIT_INVALID)
    data = api().post("/v1/tokens", {"role": "owner" if owner else role, "name": label,
                                     "description": description})

    def show(d: dict[str, Any]) -> None:
        print(d["token"])
        err.print(f"{d['role']} token {d['id']} for {d['name']}: shown once, keep it safe")
    emit(data, output, show)


@token_app.command("list")
@guarded
def token_list(output: Output = "table") -> None:
    data = api().get("/v1/tokens")
    emit(data, output, lambda d: rows(["id", "role", "name", "created", "revoked",
                                       "description"], [
        [t["id"], t["role"], t["name"], _when(t["created"]), "yes" if t["revoked"] else "",
         t["description"]] for t in d["tokens"]]))


@token_app.command("revoke")
@guarded
def token_revoke(token_id: str, output: Output = "table") -> None:
    data = api().delete(f"/v1/tokens/{q(token_id)}")
    emit(data, output, lambda d: err.print(f"token {token_id} revoked"))


@token_app.command("rotate")
@guarded
def token_rotate(token_id: str, output: Output = "table") -> None:
    """Revoke a token and print its replacement (same role and name)."""
    data = api().post(f"/v1/tokens/{q(token_id)}/rotate")

    def show(d: dict[str, Any]) -> None:
        print(d["token"])
        err.print(f"token {token_id} revoked; new token {d['id']}")
    emit(data, output, show)
