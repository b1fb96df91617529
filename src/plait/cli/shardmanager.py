"""``plait shardmanager``: the Shard Manager service (``serve``) and a look at an
application's shard map (``show``)."""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path
from typing import Annotated

import typer

from plait.cli.client import EXIT_FAILED, EXIT_UNREACHABLE, CliError
from plait.cli.common import guarded

shardmanager_app = typer.Typer(
    help="Shard Manager: shard maps of sharded applications, served as their "
         "TaskController.", no_args_is_help=True)


def _call(method: str, url: str, token_file: Path, timeout: float,
          body: object = None) -> object:
    """One request to Shard Manager: its JSON answer, or a one-line error that names
    the service (not reached, or what it answered)."""
    import httpx

    try:
        r = httpx.request(method, url, json=body, timeout=timeout,
                          headers={"Authorization": f"Bearer {_token(token_file)}"})
    except httpx.HTTPError as exc:
        raise CliError(f"Shard Manager at {url} not reached: {exc} (is plait shardmanager "
                       "serve running there? --url)", EXIT_UNREACHABLE) from None
    if not r.is_success:
        raise CliError(f"Shard Manager answered {r.status_code}: {r.text[:500]}", EXIT_FAILED)
    try:
        return r.json()
    except ValueError:
        raise CliError(f"Shard Manager answered {r.status_code} with no JSON",
                       EXIT_FAILED) from None


def _token(token_file: Path, make: bool = False) -> str:
    """The service's token: read from the file, or (``make``) made there, mode 0600,
    when the file does not exist."""
    if not token_file.exists() and not make:
        raise typer.BadParameter(f"{token_file} does not exist (plait shardmanager serve "
                                 "makes it)", param_hint="--token-file")
    if token_file.exists():
        token = token_file.read_text().strip()
        if len(token) < 16:
            raise typer.BadParameter(f"{token_file}: a token of at least 16 characters",
                                     param_hint="--token-file")
        return token
    token = secrets.token_urlsafe(32)
    token_file.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token


@shardmanager_app.command("serve")
def serve(
    token_file: Annotated[Path, typer.Option(
        help="the service's token (made there, mode 0600, if the file does not exist)")],
    port: Annotated[int, typer.Option(min=0, max=65535)] = 7090,
    host: Annotated[str, typer.Option(help="the address to listen on")] = "127.0.0.1",
    data_dir: Annotated[Path | None, typer.Option(
        help="where the shard maps are saved (none: kept in memory only)")] = None,
    task_networks: Annotated[str | None, typer.Option(
        help="the networks task endpoints may be in, comma-separated CIDRs ('any', "
             "'loopback'); default any, and loopback when --host is loopback. Cloud "
             "metadata addresses and this service are refused whatever this says")] = None,
) -> None:
    """Run Shard Manager until SIGINT or SIGTERM (then it saves its maps and stops)."""
    from plait import logconfig
    from plait.errors import ValidationError
    from plait.shardmanager.service import serve as run
    from plait.taskcontrol.urlpolicy import networks

    logconfig.configure("shardmanager")
    allow = None if task_networks is None else task_networks.split(",")
    try:
        networks(allow or ())
    except ValidationError as exc:
        raise typer.BadParameter(exc.message, param_hint="--task-networks") from None
    run(_token(token_file, make=True), host, port, None if data_dir is None else str(data_dir),
        allow)


@shardmanager_app.command("show")
@guarded
def show(
    app: str,
    url: Annotated[str, typer.Option(help="Shard Manager's URL")] = "http://127.0.0.1:7090",
    token_file: Annotated[Path, typer.Option(help="the service's token")] = Path(
        "sm-token"),
) -> None:
    """An application: its tasks, how many shards are fully replicated, what waits."""
    typer.echo(json.dumps(_call("GET", f"{url.rstrip('/')}/v1/apps/{app}", token_file, 10),
                          indent=2))


@shardmanager_app.command("define")
@guarded
def define(
    app: str,
    job: Annotated[str, typer.Option(help="the plait job whose tasks serve the application")],
    shards: Annotated[int, typer.Option(min=1, max=100_000, help="how many shards")],
    replication: Annotated[int, typer.Option(min=1, max=9)] = 3,
    max_down: Annotated[int, typer.Option(
        min=1, max=8, help="replicas of a shard an operation may leave down")] = 1,
    controller_key: Annotated[str | None, typer.Option(
        help="the job's TaskControl key (default: read from plait with the CLI's "
             "context, as plait job controller-key JOB does)")] = None,
    tasks: Annotated[int | None, typer.Option(
        min=1, max=100_000, help="the job's task count: tasks register indices under it "
        "(default: read from plait with the controller key; define again after a "
        "resize)")] = None,
    url: Annotated[str, typer.Option(help="Shard Manager's URL")] = "http://127.0.0.1:7090",
    token_file: Annotated[Path, typer.Option(help="the service's token")] = Path("sm-token"),
) -> None:
    """Define (or change) a sharded application: Shard Manager lays its shards out over
    the job's tasks and becomes the job's TaskController (point the job's
    task_controller at URL/v1/apps/APP/taskcontrol)."""
    if controller_key is None:
        from plait.cli.common import api
        controller_key = str(api().get(f"/v1/jobs/{job}/controller-key")["key"])
        if tasks is None:
            tasks = int(api().get(f"/v1/jobs/{job}")["task_count"]) or None
    _call("PUT", f"{url.rstrip('/')}/v1/apps/{app}", token_file, 30, {
        "job": job, "shards": shards, "replication": replication, "max_down": max_down,
        "controller_key": controller_key, "tasks": tasks})
    typer.echo(f"application {app}: {shards} shards x {replication} on job {job}; its "
               f"TaskController: {url.rstrip('/')}/v1/apps/{app}/taskcontrol")


@shardmanager_app.command("token")
def token(
    app: str,
    token_file: Annotated[Path, typer.Option(help="the service's token")] = Path("sm-token"),
    reader: Annotated[bool, typer.Option(
        "--reader", help="the clients' read-only token instead: it reads the map, "
                         "nothing else")] = False,
) -> None:
    """The secret of an application's tasks (their ``PLAIT_SM_TOKEN``: they sign their
    registrations with keys derived from it, and never send it), or with --reader the
    token its clients read the map with."""
    from plait.shardmanager.credentials import read_token, task_secret

    typer.echo((read_token if reader else task_secret)(_token(token_file), app))
