"""plait hostprofile: host profiles, the settings machines carry (admins write them;
owners read them)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from plait.cli.client import EXIT_INVALID, CliError, q
from plait.cli.common import (
    Output,
    _when,
    api,
    emit,
    guarded,
    kv_table,
    load_documents,
    rows,
)
from plait.errors import PlaitError

hostprofile_app = typer.Typer(help="Host profiles: the settings machines carry (Sidekick).",
                              no_args_is_help=True)


def _summary(p: dict[str, Any]) -> str:
    parts = []
    if p.get("sysctls"):
        parts.append(f"{len(p['sysctls'])} sysctls")
    if p.get("cgroup_controllers"):
        parts.append("cgroup " + ",".join(p["cgroup_controllers"]))
    if p.get("turbo") is not None:
        parts.append("turbo " + ("on" if p["turbo"] else "off"))
    if p.get("hugepages_2m") or p.get("hugepages_1g"):
        parts.append(f"hugepages {p.get('hugepages_2m', 0)}x2M {p.get('hugepages_1g', 0)}x1G")
    if p.get("fs_label"):
        parts.append(f"fs {p['fs_label']}")
    if p.get("nic"):
        parts.append(f"{len(p['nic'])} nic settings")
    if p.get("user"):
        parts.append(f"{len(p['user'])} user settings")
    return ", ".join(parts) or "(sets nothing)"


def _rows(items: list[dict[str, Any]]) -> None:
    rows(["name", "version", "settings", "description"],
         [[p["name"], p["version"], _summary(p), p.get("description", "")] for p in items])


@hostprofile_app.command("create")
@guarded
def hostprofile_create(
    file: Annotated[Path, typer.Argument(help="YAML with one or more host profiles")],
    output: Output = "table",
) -> None:
    """Create host profiles from a file, or store their next versions (admin). The
    same settings again make no new version."""
    from plait.model import parse
    from plait.model.hostprofile import HostProfileSpec

    specs = []
    for i, doc in enumerate(load_documents(file)):
        try:
            specs.append(parse(HostProfileSpec, doc))
        except PlaitError as exc:
            raise CliError(f"{file} entry {i + 1}: {exc}", EXIT_INVALID) from None
    a = api()
    made = [a.put(f"/v1/hostprofiles/{q(s.name)}", s.model_dump(mode="json")) for s in specs]
    emit(made, output, _rows)


@hostprofile_app.command("list")
@guarded
def hostprofile_list(output: Output = "table") -> None:
    """Every host profile's current version."""
    data = api().get("/v1/hostprofiles")
    emit(data, output, lambda d: _rows(d["profiles"]))


@hostprofile_app.command("show")
@guarded
def hostprofile_show(
    name: str,
    version: Annotated[int | None, typer.Option(min=1, help="a kept version")] = None,
    versions: Annotated[bool, typer.Option("--versions", help="every kept version")] = False,
    output: Output = "table",
) -> None:
    """A host profile's settings, the entitlements that name it and their machines."""
    a = api()
    if versions:
        data = a.get(f"/v1/hostprofiles/{q(name)}/versions")
        emit(data, output, lambda d: rows(["version", "created", "settings"], [
            [p["version"], _when(p.get("created")), _summary(p)] for p in d["versions"]]))
        return
    data = a.get(f"/v1/hostprofiles/{q(name)}",
                 **({"version": version} if version is not None else {}))
    emit(data, output, lambda d: kv_table(d, f"host profile {name} v{d['version']}"))


@hostprofile_app.command("diff")
@guarded
def hostprofile_diff(
    name: Annotated[str, typer.Argument(help="PROFILE or PROFILE@VERSION")],
    other: Annotated[str | None, typer.Argument(
        help="PROFILE or PROFILE@VERSION to compare with (default: NAME's previous "
             "version against its current one)")] = None,
    output: Output = "table",
) -> None:
    """What changes, setting by setting, from one profile (or version) to another."""
    def split(ref: str) -> tuple[str, int | None]:
        base, at, v = ref.partition("@")
        if at and not v.isdigit():
            raise CliError(f"{ref!r}: a version is a number (PROFILE@3)", EXIT_INVALID)
        return base, int(v) if at else None

    a_name, a_version = split(name)
    params: dict[str, Any] = {}
    if a_version is not None:
        params["version"] = a_version
    if other is not None:
        b_name, b_version = split(other)
        params["to"] = b_name
        if b_version is not None:
            params["to_version"] = b_version
    data = api().get(f"/v1/hostprofiles/{q(a_name)}/diff", **params)

    def show(d: dict[str, Any]) -> None:
        print(f"{d['from']['name']} v{d['from']['version']} -> "
              f"{d['to']['name']} v{d['to']['version']}")
        if not d["changes"]:
            print("(the same settings)")
            return
        rows(["setting", "from", "to"], [[c["setting"], "-" if c["old"] is None else c["old"],
                                          "-" if c["new"] is None else c["new"]]
                                         for c in d["changes"]])
    emit(data, output, show)


@hostprofile_app.command("delete")
@guarded
def hostprofile_delete(name: str, output: Output = "table") -> None:
    """Delete a host profile no entitlement names (admin)."""
    data = api().delete(f"/v1/hostprofiles/{q(name)}")
    emit(data, output, lambda d: print(f"host profile {d['name']} deleted"))
