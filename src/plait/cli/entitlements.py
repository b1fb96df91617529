"""plait entitlement: quota + pseudo-cluster."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from plait.cli.client import EXIT_INVALID, CliError, q
from plait.cli.common import Output, api, emit, guarded, kv_table, load_documents, rows, say
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


def _profiles(text: str) -> list[str]:
    """``--canary-host-profiles``: names separated by commas ('' for none)."""
    return [p.strip() for p in text.split(",") if p.strip()]


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
    canary_host_profiles: Annotated[str, typer.Option(
        help="comma-separated host profiles its owner's canaries may switch machines "
             "to (besides its own)")] = "",
    output: Output = "table",
) -> None:
    """Create entitlements from a file (each one created, or replaced as the file
    writes it: apply), or one from options (admin). An entitlement that exists is not
    replaced from options: ``plait entitlement update`` changes what it is given."""
    a = api()
    if file is not None:
        docs = load_documents(file)
    elif name and owner:
        if machines is not None and rru is not None:
            raise CliError("give one of --machines or --rru, not both", EXIT_INVALID)
        quota: dict[str, Any] = {"machines": machines} if rru is None else {"rru": rru}
        docs = [{"name": name, "owner": owner, "quota": quota, "host_profile": host_profile,
                 "surge_buffer": surge_buffer,
                 "canary_host_profiles": _profiles(canary_host_profiles)}]
        try:
            a.get(f"/v1/entitlements/{q(name)}")
        except CliError as exc:
            if "not found" not in exc.message:
                raise
        else:
            raise CliError(f"entitlement {name} exists: change it with plait entitlement "
                           f"update {name} (--machines, --rru, --host-profile, "
                           "--surge-buffer: what is not given keeps its value), or apply "
                           "a file of its whole spec with plait entitlement create FILE",
                           EXIT_INVALID)
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
    made: list[dict[str, Any]] = []
    for i, spec in enumerate(specs):
        try:
            made.append(a.post("/v1/entitlements", spec.model_dump(mode="json")))
        except CliError as exc:
            if made:  # (what was stored stays: say so)
                done = ", ".join(m["name"] for m in made)
                before = "entry 1" if i == 1 else f"entries 1-{i}"
                exc.message = (f"{file} entry {i + 1}: {exc.message} ({before}, {done}, "
                               f"{'was' if i == 1 else 'were'} created or changed)")
            raise
    emit(made, output, _ent_rows)


@entitlement_app.command("update")
@guarded
def entitlement_update(
    name: str,
    machines: Annotated[int | None, typer.Option(min=0, help="quota in machines")] = None,
    rru: Annotated[float | None, typer.Option(min=0, help="quota in RRU")] = None,
    host_profile: Annotated[str | None, typer.Option()] = None,
    surge_buffer: Annotated[int | None, typer.Option(
        min=0, help="surge tasks its jobs with update.surge may run at once")] = None,
    canary_host_profiles: Annotated[str | None, typer.Option(
        help="comma-separated host profiles its owner's canaries may switch machines "
             "to (besides its own; '' for none)")] = None,
    output: Output = "table",
) -> None:
    """Change an entitlement's quota or settings (admin): what is given changes, the
    rest of its spec (lending, elastic terms, pins, preferences) keeps its value."""
    if machines is not None and rru is not None:
        raise CliError("give one of --machines or --rru, not both", EXIT_INVALID)
    if machines is None and rru is None and host_profile is None and surge_buffer is None \
            and canary_host_profiles is None:
        raise CliError("nothing to change: give --machines, --rru, --host-profile, "
                       "--surge-buffer or --canary-host-profiles", EXIT_INVALID)
    from plait.model import Entitlement, parse

    a = api()
    current = a.get(f"/v1/entitlements/{q(name)}")
    spec = {k: v for k, v in current.items() if k in Entitlement.model_fields}
    if machines is not None:
        spec["quota"] = {"machines": machines}
    if rru is not None:
        spec["quota"] = {"rru": rru}
    if host_profile is not None:
        spec["host_profile"] = host_profile
    if surge_buffer is not None:
        spec["surge_buffer"] = surge_buffer
    if canary_host_profiles is not None:
        spec["canary_host_profiles"] = _profiles(canary_host_profiles)
    try:
        parsed = parse(Entitlement, spec)
    except PlaitError as exc:
        raise CliError(f"entitlement {name}: {exc}", EXIT_INVALID) from None
    answer = a.post("/v1/entitlements", parsed.model_dump(mode="json"))
    emit([answer], output, _ent_rows)
    quota = answer.get("quota") or {}
    if output != "json" and quota.get("machines") is not None and (
            answer.get("machines", 0) > quota["machines"]):
        say(f"entitlement {name} uses {answer['machines']} machines, above its quota of "
            f"{quota['machines']}: nothing is taken back, and its jobs' new tasks wait "
            "until it is under")


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


@entitlement_app.command("delete")
@guarded
def entitlement_delete(name: str, output: Output = "table") -> None:
    """Delete an entitlement that no job uses (admin): its machines go back to the
    region's free pool. Refused while jobs use it (delete or move them first)."""
    data = api().delete(f"/v1/entitlements/{q(name)}")
    released = data.get("released") or []

    def said(d: dict[str, Any]) -> None:
        print(f"entitlement {d['name']} deleted" + (
            f"; {len(released)} machine{'s' if len(released) != 1 else ''} back to the "
            "free pool" if released else ""))
    emit(data, output, said)
