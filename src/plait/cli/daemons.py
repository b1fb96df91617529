"""The long-running processes: plait serve (and scheduler), frontend, agent."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from plait.cli.client import EXIT_DENIED, EXIT_INVALID, q
from plait.cli.common import Output, api, emit, err
from plait.clientconfig import ClientConfig
from plait.errors import Conflict, PlaitError, ValidationError

if TYPE_CHECKING:
    from plait.server.serve import Started

#: seconds `plait agent` waits out a refusal of its join for a live agent of its
#: machine (more than a control plane's heartbeat timeout, 5 s by default)
JOIN_WAIT = 15.0

#: tracing (plait.tracing), the same on every process that serves the API
OtlpEndpoint = Annotated[str | None, typer.Option(
    envvar="PLAIT_OTLP_ENDPOINT", help="send traces to this OpenTelemetry collector (OTLP "
                                       "over HTTP/protobuf, e.g. http://localhost:4318)")]
TraceFile = Annotated[Path | None, typer.Option(
    envvar="PLAIT_TRACE_FILE", help="append traces to this file, one JSON object per "
                                    "finished span")]


# -- serve ---------------------------------------------------------------------------------
def serve(
    data_dir: Annotated[Path, typer.Option(help="where the SQLite store and admin token live")]
    = Path(".plait"),
    store: Annotated[str | None, typer.Option(
        help="zk://host:port,...[?auth_file=PATH] or sqlite:///path (default: SQLite in "
             "--data-dir)")] = None,
    host: str = "127.0.0.1",
    port: int = 7070,
    machines: Annotated[int, typer.Option(min=1, help="machines of a new region")] = 48,
    dcs: Annotated[int, typer.Option(min=1)] = 2,
    msbs_per_dc: Annotated[int, typer.Option(min=1)] = 3,
    sim_agents: Annotated[bool, typer.Option(help="run simulated agents on every machine")]
    = False,
    tick: Annotated[float, typer.Option(min=0.01, help="seconds between reconcile passes")]
    = 0.5,
    min_pass_gap: Annotated[float, typer.Option(
        min=0.0, max=10.0, help="seconds at least between two passes' starts: a burst of "
                                "requests is taken in passes this far apart (longer: "
                                "fewer, larger passes, and later placements)")] = 0.05,
    event_retention: Annotated[int, typer.Option(min=1, help="events kept in all")] = 10_000,
    event_retention_per_owner: Annotated[int, typer.Option(
        min=1, help="events kept of each owner (an entitlement's, or an owner's own "
                    "requests'): one owner's volume drops only its own")] = 2_000,
    event_retention_system: Annotated[int, typer.Option(
        min=1, help="events kept of the region's own (admins', plait's components')")]
    = 5_000,
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
    otlp_endpoint: OtlpEndpoint = None,
    trace_file: TraceFile = None,
    metrics: Annotated[bool, typer.Option(
        help="count and time what the control plane does (Prometheus, GET /metrics); "
             "off, /metrics is empty")] = True,
    owner_max_jobs: Annotated[int, typer.Option(
        min=0, help="jobs one owner may hold, unless an admin set its own (plait owner "
                    "limits set)")] = 1_000,
    owner_max_tasks: Annotated[int, typer.Option(
        min=0, help="tasks in all one owner may hold, unless an admin set its own")]
    = 50_000,
    metrics_jobs: Annotated[int, typer.Option(
        min=0, max=100_000, help="jobs with per-job series of their own in /metrics: those "
                                 "with the most tasks; the others' are summed (job "
                                 "\"_other\")")] = 100,
) -> None:
    """Run a replica of the control plane and its API (Ctrl-C stops it). Every replica
    on one store campaigns: the leader runs the control plane, the others keep warm,
    pass requests on to the leader and take over when it goes. At first start it
    creates an admin token and writes it to the client configuration, so the CLI works
    at once. With --shard, it is one scheduler shard of the region: it manages the
    jobs of the entitlements the front end maps to it, and clients talk to the front
    end (plait frontend), which writes the client configuration."""
    from plait.cli.signals import as_foreground

    as_foreground()  # (first: a script's background job starts with SIGINT ignored)
    import threading

    import uvicorn

    from plait import logconfig, tracing

    logconfig.configure("controlplane" if shard is None else "scheduler")
    log = logconfig.get("plait.serve")
    from plait.api.app import create_app
    from plait.model import RegionSpec
    from plait.server.controlplane import ControlPlaneConfig
    from plait.server.events import Retention
    from plait.server.limits import uvicorn_options
    from plait.server.serve import prepare

    try:
        region = RegionSpec.sized(machines, dcs=dcs, msbs_per_dc=msbs_per_dc,
                                  rows_per_msb=1, racks_per_row=2)
        _check_tls(tls_cert, tls_key)
        config = ControlPlaneConfig(region=region, tick_seconds=tick, sim_agents=sim_agents,
                                    min_pass_gap=min_pass_gap,
                                    retention=Retention(event_retention, event_max_age,
                                                        event_retention_per_owner,
                                                        event_retention_system),
                                    heartbeat_timeout=heartbeat_timeout,
                                    startup_grace=startup_grace, ca_file=ca_file, shard=shard,
                                    controller_networks=tuple(controller_networks.split(",")),
                                    controller_deadline=controller_deadline,
                                    metrics=metrics, metrics_jobs=metrics_jobs,
                                    owner_max_jobs=owner_max_jobs,
                                    owner_max_tasks=owner_max_tasks)
        scheme = "https" if tls_cert else "http"
        tracing.configure(otlp_endpoint, trace_file, "plait-serve" if shard is None else
                          f"plait-shard-{shard}", advertise or f"{scheme}://{host}:{port}")
        started = prepare(data_dir, store, config, host, port,
                          write_config and shard is None, context,
                          scheme="https" if tls_cert else "http")
    except PlaitError as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(EXIT_INVALID) from None
    from plait.server.leader import Leadership

    cp = started.control_plane
    cp.controllers.serving_at(started.url, *([advertise] if advertise else []))
    leadership = Leadership(cp, advertise or started.url, session_timeout=session_timeout)
    log.info("control plane started", machines=len(cp.fleet), api=started.url, shard=shard)
    _log_started(log, started, context)
    # the app's shutdown stops the loop and closes the store (uvicorn re-raises the
    # signal that stopped it, so nothing after run() would run)
    server = uvicorn.Server(uvicorn.Config(
        create_app(cp, close_store=True, leadership=leadership), host=host, port=port,
        log_level="warning", access_log=False, **uvicorn_options(),
        ssl_certfile=str(tls_cert) if tls_cert else None,
        ssl_keyfile=str(tls_key) if tls_key else None))
    handle_exit = server.handle_exit

    def stopping(sig: int, frame: Any) -> None:
        # agents' long-polls are answered at once, so the stop waits for none of them
        # (on a thread: the signal may have come while the main thread holds the lock)
        threading.Thread(target=cp.gateway.waiters.close, daemon=True).start()
        handle_exit(sig, frame)
    server.handle_exit = stopping  # type: ignore[method-assign]
    server.run()
    if not server.started:
        raise typer.Exit(3)  # (as uvicorn.run: it could not start, and said why)


def _check_tls(tls_cert: Path | None, tls_key: Path | None) -> None:
    if (tls_cert is None) != (tls_key is None):
        raise ValidationError("tls", "give --tls-cert and --tls-key together")
    for f in (tls_cert, tls_key):
        if f is not None and not f.is_file():
            raise ValidationError("tls", f"{f} is not a file")


def _log_started(log: Any, started: Started, context: str) -> None:
    """The store's warnings, and where the client configuration was written."""
    from plait.store.backup import store_warnings

    for warning in store_warnings(started.control_plane.store):
        log.warning(warning)
    if started.config_path is not None:
        log.info("client configuration written", path=str(started.config_path),
                 context=started.context)
        if started.context != context:
            log.warning("the client context asked for holds another region's URL: kept, "
                        "and this region's written under another name",
                        asked=context, written=started.context)


def frontend(
    data_dir: Annotated[Path, typer.Option(
        help="where the SQLite store is (when no --store) and the admin token was "
             "written")] = Path(".plait"),
    store: Annotated[str | None, typer.Option(
        help="zk://host:port,...[?auth_file=PATH] or sqlite:///path (default: SQLite in "
             "--data-dir)")] = None,
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
    otlp_endpoint: OtlpEndpoint = None,
    trace_file: TraceFile = None,
) -> None:
    """Run a front end of a sharded region: one API over every scheduler shard
    (plait serve --shard S). It keeps no state (the entitlement-to-shard map is in the
    store), so several may run, each behind its own URL; clients and agents may use any
    of them."""
    from plait.cli.signals import as_foreground

    as_foreground()  # (first: a script's background job starts with SIGINT ignored)
    import uvicorn

    from plait import logconfig, tracing

    logconfig.configure("frontend")
    log = logconfig.get("plait.frontend")
    from plait.frontend.router import ShardRouter
    from plait.server.limits import uvicorn_options
    from plait.server.serve import store_for

    if (tls_cert is None) != (tls_key is None):
        err.print("[red]error:[/red] tls: give --tls-cert and --tls-key together")
        raise typer.Exit(EXIT_INVALID)
    url = f"{'https' if tls_cert else 'http'}://{host}:{port}"
    try:
        tracing.configure(otlp_endpoint, trace_file, "plait-frontend", url)
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
        context = client.own_context(context, url)
        old = client.contexts.get(context)
        token = admin_file.read_text().strip() if admin_file.exists() else (
            old.token if old is not None else None)
        client.set_context(context, url, token, ca_file=ca_file)
        log.info("client configuration written", path=str(client.save(None)),
                 context=context)
    log.info("front end started", api=url)
    uvicorn.run(ShardRouter(opened, identity=url, ca_file=ca_file), host=host, port=port,
                log_level="warning", access_log=False, **uvicorn_options(),
                ssl_certfile=str(tls_cert) if tls_cert else None,
                ssl_keyfile=str(tls_key) if tls_key else None)


def entitlement_move(name: str, to_shard: Annotated[int, typer.Option(
        "--to-shard", min=0, help="the scheduler shard to manage it from now on")],
        output: Output = "table") -> None:
    """Move an entitlement to another scheduler shard, without restarting any of its
    tasks (its jobs accept no changes for the moment it takes)."""
    a = api()
    done = a.post(f"/v1/admin/entitlements/{q(name)}/move", {"shard": to_shard})
    emit(done, output, lambda d: print(
        f"entitlement {d['entitlement']}: shard {d['from_shard']} -> {d['to_shard']}, "
        f"{d['jobs']} jobs, writes held for {d['unavailable_s']:.3f}s"))


# -- agent ---------------------------------------------------------------------------------
def agent(
    machine_id: Annotated[str, typer.Option(help="this machine's id in the region")],
    control_plane: Annotated[str, typer.Option(help="front-end URL(s), comma-separated")],
    data_dir: Annotated[Path, typer.Option(help="the agent's state, task dirs and logs")],
    join_token_file: Annotated[Path | None, typer.Option(
        help="a file holding the cluster join token (first start only; or set "
             "PLAIT_JOIN_TOKEN). Never on the command line, where ps shows it")] = None,
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
        help="a directory or file sandboxed tasks must not see (repeatable; the join "
             "token file is hidden anyway)")] = None,
    task_user: Annotated[str, typer.Option(
        help="sandbox, agent run as root: the user tasks run as (root: as root, with "
             "reduced capabilities)")] = "nobody",
    ca_file: Annotated[str | None, typer.Option(
        help="the CA certificate of the control plane's https URLs (plait admin certs "
             "writes ca.pem); default: the system's authorities")] = None,
    metrics_port: Annotated[int, typer.Option(
        min=0, max=65535, help="serve Prometheus metrics at http://HOST:PORT/metrics "
                               "(0: not served)")] = 0,
    metrics_host: Annotated[str, typer.Option(
        help="the address the metrics are served on (loopback by default: they name "
             "the jobs on this machine)")] = "127.0.0.1",
    profile_applier: Annotated[str, typer.Option(
        help="what switches the machine's host profile: record (on record only), sysctl "
             "(writes /proc/sys, restores on leave) or script (--profile-script)")]
    = "record",
    profile_script: Annotated[str | None, typer.Option(
        help="the script applier's command: run as CMD apply PROFILE.json")] = None,
    profile_timeout: Annotated[float, typer.Option(
        min=0.1, help="seconds a profile script may run before it is killed")] = 300.0,
) -> None:
    """Run the agent of one machine: join, pull the desired task set, run the tasks as
    processes, report their statuses and output. Tasks keep running if the control
    plane is unreachable, and a restarted agent adopts them."""
    from plait.cli.signals import as_foreground

    as_foreground()  # (first: a script's background job starts with SIGINT ignored)
    import signal
    import threading

    import httpx

    from plait import logconfig
    from plait.cli.common import safe

    logconfig.configure("agent")
    log = logconfig.get("plait.agent").bind(machine=machine_id)
    from plait.agent.daemon import Agent, JoinRefused
    from plait.agent.runtimes import create_runtime

    join_token = os.environ.get("PLAIT_JOIN_TOKEN") or None
    if join_token_file is not None:
        try:
            join_token = join_token_file.read_text(encoding="utf-8").strip() or None
        except (OSError, UnicodeError) as exc:
            err.print(f"[red]error:[/red] cannot read the join token from {join_token_file}: "
                      f"{getattr(exc, 'strerror', None) or exc}")
            raise typer.Exit(EXIT_INVALID) from None
    described = {"fault_domain": fault_domain, "cpu": cpu, "memory_gb": memory_gb,
                 "type": type}
    if any(v is not None for v in described.values()):
        missing = [f"--{k.replace('_', '-')}" for k, v in described.items() if v is None]
        if missing:
            err.print(f"[red]error:[/red] registering a machine needs {', '.join(missing)} too")
            raise typer.Exit(EXIT_INVALID)
        described["disk_gb"] = disk_gb
    from plait.sidekick.appliers import make as make_applier

    try:
        applier = make_applier(profile_applier, data_dir / "sidekick", script=profile_script,
                               timeout=profile_timeout)
        a = Agent(machine_id, control_plane.split(","), join_token, data_dir, advertise,
                  runtime=create_runtime(runtime, data_dir, [
                      *(hide or ()), *([join_token_file] if join_token_file else [])],
                      task_user),
                  describe=described if fault_domain is not None else None,
                  ca_file=ca_file, applier=applier)
    except (ValueError, OSError, RuntimeError, PlaitError) as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(EXIT_INVALID) from None
    log.info("agent started", isolation=a.runtime.describe(), adopted=len(a.handles))
    if metrics_port:
        from prometheus_client import start_http_server

        try:
            start_http_server(metrics_port, metrics_host, registry=a.metrics.registry)
        except OSError as exc:
            err.print(f"[red]error:[/red] cannot serve metrics on {metrics_host}:"
                      f"{metrics_port}: {exc.strerror or exc}")
            raise typer.Exit(EXIT_INVALID) from None
    stop = threading.Event()
    shutdown = {"tasks": False}

    def stop_tasks(*_: object) -> None:  # Ctrl-C (SIGINT): stop the tasks too
        shutdown["tasks"] = True
        stop.set()

    # SIGTERM stops the agent alone: its tasks keep running, and a new agent adopts them
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, stop_tasks)
    (data_dir / "agent.pid").write_text(f"{os.getpid()}\n")
    # join first: a refused join is an error, not a retry; but a live agent of the
    # machine (409) may be one that just stopped (a host reinstalled, its data dir
    # lost), whose last heartbeat the control plane still counts: waited out
    waiting_since = time.monotonic()
    while not stop.is_set():
        try:
            a.join()
            break
        except (ConnectionError, httpx.HTTPStatusError) as exc:  # (5xx: no leader yet)
            log.warning("cannot join yet; retrying", error=str(exc))
            stop.wait(interval)
        except (ValueError, OSError) as exc:  # no join token, a data dir it cannot write
            err.print(f"[red]error:[/red] {exc}")
            raise typer.Exit(EXIT_INVALID) from None
        except JoinRefused as exc:
            if exc.status == 409 and time.monotonic() - waiting_since < JOIN_WAIT:
                log.warning("join refused: waiting for the machine's last agent to be "
                            "silent", error=exc.reason)
                stop.wait(interval)
                continue
            err.print(f"[red]error:[/red] the control plane refused machine {machine_id}: "
                      f"{safe(exc.reason)}")
            raise typer.Exit(EXIT_DENIED if exc.status in (401, 403) else EXIT_INVALID) from None
    a.run(interval, stop)
    if shutdown["tasks"]:
        a.shutdown()
        log.info("tasks stopped")


# one command each (plait.cli.main loads them when named)
serve_app = typer.Typer()
serve_app.command()(serve)
scheduler_app = typer.Typer()
scheduler_app.command("scheduler", help="Run a replica of scheduler shard --shard S of a "
                      "sharded region (the same as plait serve --shard S).")(serve)
frontend_app = typer.Typer()
frontend_app.command()(frontend)
agent_app = typer.Typer()
agent_app.command()(agent)
