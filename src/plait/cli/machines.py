"""plait machine: inspect, fail, repair, cordon, drain (admin)."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from plait.cli.client import EXIT_INVALID, CliError, q
from plait.cli.common import (
    Output,
    _when,
    api,
    emit,
    err,
    gathered,
    guarded,
    kv_table,
    out,
    parse_duration,
    rows,
    say,
    tabulated,
)

# -- machines ------------------------------------------------------------------------------
machine_app = typer.Typer(help="Machines: inspect, fail, drain, cordon (admin).",
                          no_args_is_help=True)


MACHINE_COLUMNS = ["id", "state", "cordoned", "entitlement", "dc", "msb", "rack", "type",
                   "tasks", "host profile"]
#: with a loan column (``--loaned``, or a page with a machine on loan)
LOAN_COLUMNS = [*MACHINE_COLUMNS, "loan"]


def _profile(m: dict[str, Any]) -> str:
    p = m.get("host_profile")
    if not p:
        return ""  # (another shard's: plait machine show M asks it)
    applied, target = p.get("applied") or "(none)", p.get("target")
    if m.get("entitlement") is None:
        return str(applied)  # (the free pool keeps what a machine carries)
    if p.get("error"):
        return f"{applied} (switch to {target} failing)"
    if applied != target:
        return f"{applied} -> {target}"
    return str(applied or "")


def _loan(m: dict[str, Any]) -> str:
    loan = m.get("loan")
    if not loan:
        return ""
    if loan.get("revoking"):
        return f"revoking: tasks off by {_when(loan.get('deadline'))}"
    return "on loan"


def _machine_row(m: dict[str, Any]) -> list[Any]:
    return [m["id"], m["state"], "yes" if m["cordoned"] else "", m["entitlement"] or "(free)",
            m["fault_domain"]["dc"], m["fault_domain"]["msb"], m["fault_domain"]["rack"],
            m["type"], m["tasks"], _profile(m)]


def _loan_row(m: dict[str, Any]) -> list[Any]:
    return [*_machine_row(m), _loan(m)]


@machine_app.command("list")
@guarded
def machine_list(state: Annotated[str | None, typer.Option()] = None,
                 entitlement: Annotated[str | None, typer.Option()] = None,
                 loaned: Annotated[bool, typer.Option(
                     "--loaned", help="only machines on loan to elastic entitlements")] = False,
                 limit: Annotated[int, typer.Option(min=1, max=1000,
                                                    help="machines per page")] = 100,
                 offset: Annotated[int, typer.Option(min=0)] = 0,
                 continue_: Annotated[str | None, typer.Option(
                     "--continue", help="the next page (the token a page printed)")] = None,
                 all_: Annotated[bool, typer.Option(
                     "--all", help="every page, printed as each comes")] = False,
                 output: Output = "table") -> None:
    """Machines in the region's order, filtered on the server: one page (``--limit``
    from ``--offset``, or after ``--continue``), or ``--all`` of them."""
    a = api()
    if all_ or continue_:
        pages = a.pages("/v1/machines", "machines", limit, continue_, one=not all_,
                        state=state, entitlement=entitlement, loaned=loaned or None)
        if output == "json":
            found, token = gathered(pages)
            emit({"machines": found, "continue": token}, output, lambda d: None)
            return
        token = tabulated(pages, LOAN_COLUMNS if loaned else MACHINE_COLUMNS,
                          _loan_row if loaned else _machine_row)
        if token:
            say(f"more: plait machine list --continue {token}")
        return
    data = a.get("/v1/machines", state=state, entitlement=entitlement, limit=limit,
                 offset=offset, loaned=loaned or None)

    def show(d: dict[str, Any]) -> None:
        if loaned or any(m.get("loan") for m in d["machines"]):
            rows(LOAN_COLUMNS, [_loan_row(m) for m in d["machines"]])
        else:
            rows(MACHINE_COLUMNS, [_machine_row(m) for m in d["machines"]])
        shown, total, first = len(d["machines"]), d["total"], d["offset"]
        if shown and (first or shown < total):  # (a part: which)
            out.print(f"machines {first + 1}-{first + shown} of {total}")
        else:
            out.print(f"{shown} of {total} machines")
        if d.get("continue"):
            say(f"more: plait machine list --limit {limit} --continue {d['continue']}")
    emit(data, output, show)


@machine_app.command("show")
@guarded
def machine_show(machine: str, output: Output = "table") -> None:
    data = api().get(f"/v1/machines/{q(machine)}")
    emit(data, output, lambda d: kv_table(d, f"machine {machine}"))


def _machine_op(machine: str, op: str, body: Any, output: str) -> None:
    data = api().post(f"/v1/machines/{q(machine)}/{op}", body)
    def said(d: dict[str, Any]) -> None:
        what = d.get("event") or d.get("ended")
        err.print(f"machine {machine}: {op}" + (f" ({json.dumps(what)})" if what else ""),
                  markup=False)
    emit(data, output, said)


@machine_app.command("fail")
@guarded
def machine_fail(machine: str, output: Output = "table") -> None:
    """Mark a machine failed: its tasks are moved per TaskControl."""
    _machine_op(machine, "fail", None, output)


@machine_app.command("repair")
@guarded
def machine_repair(machine: str, output: Output = "table") -> None:
    _machine_op(machine, "repair", None, output)


@machine_app.command("cordon")
@guarded
def machine_cordon(machine: str, output: Output = "table") -> None:
    """No new tasks on the machine; running ones stay."""
    _machine_op(machine, "cordon", None, output)


@machine_app.command("uncordon")
@guarded
def machine_uncordon(machine: str, output: Output = "table") -> None:
    _machine_op(machine, "uncordon", None, output)


@machine_app.command("drain")
@guarded
def machine_drain(machine: str, deadline: Annotated[str | None, typer.Option(
        help="time TaskControl has to move the tasks (300, 90s, 10m, 2h)")] = None,
        to: Annotated[str, typer.Option(
            help="once empty: free (back to the free pool) or maintenance (out of "
                 "service until uncordoned)")] = "maintenance",
        output: Output = "table") -> None:
    """Cordon and move every task off through TaskControl; stop what is left at the
    deadline; then give the machine back to the free pool or keep it out of service."""
    if to not in ("free", "maintenance"):
        raise CliError(f"--to {to}: free or maintenance", EXIT_INVALID)
    body: dict[str, object] = {"to": to}
    if deadline is not None:
        body["deadline_seconds"] = parse_duration(deadline)
    _machine_op(machine, "drain", body, output)
