"""plait bench: reproducible benchmarks; each prints one JSON object."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from plait.cli.common import err, refuse
from plait.errors import PlaitError, ValidationError

bench_app = typer.Typer(help="Reproducible benchmarks; each prints one JSON object.",
                        no_args_is_help=True)


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
    scenario: Annotated[str, typer.Option(help="default (100K machines, 20 entitlements), "
                                               "big-entitlement (one entitlement holding "
                                               "half the region, all with room) or "
                                               "rack-spread (jobs spread over racks)")] = "default",
) -> None:
    """Job allocations per second on a generated region (one JSON object on stdout)."""
    from plait.bench import allocator

    try:
        result = allocator.run(machines=machines, jobs=jobs, tasks_per_job=tasks_per_job,
                               dcs=dcs, msbs_per_dc=msbs_per_dc, repeat_ratio=repeat_ratio,
                               entitlements=entitlements, seed=seed, scenario=scenario)
    except PlaitError as exc:
        raise refuse(exc) from None
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
                      console=err.console, transient=True) as progress:
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
        raise refuse(exc) from None
    print(json.dumps(result))


@bench_app.command("throughput")
def bench_throughput(
    frontend: Annotated[bool, typer.Option(help="the clients call plait frontend, in front "
                                                "of the serve as scheduler shard 0 (else "
                                                "the serve directly)")] = False,
    machines: Annotated[int, typer.Option(min=1, help="machines of the served region")] = 1000,
    jobs: Annotated[int, typer.Option(min=1, help="one-task jobs (1 cpu) created")] = 2000,
    clients: Annotated[int, typer.Option(min=1, help="client processes, one keep-alive "
                                                     "connection each, closed loop")] = 8,
    pass_gap: Annotated[float | None, typer.Option(
        min=0.0, max=10.0, help="the serve's --min-pass-gap (default: the serve's own, "
                                "0.05 s); 1 s leaves the request path nearly alone with "
                                "the interpreter: what the front door takes without the "
                                "pass beside it")] = None,
) -> None:
    """Single-job creates from many client processes: acknowledged per second, placed
    per second, latency (one JSON object on stdout)."""
    from plait.bench import throughput

    try:
        result = throughput.run(machines=machines, jobs=jobs, clients=clients,
                                frontend=frontend,
                                serve_extra=() if pass_gap is None else (
                                    "--min-pass-gap", str(pass_gap)))
    except PlaitError as exc:
        raise refuse(exc) from None
    print(json.dumps(result))


@bench_app.command("createcost")
def bench_createcost(
    machines: Annotated[int, typer.Option(min=1, help="machines of the region")] = 1000,
    jobs: Annotated[int, typer.Option(min=2, help="one-task jobs (1 cpu) created per "
                                                  "measurement")] = 2000,
    batch: Annotated[list[int] | None, typer.Option(
        min=1, max=256, help="a size of the front end's batches of creates to measure "
                             "(repeat the option; default 1, 4 and 16)")] = None,
    pass_batch: Annotated[int, typer.Option(min=1, help="creates between two passes")] = 24,
) -> None:
    """CPU per create of a shard's request path (by batch size) and of its pass over a
    job's life, in-process (one JSON object on stdout)."""
    from plait.bench import createcost

    try:
        result = createcost.run(machines=machines, jobs=jobs,
                                batches=tuple(batch or (1, 4, 16)), pass_batch=pass_batch)
    except PlaitError as exc:
        raise refuse(exc) from None
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
        raise refuse(ValidationError("tarpits", "must be fewer than the jobs"))
    print(json.dumps(taskcontrol.run(jobs=jobs, tarpits=tarpits, machines=machines,
                                     seconds=seconds, update_rate=update_rate)))


@bench_app.command("gates")
def bench_gates(
    jobs: Annotated[int, typer.Option(min=2, help="one-task jobs, each pushing behind an "
                                                  "HTTP gate")] = 1000,
    owners: Annotated[int, typer.Option(min=2, help="owners sharing the jobs")] = 5,
    tarpits: Annotated[int, typer.Option(min=0, help="of the first owner's jobs, those "
                                                     "whose gate is a tarpit")] = 10,
    rate: Annotated[float, typer.Option(min=0.1, help="pushes started per second")] = 12.0,
    machines: Annotated[int, typer.Option(min=1, help="simulated machines")] = 250,
) -> None:
    """Gates per owner: other owners' push stage times with one owner's tarpit gates
    and, in the same run, without them (one JSON object on stdout)."""
    from plait.bench import gates

    if tarpits * owners >= jobs:
        raise refuse(ValidationError("tarpits", "must be fewer than the first owner's jobs"))
    with Progress(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(),
                  console=err.console, transient=True) as progress:
        bar = progress.add_task("pushes completed", total=1)

        def show(done: int, total: int) -> None:
            progress.update(bar, completed=done, total=total)

        result = gates.run(jobs=jobs, owners=owners, tarpits=tarpits, rate=rate,
                           machines=machines, progress=show)
    print(json.dumps(result))


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
        raise refuse(exc) from None
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
        raise refuse(exc) from None
    print(json.dumps(result))


@bench_app.command("cli")
def bench_cli(
    sequential: Annotated[int, typer.Option(min=1, help="deploys of an unchanged spec, "
                                                        "one after another")] = 20,
    parallel: Annotated[int, typer.Option(min=1, help="deploys of distinct jobs")] = 200,
    shells: Annotated[int, typer.Option(min=1, help="shells running them at once")] = 8,
) -> None:
    """The plait command's wall time: one deploy, and deploys from parallel shells, against
    a plait serve process (one JSON object on stdout)."""
    from plait.bench import cli

    print(json.dumps(cli.run(sequential=sequential, parallel=parallel, shells=shells)))


@bench_app.command("chaos")
def bench_chaos(
    seconds: Annotated[float, typer.Option(min=1, help="seconds of random kills")] = 300.0,
    seed: Annotated[int, typer.Option(help="the kill schedule's seed")] = 0,
    machines: Annotated[int, typer.Option(min=2, max=32)] = 4,
) -> None:
    """plait up under random SIGKILLs of tasks, agents and the control plane while a job
    is updated and resized: acknowledged writes lost, double serving, convergence and
    processes left behind (one JSON object on stdout)."""
    from plait.bench import chaos

    print(json.dumps(chaos.run(seconds=seconds, seed=seed, machines=machines)))


@bench_app.command("versions")
def bench_versions(
    updates: Annotated[int, typer.Option(min=10, help="updates of the job")] = 40,
    spec_kb: Annotated[int, typer.Option(min=1, max=900, help="kB of environment in "
                                                             "its spec")] = 40,
    keep_versions: Annotated[int, typer.Option(min=1, max=100)] = 10,
) -> None:
    """A job's update latency and record size as its versions pile up (one JSON object
    on stdout)."""
    from plait.bench import versions

    print(json.dumps(versions.run(updates=updates, spec_kb=spec_kb,
                                  keep_versions=keep_versions)))


@bench_app.command("ui")
def bench_ui(
    machines: Annotated[int, typer.Option(min=10)] = 1000,
    jobs: Annotated[int, typer.Option(min=1)] = 200,
    tasks_per_job: Annotated[int, typer.Option(min=1)] = 5,
    requests: Annotated[int, typer.Option(min=5)] = 50,
) -> None:
    """How fast the web UI's pages answer for a region of --machines and --jobs
    (``ui_p99_ms``: the slowest page's 99th percentile)."""
    from plait.bench import ui

    print(json.dumps(ui.run(machines=machines, jobs=jobs, tasks_per_job=tasks_per_job,
                            requests=requests)))


@bench_app.command("observability")
def bench_observability(
    machines: Annotated[int, typer.Option(min=1, help="machines of the allocation "
                                                      "figure's region")] = 2000,
    jobs: Annotated[int, typer.Option(min=1, help="jobs placed and freed each allocation "
                                                  "round")] = 50,
    tasks_per_job: Annotated[int, typer.Option(min=1)] = 10,
    alloc_rounds: Annotated[int, typer.Option(min=1, help="allocation rounds (each "
                                                          "request on both sides)")] = 40,
    api_machines: Annotated[int, typer.Option(min=1, help="machines of each served "
                                                          "region")] = 200,
    api_requests: Annotated[int, typer.Option(min=1, help="job creates (then gets) per "
                                                          "API round and side")] = 200,
    api_rounds: Annotated[int, typer.Option(min=1, help="API rounds")] = 12,
    api_starts: Annotated[int, typer.Option(min=1, help="pairs of fresh servers the API "
                                                        "rounds are spread over")] = 4,
    ui_machines: Annotated[int, typer.Option(min=10, help="machines of the web UI's "
                                                          "region")] = 1000,
    ui_jobs: Annotated[int, typer.Option(min=1)] = 200,
    ui_requests: Annotated[int, typer.Option(min=5, help="fetches of each page")] = 50,
) -> None:
    """What observability costs on the hot paths: allocations and API requests with it
    on and off, interleaved (one JSON object on stdout)."""
    from plait.bench import observability

    print(json.dumps(observability.run(
        machines=machines, jobs=jobs, tasks_per_job=tasks_per_job,
        alloc_rounds=alloc_rounds, api_machines=api_machines, api_requests=api_requests,
        api_rounds=api_rounds, api_starts=api_starts, ui_machines=ui_machines,
        ui_jobs=ui_jobs, ui_requests=ui_requests)))


@bench_app.command("lists")
def bench_lists(
    jobs: Annotated[int, typer.Option(min=1, help="one-task jobs to list")] = 2000,
    machines: Annotated[int, typer.Option(min=1)] = 1000,
    clients: Annotated[int, typer.Option(min=1, help="threads creating the jobs")] = 8,
    repeat: Annotated[int, typer.Option(min=1, help="reads of each kind")] = 5,
    page: Annotated[int, typer.Option(min=1, help="the page's limit")] = 100,
) -> None:
    """GET /v1/jobs whole and by pages, and plait job list, against a plait serve process
    with many jobs (one JSON object on stdout)."""
    from plait.bench import lists

    print(json.dumps(lists.run(jobs=jobs, machines=machines, clients=clients, repeat=repeat,
                               page=page)))


@bench_app.command("agent")
def bench_agent(
    tasks: Annotated[int, typer.Option(min=1, help="tasks of the one real agent, each "
                                                   "probed over HTTP")] = 10,
    agents: Annotated[int, typer.Option(min=1, help="agents connected to the idle "
                                                    "control plane")] = 20,
    seconds: Annotated[float, typer.Option(min=1, help="each measured window")] = 60.0,
    probe_interval: Annotated[float, typer.Option(min=0.1, help="seconds between a "
                                                                "task's probes")] = 1.0,
    settle_timeout: Annotated[float, typer.Option(min=1, help="seconds the tasks (the "
                                                              "agents) may take to be "
                                                              "healthy (connected)")] = 120.0,
) -> None:
    """What agents cost while nothing changes: one agent process's CPU with probed
    tasks, and an idle control plane's CPU with connected agents (one JSON object on
    stdout)."""
    from plait.bench import agent

    print(json.dumps(agent.run(tasks=tasks, agents=agents, seconds=seconds,
                               probe_interval=probe_interval,
                               settle_timeout=settle_timeout)))
