"""plait context: named API contexts in the client configuration."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from plait.cli.client import EXIT_INVALID, CliError
from plait.cli.common import Output, emit, err, guarded, rows
from plait.clientconfig import ClientConfig, default_path

# -- context -------------------------------------------------------------------------------
context_app = typer.Typer(help="Named API contexts in the client configuration.",
                          no_args_is_help=True)


@context_app.command("list")
@guarded
def context_list(output: Output = "table") -> None:
    cfg = ClientConfig.load()
    data = {"current_context": cfg.current_context, "path": str(default_path()),
            "contexts": {n: {"url": c.url, "token": "set" if c.token else None}
                         for n, c in cfg.contexts.items()}}
    emit(data, output, lambda d: rows(["", "context", "url", "token"], [
        ["*" if n == d["current_context"] else "", n, c["url"], c["token"] or "-"]
        for n, c in d["contexts"].items()]))


@context_app.command("use")
@guarded
def context_use(name: str) -> None:
    cfg = ClientConfig.load()
    if name not in cfg.contexts:
        raise CliError(f"no context {name!r}; have {', '.join(cfg.contexts) or 'none'}",
                       EXIT_INVALID)
    cfg.current_context = name
    cfg.save()
    err.print(f"using context {name}")


@context_app.command("set")
@guarded
def context_set(name: str, url: Annotated[str, typer.Option()],
                token: Annotated[str | None, typer.Option()] = None,
                use: Annotated[bool, typer.Option(help="make it the current context")] = False,
                ca_file: Annotated[str | None, typer.Option(
                    help="the CA certificate of an https API (plait admin certs writes "
                         "ca.pem)")] = None,
                ) -> None:
    cfg = ClientConfig.load()
    cfg.set_context(name, url, token, use, ca_file=str(Path(ca_file).resolve())
                    if ca_file else None)
    err.print(f"context {name} saved in {cfg.save()}")
