"""plait events: the event log, filtered, followed."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Annotated, Any

import typer

from plait.cli.client import EXIT_INVALID, Api, CliError
from plait.cli.common import Output, _when, api, guarded, out, safe


# -- events --------------------------------------------------------------------------------
def events(
    job: Annotated[str | None, typer.Option()] = None,
    kind: Annotated[str | None, typer.Option()] = None,
    source: Annotated[str | None, typer.Option(help="scheduler, broker, api, auth")] = None,
    entitlement: Annotated[str | None, typer.Option()] = None,
    machine: Annotated[str | None, typer.Option()] = None,
    task: Annotated[int | None, typer.Option(min=0, help="a task of --job (its index)")]
    = None,
    actor: Annotated[str | None, typer.Option(
        help="who: owner:NAME, admin:NAME, or a component (scheduler, health, ...)")] = None,
    request_id: Annotated[str | None, typer.Option(
        "--request-id", help="the events an API request caused (its X-Request-Id)")] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000)] = 50,
    follow_: Annotated[bool, typer.Option("--follow", "-f", help="keep printing new ones")]
    = False,
    output: Output = "table",
) -> None:
    """The region's events, oldest first (the last --limit of them): who did what, to
    which task, and why (the reason, and the TaskControl decision)."""
    guarded(_events)(job, kind, source, entitlement, machine, limit, follow_, output,
                     task=task, actor=actor, request_id=request_id)


def _pages(a: Api, after: int, **filters: Any) -> Iterator[dict[str, Any]]:
    while True:
        page = a.get("/v1/events", after=after, limit=1000, **filters)
        yield from page["events"]
        if page["next"] is None:
            return
        after = page["next"]


def _events(job: str | None, kind: str | None, source: str | None, entitlement: str | None,
            machine: str | None, limit: int, follow_: bool, output: str,
            task: int | None = None, actor: str | None = None,
            request_id: str | None = None) -> None:
    a = api()
    filters = {"job": job, "kind": kind, "source": source, "entitlement": entitlement,
               "machine": machine, "task": task, "actor": actor, "request_id": request_id}
    found = list(_pages(a, 0, **filters))[-limit:]

    def line(e: dict[str, Any]) -> None:
        if output == "json":
            print(json.dumps(e, sort_keys=True))
            return
        subject = e["job"] or e["machine"] or e["entitlement"] or ""
        why = "; ".join(x for x in (e.get("reason"), e.get("decision")) if x)
        who = e.get("actor") or e["source"]
        out.print(safe(f"{_when(e['time'])}  {who:14} {e['kind']:20} {subject:16} "
                       f"{e['message']}" + (f"  [{why}]" if why else "")), highlight=False,
                  markup=False)  # (as it is: "[op ids]" and the brackets are not markup)
    if output not in ("json", "table"):
        raise CliError(f"--output must be table or json, not {output!r}", EXIT_INVALID)
    for e in found:
        line(e)
    after = found[-1]["seq"] if found else 0
    while follow_:
        time.sleep(1.0)
        for e in _pages(a, after, **filters):
            line(e)
            after = e["seq"]


events_app = typer.Typer()
events_app.command()(events)
