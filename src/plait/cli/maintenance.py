"""plait maintenance: planned maintenance (admin)."""

from __future__ import annotations

from typing import Annotated

import typer

from plait.cli.client import q
from plait.cli.common import (
    Output,
    _when,
    api,
    emit,
    err,
    guarded,
    parse_duration,
    parse_time,
    rows,
)

# -- maintenance ---------------------------------------------------------------------------
maintenance_app = typer.Typer(help="Planned maintenance (admin).", no_args_is_help=True)


@maintenance_app.command("schedule")
@guarded
def maintenance_schedule(
    machines: Annotated[list[str], typer.Argument(help="machine ids")],
    start: Annotated[str, typer.Option(help="now, +10m, unix seconds or ISO 8601")] = "+10m",
    duration: Annotated[str, typer.Option(help="90s, 30m, 2h")] = "1h",
    reason: Annotated[str, typer.Option()] = "maintenance",
    output: Output = "table",
) -> None:
    """Announce maintenance: tasks get advance notice and move or stop per TaskControl;
    at the start, what still runs there is stopped."""
    data = api().post("/v1/maintenance", {"machines": machines, "start": parse_time(start),
                                          "duration_seconds": parse_duration(duration),
                                          "reason": reason})
    emit(data, output, lambda d: err.print(f"maintenance {d['event']} scheduled"))


@maintenance_app.command("list")
@guarded
def maintenance_list(output: Output = "table") -> None:
    data = api().get("/v1/maintenance")
    emit(data, output, lambda d: rows(["id", "kind", "machines", "start", "end", "reason"], [
        [e["id"], e["kind"], ", ".join(e["machines"][:5]) + (" ..." if len(e["machines"]) > 5
                                                              else ""),
         _when(e["start"]), _when(e["end"]), e["reason"]] for e in d["events"]]))


@maintenance_app.command("cancel")
@guarded
def maintenance_cancel(
    event: Annotated[str, typer.Argument(help="the maintenance's id (plait maintenance list)")],
    output: Output = "table",
) -> None:
    """Cancel a maintenance: one that has not started is withdrawn (its advance notices
    stop, its machines are uncordoned); one under way ends now (its machines are back
    in service, and the tasks parked for it start again)."""
    data = api().delete(f"/v1/maintenance/{q(event)}")
    emit(data, output, lambda d: err.print(
        f"maintenance {d['event']} {'cancelled' if d['state'] == 'cancelled' else 'ended early'}"
        f" ({len(d['machines'])} machine{'s' if len(d['machines']) != 1 else ''})"))
