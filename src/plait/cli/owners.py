"""plait owner: limits per owner on jobs and tasks."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from plait.cli.client import q
from plait.cli.common import Output, api, emit, err, guarded, rows

owner_app = typer.Typer(help="Owners: their limits on jobs and tasks.", no_args_is_help=True)
limits_app = typer.Typer(help="An owner's limits on jobs and tasks (set: admin).",
                         no_args_is_help=True)
owner_app.add_typer(limits_app, name="limits")


def _table(owners: list[dict[str, Any]]) -> None:
    rows(["owner", "jobs", "tasks", "set", "jobs held", "tasks held"], [
        [o["owner"], f"{o['jobs']:,}", f"{o['tasks']:,}",
         ", ".join(f"{k} {v:,}" for k, v in sorted(o["set"].items())) or "(defaults)",
         f"{o['used']['jobs']:,}", f"{o['used']['tasks']:,}"] for o in owners])


@limits_app.command("show")
@guarded
def limits_show(
    owner: Annotated[str | None, typer.Argument(help="one owner (an owner token: its "
                                                     "own); every owner if not given")]
    = None,
    output: Output = "table",
) -> None:
    """The limits per owner (the region's defaults unless an admin set its own) and
    what each holds."""
    if owner is not None:
        data = api().get(f"/v1/owners/{q(owner)}/limits")
        emit(data, output, lambda d: _table([d]))
        return
    data = api().get("/v1/owners/limits")

    def show(d: dict[str, Any]) -> None:
        err.print(f"defaults: {d['defaults']['jobs']:,} jobs and {d['defaults']['tasks']:,} "
                  "tasks per owner")
        _table(d["owners"])
    emit(data, output, show)


@limits_app.command("set")
@guarded
def limits_set(
    owner: str,
    jobs: Annotated[int | None, typer.Option(min=0, help="jobs the owner may hold at "
                                                         "most")] = None,
    tasks: Annotated[int | None, typer.Option(min=0, help="tasks in all the owner may "
                                                          "hold at most")] = None,
    output: Output = "table",
) -> None:
    """Set an owner's limits (admin); a limit not given is the region's default. A
    lower limit takes nothing away: the owner cannot grow until under it."""
    data = api().put(f"/v1/owners/{q(owner)}/limits", {"jobs": jobs, "tasks": tasks})
    emit(data, output, lambda d: _table([d]))
