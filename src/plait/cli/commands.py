"""The ``plait`` verbs that talk to a control plane: serve, entitlement, job, task,
machine, maintenance, events, token, context.

Every verb finds the API URL and token in the client configuration (a named context;
``--context`` picks another), overridable by ``PLAIT_URL``/``PLAIT_TOKEN`` and by
``--url``/``--token``. Lists print tables; ``--output json`` prints the API's JSON
for scripts. Errors are one line on stderr and a non-zero exit code (see
``plait.cli.client``).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import re
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
import yaml
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from plait.cli.client import EXIT_DENIED, EXIT_FAILED, EXIT_INVALID, Api, CliError, Target
from plait.clientconfig import ClientConfig, default_path
from plait.errors import Conflict, PlaitError, ValidationError

if TYPE_CHECKING:  # (imported where used: `plait agent` starts without the model)
    from plait.model import JobSpec

err = Console(stderr=True)
out = Console()
target = Target()

def _output_format(value: str) -> str:
    if value not in ("table", "json"):  # checked before anything is sent
        raise typer.BadParameter(f"must be table or json, not {value!r}")
    return value


Output = Annotated[str, typer.Option("--output", "-o", help="table or json",
                                     callback=_output_format)]
Wait = Annotated[bool, typer.Option("--wait", help="follow the rollout until it settles")]
Timeout = Annotated[float, typer.Option("--timeout", help="seconds --wait waits at most")]


def guarded(fn: Callable[..., None]) -> Callable[..., None]:
    """Run a verb; a failure becomes one line on stderr and its exit code."""
    import functools

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> None:
        try:
            fn(*args, **kwargs)
        except CliError as exc:
            err.print(f"[red]error:[/red] {exc.message}", highlight=False)
            raise typer.Exit(exc.code) from None
        except PlaitError as exc:
            err.print(f"[red]error:[/red] {exc}", highlight=False)
            raise typer.Exit(EXIT_INVALID) from None
    return run


def api() -> Api:
    return Api(target)


def emit(data: Any, output: str, table: Callable[[Any], object]) -> None:
    if output == "json":
        print(json.dumps(data, indent=2, sort_keys=True))
    elif output == "table":
        table(data)
    else:
        raise CliError(f"--output must be table or json, not {output!r}", EXIT_INVALID)


def kv_table(data: dict[str, Any], title: str | None = None) -> None:
    t = Table(title=title, show_header=False)
    for key, value in data.items():
        t.add_row(key, value if isinstance(value, str) else json.dumps(value))
    out.print(t)


def rows(columns: list[str], items: list[list[Any]], title: str | None = None) -> None:
    t = Table(title=title)
    for c in columns:
        t.add_column(c)
    for item in items:
        t.add_row(*["" if v is None else str(v) for v in item])
    out.print(t)


def load_documents(path: Path) -> list[dict[str, Any]]:
    """The mappings in a YAML file: one, several documents, or a list under any key."""
    try:
        text = sys.stdin.read() if str(path) == "-" else path.read_text()
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror}", EXIT_INVALID) from None
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        raise CliError(f"{path} is not valid YAML: {exc}", EXIT_INVALID) from None
    found: list[dict[str, Any]] = []
    for doc in docs:
        if isinstance(doc, list):
            found.extend(doc)
        elif isinstance(doc, dict) and len(doc) == 1 and isinstance(next(iter(doc.values())),
                                                                    list):
            found.extend(next(iter(doc.values())))
        else:
            found.append(doc)
    for item in found:
        if not isinstance(item, dict):
            raise CliError(f"{path}: expected mappings, found {type(item).__name__}",
                           EXIT_INVALID)
    if not found:
        raise CliError(f"{path} is empty", EXIT_INVALID)
    return found


def job_spec_from(path: Path) -> JobSpec:
    from plait.model import JobSpec, parse

    docs = load_documents(path)
    if len(docs) != 1:
        raise CliError(f"{path} holds {len(docs)} jobs; give one per file", EXIT_INVALID)
    try:
        return parse(JobSpec, docs[0])
    except PlaitError as exc:
        raise CliError(f"{path}: {exc}", EXIT_INVALID) from None


# -- serve ---------------------------------------------------------------------------------
def serve(
    data_dir: Annotated[Path, typer.Option(help="where the SQLite store and admin token live")]
    = Path(".plait"),
    store: Annotated[str | None, typer.Option(help="zk://host:port,... or sqlite:///path "
                                                   "(default: SQLite in --data-dir)")] = None,
    host: str = "127.0.0.1",
    port: int = 7070,
    machines: Annotated[int, typer.Option(min=1, help="machines of a new region")] = 48,
    dcs: Annotated[int, typer.Option(min=1)] = 2,
    msbs_per_dc: Annotated[int, typer.Option(min=1)] = 3,
    sim_agents: Annotated[bool, typer.Option(help="run simulated agents on every machine")]
    = False,
    tick: Annotated[float, typer.Option(min=0.01, help="seconds between reconcile passes")]
    = 0.5,
    event_retention: Annotated[int, typer.Option(min=1, help="events kept")] = 10_000,
    event_max_age: Annotated[float, typer.Option(min=1, help="seconds events are kept")]
    = 7 * 86400.0,
    heartbeat_timeout: Annotated[float, typer.Option(
        min=0.5, help="seconds without a heartbeat before a machine is unavailable")] = 5.0,
    startup_grace: Annotated[float, typer.Option(
        min=0, help="after a start, seconds a machine's agent has for its first heartbeat")]
    = 30.0,
    context: Annotated[str, typer.Option(help="client context to write")] = "local",
    write_config: Annotated[bool, typer.Option(help="write URL and admin token to the "
                                                    "client configuration")] = True,
    advertise: Annotated[str | None, typer.Option(
        help="the URL other replicas reach this one at (default http://HOST:PORT)")] = None,
    session_timeout: Annotated[float, typer.Option(
        min=0.2, help="seconds the leader's store session outlives it (failover time)")]
    = 1.0,
    tls_cert: Annotated[Path | None, typer.Option(
        help="serve https with this certificate (plait admin certs writes server.pem)")]
    = None,
    tls_key: Annotated[Path | None, typer.Option(help="the certificate's key")] = None,
    ca_file: Annotated[str | None, typer.Option(
        help="the CA certificate other replicas' and TaskControllers' https certificates "
             "are checked against (default: the system's authorities)")] = None,
    shard: Annotated[int | None, typer.Option(
        min=0, help="run as this scheduler shard of the region (behind plait frontend); "
                    "replicas of one shard give the same number")] = None,
    controller_networks: Annotated[str, typer.Option(
        help="comma-separated networks (CIDR; 'loopback', 'any') TaskController URLs may "
             "point into; loopback and link-local only when named")] = "any",
    controller_deadline: Annotated[float, typer.Option(
        min=0.1, max=60, help="hard deadline of one TaskController call, seconds")] = 5.0,
) -> None:
    """Run a replica of the control plane and its API (Ctrl-C stops it). Every replica
    on one store campaigns: the leader runs the control plane, the others keep warm,
    pass requests on to the leader and take over when it goes. At first start it
    creates an admin token and writes it to the client configuration, so the CLI works
    at once. With --shard, it is one scheduler shard of the region: it manages the
    jobs of the entitlements the front end maps to it, and clients talk to the front
    end (plait frontend), which writes the client configuration."""
    import uvicorn

    from plait.frontend import create_app
    from plait.model import RegionSpec
    from plait.server.controlplane import ControlPlaneConfig
    from plait.server.events import Retention
    from plait.server.serve import prepare

    try:
        region = RegionSpec.sized(machines, dcs=dcs, msbs_per_dc=msbs_per_dc,
                                  rows_per_msb=1, racks_per_row=2)
        if (tls_cert is None) != (tls_key is None):
            raise ValidationError("tls", "give --tls-cert and --tls-key together")
        for f in (tls_cert, tls_key):
            if f is not None and not f.is_file():
                raise ValidationError("tls", f"{f} is not a file")
        config = ControlPlaneConfig(region=region, tick_seconds=tick, sim_agents=sim_agents,
                                    retention=Retention(event_retention, event_max_age),
                                    heartbeat_timeout=heartbeat_timeout,
                                    startup_grace=startup_grace, ca_file=ca_file, shard=shard,
                                    controller_networks=tuple(controller_networks.split(",")),
                                    controller_deadline=controller_deadline)
        started = prepare(data_dir, store, config, host, port,
                          write_config and shard is None, context,
                          scheme="https" if tls_cert else "http")
    except PlaitError as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(EXIT_INVALID) from None
    from plait.server.leader import Leadership

    cp = started.control_plane
    cp.serving_at(started.url, *([advertise] if advertise else []))
    leadership = Leadership(cp, advertise or started.url, session_timeout=session_timeout)
    err.print(f"plait control plane{'' if shard is None else f' shard {shard}'}: "
              f"{len(cp.fleet)} machines, API on {started.url}")
    if started.config_path is not None:
        err.print(f"client configuration: {started.config_path} (context {context})")
    # the app's shutdown stops the loop and closes the store (uvicorn re-raises the
    # signal that stopped it, so nothing after run() would run)
    uvicorn.run(create_app(cp, close_store=True, leadership=leadership), host=host, port=port,
                log_level="warning", access_log=False,
                ssl_certfile=str(tls_cert) if tls_cert else None,
                ssl_keyfile=str(tls_key) if tls_key else None)


def frontend(
    data_dir: Annotated[Path, typer.Option(
        help="where the SQLite store is (when no --store) and the admin token was "
             "written")] = Path(".plait"),
    store: Annotated[str | None, typer.Option(help="zk://host:port,... or sqlite:///path "
                                                   "(default: SQLite in --data-dir)")] = None,
    host: str = "127.0.0.1",
    port: int = 7070,
    context: Annotated[str, typer.Option(help="client context to write")] = "local",
    write_config: Annotated[bool, typer.Option(help="write URL and admin token to the "
                                                    "client configuration")] = True,
    tls_cert: Annotated[Path | None, typer.Option(
        help="serve https with this certificate (plait admin certs writes server.pem)")]
    = None,
    tls_key: Annotated[Path | None, typer.Option(help="the certificate's key")] = None,
    ca_file: Annotated[str | None, typer.Option(
        help="the CA certificate the shards' https certificates are checked against")]
    = None,
    shards: Annotated[int | None, typer.Option(
        min=1, help="the region's scheduler shards (0..N-1): until each has a leader the "
                    "front end is not healthy (default: those that have started)")] = None,
) -> None:
    """Run a front end of a sharded region: one API over every scheduler shard
    (plait serve --shard S). It keeps no state (the entitlement-to-shard map is in the
    store), so several may run, each behind its own URL; clients and agents may use any
    of them."""
    import uvicorn

    from plait.clientconfig import ClientConfig
    from plait.frontend.router import ShardRouter
    from plait.server.serve import store_for

    if (tls_cert is None) != (tls_key is None):
        err.print("[red]error:[/red] tls: give --tls-cert and --tls-key together")
        raise typer.Exit(EXIT_INVALID)
    url = f"{'https' if tls_cert else 'http'}://{host}:{port}"
    try:
        opened = store_for(data_dir, store)
        for shard in range(shards or 0):
            with contextlib.suppress(Conflict):
                opened.create(f"/frontend/shards/{shard}", b"{}")
    except PlaitError as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(EXIT_INVALID) from None
    if write_config:
        admin_file = data_dir / "admin-token"
        client = ClientConfig.load(None)
        old = client.contexts.get(context)
        token = admin_file.read_text().strip() if admin_file.exists() else (
            old.token if old is not None else None)
        client.set_context(context, url, token, ca_file=ca_file)
        err.print(f"client configuration: {client.save(None)} (context {context})")
    err.print(f"plait front end: API on {url}")
    uvicorn.run(ShardRouter(opened, identity=url, ca_file=ca_file), host=host, port=port,
                log_level="warning", access_log=False,
                ssl_certfile=str(tls_cert) if tls_cert else None,
                ssl_keyfile=str(tls_key) if tls_key else None)


def entitlement_move(name: str, to_shard: Annotated[int, typer.Option(
        "--to-shard", min=0, help="the scheduler shard to manage it from now on")],
        output: Output = "table") -> None:
    """Move an entitlement to another scheduler shard, without restarting any of its
    tasks (its jobs accept no changes for the moment it takes)."""
    a = api()
    done = a.post(f"/v1/admin/entitlements/{name}/move", {"shard": to_shard})
    emit(done, output, lambda d: print(
        f"entitlement {d['entitlement']}: shard {d['from_shard']} -> {d['to_shard']}, "
        f"{d['jobs']} jobs, writes held for {d['unavailable_s']:.3f}s"))


# -- agent ---------------------------------------------------------------------------------
def agent(
    machine_id: Annotated[str, typer.Option(help="this machine's id in the region")],
    control_plane: Annotated[str, typer.Option(help="front-end URL(s), comma-separated")],
    data_dir: Annotated[Path, typer.Option(help="the agent's state, task dirs and logs")],
    join_token: Annotated[str | None, typer.Option(
        envvar="PLAIT_JOIN_TOKEN", help="the cluster join token (first start only)")] = None,
    advertise: Annotated[str, typer.Option(help="address tasks are reached at")] = "127.0.0.1",
    interval: Annotated[float, typer.Option(min=0.05, help="seconds between steps")] = 1.0,
    fault_domain: Annotated[str | None, typer.Option(
        help="region/dc/msb/row/rack: registers the machine (with --cpu, --memory-gb, "
             "--type) when it joins; a machine the region has must match")] = None,
    cpu: Annotated[float | None, typer.Option(min=0.001, help="the machine's cpu (RRU)")]
    = None,
    memory_gb: Annotated[float | None, typer.Option(min=0.001)] = None,
    disk_gb: Annotated[float, typer.Option(min=0)] = 0.0,
    type: Annotated[str | None, typer.Option("--type", help="the machine type (SKU)")]
    = None,
    runtime: Annotated[str, typer.Option(
        help="process (cgroups or rlimits), or sandbox (bubblewrap namespaces and a "
             "read-only root, plus the same limits)")] = "process",
    hide: Annotated[list[Path] | None, typer.Option(
        help="a directory sandboxed tasks must not see (repeatable)")] = None,
    ca_file: Annotated[str | None, typer.Option(
        help="the CA certificate of the control plane's https URLs (plait admin certs "
             "writes ca.pem); default: the system's authorities")] = None,
) -> None:
    """Run the agent of one machine: join, pull the desired task set, run the tasks as
    processes, report their statuses and output. Tasks keep running if the control
    plane is unreachable, and a restarted agent adopts them."""
    import signal
    import threading

    import httpx

    from plait.agent.daemon import Agent
    from plait.agent.runtime import create_runtime

    described = {"fault_domain": fault_domain, "cpu": cpu, "memory_gb": memory_gb,
                 "type": type}
    if any(v is not None for v in described.values()):
        missing = [f"--{k.replace('_', '-')}" for k, v in described.items() if v is None]
        if missing:
            err.print(f"[red]error:[/red] registering a machine needs {', '.join(missing)} too")
            raise typer.Exit(EXIT_INVALID)
        described["disk_gb"] = disk_gb
    try:
        a = Agent(machine_id, control_plane.split(","), join_token, data_dir, advertise,
                  runtime=create_runtime(runtime, data_dir, hide or ()),
                  describe=described if fault_domain is not None else None,
                  ca_file=ca_file)
    except (ValueError, OSError, RuntimeError, PlaitError) as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(EXIT_INVALID) from None
    err.print(f"plait agent {machine_id}: isolation {a.runtime.describe()}; "
              f"{len(a.handles)} running tasks adopted")
    stop = threading.Event()
    shutdown = {"tasks": False}

    def stop_tasks(*_: object) -> None:  # Ctrl-C (SIGINT): stop the tasks too
        shutdown["tasks"] = True
        stop.set()

    # SIGTERM stops the agent alone: its tasks keep running, and a new agent adopts them
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, stop_tasks)
    (data_dir / "agent.pid").write_text(f"{os.getpid()}\n")
    while not stop.is_set():  # join first: a refused join is an error, not a retry
        try:
            a.join()
            break
        except ConnectionError as exc:
            err.print(f"plait agent {machine_id}: {exc}; retrying")
            stop.wait(interval)
        except httpx.HTTPStatusError as exc:
            try:
                reason = exc.response.json().get("message", exc.response.text)
            except ValueError:
                reason = exc.response.text
            err.print(f"[red]error:[/red] the control plane refused machine {machine_id}: "
                      f"{reason}")
            raise typer.Exit(EXIT_DENIED if exc.response.status_code in (401, 403)
                             else EXIT_INVALID) from None
    a.run(interval, stop)
    if shutdown["tasks"]:
        a.shutdown()
        err.print(f"plait agent {machine_id}: tasks stopped")


# -- up ------------------------------------------------------------------------------------
def up(
    data_dir: Annotated[Path, typer.Option(help="store, tokens and agents' state")]
    = Path(".plait"),
    machines: Annotated[int, typer.Option(min=1, max=200, help="agents (one per machine)")]
    = 6,
    dcs: Annotated[int, typer.Option(min=1)] = 2,
    msbs_per_dc: Annotated[int, typer.Option(min=1)] = 3,
    host: str = "127.0.0.1",
    port: int = 7070,
    heartbeat_timeout: Annotated[float, typer.Option(min=0.5)] = 5.0,
    startup_grace: Annotated[float, typer.Option(
        min=0, help="seconds the agents have for their first heartbeat")] = 30.0,
    runtime: Annotated[str, typer.Option(help="the agents' runtime: process or sandbox")]
    = "process",
    replicas: Annotated[int, typer.Option(
        min=1, max=9, help="control-plane replicas (one leads; the others, `plait serve` "
                           "processes on ports PORT+1..., take over when it goes)")] = 1,
    store: Annotated[str | None, typer.Option(
        help="zk://host:port,... (default: SQLite in --data-dir)")] = None,
    shards: Annotated[int, typer.Option(
        min=1, max=16, help="scheduler shards behind a front end on PORT (shard S replica "
                            "R on PORT+1+S*REPLICAS+R)")] = 1,
) -> None:
    """A whole region on this box: the control plane (API, scheduler, allocator,
    brokers, health checks), with --replicas, and one agent process per machine, each
    with its own fault domain. With --shards, the scheduling is split by entitlement
    between shards (each with --replicas), behind a front end. Ctrl-C stops the agents
    and their tasks; `plait up` again on the same data dir brings every job back.
    Agents and replicas that still run (the `plait up` process alone was killed) are
    adopted, with their tasks, instead of started again."""
    import signal
    import subprocess
    import threading

    import httpx

    from plait.frontend.router import ShardRouter
    from plait.model import RegionSpec
    from plait.server.controlplane import ControlPlaneConfig
    from plait.server.serve import ApiServer, AsgiServer, prepare, store_for

    region = RegionSpec.sized(machines, dcs=dcs, msbs_per_dc=msbs_per_dc, rows_per_msb=1,
                              racks_per_row=1)
    sharded = shards > 1
    # a region on one box: its TaskControllers run on loopback too
    config = ControlPlaneConfig(region=region, tick_seconds=0.2,
                                heartbeat_timeout=heartbeat_timeout,
                                startup_grace=startup_grace, shard=0 if sharded else None,
                                controller_networks=("loopback", "any"))
    # Ctrl-C from now on stops whatever has started, in order
    done = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: done.set())
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    started = prepare(data_dir, store, config, host, port)
    cp = started.control_plane
    for shard in range(shards if sharded else 0):  # the front end waits for each one's leader
        with contextlib.suppress(Conflict):
            cp.store.create(f"/frontend/shards/{shard}", b"{}")
    join_file = data_dir / "join-token"
    if not join_file.exists():
        _, token = cp.tokens.create("join", "plait-up", cp.clock(), "agents of plait up")
        fd = os.open(join_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(token + "\n")
    join = join_file.read_text().strip()
    # the agents start first (they retry their join until the API answers): their
    # start-up overlaps the control plane's
    # sharded: the front end on PORT, shard S replica R on PORT+1+S*REPLICAS+R (this
    # process runs the front end and shard 0's first replica)
    first = port + 1 if sharded else port
    server = ApiServer(cp, host, first, log_level="warning",
                       replica=replicas > 1 or sharded)
    front = AsgiServer(ShardRouter(store_for(data_dir, store), identity=f"http://{host}:"
                                   f"{port}"), host, port) if sharded else None
    urls = [front.url] if front is not None else [server.url] + [
        f"http://{host}:{port + i}" for i in range(1, replicas)]
    agents: dict[str, subprocess.Popen[bytes] | int] = {}
    adopted = 0
    for m in range(len(cp.fleet)):
        name = cp.fleet.name(m)
        home = data_dir / "agents" / name
        home.mkdir(parents=True, exist_ok=True)
        pid = _alive_pid(home / "agent.pid")
        if pid is not None:
            agents[name] = pid  # still running from before: adopted with its tasks
            adopted += 1
            continue
        log = open(home / "agent.log", "ab")  # noqa: SIM115 (the agent's lifetime)
        res = cp.fleet.resources(m)
        # each agent describes its machine, as on a real host (checked on join)
        agents[name] = subprocess.Popen(
            [sys.executable, "-m", "plait.cli.agent", "--machine-id", name,
             "--control-plane", ",".join(urls), "--join-token", join, "--data-dir", str(home),
             "--interval", "0.5", "--fault-domain", str(cp.fleet.fault_domain(m)),
             "--cpu", f"{res.cpu:g}", "--memory-gb", f"{res.memory_gb:g}",
             "--type", cp.fleet.type_names[int(cp.fleet.type_code[m])],
             "--runtime", runtime, "--hide", str(data_dir.resolve())],
            stdout=log, stderr=log, start_new_session=True)  # outlives a killed `up`
    server.start()
    # the other replicas, once this one campaigns (it leads, unless a replica left
    # running by a killed `plait up` does)
    followers: dict[str, subprocess.Popen[bytes] | int] = {}
    for shard in range(shards):
        for i in range(replicas):
            if shard == 0 and i == 0:
                continue  # (this process)
            name = f"{shard}-{i}" if sharded else str(i)
            pid_file = data_dir / "replicas" / f"{name}.pid"
            pid_file.parent.mkdir(parents=True, exist_ok=True)
            pid = _alive_pid(pid_file, b"serve")
            if pid is not None:
                followers[name] = pid
                continue
            log = open(data_dir / "replicas" / f"{name}.log", "ab")  # noqa: SIM115
            at = first + shard * replicas + i
            followers[name] = proc = subprocess.Popen(
                [sys.executable, "-m", "plait.cli.main", "serve", "--data-dir", str(data_dir),
                 *(["--store", store] if store else []), "--host", host, "--port", str(at),
                 "--no-write-config", "--tick", "0.2", "--heartbeat-timeout",
                 str(heartbeat_timeout), "--startup-grace", str(startup_grace),
                 "--controller-networks", "loopback,any",
                 *(["--shard", str(shard)] if sharded else [])],
                stdout=log, stderr=log, start_new_session=True)
            pid_file.write_text(f"{proc.pid}\n")
    if front is not None:
        front.start()
    lead = server.leadership
    deadline = time.monotonic() + 10
    # until the election has an outcome: this replica leads, or another does
    while lead is not None and not lead.leading and lead.leader() in (None, lead.identity) \
            and time.monotonic() < deadline and not done.is_set():
        time.sleep(0.05)
    if front is not None:  # every shard has a leader: the front end serves
        probe = httpx.Client(timeout=5)
        deadline = time.monotonic() + 60
        while not done.is_set() and time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if probe.get(f"{front.url}/healthz").status_code == 200:
                    break
            time.sleep(0.1)
        probe.close()
        out.print(f"[bold]plait up[/bold]: {len(cp.fleet)} machines "
                  f"({len(agents) - adopted} agents started, {adopted} adopted), "
                  f"{shards} scheduler shards x {replicas} replicas on ports {first}-"
                  f"{first + shards * replicas - 1}, API (front end) on {front.url}")
    else:
        # (heartbeats are counted by the leader: here, unless another replica leads)
        ready = cp.wait_for_agents(list(agents), timeout=60) if lead is None or \
            lead.leading else 0
        out.print(f"[bold]plait up[/bold]: {len(cp.fleet)} machines "
                  f"({len(agents) - adopted} agents started, {adopted} adopted; {ready} "
                  f"heartbeating), API on {server.url}"
                  + (f", replicas on {', '.join(urls[1:])}" if replicas > 1 else ""))
    out.print(f"CLI configured ({started.config_path}): try "
              "[cyan]plait job deploy examples/web.yaml --wait[/cyan]; Ctrl-C stops")
    done.wait()
    out.print("stopping the agents and their tasks ...")
    for follower in followers.values():  # (first: none takes over meanwhile)
        pid = follower if isinstance(follower, int) else follower.pid
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)
    for follower in followers.values():
        pid = follower if isinstance(follower, int) else follower.pid
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and _alive(pid):
            if not isinstance(follower, int):
                follower.poll()
            time.sleep(0.05)
    for agent in agents.values():
        pid = agent if isinstance(agent, int) else agent.pid
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGINT)
    deadline = time.monotonic() + 30
    for agent in agents.values():
        pid = agent if isinstance(agent, int) else agent.pid
        while time.monotonic() < deadline and _alive(pid):
            if not isinstance(agent, int):
                agent.poll()
            time.sleep(0.1)
    if front is not None:
        front.stop()
    server.stop()
    cp.store.close()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:  # a zombie child is not alive
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return True


def _alive_pid(path: Path, what: bytes = b"agent") -> int | None:
    try:
        pid = int(path.read_text().strip())
    except (OSError, ValueError):
        return None
    if not _alive(pid):
        return None
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return pid if what in cmdline else None


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


# -- entitlements --------------------------------------------------------------------------
entitlement_app = typer.Typer(help="Entitlements: quota + pseudo-cluster.", no_args_is_help=True)


def _ent_rows(items: list[dict[str, Any]]) -> None:
    rows(["name", "owner", "quota", "machines", "rru", "host profile", "jobs"], [
        [e["name"], e["owner"],
         f"{e['quota']['machines']} machines" if e["quota"].get("machines") is not None
         else f"{e['quota']['rru']} RRU", e["machines"], e["rru"], e["host_profile"],
         len(e["jobs"])] for e in items])


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
    output: Output = "table",
) -> None:
    """Create entitlements from a file, or one from options (admin)."""
    if file is not None:
        docs = load_documents(file)
    elif name and owner:
        quota: dict[str, Any] = {"machines": machines} if rru is None else {"rru": rru}
        docs = [{"name": name, "owner": owner, "quota": quota, "host_profile": host_profile}]
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
    data = api().get(f"/v1/entitlements/{name}")
    emit(data, output, lambda d: kv_table(d, f"entitlement {name}"))


# -- jobs ----------------------------------------------------------------------------------
job_app = typer.Typer(help="Jobs: deploy, inspect, update, resize, restart, roll back.",
                      no_args_is_help=True)


def _status(j: dict[str, Any]) -> str:
    if j["deleting"]:
        return "deleting"
    if j["halted"]:
        return "halted"
    if j.get("batch") and j["phase"] != "running":
        return str(j["phase"])  # complete, or failed
    if j["settled"]:
        return "settled"
    if j["unplaced_reason"]:
        return "unplaced"
    return "rolling out" if j["rollout_active"] else "converging"


def _job_rows(jobs: list[dict[str, Any]]) -> None:
    rows(["name", "entitlement", "version", "tasks", "running", "serving", "updated",
          "status"], [
        [j["name"], j["entitlement"], j["version"], j["task_count"],
         j["tasks"].get("running", 0), j["serving"], j["updated"], _status(j)] for j in jobs])


def _plan_table(plan: dict[str, Any]) -> None:
    out.print(f"[bold]{plan['action']}[/bold] job {plan['job']}: "
              f"+{plan['tasks_added']} tasks, -{plan['tasks_removed']} tasks, "
              f"{plan['tasks_updated']} updated (at most {plan['max_unavailable']} "
              "unavailable at once)")
    if plan["changes"]:
        rows(["field", "current", "new"], [
            [k, json.dumps(v["from"]), json.dumps(v["to"])] for k, v in plan["changes"].items()],
            title="spec changes")
    p = plan["placement"]
    out.print(f"placement now: {p['placeable']} placeable "
              f"({', '.join(f'{k}: {v}' for k, v in sorted(p['by_dc'].items())) or 'none'}), "
              f"{p['machines_to_claim']} machines to claim from the free pool, "
              f"{p['unplaced']} unplaced" + (f" ({p['unplaced_reason']})"
                                             if p["unplaced_reason"] else ""))


def follow(a: Api, name: str, timeout: float, deleting: bool = False) -> dict[str, Any]:
    """A live progress bar until the job settles (or is gone, for a delete)."""
    deadline = time.monotonic() + timeout
    last: dict[str, Any] = {}
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("{task.fields[detail]}"), TimeElapsedColumn(),
                  console=err) as progress:
        bar = progress.add_task(f"{name}", total=None, detail="")
        while True:
            try:
                job: dict[str, Any] = a.get(f"/v1/jobs/{name}")
            except CliError as exc:
                if deleting and "not found" in exc.message:
                    progress.update(bar, total=1, completed=1, detail="deleted")
                    return last
                raise
            last = job
            if deleting:
                left = sum(job["tasks"].values())
                progress.update(bar, total=max(left, 1), completed=0,
                                detail=f"{left} tasks left")
            elif job.get("batch"):  # a batch job: until every task exited 0
                progress.update(bar, total=job["task_count"], completed=job["succeeded"],
                                description=f"{name} v{job['version']}",
                                detail=f"{job['running']} running, {job['failed']} failed")
                if job["phase"] == "failed":
                    raise CliError(f"batch job {name} failed: {job['failed']} tasks exited "
                                   f"non-zero with no retries left (plait job show {name})",
                                   EXIT_FAILED)
                if job["phase"] == "complete" and job["applied_version"] == job["version"]:
                    return job
            else:
                progress.update(bar, total=job["task_count"], completed=job["updated"],
                                description=f"{name} v{job['version']}",
                                detail=f"{job['unavailable']} unavailable, {job['serving']} "
                                       "serving")
                if job["halted"]:
                    raise CliError(f"rollout of {name} halted: {job['halted']} "
                                   f"(plait job resume {name}, or roll back)", EXIT_FAILED)
                if job["settled"]:
                    return job
            if time.monotonic() > deadline:
                reason = job.get("unplaced_reason")
                raise CliError(f"{name} did not settle within {timeout:g}s" +
                               (f" ({reason})" if reason else ""), EXIT_FAILED)
            time.sleep(0.3)


@job_app.command("deploy")
@guarded
def job_deploy(file: Path, dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="show what would change, change nothing")] = False,
        wait: Wait = False, timeout: Timeout = 600.0, output: Output = "table") -> None:
    """Create the job in FILE, or roll out FILE as its new version."""
    spec = job_spec_from(file)
    body = spec.model_dump(mode="json")
    a = api()
    if dry_run:
        emit(a.post("/v1/jobs", body, dry_run="true"), output, _plan_table)
        return
    try:
        a.get(f"/v1/jobs/{spec.name}")
        exists = True
    except CliError as exc:
        if "not found" not in exc.message:
            raise
        exists = False
    result = a.put(f"/v1/jobs/{spec.name}", body) if exists else a.post("/v1/jobs", body)
    if output == "table":
        err.print(f"job {spec.name}: version {result['version']} stored "
                  f"({'updated' if exists else 'created'})")
    if wait:
        result = follow(a, spec.name, timeout)
    if output == "json":
        emit(result, output, lambda d: None)


@job_app.command("update")
@guarded
def job_update(file: Path, wait: Wait = False, timeout: Timeout = 600.0,
               output: Output = "table") -> None:
    """Roll out FILE as a new version of an existing job."""
    spec = job_spec_from(file)
    a = api()
    result = a.put(f"/v1/jobs/{spec.name}", spec.model_dump(mode="json"))
    err.print(f"job {spec.name}: version {result['version']} stored")
    if wait:
        result = follow(a, spec.name, timeout)
    if output == "json":
        emit(result, output, lambda d: None)


@job_app.command("list")
@guarded
def job_list(entitlement: Annotated[str | None, typer.Option()] = None,
             output: Output = "table") -> None:
    data = api().get("/v1/jobs", entitlement=entitlement)
    emit(data, output, lambda d: _job_rows(d["jobs"]))


@job_app.command("show")
@guarded
def job_show(name: str, output: Output = "table") -> None:
    a = api()
    job = a.get(f"/v1/jobs/{name}")
    tasks = a.get(f"/v1/jobs/{name}/tasks")["tasks"]
    events = a.get("/v1/events", job=name, limit=1000)["events"][-10:]
    data = {**job, "task_list": tasks, "recent_events": events}

    def show(d: dict[str, Any]) -> None:
        moving = d.get("moving_from")
        kv_table({"name": d["name"], "entitlement": d["entitlement"] + (
                      f" (moving from {moving}: {d.get('on_entitlement', 0)}/{d['task_count']}"
                      " tasks there)" if moving else ""),
                  "version": f"{d['version']} (applied {d['applied_version']})",
                  "status": _status(d), "tasks": d["task_count"],
                  "states": ", ".join(f"{k} {v}" for k, v in sorted(d["tasks"].items())),
                  "serving": d["serving"], "unavailable": d["unavailable"],
                  **({"succeeded / failed / running":
                      f"{d['succeeded']} / {d['failed']} / {d['running']}"}
                     if d.get("batch") else {}),
                  "command": " ".join([d["spec"]["command"], *d["spec"]["args"]]),
                  "halted": d["halted"] or "-", "unplaced": d["unplaced_reason"] or "-",
                  "error": d.get("error") or "-"},
                 f"job {name}")
        _task_rows(d["task_list"])
        for e in d["recent_events"]:
            out.print(f"  {_when(e['time'])}  {e['kind']:18} {e['message']}", highlight=False)
    emit(data, output, show)


@job_app.command("history")
@guarded
def job_history(name: str, output: Output = "table") -> None:
    data = api().get(f"/v1/jobs/{name}/history")
    emit(data, output, lambda d: rows(["#", "time", "operation", "what"], [
        [e["seq"], _when(e["time"]), e["op"], e["message"]] for e in d["operations"]],
        title=f"job {name}: {d['versions']} versions"))


@job_app.command("controller-key")
@guarded
def job_controller_key(name: str, output: Output = "table") -> None:
    """The key the job's TaskController checks plait's calls with: each call carries
    Plait-Signature: t=<seconds>,v1=<hex HMAC-SHA256(key, "<t>." + body)>."""
    data = api().get(f"/v1/jobs/{name}/controller-key")
    emit(data, output, lambda d: out.print(d["key"], highlight=False))


def _ack(a: Api, name: str, result: dict[str, Any], what: str, wait: bool, timeout: float,
         output: str, deleting: bool = False) -> None:
    if output == "table":
        err.print(f"job {name}: {what} stored (operation {result['operation']})")
    if wait:
        result = follow(a, name, timeout, deleting)
    if output == "json":
        emit(result, output, lambda d: None)


@job_app.command("resize")
@guarded
def job_resize(name: str, task_count: int, wait: Wait = False, timeout: Timeout = 600.0,
               output: Output = "table") -> None:
    a = api()
    _ack(a, name, a.post(f"/v1/jobs/{name}/resize", {"task_count": task_count}),
         f"resize to {task_count}", wait, timeout, output)


@job_app.command("restart")
@guarded
def job_restart(name: str, index: Annotated[int | None, typer.Option(
        help="restart one task only")] = None, wait: Wait = False, timeout: Timeout = 600.0,
        output: Output = "table") -> None:
    """Restart every task (or one), paced like an update and through TaskControl."""
    a = api()
    _ack(a, name, a.post(f"/v1/jobs/{name}/restart", {"index": index}),
         "restart", wait, timeout, output)


@job_app.command("rollback")
@guarded
def job_rollback(name: str, version: int, wait: Wait = False, timeout: Timeout = 600.0,
                 output: Output = "table") -> None:
    """Roll out an earlier version again (as a new version)."""
    a = api()
    _ack(a, name, a.post(f"/v1/jobs/{name}/rollback", {"version": version}),
         f"rollback to version {version}", wait, timeout, output)


@job_app.command("move")
@guarded
def job_move(name: str, to_entitlement: Annotated[str, typer.Option(
        "--to-entitlement", help="the entitlement to move the job to")],
        wait: Wait = False, timeout: Timeout = 600.0, output: Output = "table") -> None:
    """Move a job to another entitlement: every task is stopped and started again on
    that entitlement's machines, paced like an update (the bar counts tasks moved)."""
    a = api()
    _ack(a, name, a.post(f"/v1/jobs/{name}/move", {"entitlement": to_entitlement}),
         f"move to entitlement {to_entitlement}", wait, timeout, output)


@job_app.command("resume")
@guarded
def job_resume(name: str, output: Output = "table") -> None:
    """Resume a halted rollout."""
    a = api()
    _ack(a, name, a.post(f"/v1/jobs/{name}/resume"), "resume", False, 0, output)


@job_app.command("delete")
@guarded
def job_delete(name: str, wait: Wait = False, timeout: Timeout = 600.0,
               output: Output = "table") -> None:
    a = api()
    _ack(a, name, a.delete(f"/v1/jobs/{name}"), "delete", wait, timeout, output, deleting=True)


# -- tasks ---------------------------------------------------------------------------------
task_app = typer.Typer(help="The tasks of a job.", no_args_is_help=True)


def _task_rows(tasks: list[dict[str, Any]]) -> None:
    rows(["index", "state", "version", "machine", "serving", "healthy", "operation", "exit"], [
        [t["index"], t["state"], t["version"], t["machine"] or "-",
         "yes" if t["serving"] else "no", "yes" if t["healthy"] else "no",
         t["operation"] or "-", "-" if t.get("exit_code") is None else t["exit_code"]]
        for t in tasks])


@task_app.command("list")
@guarded
def task_list(job: str, output: Output = "table") -> None:
    data = api().get(f"/v1/jobs/{job}/tasks")
    emit(data, output, lambda d: _task_rows(d["tasks"]))


@task_app.command("restart")
@guarded
def task_restart(job: str, index: int, output: Output = "table") -> None:
    a = api()
    _ack(a, job, a.post(f"/v1/jobs/{job}/tasks/{index}/restart"), f"restart of task {index}",
         False, 0, output)


@task_app.command("logs")
@guarded
def task_logs(job: str, index: int, follow_: Annotated[bool, typer.Option(
        "--follow", "-f", help="keep printing new output")] = False) -> None:
    """What a task printed (the tail kept by the control plane)."""
    a = api()
    after = 0
    while True:
        page = a.get(f"/v1/jobs/{job}/tasks/{index}/logs", after=after)
        if page["skipped"]:
            err.print("[dim](older output dropped)[/dim]")
        sys.stdout.write(page["data"])
        sys.stdout.flush()
        after = page["next"]
        if not follow_:
            return
        if not page["data"]:
            time.sleep(1.0)


# -- discovery -----------------------------------------------------------------------------
def discover(job: str, output: Output = "table") -> None:
    """The task endpoints enabled in service discovery."""
    guarded(_discover)(job, output)


def _discover(job: str, output: str) -> None:
    data = api().get(f"/v1/discovery/{job}")
    emit(data, output, lambda d: rows(["index", "machine", "endpoint"], [
        [e["index"], e["machine"], e.get("endpoint") or "-"] for e in d["endpoints"]]))


# -- machines ------------------------------------------------------------------------------
machine_app = typer.Typer(help="Machines: inspect, fail, drain, cordon (admin).",
                          no_args_is_help=True)


def _machine_rows(ms: list[dict[str, Any]]) -> None:
    rows(["id", "state", "cordoned", "entitlement", "dc", "msb", "rack", "type", "tasks"], [
        [m["id"], m["state"], "yes" if m["cordoned"] else "", m["entitlement"] or "(free)",
         m["fault_domain"]["dc"], m["fault_domain"]["msb"], m["fault_domain"]["rack"],
         m["type"], m["tasks"]] for m in ms])


@machine_app.command("list")
@guarded
def machine_list(state: Annotated[str | None, typer.Option()] = None,
                 entitlement: Annotated[str | None, typer.Option()] = None,
                 limit: Annotated[int, typer.Option(min=1, max=1000)] = 100,
                 offset: Annotated[int, typer.Option(min=0)] = 0,
                 output: Output = "table") -> None:
    data = api().get("/v1/machines", state=state, entitlement=entitlement, limit=limit,
                     offset=offset)

    def show(d: dict[str, Any]) -> None:
        _machine_rows(d["machines"])
        out.print(f"{len(d['machines'])} of {d['total']} machines from {d['offset']}")
    emit(data, output, show)


@machine_app.command("show")
@guarded
def machine_show(machine: str, output: Output = "table") -> None:
    data = api().get(f"/v1/machines/{machine}")
    emit(data, output, lambda d: kv_table(d, f"machine {machine}"))


def _machine_op(machine: str, op: str, body: Any, output: str) -> None:
    data = api().post(f"/v1/machines/{machine}/{op}", body)
    emit(data, output, lambda d: err.print(f"machine {machine}: {op} "
                                           f"({json.dumps(d.get('event', d.get('ended', '')))})"))


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
        output: Output = "table") -> None:
    """Cordon and move every task off through TaskControl; stop what is left at the
    deadline."""
    body = None if deadline is None else {"deadline_seconds": parse_duration(deadline)}
    _machine_op(machine, "drain", body, output)


def parse_duration(text: str) -> float:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", text)
    if not m:
        raise CliError(f"{text!r} is not a duration like 90, 90s, 10m, 2h or 1d", EXIT_INVALID)
    return float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]


def parse_time(text: str) -> float:
    """``now``, ``+10m`` (from now), a unix time, or an ISO 8601 time."""
    if text == "now":
        return time.time()
    if text.startswith("+"):
        return time.time() + parse_duration(text[1:])
    try:
        return float(text)
    except ValueError:
        pass
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        raise CliError(f"{text!r} is not a time (now, +10m, unix seconds or ISO 8601)",
                       EXIT_INVALID) from None
    if when.tzinfo is None:
        when = when.astimezone()
    return when.timestamp()


def _when(t: float | None) -> str:
    if t is None:
        return "-"
    return dt.datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S")


# -- maintenance ---------------------------------------------------------------------------
maintenance_app = typer.Typer(help="Planned maintenance (admin).", no_args_is_help=True)


@maintenance_app.command("schedule")
@guarded
def maintenance_schedule(
    machines: Annotated[list[str], typer.Argument(help="machine ids")],
    start: Annotated[str, typer.Option(help="now, +10m, unix seconds or ISO 8601")] = "+10m",
    duration: Annotated[str, typer.Option(help="90s, 30m, 2h")] = "1h",
    reason: Annotated[str, typer.Option()] = "maintenance",
    output: Output = "table",
) -> None:
    """Announce maintenance: tasks get advance notice and move or stop per TaskControl;
    at the start, what still runs there is stopped."""
    data = api().post("/v1/maintenance", {"machines": machines, "start": parse_time(start),
                                          "duration_seconds": parse_duration(duration),
                                          "reason": reason})
    emit(data, output, lambda d: err.print(f"maintenance {d['event']} scheduled"))


@maintenance_app.command("list")
@guarded
def maintenance_list(output: Output = "table") -> None:
    data = api().get("/v1/maintenance")
    emit(data, output, lambda d: rows(["id", "kind", "machines", "start", "end", "reason"], [
        [e["id"], e["kind"], ", ".join(e["machines"][:5]) + (" ..." if len(e["machines"]) > 5
                                                              else ""),
         _when(e["start"]), _when(e["end"]), e["reason"]] for e in d["events"]]))


# -- events --------------------------------------------------------------------------------
def events(
    job: Annotated[str | None, typer.Option()] = None,
    kind: Annotated[str | None, typer.Option()] = None,
    source: Annotated[str | None, typer.Option(help="scheduler, broker, api, auth")] = None,
    entitlement: Annotated[str | None, typer.Option()] = None,
    machine: Annotated[str | None, typer.Option()] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000)] = 50,
    follow_: Annotated[bool, typer.Option("--follow", "-f", help="keep printing new ones")]
    = False,
    output: Output = "table",
) -> None:
    """The region's events, oldest first (the last --limit of them)."""
    guarded(_events)(job, kind, source, entitlement, machine, limit, follow_, output)


def _pages(a: Api, after: int, **filters: Any) -> Iterator[dict[str, Any]]:
    while True:
        page = a.get("/v1/events", after=after, limit=1000, **filters)
        yield from page["events"]
        if page["next"] is None:
            return
        after = page["next"]


def _events(job: str | None, kind: str | None, source: str | None, entitlement: str | None,
            machine: str | None, limit: int, follow_: bool, output: str) -> None:
    a = api()
    filters = {"job": job, "kind": kind, "source": source, "entitlement": entitlement,
               "machine": machine}
    found = list(_pages(a, 0, **filters))[-limit:]

    def line(e: dict[str, Any]) -> None:
        if output == "json":
            print(json.dumps(e, sort_keys=True))
            return
        subject = e["job"] or e["machine"] or e["entitlement"] or ""
        out.print(f"{_when(e['time'])}  {e['source']:9} {e['kind']:20} {subject:16} "
                  f"{e['message']}", highlight=False)
    if output not in ("json", "table"):
        raise CliError(f"--output must be table or json, not {output!r}", EXIT_INVALID)
    for e in found:
        line(e)
    after = found[-1]["seq"] if found else 0
    while follow_:
        time.sleep(1.0)
        for e in _pages(a, after, **filters):
            line(e)
            after = e["seq"]


# -- tokens --------------------------------------------------------------------------------
token_app = typer.Typer(help="API tokens (admin).", no_args_is_help=True)


@token_app.command("create")
@guarded
def token_create(
    owner: Annotated[str | None, typer.Option(help="an owner token for this owner")] = None,
    role: Annotated[str, typer.Option(help="owner, admin or join")] = "owner",
    name: Annotated[str | None, typer.Option(help="label (admin and join tokens)")] = None,
    description: str = "",
    output: Output = "table",
) -> None:
    """Create a token; it is printed once (the server keeps only its hash)."""
    label = owner or name
    if label is None:
        raise CliError("give --owner O (or --role admin|join --name N)", EXIT_INVALID)
    if owner and role != "owner":
        raise CliError(f"--owner makes an owner token; not with --role {role}", EXIT_INVALID)
    data = api().post("/v1/tokens", {"role": "owner" if owner else role, "name": label,
                                     "description": description})

    def show(d: dict[str, Any]) -> None:
        print(d["token"])
        err.print(f"{d['role']} token {d['id']} for {d['name']}: shown once, keep it safe")
    emit(data, output, show)


@token_app.command("list")
@guarded
def token_list(output: Output = "table") -> None:
    data = api().get("/v1/tokens")
    emit(data, output, lambda d: rows(["id", "role", "name", "created", "revoked",
                                       "description"], [
        [t["id"], t["role"], t["name"], _when(t["created"]), "yes" if t["revoked"] else "",
         t["description"]] for t in d["tokens"]]))


@token_app.command("revoke")
@guarded
def token_revoke(token_id: str, output: Output = "table") -> None:
    data = api().delete(f"/v1/tokens/{token_id}")
    emit(data, output, lambda d: err.print(f"token {token_id} revoked"))


@token_app.command("rotate")
@guarded
def token_rotate(token_id: str, output: Output = "table") -> None:
    """Revoke a token and print its replacement (same role and name)."""
    data = api().post(f"/v1/tokens/{token_id}/rotate")

    def show(d: dict[str, Any]) -> None:
        print(d["token"])
        err.print(f"token {token_id} revoked; new token {d['id']}")
    emit(data, output, show)


def register(app: typer.Typer) -> None:
    """Add the client verbs and the global --context/--url/--token options."""

    @app.callback()
    def main(
        context: Annotated[str | None, typer.Option(help="client context to use")] = None,
        url: Annotated[str | None, typer.Option(help="API URL (else PLAIT_URL, context)")]
        = None,
        token: Annotated[str | None, typer.Option(help="API token (else PLAIT_TOKEN, "
                                                       "context)")] = None,
    ) -> None:
        """plait: a cluster manager with one control plane per region."""
        target.context, target.url, target.token = context, url, token

    app.command()(serve)
    app.command("scheduler", help="Run a replica of scheduler shard --shard S of a sharded "
                "region (the same as plait serve --shard S).")(serve)
    app.command()(frontend)
    app.command()(agent)
    app.command()(up)
    app.command()(discover)
    app.command()(events)
    app.add_typer(context_app, name="context")
    app.add_typer(entitlement_app, name="entitlement")
    app.add_typer(job_app, name="job")
    app.add_typer(task_app, name="task")
    app.add_typer(machine_app, name="machine")
    app.add_typer(maintenance_app, name="maintenance")
    app.add_typer(token_app, name="token")


__all__ = ["EXIT_FAILED", "entitlement_move", "guarded", "register"]
