"""plait task: the tasks of a job, their logs."""

from __future__ import annotations

import sys
import time
from typing import Annotated

import typer

from plait.cli.client import q
from plait.cli.common import Output, api, emit, err, guarded
from plait.cli.jobs import _ack, _task_rows

# -- tasks ---------------------------------------------------------------------------------
task_app = typer.Typer(help="The tasks of a job.", no_args_is_help=True)



@task_app.command("list")
@guarded
def task_list(job: str, output: Output = "table", limit: Annotated[int, typer.Option(
        min=0, help="rows of the table at most (0: all; -o json and yaml give all)")] = 1000,
              ) -> None:
    data = api().get(f"/v1/jobs/{q(job)}/tasks")
    emit(data, output, lambda d: _task_rows(d["tasks"], limit, "--limit 0 for all"))


@task_app.command("restart")
@guarded
def task_restart(job: str, index: int, output: Output = "table") -> None:
    a = api()
    _ack(a, job, a.post(f"/v1/jobs/{q(job)}/tasks/{index}/restart"), f"restart of task {index}",
         False, 0, output)


@task_app.command("logs")
@guarded
def task_logs(job: str, index: int, follow_: Annotated[bool, typer.Option(
        "--follow", "-f", help="keep printing new output")] = False) -> None:
    """What a task printed (the tail kept by the control plane)."""
    a = api()
    after = 0
    while True:
        page = a.get(f"/v1/jobs/{q(job)}/tasks/{index}/logs", after=after)
        if page["skipped"]:
            err.print("[dim](older output dropped)[/dim]")
        sys.stdout.write(page["data"])
        sys.stdout.flush()
        after = page["next"]
        if not follow_:
            return
        if not page["data"]:
            time.sleep(1.0)
