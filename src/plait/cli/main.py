"""The ``plait`` command."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from plait import __version__
from plait.errors import PlaitError, ValidationError

app = typer.Typer(help="plait: a cluster manager with one control plane per region.",
                  no_args_is_help=True, add_completion=False)
bench_app = typer.Typer(help="Reproducible benchmarks; each prints one JSON object.",
                        no_args_is_help=True)
region_app = typer.Typer(help="Generated regions (fleet topologies).", no_args_is_help=True)
sim_app = typer.Typer(help="Run the real scheduler and allocator on a simulated region.",
                      no_args_is_help=True)
from plait.cli.commands import register  # noqa: E402

register(app)
app.add_typer(bench_app, name="bench")
app.add_typer(region_app, name="region")
app.add_typer(sim_app, name="sim")
console = Console(stderr=True)


def _refuse(exc: PlaitError) -> typer.Exit:
    """Bad input: say what is wrong, in one line, and exit 2 (as a usage error)."""
    console.print(f"[red]error:[/red] {exc}")
    return typer.Exit(2)


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

    try:
        result = allocator.run(machines=machines, jobs=jobs, tasks_per_job=tasks_per_job,
                               dcs=dcs, msbs_per_dc=msbs_per_dc, repeat_ratio=repeat_ratio,
                               entitlements=entitlements, seed=seed)
    except PlaitError as exc:
        raise _refuse(exc) from None
    print(json.dumps(result))


@bench_app.command("scheduler")
def bench_scheduler(
    big_tasks: Annotated[int, typer.Option(min=1, help="tasks of the job re-planned")] = 15_000,
    machines: Annotated[int, typer.Option(min=10)] = 10_000,
    jobs: Annotated[int, typer.Option(min=1)] = 200,
    sim_seconds: Annotated[float, typer.Option(min=1)] = 600.0,
    repeat: Annotated[int, typer.Option(min=1)] = 3,
    seed: int = 0,
) -> None:
    """Reconcile cost of a huge job update and simulated task operations per second."""
    from plait.bench import scheduler

    print(json.dumps(scheduler.run(big_tasks=big_tasks, machines=machines, jobs=jobs,
                                   sim_seconds=sim_seconds, repeat=repeat, seed=seed)))


@bench_app.command("region")
def bench_region(
    machines: Annotated[int, typer.Option(min=100, help="machines in the region")] = 1_000_000,
    shards: Annotated[int, typer.Option(min=1, help="scheduler shards")] = 20,
    tasks_per_machine: Annotated[float, typer.Option(min=0.01, help="tasks of the job mix "
                                                                    "per machine")] = 2.0,
    seed: int = 0,
) -> None:
    """A simulated sharded region: memory of its whole control-plane state and the
    slowest shard's reconcile pass (one JSON object on stdout, progress on stderr)."""
    from plait.bench import region

    if machines < 100_000:
        result = region.run(machines=machines, shards=shards,
                            tasks_per_machine=tasks_per_machine, seed=seed)
    else:
        with Progress(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(),
                      console=console, transient=True) as progress:
            bar = progress.add_task("region", total=1)

            def show(what: str, done: int, total: int) -> None:
                progress.update(bar, description=what, completed=done, total=total)

            result = region.run(machines=machines, shards=shards,
                                tasks_per_machine=tasks_per_machine, seed=seed,
                                progress=show)
    print(json.dumps(result))


@bench_app.command("api")
def bench_api(
    rate: Annotated[float, typer.Option(min=0.001, help="offered job creates per second "
                                                        "(open loop)")] = 200.0,
    seconds: Annotated[float, typer.Option(min=0.001, help="measured seconds of the "
                                                           "base run")] = 20.0,
    connections: Annotated[int, typer.Option(min=1, help="HTTP connections at most")] = 50,
    machines: Annotated[int, typer.Option(min=1, help="machines of the served region")] = 2000,
    search: Annotated[bool, typer.Option(help="search for the highest rate with p99 <= 1 s "
                                              "and no errors")] = True,
    max_rate: Annotated[float, typer.Option(min=0.001, help="highest rate searched")] = 6400.0,
    step_seconds: Annotated[float, typer.Option(min=0.001, help="measured seconds of a "
                                                                "search step")] = 5.0,
    search_budget: Annotated[float, typer.Option(min=0, help="seconds the search may "
                                                             "take")] = 240.0,
    min_achieved_ratio: Annotated[float, typer.Option(
        min=0.0, max=1.0, help="a sustained rate must also be answered at this share of "
                               "the offered rate (0: p99 and errors only)")] = 0.9,
) -> None:
    """Durable job creates per second through the REST API of a `plait serve` process,
    under an open-loop load from another process (one JSON object on stdout)."""
    from plait.bench import api

    try:
        result = api.run(rate=rate, seconds=seconds, connections=connections,
                         machines=machines, sustained_search=search, max_rate=max_rate,
                         step_seconds=step_seconds, search_budget_seconds=search_budget,
                         min_achieved_ratio=min_achieved_ratio)
    except PlaitError as exc:
        raise _refuse(exc) from None
    print(json.dumps(result))


@bench_app.command("taskcontrol")
def bench_taskcontrol(
    jobs: Annotated[int, typer.Option(min=2, help="jobs, each with an HTTP TaskController")]
    = 1000,
    tarpits: Annotated[int, typer.Option(min=0, help="of them behind a tarpit (one byte "
                                                     "every 2 s)")] = 10,
    machines: Annotated[int, typer.Option(min=1, help="machines, each with an agent "
                                                      "heartbeating over the API")] = 100,
    seconds: Annotated[float, typer.Option(min=1, help="measured window")] = 30.0,
    update_rate: Annotated[float, typer.Option(min=0, help="job updates per second "
                                                           "during the window")] = 10.0,
) -> None:
    """TaskControl off the pass: controller calls per second, other tenants' API
    latency and the agents' heartbeat latency while tarpit controllers hang on
    (one JSON object on stdout)."""
    from plait.bench import taskcontrol

    if tarpits >= jobs:
        raise _refuse(ValidationError("tarpits", "must be fewer than the jobs"))
    print(json.dumps(taskcontrol.run(jobs=jobs, tarpits=tarpits, machines=machines,
                                     seconds=seconds, update_rate=update_rate)))


@bench_app.command("recovery")
def bench_recovery(
    machines: Annotated[int, typer.Option(min=2, max=200, help="agents of `plait up` (one "
                                                              "per machine)")] = 20,
    tasks: Annotated[int, typer.Option(min=1, help="tasks of the deploy figure (`sleep "
                                                   "infinity`)")] = 200,
    heartbeat_timeout: Annotated[float, typer.Option(min=0.5, help="seconds without a "
                                                     "heartbeat before a machine is "
                                                     "unavailable")] = 5.0,
    timeout: Annotated[float, typer.Option(min=1, help="seconds each wait may take at "
                                                       "most")] = 120.0,
) -> None:
    """A region of real agents on this box (`plait up`): its start, a deploy of sleeping
    tasks, and the web job recovering from a machine failure (one JSON object on
    stdout)."""
    from plait.bench import recovery

    try:
        result = recovery.run(machines=machines, tasks=tasks,
                              heartbeat_timeout=heartbeat_timeout, timeout=timeout)
    except PlaitError as exc:
        raise _refuse(exc) from None
    print(json.dumps(result))


@bench_app.command("failover")
def bench_failover(
    replicas: Annotated[int, typer.Option(min=2, max=5, help="control-plane replicas")] = 2,
    machines: Annotated[int, typer.Option(min=1, max=50, help="agents (one per machine)")]
    = 3,
    tasks: Annotated[int, typer.Option(min=1, help="sleeping tasks that must not restart")]
    = 6,
    steady_seconds: Annotated[float, typer.Option(
        min=0, help="seconds of steady writes with no fault (leader changes then are "
                    "spurious)")] = 120.0,
    rate: Annotated[float, typer.Option(min=0.1, help="job creations per second")] = 10.0,
    session_timeout: Annotated[float, typer.Option(min=0.2, help="the leader's store "
                                                   "session timeout, seconds")] = 1.0,
    timeout: Annotated[float, typer.Option(min=1, help="seconds each wait may take at "
                                                       "most")] = 120.0,
    frontend: Annotated[bool, typer.Option(
        help="the replicas are a scheduler shard's, behind plait frontend (else an "
             "unsharded control plane's, called directly)")] = True,
) -> None:
    """A replicated scheduler shard on a 3-member ZooKeeper ensemble on this box, behind
    a front end: steady writes with no fault, then SIGKILL of the leader; then an
    entitlement moved between two shards under writes (one JSON object on stdout)."""
    from plait.bench import failover

    try:
        result = failover.run(replicas=replicas, machines=machines, tasks=tasks,
                              steady_seconds=steady_seconds, rate=rate,
                              session_timeout=session_timeout, timeout=timeout,
                              frontend=frontend)
    except PlaitError as exc:
        raise _refuse(exc) from None
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
    try:
        spec = RegionSpec.sized(machines, dcs=dcs, msbs_per_dc=msbs_per_dc)
    except PlaitError as exc:
        raise _refuse(exc) from None
    fleet = generate(spec, seed=seed)
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
    """Run `plait up` on this box and drive it with the CLI (deploy examples/web.yaml,
    its endpoints, a rolling update, a machine that dies, a batch job), then walk
    through entitlements growing and shrinking
    (the paper's Figure 7), run the allocator benchmark and a simulated rollout."""
    from plait.allocator import AllocationRequest, Allocator, MachineIndex
    from plait.bench import allocator as bench
    from plait.broker import Region
    from plait.model import Entitlement, Quota, RegionSpec, Resources, generate

    out = Console()
    examples = Path(__file__).resolve().parents[3] / "examples"
    if (examples / "web.yaml").exists():
        from plait.cli.demo import region_demo

        region_demo(out, lambda args: app(args, standalone_mode=False), examples)
    else:
        out.print("(examples/ not found: skipping the region on this box)")
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
    out.rule("[bold]a rolling update on a simulated region, one task at a time, two "
             "machines failing halfway")
    sim_rollout(tasks=30, machines=60, controller="one-at-a-time", max_unavailable="10%",
                fail=2, crash=False, limit=3600, as_json=False)


admin_app = typer.Typer(help="Operations on the control plane's store.", no_args_is_help=True)
app.add_typer(admin_app, name="admin")
STORE_HELP = "sqlite:///path/plait.db (or a path) or zk://host:port[,host:port]"


admin_entitlement_app = typer.Typer(help="Entitlements across scheduler shards.",
                                    no_args_is_help=True)
admin_app.add_typer(admin_entitlement_app, name="entitlement")


@admin_entitlement_app.command("move")
def admin_entitlement_move(
    name: Annotated[str, typer.Argument(help="the entitlement")],
    to_shard: Annotated[int, typer.Option("--to-shard", min=0,
                                          help="the scheduler shard to manage it from now on")],
    output: Annotated[str, typer.Option("--output", "-o", help="table or json")] = "table",
) -> None:
    """Move an entitlement to another scheduler shard, without restarting any of its
    tasks (its jobs accept no changes for the moment it takes)."""
    from plait.cli.commands import entitlement_move, guarded

    guarded(entitlement_move)(name, to_shard=to_shard, output=output)


@admin_app.command("certs")
def admin_certs(
    out: Annotated[Path, typer.Option(help="where the CA and certificates are written")],
    host: Annotated[list[str], typer.Option(
        help="a name or address the control plane is reached at (repeatable)")],
    days: Annotated[int, typer.Option(min=1, help="validity of the server certificate")]
    = 365,
) -> None:
    """A small CA and a server certificate for a lab: ca.pem (give it to clients and
    agents with --ca-file), server.pem and server-key.pem (plait serve --tls-cert
    --tls-key). An existing CA in --out is reused."""
    from plait.tls import make_lab_certs

    try:
        paths = make_lab_certs(out, host, days)
    except PlaitError as exc:
        raise _refuse(exc) from None
    for kind, path in paths.items():
        print(f"{kind:>10}: {path}")


@admin_app.command("backup")
def admin_backup(
    file: Annotated[str, typer.Argument(help="where to write the backup (JSON)")],
    store: Annotated[str, typer.Option(envvar="PLAIT_STORE", help=STORE_HELP)] = "plait.db",
) -> None:
    """Write a consistent snapshot of every persistent key to FILE."""
    from plait.store.backup import backup, dumps, open_store

    try:
        st = open_store(store)
    except PlaitError as exc:
        raise _refuse(exc) from None
    try:
        document = backup(st)
    finally:
        st.close()
    with open(file, "w") as out:
        out.write(dumps(document))
    console.print(f"{len(document['keys'])} keys written to {file}")


@admin_app.command("restore")
def admin_restore(
    file: Annotated[str, typer.Argument(help="a backup written by 'plait admin backup'")],
    store: Annotated[str, typer.Option(envvar="PLAIT_STORE", help=STORE_HELP)] = "plait.db",
) -> None:
    """Load FILE into an empty store (all keys in one transaction, or none)."""
    from plait.store.backup import open_store, restore

    try:
        with open(file) as src:
            document = json.load(src)
    except (OSError, ValueError) as exc:
        raise _refuse(PlaitError(f"{file}: {exc}")) from None
    try:
        st = open_store(store)
    except PlaitError as exc:
        raise _refuse(exc) from None
    try:
        n = restore(st, document)
    except PlaitError as exc:
        raise _refuse(exc) from None
    finally:
        st.close()
    console.print(f"{n} keys restored from {file}")


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
        raise _refuse(exc) from None
    sim = world(machines=machines)
    s = sim.scheduler
    cap = update.resolve(tasks) or 1
    controllers: dict[str, TaskController | None] = {
        "none": None, "one-at-a-time": OneAtATime(), "default": DefaultController(cap),
        "leader-last": LeaderLast(lambda: 0)}
    if controller not in controllers:
        raise _refuse(PlaitError(f"--controller: unknown {controller!r}; "
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
            "{task.completed}/{task.total}"), TimeElapsedColumn(), console=console,
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
    Console().print(table)
    for event in s.events[-8:]:
        Console().print(f"  t={event.time:7.1f}  {event.kind:16} {event.message}")


if __name__ == "__main__":
    app()
