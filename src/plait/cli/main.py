"""The ``plait`` command."""

from __future__ import annotations

import json
import time
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from plait import __version__

app = typer.Typer(help="plait: a cluster manager with one control plane per region.",
                  no_args_is_help=True, add_completion=False)
bench_app = typer.Typer(help="Reproducible benchmarks; each prints one JSON object.",
                        no_args_is_help=True)
region_app = typer.Typer(help="Generated regions (fleet topologies).", no_args_is_help=True)
app.add_typer(bench_app, name="bench")
app.add_typer(region_app, name="region")
console = Console(stderr=True)


@app.command()
def version() -> None:
    """Print plait's version."""
    print(__version__)


@bench_app.command("allocator")
def bench_allocator(
    machines: Annotated[int, typer.Option(min=1, help="machines in the region")] = 100_000,
    jobs: Annotated[int, typer.Option(min=1, help="allocation requests to issue")] = 2_000,
    tasks_per_job: Annotated[int, typer.Option(min=1)] = 36,
    dcs: Annotated[int, typer.Option(min=1)] = 5,
    msbs_per_dc: Annotated[int, typer.Option(min=1)] = 12,
    repeat_ratio: Annotated[float, typer.Option(min=0.0, max=1.0,
                                                help="share of requests that repeat an "
                                                     "earlier job's request")] = 0.0,
    entitlements: Annotated[int, typer.Option(min=1)] = 20,
    seed: int = 0,
) -> None:
    """Job allocations per second on a generated region (one JSON object on stdout)."""
    from plait.bench import allocator

    result = allocator.run(machines=machines, jobs=jobs, tasks_per_job=tasks_per_job, dcs=dcs,
                           msbs_per_dc=msbs_per_dc, repeat_ratio=repeat_ratio,
                           entitlements=entitlements, seed=seed)
    print(json.dumps(result))


@region_app.command("describe")
def region_describe(
    machines: Annotated[int, typer.Option(min=1)] = 100_000,
    dcs: Annotated[int, typer.Option(min=1)] = 5,
    msbs_per_dc: Annotated[int, typer.Option(min=1)] = 12,
    seed: int = 0,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON instead of a table")] = False,
) -> None:
    """Generate a region and summarise it: fault domains, machine types, capacity."""
    from plait.allocator import MachineIndex
    from plait.broker import Region
    from plait.model import RegionSpec, describe, generate

    t0 = time.perf_counter()
    fleet = generate(RegionSpec.sized(machines, dcs=dcs, msbs_per_dc=msbs_per_dc), seed=seed)
    index = MachineIndex(fleet, Region(fleet))
    seconds = time.perf_counter() - t0
    summary = dict(describe(fleet))
    summary["index_bytes_per_machine"] = round(index.nbytes() / len(fleet), 1)
    summary["build_and_index_s"] = round(seconds, 3)
    if as_json:
        print(json.dumps(summary))
        return
    table = Table(title=f"region {fleet.region}", show_header=False)
    for key, value in summary.items():
        table.add_row(key, str(value))
    Console().print(table)


@app.command()
def demo(
    machines: Annotated[int, typer.Option(min=100)] = 100_000,
    jobs: Annotated[int, typer.Option(min=1)] = 2_000,
) -> None:
    """Generate a region, walk through entitlements growing and shrinking (the paper's
    Figure 7), then run the allocator benchmark."""
    from plait.allocator import AllocationRequest, Allocator, MachineIndex
    from plait.bench import allocator as bench
    from plait.broker import Region
    from plait.model import Entitlement, Quota, RegionSpec, Resources, generate

    out = Console()
    fleet = generate(RegionSpec.sized(machines))
    region = Region(fleet)
    index = MachineIndex(fleet, region)
    alloc = Allocator(index)
    out.rule(f"[bold]region {fleet.region}: {len(fleet):,} machines, "
             f"{len(fleet.level_names['dc'])} DCs, {len(fleet.level_names['msb'])} MSBs")
    alloc.define(Entitlement(name="web", owner="web-team", quota=Quota(machines=100)))
    task = Resources(cpu=4, memory_gb=16)

    def show(step: str, request: AllocationRequest) -> None:
        result = alloc.allocate(request)
        out.print(f"[bold]{step}")
        table = Table()
        table.add_column("task")
        table.add_column("machine")
        table.add_column("msb")
        for t, m in zip(result.tasks, result.machines, strict=True):
            table.add_row(f"{request.job}/{t}", fleet.name(m),
                          fleet.level_names["msb"][int(fleet.codes["msb"][m])])
        out.print(table)
        usage = alloc.usage("web")
        out.print(f"  claimed {result.machine_ids(result.claimed)}, released "
                  f"{result.machine_ids(result.released)}; entitlement web now holds "
                  f"{usage.machines} machine(s) of its quota of {usage.quota}")

    show("start job D (1 task): a machine joins the entitlement",
         AllocationRequest.of("d", "web", task, allocate=[0]))
    show("start job E (2 tasks): one stacks on D's machine, one more machine joins",
         AllocationRequest.of("e", "web", task, allocate=[0, 1]))
    show("stop job E: its extra machine returns to the free pool",
         AllocationRequest.of("e", "web", task, free=[0, 1]))
    out.rule("[bold]allocator benchmark")
    with Progress(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(),
                  console=console, transient=True) as progress:
        progress.add_task(f"allocating {jobs:,} jobs of 36 tasks on {machines:,} machines",
                          total=None)
        result = bench.run(machines=machines, jobs=jobs)
    out.print_json(json.dumps(result))


if __name__ == "__main__":
    app()
