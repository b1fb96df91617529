"""plait discover: the tasks of a job enabled in service discovery."""

from __future__ import annotations

import typer

from plait.cli.client import q
from plait.cli.common import Output, api, emit, guarded, rows


# -- discovery -----------------------------------------------------------------------------
def discover(job: str, output: Output = "table") -> None:
    """The task endpoints enabled in service discovery."""
    guarded(_discover)(job, output)


def _discover(job: str, output: str) -> None:
    data = api().get(f"/v1/discovery/{q(job)}")
    emit(data, output, lambda d: rows(["index", "machine", "endpoint"], [
        [e["index"], e["machine"], e.get("endpoint") or "-"] for e in d["endpoints"]]))


discover_app = typer.Typer()
discover_app.command()(discover)
