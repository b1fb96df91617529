"""The ``plait`` command.

Each noun lives in a module of its own (``plait.cli.jobs``, ``plait.cli.machines``,
...; the daemons in ``plait.cli.daemons``, the ``plait up`` supervisor in
``plait.cli.up``) and is loaded only when named: ``plait job deploy`` imports the
job verbs and the client, not the scheduler, the simulator or the benchmarks.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Annotated, Any

import typer
import typer.main
from typer.core import TyperGroup

from plait import __version__

#: command -> (module, the Typer app that holds it, its one-line help for listings)
LAZY: dict[str, tuple[str, str, str]] = {
    "serve": ("plait.cli.daemons", "serve_app",
              "Run a replica of the control plane and its API."),
    "scheduler": ("plait.cli.daemons", "scheduler_app",
                  "Run a replica of scheduler shard --shard S of a sharded region."),
    "frontend": ("plait.cli.daemons", "frontend_app",
                 "Run a front end of a sharded region."),
    "agent": ("plait.cli.daemons", "agent_app", "Run the agent of one machine."),
    "up": ("plait.cli.up", "up_app", "A whole region on this box."),
    "discover": ("plait.cli.discovery", "discover_app",
                 "The task endpoints enabled in service discovery."),
    "events": ("plait.cli.events", "events_app", "The event log, filtered or followed."),
    "context": ("plait.cli.contexts", "context_app",
                "Named API contexts in the client configuration."),
    "entitlement": ("plait.cli.entitlements", "entitlement_app",
                    "Entitlements: quota + pseudo-cluster."),
    "hostprofile": ("plait.cli.hostprofiles", "hostprofile_app",
                    "Host profiles: the settings machines carry (Sidekick)."),
    "job": ("plait.cli.jobs", "job_app",
            "Jobs: deploy, inspect, update, resize, restart, roll back."),
    "task": ("plait.cli.tasks", "task_app", "The tasks of a job."),
    "push": ("plait.cli.push", "push_app",
             "Push a spec to a job in stages with health gates (status, abort)."),
    "canary": ("plait.cli.push", "canary_app",
               "Canaries: a spec on some of a job's tasks for a while."),
    "machine": ("plait.cli.machines", "machine_app",
                "Machines: inspect, fail, drain, cordon (admin)."),
    "maintenance": ("plait.cli.maintenance", "maintenance_app",
                    "Planned maintenance (admin)."),
    "token": ("plait.cli.tokens", "token_app", "API tokens (admin)."),
    "owner": ("plait.cli.owners", "owner_app", "Owners: their limits on jobs and tasks."),
    "admin": ("plait.cli.admin", "admin_app", "Operations on the control plane's store."),
    "bench": ("plait.cli.bench", "bench_app",
              "Reproducible benchmarks; each prints one JSON object."),
    "region": ("plait.cli.sim", "region_app", "Generated regions (fleet topologies)."),
    "explain": ("plait.cli.explain", "explain_app",
                "Every field of a job spec or an entitlement: type, default, bounds."),
    "shardmanager": ("plait.cli.shardmanager", "shardmanager_app",
                     "Shard Manager: shard maps of sharded applications (serve, show)."),
    "sim": ("plait.cli.sim", "sim_app",
            "Run the real scheduler and allocator on a simulated region."),
    "demo": ("plait.cli.sim", "demo_app",
             "Run plait up on this box and drive it with the CLI, then a simulated region."),
}


class LazyGroup(TyperGroup):
    """The top-level command: a noun's module is imported, and its commands built,
    when the noun is named (``--help`` lists them all, and so builds them all)."""

    def list_commands(self, ctx: Any) -> list[str]:
        return sorted({*super().list_commands(ctx), *LAZY})

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        if cmd_name not in self.commands and cmd_name in LAZY:
            module, attr, _ = LAZY[cmd_name]
            sub = getattr(importlib.import_module(module), attr)
            command = typer.main.get_command(sub)
            command.name = cmd_name
            self.commands[cmd_name] = command
        return super().get_command(ctx, cmd_name)


app = typer.Typer(cls=LazyGroup, help="plait: a cluster manager with one control plane per "
                  "region.", no_args_is_help=True, add_completion=False)


@app.callback()
def main(
    context: Annotated[str | None, typer.Option(help="client context to use")] = None,
    url: Annotated[str | None, typer.Option(help="API URL, or several comma-separated "
                                                 "(else PLAIT_URL, context)")] = None,
    token: Annotated[str | None, typer.Option(help="API token (else PLAIT_TOKEN, "
                                                   "context)")] = None,
) -> None:
    """plait: a cluster manager with one control plane per region."""
    from plait.cli.common import target

    target.context, target.url, target.token = context, url, token


@app.command()
def version() -> None:
    """Print plait's version."""
    print(__version__)


#: verbs that make a few API calls and end: their process exits without the
#: interpreter's teardown (tens of milliseconds of freeing modules one by one)
CLIENT_VERBS = frozenset({"canary", "context", "discover", "entitlement", "hostprofile", "job",
                          "machine", "maintenance", "push", "task", "token", "version"})


#: the top-level options a client verb also takes after its noun (``plait job list
#: --url URL``), as kubectl takes ``--context`` anywhere; ``plait context`` has options
#: of its own by these names, so they are not moved there
GLOBAL_OPTIONS = ("--url", "--token", "--context")
HOISTED = CLIENT_VERBS - {"context", "version"} | {"events"}


def hoist(argv: list[str]) -> list[str]:
    """``argv`` with ``--url``/``--token``/``--context`` given after a client noun moved
    before it, where the top-level command reads them."""
    at = 1
    while at < len(argv) and argv[at].split("=", 1)[0] in GLOBAL_OPTIONS:
        at += 1 if "=" in argv[at] else 2  # (already before the noun)
    if at >= len(argv) or argv[at] not in HOISTED:
        return argv
    moved: list[str] = []
    rest: list[str] = []
    k = at + 1
    while k < len(argv):
        arg = argv[k]
        if arg == "--":
            rest += argv[k:]
            break
        if arg.split("=", 1)[0] in GLOBAL_OPTIONS:
            if "=" in arg:
                moved.append(arg)
                k += 1
                continue
            if k + 1 < len(argv):
                moved += argv[k:k + 2]
                k += 2
                continue
        rest.append(arg)
        k += 1
    return [*argv[:at], *moved, argv[at], *rest]


def run() -> None:
    """The ``plait`` console script."""
    sys.argv[:] = hoist(sys.argv)
    quick = len(sys.argv) > 1 and sys.argv[1] in CLIENT_VERBS
    if not quick:
        app()
        return
    code = 0
    try:
        app()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    app()
