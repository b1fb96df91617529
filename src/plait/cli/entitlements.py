"""plait entitlement: quota + pseudo-cluster."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from plait.cli.client import EXIT_INVALID, CliError, q
from plait.cli.common import Output, api, emit, guarded, kv_table, load_documents, rows
from plait.errors import PlaitError

# -- entitlements --------------------------------------------------------------------------
entitlement_app = typer.Typer(help="Entitlements: quota + pseudo-cluster.", no_args_is_help=True)


def _loans(e: dict[str, Any]) -> str:
    """A lender, or an elastic entitlement's published terms; its surge buffer."""
    terms = e.get("elastic")
    buffer = f"surge buffer {e['surge_buffer']}" if e.get("surge_buffer") else ""
    if terms:
        said = (f"elastic: {terms['min_notice_seconds']:g}s notice, at most "
                f"{terms['max_reclaim_fraction_per_minute']:.0%}/min reclaimed")
    else:
        said = "lends unused machines" if e.get("lends") else ""
    return "; ".join(x for x in (said, buffer) if x)


def _ent_rows(items: list[dict[str, Any]]) -> None:
    rows(["name", "owner", "quota", "machines", "rru", "host profile", "jobs", "terms"], [
        [e["name"], e["owner"],
         f"{e['quota']['machines']} machines" if e["quota"].get("machines") is not None
         else f"{e['quota']['rru']} RRU", e["machines"], e["rru"], e["host_profile"],
         len(e["jobs"]), _loans(e)] for e in items])


@entitlement_app.command("create")
@guarded
def entitlement_create(
    file: Annotated[Path | None, typer.Argument(help="YAML with one or more entitlements")]
    = None,
    name: Annotated[str | None, typer.Option()] = None,
    owner: Annotated[str | None, typer.Option()] = None,
    machines: Annotated[int | None, typer.Option(help="quota in machines")] = None,
    rru: Annotated[float | None, typer.Option(help="quota in RRU")] = None,
    host_profile: Annotated[str, typer.Option()] = "default",
    surge_buffer: Annotated[int, typer.Option(
        min=0, help="surge tasks its jobs with update.surge may run at once")] = 0,
    output: Output = "table",
) -> None:
    """Create entitlements from a file, or one from options (admin)."""
    if file is not None:
        docs = load_documents(file)
    elif name and owner:
        quota: dict[str, Any] = {"machines": machines} if rru is None else {"rru": rru}
        docs = [{"name": name, "owner": owner, "quota": quota, "host_profile": host_profile,
                 "surge_buffer": surge_buffer}]
    else:
        raise CliError("give a FILE, or --name, --owner and --machines/--rru", EXIT_INVALID)
    from plait.model import Entitlement, parse

    specs = []
    for i, doc in enumerate(docs):
        try:
            specs.append(parse(Entitlement, doc))
        except PlaitError as exc:
            where = f"{file} entry {i + 1}" if file else "entitlement"
            raise CliError(f"{where}: {exc}", EXIT_INVALID) from None
    a = api()
    made = [a.post("/v1/entitlements", s.model_dump(mode="json")) for s in specs]
    emit(made, output, _ent_rows)


@entitlement_app.command("list")
@guarded
def entitlement_list(output: Output = "table") -> None:
    data = api().get("/v1/entitlements")
    emit(data, output, lambda d: _ent_rows(d["entitlements"]))


@entitlement_app.command("show")
@guarded
def entitlement_show(name: str, output: Output = "table") -> None:
    data = api().get(f"/v1/entitlements/{q(name)}")
    emit(data, output, lambda d: kv_table(d, f"entitlement {name}"))
