"""plait region, plait sim, plait demo: the simulated world and the walk-through."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from plait.cli.common import err, out, refuse
from plait.errors import PlaitError

region_app = typer.Typer(help="Generated regions (fleet topologies).", no_args_is_help=True)
sim_app = typer.Typer(help="Run the real scheduler and allocator on a simulated region.",
                      no_args_is_help=True)
demo_app = typer.Typer()


@region_app.callback()
def region_group() -> None:
    """Generated regions (fleet topologies)."""


@sim_app.callback()
def sim_group() -> None:
    """Run the real scheduler and allocator on a simulated region."""


@region_app.command("describe")
def region_describe(
    machines: Annotated[int, typer.Option(min=1)] = 100_000,
    dcs: Annotated[int, typer.Option(min=1)] = 5,
    msbs_per_dc: Annotated[int, typer.Option(min=1)] = 12,
    seed: int = 0,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON instead of a table")] = False,
) -> None:
    """Generate a region and summarise it: fault domains, machine types, capacity."""
    from plait.model import RegionSpec, describe, generate
    from plait.scheduler.wiring import wire

    t0 = time.perf_counter()
    try:
        spec = RegionSpec.sized(machines, dcs=dcs, msbs_per_dc=msbs_per_dc)
    except PlaitError as exc:
        raise refuse(exc) from None
    fleet = generate(spec, seed=seed)
    index = wire(fleet).index
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
    out.print(table)


@demo_app.command()
def demo(
    machines: Annotated[int, typer.Option(min=100)] = 100_000,
    jobs: Annotated[int, typer.Option(min=1)] = 2_000,
) -> None:
    """Run `plait up` on this box and drive it with the CLI (deploy examples/web.yaml,
    its endpoints, a rolling update, a machine that dies, a batch job), then walk
    through entitlements growing and shrinking
    (the paper's Figure 7), run the allocator benchmark and a simulated rollout."""
    from rich.console import Console

    from plait.allocator import AllocationRequest
    from plait.bench import allocator as bench
    from plait.cli.main import app
    from plait.model import Entitlement, Quota, RegionSpec, Resources, generate
    from plait.scheduler.wiring import wire

    out = Console()
    examples = Path(__file__).resolve().parents[3] / "examples"
    if (examples / "web.yaml").exists():
        from plait.cli.demo import region_demo

        region_demo(out, lambda args: app(args, standalone_mode=False), examples)
    else:
        out.print("(examples/ not found: skipping the region on this box)")
    fleet = generate(RegionSpec.sized(machines))
    core = wire(fleet)
    alloc = core.allocator
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
                  console=err.console, transient=True) as progress:
        progress.add_task(f"allocating {jobs:,} jobs of 36 tasks on {machines:,} machines",
                          total=None)
        result = bench.run(machines=machines, jobs=jobs)
    out.print_json(json.dumps(result))
    out.rule("[bold]a rolling update on a simulated region, one task at a time, two "
             "machines failing halfway")
    sim_rollout(tasks=30, machines=60, controller="one-at-a-time", max_unavailable="10%",
                fail=2, crash=False, limit=3600, as_json=False)


@sim_app.command("run")
def sim_run(
    file: Annotated[Path, typer.Argument(help="a scenario file (examples/scenarios/)")],
    plot: Annotated[Path | None, typer.Option(help="write the scenario's plot here (PNG)")]
    = None,
    hours: Annotated[float | None, typer.Option(
        min=0.01, help="simulate this many hours instead of the file's")] = None,
    machines: Annotated[int | None, typer.Option(
        min=2, help="this many machines instead of the file's")] = None,
    seed: Annotated[int | None, typer.Option(help="another random seed")] = None,
) -> None:
    """Run a scenario file on the simulated clock with the real scheduler, allocator
    and Sidekick; print its figures as one JSON object (and draw its plot)."""
    from plait.sim import files

    overrides = {k: v for k, v in (("hours", hours), ("machines", machines),
                                   ("seed", seed)) if v is not None}
    try:
        kind, scenario = files.load(file, overrides)
    except PlaitError as exc:
        raise refuse(exc) from None
    if plot is not None:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise refuse(PlaitError("--plot needs matplotlib: pip install 'plait[plot]'")
                         ) from None
    with Progress(TextColumn(f"simulating {file.name}"), BarColumn(),
                  TextColumn("{task.percentage:>3.0f}%"), TimeElapsedColumn(),
                  console=err.console, transient=True) as progress:
        bar = progress.add_task("run", total=1.0)
        figures, draw = kind.run(scenario, lambda done: progress.update(bar, completed=done))
    if plot is not None:
        draw(str(plot))
        err.print(f"plot: {plot}")
    print(json.dumps(figures))


@sim_app.command("rollout")
def sim_rollout(
    tasks: Annotated[int, typer.Option(min=1)] = 30,
    machines: Annotated[int, typer.Option(min=2)] = 60,
    controller: Annotated[str, typer.Option(
        help="none | one-at-a-time | leader-last | default")] = "none",
    max_unavailable: Annotated[str, typer.Option(help="a count or a percentage")] = "10%",
    fail: Annotated[int, typer.Option(min=0, help="machines that fail mid-rollout")] = 0,
    crash: Annotated[bool, typer.Option(help="the new version crashes")] = False,
    limit: Annotated[float, typer.Option(min=1, help="simulated seconds at most")] = 3600,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Deploy a job on a simulated region, then roll out a new version: the real
    scheduler, allocator and TaskControl on the simulated clock."""
    from plait.model import UpdatePolicy
    from plait.model.base import build
    from plait.sim.scenarios import job_spec, world
    from plait.taskcontrol import DefaultController, LeaderLast, OneAtATime
    from plait.taskcontrol.protocol import TaskController

    try:
        update = build(UpdatePolicy, max_unavailable=int(max_unavailable)
                       if max_unavailable.isdigit() else max_unavailable)
    except PlaitError as exc:
        raise refuse(exc) from None
    sim = world(machines=machines)
    s = sim.scheduler
    cap = update.resolve(tasks) or 1
    controllers: dict[str, TaskController | None] = {
        "none": None, "one-at-a-time": OneAtATime(), "default": DefaultController(cap),
        "leader-last": LeaderLast(lambda: 0)}
    if controller not in controllers:
        raise refuse(PlaitError(f"--controller: unknown {controller!r}; "
                                 f"one of {', '.join(controllers)}"))
    spec = job_spec("demo", tasks, cpu=2, memory_gb=4, update=update)
    s.create_job(spec, sim.now, controller=controllers[controller])
    sim.run_until(lambda: len(s.discovery("demo")) == tasks, limit)
    start = sim.now
    s.update_job(spec.model_copy(update={"command": "crash" if crash else "serve",
                                         "args": ("--v2",)}), sim.now)
    job = s.job("demo")
    worst = 0
    failed = False
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn(
            "{task.completed}/{task.total}"), TimeElapsedColumn(), console=err.console,
            transient=as_json) as progress:
        bar = progress.add_task("rolling out version 2", total=tasks)
        while sim.now - start < limit:
            sim.step()
            worst = max(worst, s.unavailable(job))
            done = sum(1 for r in job.tasks.values() if r.spec_version == 2 and r.serving)
            progress.update(bar, completed=done)
            if fail and not failed and done >= tasks // 2:
                victims = sorted({m for _, m in s.discovery("demo")})[:fail]
                sim.fail(victims)
                failed = True
            if not job.rollout_active or job.halted:
                break
    summary = {
        "tasks": tasks, "controller": controller, "max_unavailable": cap,
        "rollout_seconds": sim.now - start, "finished": not job.rollout_active,
        "halted": job.halted, "worst_unavailable": worst,
        "serving": len(s.discovery("demo")), **s.counters,
    }
    if as_json:
        print(json.dumps(summary))
        return
    table = Table(title="rollout", show_header=False)
    for key, value in summary.items():
        table.add_row(key, str(value))
    out.print(table)
    for event in s.events[-8:]:
        out.print(f"  t={event.time:7.1f}  {event.kind:16} {event.message}")
