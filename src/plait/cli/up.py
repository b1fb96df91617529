"""plait up: a whole region on this box (control plane, replicas, shards, agents)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, TYPE_CHECKING, Annotated

import typer

from plait.cli.client import EXIT_INVALID
from plait.cli.common import err, out
from plait.cli.daemons import OtlpEndpoint, TraceFile
from plait.errors import Conflict, PlaitError
from plait.localprocs import (
    alive,
    cmdline,
    kill_groups,
    listen_error,
    plait_processes,
    processes_under,
)

if TYPE_CHECKING:
    import threading

    from plait.server.controlplane import ControlPlane
    from plait.server.leader import Leadership


# -- up ------------------------------------------------------------------------------------
def up(
    data_dir: Annotated[Path, typer.Option(help="store, tokens and agents' state")]
    = Path(".plait"),
    machines: Annotated[int | None, typer.Option(
        min=1, max=200, help="agents (one per machine) of a new region (default 6)")]
    = None,
    dcs: Annotated[int | None, typer.Option(
        min=1, help="data centers of a new region (default 2)")] = None,
    msbs_per_dc: Annotated[int | None, typer.Option(
        min=1, help="MSBs per data center of a new region (default 3)")] = None,
    host: str = "127.0.0.1",
    port: int = 7070,
    heartbeat_timeout: Annotated[float, typer.Option(min=0.5)] = 5.0,
    startup_grace: Annotated[float, typer.Option(
        min=0, help="seconds the agents have for their first heartbeat")] = 30.0,
    runtime: Annotated[str, typer.Option(help="the agents' runtime: process or sandbox")]
    = "process",
    task_user: Annotated[str, typer.Option(
        help="sandbox, run as root: the user tasks run as (root: as root, with reduced "
             "capabilities)")] = "nobody",
    replicas: Annotated[int, typer.Option(
        min=1, max=9, help="control-plane replicas (one leads; the others, `plait serve` "
                           "processes on ports PORT+1..., take over when it goes)")] = 1,
    store: Annotated[str | None, typer.Option(
        help="zk://host:port,... (default: SQLite in --data-dir)")] = None,
    shards: Annotated[int, typer.Option(
        min=1, max=16, help="scheduler shards behind a front end on PORT (shard S replica "
                            "R on PORT+1+S*REPLICAS+R)")] = 1,
    profile_applier: Annotated[str, typer.Option(
        help="what switches each machine's host profile: record, sysctl or script "
             "(the agents' --profile-applier)")] = "record",
    profile_script: Annotated[str | None, typer.Option(
        help="the script applier's command (CMD apply PROFILE.json)")] = None,
    owner_max_jobs: Annotated[int, typer.Option(
        min=0, help="jobs one owner may hold, unless an admin set its own")] = 1_000,
    owner_max_tasks: Annotated[int, typer.Option(
        min=0, help="tasks in all one owner may hold, unless an admin set its own")]
    = 50_000,
    otlp_endpoint: OtlpEndpoint = None,
    trace_file: TraceFile = None,
) -> None:
    """A whole region on this box: the control plane (API, scheduler, allocator,
    brokers, health checks), with --replicas, and one agent process per machine, each
    with its own fault domain. With --shards, the scheduling is split by entitlement
    between shards (each with --replicas), behind a front end. Ctrl-C stops the agents
    and their tasks; `plait up` again on the same data dir brings every job back.
    Agents and replicas that still run (the `plait up` process alone was killed) are
    adopted, with their tasks, instead of started again. Logs: DATA/up.log (this
    process: the API and the control plane), DATA/replicas/*.log and
    DATA/agents/*/agent.log; warnings and errors of this process also on stderr."""
    from plait.cli.signals import as_foreground

    as_foreground()  # (first: a script's background job starts with SIGINT ignored)
    import threading

    from plait import logconfig, tracing

    held = _hold(data_dir)  # (for this process's whole life: released when it ends)
    # (a file: a region's every request and task start would drown the terminal)
    logconfig.configure("up", file=data_dir / "up.log")
    from plait.frontend.router import ShardRouter
    from plait.model import RegionSpec
    from plait.server.controlplane import ControlPlaneConfig
    from plait.server.serve import ApiServer, AsgiServer, prepare, store_for

    region = RegionSpec.sized(machines or 6, dcs=dcs or 2, msbs_per_dc=msbs_per_dc or 3,
                              rows_per_msb=1, racks_per_row=1)
    sharded = shards > 1
    # a region on one box: its TaskControllers run on loopback too
    config = ControlPlaneConfig(region=region, tick_seconds=0.2,
                                heartbeat_timeout=heartbeat_timeout,
                                startup_grace=startup_grace, shard=0 if sharded else None,
                                controller_networks=("loopback", "any"),
                                owner_max_jobs=owner_max_jobs,
                                owner_max_tasks=owner_max_tasks)
    # Ctrl-C from now on stops whatever has started, in order
    done = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: done.set())
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    try:  # (its replicas are given the same tracing: tracing.argv)
        tracing.configure(otlp_endpoint, trace_file, "plait-up", f"http://{host}:{port}")
    except PlaitError as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(EXIT_INVALID) from None
    # sharded: the front end on PORT, shard S replica R on PORT+1+S*REPLICAS+R (this
    # process runs the front end and shard 0's first replica)
    first = port + 1 if sharded else port
    planned = _planned_replicas(data_dir, shards, replicas, first, sharded)
    _check_ports(host, port, first, shards, replicas, sharded, planned)
    started = prepare(data_dir, store, config, host, port)
    cp = started.control_plane
    given = [f"--{flag} {value}" for flag, value in (
        ("machines", machines), ("dcs", dcs), ("msbs-per-dc", msbs_per_dc)) if value]
    if given and cp.region_spec != region:  # (the region stored in the data dir wins)
        err.print(f"[yellow]warning:[/yellow] {data_dir} holds a region of {len(cp.fleet)} "
                  f"machines already: {', '.join(given)} ignored (they shape a new region: "
                  "give another --data-dir for one)")
    join_file = _region_records(cp, data_dir, shards if sharded else 0)
    # the agents start first (they retry their join until the API answers): their
    # start-up overlaps the control plane's
    server = ApiServer(cp, host, first, log_level="warning",
                       replica=replicas > 1 or sharded)
    front = AsgiServer(ShardRouter(store_for(data_dir, store), identity=f"http://{host}:"
                                   f"{port}"), host, port) if sharded else None
    urls = [front.url] if front is not None else [server.url] + [
        f"http://{host}:{port + i}" for i in range(1, replicas)]
    start_agent = _agent_starter(cp, data_dir, urls, join_file, [
        "--runtime", runtime, "--task-user", task_user, "--hide", str(data_dir.resolve()),
        "--profile-applier", profile_applier,
        *(["--profile-script", profile_script] if profile_script else [])])
    agents, adopted = _start_agents(cp, data_dir, start_agent)
    server.start()
    # the other replicas, once this one campaigns (it leads, unless a replica left
    # running by a killed `plait up` does)
    followers = _start_replicas(planned, data_dir, [
        *(["--store", store] if store else []), "--host", host,
        "--no-write-config", "--tick", "0.2", "--heartbeat-timeout",
        str(heartbeat_timeout), "--startup-grace", str(startup_grace),
        "--controller-networks", "loopback,any", *tracing.argv()], sharded)
    if front is not None:
        front.start()
    _await_election(server.leadership, done)
    if front is not None:  # every shard has a leader: the front end serves
        _await_front(front.url, done)
        out.print(f"[bold]plait up[/bold]: {len(cp.fleet)} machines "
                  f"({len(agents) - adopted} agents started, {adopted} adopted), "
                  f"{shards} scheduler shards x {replicas} replicas on ports {first}-"
                  f"{first + shards * replicas - 1}, API (front end) on {front.url}")
    else:
        # (heartbeats are counted by the leader: here, unless another replica leads)
        lead = server.leadership
        ready = cp.gateway.wait_for_agents(list(agents), timeout=60) if lead is None or \
            lead.leading else 0
        out.print(f"[bold]plait up[/bold]: {len(cp.fleet)} machines "
                  f"({len(agents) - adopted} agents started, {adopted} adopted; {ready} "
                  f"heartbeating), API on {server.url}"
                  + (f", replicas on {', '.join(urls[1:])}" if replicas > 1 else ""))
    _say_started(data_dir, followers, started.context, started.config_path)
    _watch_until(done, data_dir, followers, AgentWatch(data_dir, agents, start_agent))
    out.print("stopping the agents and their tasks ...")
    _stop_region(data_dir, followers, agents)
    if front is not None:
        front.stop()
    server.stop()
    cp.store.close()
    _stop_left(data_dir)
    held.close()  # (everything of the region stopped: another plait up may start)


#: a process of the region this run started (Popen), or one it adopted (its pid)
Child = subprocess.Popen[bytes] | int


def _planned_replicas(data_dir: Path, shards: int, replicas: int, first: int,
                      sharded: bool) -> list[tuple[str, int, Path, int | None]]:
    """The other replicas (name, port, pid file, pid if running): those left running by
    a killed `plait up` (or restarted by hand since) are adopted, the others started."""
    planned: list[tuple[str, int, Path, int | None]] = []
    for shard in range(shards):
        for i in range(replicas):
            if shard == 0 and i == 0:
                continue  # (this process)
            name = f"{shard}-{i}" if sharded else str(i)
            pid_file = data_dir / "replicas" / f"{name}.pid"
            at = first + shard * replicas + i
            planned.append((name, at, pid_file,
                            _alive_pid(pid_file, b"serve") or _serving_on(data_dir, at)))
    return planned


def _check_ports(host: str, port: int, first: int, shards: int, replicas: int, sharded: bool,
                 planned: list[tuple[str, int, Path, int | None]]) -> None:
    """Before anything starts (agents that outlive a failed `up`): every port this run
    listens on must be free."""
    ours = [port, *([first] if sharded else []),
            *(at for _, at, _, pid in planned if pid is None)]
    for at in ours:
        taken = listen_error(host, at)
        if taken is not None:
            flag = "--port" if at == port else f"--port (plait up listens on {port}-" \
                f"{first + shards * replicas - 1})"
            err.print(f"[red]error:[/red] cannot listen on {host}:{at} ({taken}): another "
                      f"plait up or plait serve there? ({flag})")
            raise typer.Exit(EXIT_INVALID)


def _region_records(cp: ControlPlane, data_dir: Path, shards: int) -> Path:
    """The agents' join token's file, written (owner-only) on the region's first start;
    and the shards' records, which the front end waits on (for each one's leader)."""
    for shard in range(shards):
        with contextlib.suppress(Conflict):
            cp.store.create(f"/frontend/shards/{shard}", b"{}")
    join_file = data_dir / "join-token"
    if not join_file.exists():
        _, token = cp.tokens.create("join", "plait-up", cp.clock(), "agents of plait up")
        fd = os.open(join_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(token + "\n")
    return join_file


def _agent_starter(cp: ControlPlane, data_dir: Path, urls: list[str], join_file: Path,
                   options: list[str]) -> Callable[[str], subprocess.Popen[bytes]]:
    """What starts the agent of one machine (by name), with the agents' ``options``."""
    index = {cp.fleet.name(m): m for m in range(len(cp.fleet))}

    def start_agent(name: str) -> subprocess.Popen[bytes]:
        m, home = index[name], data_dir / "agents" / name
        log = open(home / "agent.log", "ab")  # noqa: SIM115 (the agent's lifetime)
        res = cp.fleet.resources(m)
        # each agent describes its machine, as on a real host (checked on join)
        try:
            return subprocess.Popen(
                [sys.executable, "-m", "plait.cli.agent", "--machine-id", name,
                 "--control-plane", ",".join(urls), "--join-token-file", str(join_file),
                 "--data-dir", str(home),
                 "--interval", "0.5", "--fault-domain", str(cp.fleet.fault_domain(m)),
                 "--cpu", f"{res.cpu:g}", "--memory-gb", f"{res.memory_gb:g}",
                 "--type", cp.fleet.type_names[int(cp.fleet.type_code[m])], *options],
                stdout=log, stderr=log, start_new_session=True)  # outlives a killed `up`
        finally:
            log.close()  # (the agent has its own copy)

    return start_agent


def _start_agents(cp: ControlPlane, data_dir: Path,
                  start_agent: Callable[[str], subprocess.Popen[bytes]],
                  ) -> tuple[dict[str, Child], int]:
    """One agent per machine, those still running from before adopted with their tasks;
    and how many were adopted."""
    agents: dict[str, Child] = {}
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
        agents[name] = start_agent(name)
    return agents, adopted


def _start_replicas(planned: list[tuple[str, int, Path, int | None]], data_dir: Path,
                    options: list[str], sharded: bool) -> dict[str, Child]:
    """The other replicas: `plait serve` processes with ``options``, or adopted."""
    followers: dict[str, Child] = {}
    for name, at, pid_file, pid in planned:
        pid_file.parent.mkdir(parents=True, exist_ok=True)
        if pid is not None:  # left running (or restarted by hand since): adopted
            followers[name] = pid
            pid_file.write_text(f"{pid}\n")
            continue
        log = open(data_dir / "replicas" / f"{name}.log", "ab")  # noqa: SIM115
        followers[name] = proc = subprocess.Popen(
            [sys.executable, "-m", "plait.cli.main", "serve", "--data-dir", str(data_dir),
             *options, "--port", str(at),
             *(["--shard", name.split("-")[0]] if sharded else [])],
            stdout=log, stderr=log, start_new_session=True)
        pid_file.write_text(f"{proc.pid}\n")
    return followers


def _say_started(data_dir: Path, followers: dict[str, Child], context: str | None,
                 config_path: Path | None) -> None:
    """A replica that could not start (it says why in its log), where the CLI is
    configured, and where the logs are."""
    for name, child in followers.items():
        if not isinstance(child, int) and child.poll() is not None:
            err.print(f"[yellow]warning:[/yellow] replica {name} exited with "
                      f"{child.returncode}: see {data_dir / 'replicas' / f'{name}.log'}")
    named = "" if context in (None, "local") else (
        f", context {context}: the context local is another region's")
    out.print(f"CLI configured ({config_path}{named}): try "
              "[cyan]plait entitlement create examples/entitlements.yaml[/cyan], then "
              "[cyan]plait job deploy examples/web.yaml --wait[/cyan]; Ctrl-C stops")
    out.print(f"logs: {data_dir / 'up.log'}, {data_dir / 'replicas'}/*.log, "
              f"{data_dir / 'agents'}/*/agent.log")


def _stop_left(data_dir: Path) -> None:
    """What is left of the region (tasks of an agent killed earlier and never restarted)."""
    left = processes_under(data_dir.resolve())
    if left:
        out.print(f"stopping {len(left)} processes left in {data_dir} ...")
        _stop_all(left, signal.SIGTERM, [], timeout=10)
        kill_groups(p for p in left if alive(p))


def _await_election(lead: Leadership | None, done: threading.Event) -> None:
    """Until the election has an outcome: this replica leads, or another does (at most
    10 s: a region of one replica has no election)."""
    deadline = time.monotonic() + 10
    while lead is not None and not lead.leading and lead.leader() in (None, lead.identity) \
            and time.monotonic() < deadline and not done.is_set():
        time.sleep(0.05)


def _await_front(url: str, done: threading.Event) -> None:
    """Until the front end serves (every shard has a leader), at most 60 s."""
    import httpx

    probe = httpx.Client(timeout=5)
    deadline = time.monotonic() + 60
    while not done.is_set() and time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if probe.get(f"{url}/healthz").status_code == 200:
                break
        time.sleep(0.1)
    probe.close()


def _watch_until(done: threading.Event, data_dir: Path, followers: dict[str, Child],
                 watch: AgentWatch) -> None:
    """Until Ctrl-C: a replica this run started that exits is said (once), and reaped:
    no one restarts it, and a region short of a replica should not look whole. An agent
    that exits while its tasks run is restarted, to adopt them (``AgentWatch``)."""
    gone: set[str] = set()
    while not done.wait(0.25):
        for name, child in followers.items():
            if isinstance(child, int) or name in gone or child.poll() is None:
                continue
            gone.add(name)
            err.print(f"[yellow]warning:[/yellow] replica {name} exited with "
                      f"{child.returncode} and is not restarted: see "
                      f"{data_dir / 'replicas' / f'{name}.log'}")
        for said in watch.check(time.monotonic()):
            err.print(f"[yellow]warning:[/yellow] {said}")


def _stop_region(data_dir: Path, followers: dict[str, Child], agents: dict[str, Child]) -> None:
    """Every replica and agent of this data dir, those restarted by hand since included
    (found by their command lines), not only the processes this run started."""
    children = [p for p in (*followers.values(), *agents.values()) if not isinstance(p, int)]
    replica_pids = {p if isinstance(p, int) else p.pid for p in followers.values()} | (
        plait_processes(data_dir, "serve"))
    agent_pids = {p if isinstance(p, int) else p.pid for p in agents.values()} | (
        plait_processes(data_dir / "agents", "agent"))
    _stop_all(replica_pids, signal.SIGTERM, children)  # (first: none takes over meanwhile)
    _stop_all(agent_pids, signal.SIGINT, children)  # SIGINT: an agent stops its tasks too


#: after an agent exits, how long its machine's processes have to go with it before
#: `plait up` looks (a machine that dies takes its agent and its tasks at once)
AGENT_SETTLE_SECONDS = 0.5
#: restarts of one agent within ``RESTART_WINDOW_SECONDS`` past which it is left down
#: (as systemd's ``StartLimitBurst``: an agent that cannot start is not started forever)
RESTART_BURST = 5
RESTART_WINDOW_SECONDS = 60.0


def agent_exit_action(tasks_running: int, other_agent: int | None,
                      restarts: list[float], now: float) -> str:
    """What ``plait up`` does about an agent of its region that exited:

    * ``adopt``: another agent of the machine runs (restarted by hand): it is the
      machine's agent now;
    * ``dead``: nothing of its machine runs any more: the machine died (its agent and
      its tasks at once, as ``kill_machine`` of the harness kills one). It stays down,
      and the control plane replaces its tasks elsewhere after the heartbeat timeout;
    * ``restart``: its tasks still run (the agent crashed, the machine did not): a new
      agent adopts them, before the control plane takes the machine for failed and
      starts their replacements elsewhere (two copies, the old one out of its control);
    * ``give_up``: as ``restart``, but it was restarted ``RESTART_BURST`` times within
      ``RESTART_WINDOW_SECONDS``."""
    if other_agent is not None:
        return "adopt"
    if not tasks_running:
        return "dead"
    if sum(1 for t in restarts if now - t < RESTART_WINDOW_SECONDS) >= RESTART_BURST:
        return "give_up"
    return "restart"


class AgentWatch:
    """The agents of a ``plait up`` run, looked at a few times a second
    (``agent_exit_action`` decides). An agent restarted by hand or by this watch is
    watched the same way; a machine taken as dead (or given up on) is not looked at
    again by this run (its agents are still stopped with the region)."""

    def __init__(self, data_dir: Path,
                 agents: dict[str, subprocess.Popen[bytes] | int],
                 start: Callable[[str], subprocess.Popen[bytes]]) -> None:
        self.data_dir, self.agents, self.start = data_dir, agents, start
        self.exited_at: dict[str, float] = {}
        self.restarts: dict[str, list[float]] = {}
        self.down: set[str] = set()

    def check(self, now: float) -> list[str]:
        """Look at every agent; what is to be said."""
        said = []
        for name, child in list(self.agents.items()):
            if name in self.down:
                continue
            if isinstance(child, int):
                code: int | str | None = None if alive(child) else "an unknown code"
            else:
                code = child.poll()
            if code is None:
                continue
            first = self.exited_at.setdefault(name, now)
            if now - first < AGENT_SETTLE_SECONDS:
                continue
            del self.exited_at[name]
            said.append(self._exited(name, code, now))
        return said

    def _exited(self, name: str, code: int | str, now: float) -> str:
        home = self.data_dir / "agents" / name
        log = home / "agent.log"
        others = {p for p in plait_processes(home, "agent") if alive(p)}
        tasks = {p for p in processes_under(home.resolve()) if alive(p)} - others
        restarts = self.restarts.setdefault(name, [])
        action = agent_exit_action(len(tasks), min(others, default=None), restarts, now)
        if action == "adopt":
            self.agents[name] = min(others)
            return (f"agent {name} exited with {code}; another agent of it runs (pid "
                    f"{min(others)}), started by hand: it is {name}'s agent now")
        if action == "restart":
            restarts[:] = [t for t in restarts if now - t < RESTART_WINDOW_SECONDS] + [now]
            try:
                child = self.start(name)
            except OSError as exc:
                # no process or file to spare: tried again at the next look, counted as a
                # restart (the burst limit ends it); the watch itself must not die of it
                return (f"agent {name} exited with {code}; it could not be restarted: "
                        f"{exc} (tried again in a moment)")
            self.agents[name] = child
            return (f"agent {name} exited with {code} while {len(tasks)} processes of its "
                    f"tasks ran: restarted (pid {child.pid}) to adopt them; see {log}")
        self.down.add(name)
        if action == "give_up":
            return (f"agent {name} exited with {code} after {RESTART_BURST} restarts within "
                    f"{RESTART_WINDOW_SECONDS:g}s, and is not restarted again: see {log} "
                    f"(its {len(tasks)} task processes run on, out of plait's control "
                    "until an agent of it runs)")
        return (f"agent {name} exited with {code}, and nothing of its machine runs: the "
                f"machine is taken as dead and not restarted (the next plait up starts "
                f"it); see {log}")


def _hold(data_dir: Path) -> IO[str]:
    """The data dir's lock (``up.lock``, with the holder's pid), or exit 2 naming the
    ``plait up`` that holds it. Two on one data dir would both lead its region, each
    with its own view of the store, and the one stopped first would stop the other's
    agents and tasks. The kernel releases it when the process ends, a SIGKILL too."""
    data_dir.mkdir(parents=True, exist_ok=True)
    f = open(data_dir / "up.lock", "a+")  # noqa: SIM115 (held until the process ends)
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.seek(0)
        holder = f.read().strip() or "?"
        f.close()
        err.print(f"[red]error:[/red] another plait up (pid {holder}) runs the region of "
                  f"{data_dir}: stop it first (Ctrl-C), or give another --data-dir")
        raise typer.Exit(EXIT_INVALID) from None
    f.seek(0)
    f.truncate()
    f.write(f"{os.getpid()}\n")
    f.flush()
    return f


def _stop_all(pids: set[int], sig: int, children: list[subprocess.Popen[bytes]],
              timeout: float = 30.0) -> None:
    """Signal every process, then wait (at most ``timeout``) until they are gone."""
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, sig)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        for child in children:
            child.poll()  # (reaps the children this run started)
        time.sleep(0.05)


def _serving_on(data_dir: Path, port: int) -> int | None:
    """A ``plait serve`` of this data dir on ``port`` (a replica restarted by hand)."""
    for pid in plait_processes(data_dir, "serve"):
        argv = cmdline(pid).split()
        if "--port" in argv and argv[argv.index("--port") + 1:][:1] == [str(port)]:
            return pid
    return None


def _alive_pid(path: Path, what: bytes = b"agent") -> int | None:
    try:
        pid = int(path.read_text().strip())
    except (OSError, ValueError):
        return None
    if not alive(pid):
        return None
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return pid if what in cmdline else None


up_app = typer.Typer()
up_app.command()(up)
