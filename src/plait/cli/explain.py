"""plait explain: every field of a job spec or an entitlement, from the models."""

from __future__ import annotations

from typing import Annotated

import typer

from plait.cli.common import refuse
from plait.errors import PlaitError

explain_app = typer.Typer()


@explain_app.command("explain")
def explain(
    path: Annotated[str, typer.Argument(
        help="job or entitlement, then fields: job.update.max_unavailable")] = "job",
    markdown: Annotated[bool, typer.Option(
        "--markdown", help="the whole reference as Markdown (docs/spec-reference.md)")]
    = False,
) -> None:
    """What a field of a spec is: its type, default, bounds and meaning (as kubectl
    explain); a nested object lists its fields."""
    from plait.model import reference

    if markdown:
        print(reference.markdown(), end="")
        return
    try:
        about, fields = reference.explain(path)
    except PlaitError as exc:
        raise refuse(exc) from None
    if len(fields) == 1 and fields[0].path == path:
        f = fields[0]
        print(f"{f.path}  <{f.kind}>")
        print(f"  default: {f.default or 'required'}")
        if f.bounds:
            print(f"  bounds:  {f.bounds}")
        print(f"  {f.meaning}")
        return
    import shutil
    import textwrap

    width = min(100, shutil.get_terminal_size((100, 24)).columns)
    print(path)
    if about:
        print(textwrap.fill(about, width))
    print("\nFIELDS:")
    for f in fields:
        name = f.path.rsplit(".", 1)[-1]
        extra = f"default {f.default}" if f.default else "required"
        print(f"  {name}  <{f.kind}>  {extra}" + (f"  ({f.bounds})" if f.bounds else ""))
        print(textwrap.fill(f.meaning, width, initial_indent="      ",
                            subsequent_indent="      "))
        if f.model is not None:
            print(f"      (plait explain {f.path})")
