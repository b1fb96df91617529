"""The agent: one per machine. It joins with the cluster join token, then pulls its
machine's desired task set from the control plane, converges to it with real
processes, and reports their statuses, endpoints and output (DESIGN.md "Agents and
the control plane").

Everything the agent needs to keep its tasks running is on its own disk
(``DATA/agent.json``): a restarted agent adopts its running processes without
restarting them, and while the control plane is unreachable nothing is stopped.
When it reaches the control plane again, whatever is no longer assigned to its
machine is stopped (the agent fences itself: never two serving copies of a task).
A job with a fence (``JobSpec.fence``) asks for more: its tasks stop once the agent
has not reached the control plane for ``fence.seconds``, whether or not the agent
runs (``_fence`` while it does; its fence keeper process, ``plait.agent.fencekeeper``,
whatever becomes of it), and start again only from a desired set pulled after the
agent reached the control plane again (``plait.model.fence``).

It logs through ``plait.logconfig`` (logger ``plait.agent``): every line names the
machine, and lines about a task its job, index and revision; a start names the id of
the API request behind the assignment, a stop that of the request that last changed
the task's job (``request_id``, both as the desired set gives them).

Each task gets its own credential from its entry of the desired set: the agent binds
it to the endpoint it reports for the task to discovery (``host:port``: the
machine's advertised address and the task's port) and sets the result as
``PLAIT_TASK_CREDENTIAL`` in the task's environment, beside that endpoint as
``PLAIT_TASK_ENDPOINT`` (``plait.taskcontrol.signing.endpoint_credential``): kept in
memory only, never logged nor saved (a task started again after the agent restarted
gets it from the next desired set).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from plait import logconfig
from plait.agent import fencekeeper
from plait.agent.probe import Prober
from plait.agent.profile import ProfileSwitcher
from plait.agent.runtime import Handle, ProcessRuntime, proc_start_time
from plait.agent.wakeup import Wakeup
from plait.localprocs import listen_error
from plait.metrics import AgentMetrics
from plait.model import fence
from plait.model.converge import converge
from plait.model.job import restart_after
from plait.sidekick.appliers import Applier
from plait.sidekick.appliers import make as make_applier
from plait.taskcontrol.signing import endpoint_credential
from plait.tls import verify as tls_verify

log = logconfig.get("plait.agent")

#: output read per task and step: what one output chunk of the API may carry (the
#: rest follows with the next steps)
CHUNK_BYTES = 64 * 1024


@dataclass
class Task:
    job: str
    index: int
    revision: int
    port: int
    handle: dict[str, Any] | None = None
    log_offset: int = 0
    exit_code: int | None = None
    restarts: int = 0
    next_start: float = 0.0
    #: the process exited and will not be started again (restart policy)
    final: bool = False
    #: the job's restart policy: always, on-failure (with max_retries) or never
    policy: str = "always"
    max_retries: int = 3
    #: what its health probe said last (kept: a restarted agent's adopted tasks stay
    #: healthy, and in discovery, until their probe says otherwise)
    healthy: bool = False
    #: its last exit was a SIGKILL from outside (not this agent, not out of memory)
    killed: bool = False
    #: the request that assigned it, while its start waits (for the start's log line)
    cause: str | None = None
    #: stopped by its job's fence at this time (the fence keeper's clock): not started
    #: again before a desired set pulled after the agent reached the control plane
    #: again lists it
    fenced_at: float | None = None
    #: and the first report the control plane took after that (its answer's time)
    rejoined_at: float | None = None
    #: its job's ``fence.seconds`` (None: no fence)
    fence: float | None = None

    @property
    def key(self) -> str:
        return f"{self.job}.{self.index}"


def lock_data_dir(data_dir: Path) -> int:
    """Hold ``data_dir/agent.lock`` exclusively for this agent's life (the kernel lets
    go when the process dies, SIGKILL included; the descriptor is not inherited by
    tasks): a second agent on one machine's data dir would run each of its tasks
    again. Raises RuntimeError naming the agent that holds it."""
    fd = os.open(data_dir / "agent.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise RuntimeError(f"another agent (pid {holder}) runs on data dir {data_dir}: "
                           "one agent per machine (stop it first)") from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


#: a probe due within this many seconds is started with the others due now: the
#: probes of an agent's tasks fall into step, and its loop wakes once for them all
PROBE_SLACK = 0.1

#: the variables of the agent's environment a task starts with (as a systemd service
#: starts with its manager's few, not the shell's): what finds programs and sets the
#: locale and time zone, and who the process runs as; the rest only from the spec
TASK_HOST_ENV = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "LC_CTYPE", "TZ")

#: how long the run loop's long-poll waits for a change of the desired set (the
#: heartbeat is the report, sent every interval on its own; a report's answer names
#: the set's generation, so a poll stuck on a replica that stopped leading is caught
#: up at the next report)
LONG_POLL_SECONDS = 10.0

#: seconds of the control plane refusing this machine's credential (401) in a row
#: before the agent joins again to learn why (``Agent._refused``): a join of the
#: machine by another agent revokes this one's, and a refusal as short as a store
#: replica's lag behind a new credential is none
REVOKED_AFTER = 10.0
#: seconds a control plane may take a revoked credential still (its cache of them)
#: and more: a heartbeat it heard that long after this agent's first refusal was
#: another agent's
CREDENTIAL_CACHE_SLACK = 3.0

#: the kill timeout of a task whose spec names none
DEFAULT_KILL_TIMEOUT = 10.0
#: stops under way at once at most (each waits out its task's kill timeout)
STOP_THREADS = 256
#: how often the requests' deadlines are checked (seconds)
WATCH_SECONDS = 0.5


@dataclass
class Stopping:
    """A task being stopped in the background (kept in the agent's state, so a
    restarted agent finishes the stop)."""

    job: str
    index: int
    revision: int
    handle: dict[str, Any]
    grace: float
    #: forget its cgroups, logs and files once stopped (it left this machine)
    remove: bool
    future: Future[None] | None = None
    #: its job's ``fence.seconds``: the fence keeper guards it until it is gone
    fence: float | None = None

    def record(self) -> dict[str, Any]:
        return {"job": self.job, "index": self.index, "revision": self.revision,
                "handle": self.handle, "grace": self.grace, "remove": self.remove,
                "fence": self.fence}


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _some_port(host: str) -> int:
    """A free port, or 0 when none can be had now (a task holds them all): the start
    picks one then, or fails as a start does."""
    try:
        return _free_port(host)
    except OSError:
        return 0


def _batches(chunks: list[dict[str, Any]], limit: int = 512 * 1024
             ) -> list[list[dict[str, Any]]]:
    """Output chunks in requests well under the API's body limit."""
    batches: list[list[dict[str, Any]]] = []
    size = limit
    for chunk in chunks:
        n = len(json.dumps(chunk["data"])) + 100  # (as sent: escapes included)
        if size + n > limit:
            batches.append([])
            size = 0
        batches[-1].append(chunk)
        size += n
    return batches


class JoinRefused(RuntimeError):
    """The control plane refused this agent's join: ``status`` (its HTTP status) and
    ``reason`` (its answer's message)."""

    def __init__(self, machine: str, status: int, reason: str,
                 heard_ago: float | None = None) -> None:
        #: (a 409 for a live agent of the machine) how long ago the control plane
        #: heard that agent
        self.status, self.reason, self.heard_ago = status, reason, heard_ago
        super().__init__(f"joining as machine {machine} was refused ({status}): {reason}")


class BadDesired(ValueError):
    """A desired set not in the form the agent takes (the reason says where): taken as
    no answer, so every task keeps running as it is and the heartbeats go on."""


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def checked_desired(desired: Any) -> dict[str, Any]:
    """``desired`` if every part the agent reads is there and of its type, else
    ``BadDesired``: one malformed task must not stop the agent's loop, nor start or
    stop anything on a set read only in part."""
    if not isinstance(desired, dict) or not isinstance(desired.get("tasks"), list):
        raise BadDesired("a desired set without a list of tasks")
    if desired.get("generation") is not None and not _is_int(desired["generation"]):
        raise BadDesired("a generation that is not a whole number")
    for k, a in enumerate(desired["tasks"]):
        spec = a.get("spec") if isinstance(a, dict) else None
        res = spec.get("resources") if isinstance(spec, dict) else None
        if not (isinstance(a, dict) and isinstance(a.get("job"), str)
                and _is_int(a.get("index")) and _is_int(a.get("revision"))
                and isinstance(spec, dict) and isinstance(spec.get("command"), str)
                and isinstance(spec.get("args", []), list)
                and isinstance(spec.get("env", {}), dict)
                and isinstance(spec.get("restart") or {}, dict)
                and isinstance(spec.get("health") or {}, dict)
                and isinstance(res, dict) and isinstance(res.get("cpu"), (int, float))
                and isinstance(res.get("memory_gb", 0), (int, float))
                and isinstance(a.get("credential", ""), str)):
            raise BadDesired(f"task {k} of the desired set is malformed")
    stopping = desired.get("stopping", [])
    if not isinstance(stopping, list) or not all(
            isinstance(x, dict) and isinstance(x.get("job"), str) and _is_int(x.get("index"))
            for x in stopping):
        raise BadDesired("a malformed list of tasks stopping")
    return desired


def _fence_seconds(spec: dict[str, Any]) -> float | None:
    """The ``fence.seconds`` of a task's spec, or None (no fence)."""
    policy = spec.get("fence")
    seconds = policy.get("seconds") if isinstance(policy, dict) else None
    if isinstance(seconds, int | float) and not isinstance(seconds, bool):
        return float(seconds)
    return None


def _port_free(host: str, port: int) -> bool:
    return listen_error(host, port) is None


class Agent:
    def __init__(self, machine: str, urls: list[str], join_token: str | None, data_dir: Path,
                 advertise: str = "127.0.0.1", timeout: float = 5.0,
                 runtime: ProcessRuntime | None = None,
                 describe: dict[str, Any] | None = None, ca_file: str | None = None,
                 applier: Applier | None = None) -> None:
        """``describe``: this machine as it registers when it joins (fault_domain,
        cpu, memory_gb, type and optionally disk_gb); without it, the machine must be
        one the region has already. ``applier``: what switches the machine's host
        profile (``record`` by default: on record only)."""
        self.machine = machine
        self.log = log.bind(machine=machine)
        self.urls = [u.rstrip("/") for u in urls]
        self._url = 0  # the front end that answered last
        self.join_token = join_token
        # absolute: tasks run in their own directory, and PLAIT_DATA_DIR is theirs to
        # use from there (`plait up` gives a relative one)
        self.data_dir = Path(data_dir).resolve()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.data_dir, 0o700)  # its machine credential and the tasks' files
        self._lock: int | None = lock_data_dir(self.data_dir)
        #: Prometheus metrics (``plait agent --metrics-port`` serves them)
        self.metrics = AgentMetrics(self.phases)
        self.advertise = advertise
        self.describe = describe or {}
        # (loading the system's CA bundle costs a tenth of a second of cpu: only for
        # https, and only when no CA file of the control plane is given)
        self._verify = tls_verify(
            ca_file, "https:" if any(u.startswith("https:") for u in self.urls) else "http:")
        self.http = httpx.Client(timeout=timeout, verify=self._verify)
        #: requests under way: their deadlines, clients, and whether they expired
        #: (``_request``; the watchdog thread closes what runs past its deadline)
        self._deadlines: dict[threading.Event, tuple[float, httpx.Client]] = {}
        self._deadline_lock = threading.Lock()
        self._watchdog: threading.Thread | None = None
        self._closing = threading.Event()
        self.runtime = runtime or ProcessRuntime(self.data_dir)
        self.state_path = self.data_dir / "agent.json"
        digest = hashlib.sha1(str(self.data_dir).encode()).hexdigest()[:8]
        self.prefix = f"{machine}.{digest}"
        self.token: str | None = None
        #: since when the control plane has refused the machine's credential (401),
        #: and when the agent joins again to learn why (``_refused``)
        self.refused_since: float | None = None
        self._rejoin_at = 0.0
        #: the last refusal of a join logged, and when (``run``)
        self._join_refused: tuple[str, float] = ("", float("-inf"))
        self.tasks: dict[str, Task] = {}
        self.handles: dict[str, Handle] = {}
        #: the last spec seen per task (for its health probe)
        self.specs: dict[str, dict[str, Any]] = {}
        #: per task, its own credential as its desired set gave it (memory only)
        self.credentials: dict[str, str] = {}
        #: what the run loop sleeps on (woken by the long-poll, probes, stops, exits)
        self.wakeup = Wakeup()
        self.prober = Prober(on_change=self.wakeup.set)
        #: something a report should tell happened since the last (a start, an exit,
        #: a stop, a health change): the run loop reports at once
        self._dirty = False
        #: per task: (when, CPU seconds used then, the cores it used over the interval
        #: before): what its status reports as ``cpu``
        self._cpu: dict[str, tuple[float, float, float | None]] = {}
        #: the desired-set long-poll's latest answer (or why it failed), for the run
        #: loop; guarded by ``_inbox_lock``
        self._inbox: dict[str, Any] | Exception | None = None
        self._inbox_lock = threading.Lock()
        #: the last report's answer named a desired set newer than the agent has
        self._newer = False
        #: output read from tasks that exited, not sent yet
        self._output: list[dict[str, Any]] = []
        self.reachable = False
        #: the generation of the desired set last pulled (for the long-poll)
        self.generation: int | None = None
        self._saved: dict[str, Any] | None = None
        #: stops under way in the background (SIGTERM, then SIGKILL after the job's
        #: kill timeout): a task that ignores SIGTERM never holds up a heartbeat
        self.stopping: dict[str, Stopping] = {}
        #: (threads made as stops need them, up to more than a machine's tasks: a few
        #: tasks that ignore SIGTERM for their whole kill timeout hold up no other stop)
        self._stops = ThreadPoolExecutor(max_workers=STOP_THREADS, thread_name_prefix="plait-stop")
        #: the machine's host profile: switched before any task starts (Sidekick)
        self.profile = ProfileSwitcher(
            applier or make_applier("record", self.data_dir / "sidekick"), self.wakeup.set,
            machine)
        #: the fence's clock (seconds since boot, suspend included), and when the last
        #: report the control plane took was sent on it (None: none yet, and no lease
        #: left on disk by the agent before): the lease of the jobs with a fence
        self.fence_clock = fencekeeper.boottime
        self.contact: float | None = None
        #: when the last report's answer came (a desired set pulled after it may start
        #: again what the fence stopped)
        self._renewed = float("-inf")
        #: the lease file as written last, and when the keeper was last looked for
        self._lease: dict[str, Any] | None = None
        self._keeper_checked = float("-inf")
        self._keeper_proc: subprocess.Popen[bytes] | None = None
        self._me = {"pid": os.getpid(), "start_time": proc_start_time(os.getpid()) or -1}
        self._load()

    # -- local state -----------------------------------------------------------------------
    def _load(self) -> None:
        if not self.state_path.exists():
            return
        data = json.loads(self.state_path.read_text())
        if data.get("machine") != self.machine:
            raise ValueError(f"{self.state_path} belongs to machine {data.get('machine')}")
        lease = fencekeeper.read_lease(self.data_dir) or {}
        contact = lease.get("contact")
        if isinstance(contact, int | float) and contact <= self.fence_clock():
            self.contact = float(contact)  # (the lease of the agent before: it holds on)
        self.token = data.get("token")
        self.profile.load(data.get("profile"))
        for key, raw in data.get("stopping", {}).items():  # (stops the last run left)
            handle = self.runtime.adopt(raw["handle"])
            self._stop_later(key, Stopping(raw["job"], raw["index"], raw["revision"],
                                           raw["handle"], float(raw["grace"]),
                                           bool(raw["remove"]), fence=raw.get("fence")),
                             handle)
        for key, raw in data.get("tasks", {}).items():
            task = Task(**raw)
            handle = self.runtime.adopt(task.handle) if task.handle else None
            if handle is not None:
                self.handles[key] = handle  # still running: adopted, not restarted
                if task.healthy:
                    self.prober.resume(key)  # as healthy as it was, until probed
            else:
                task.handle = None
            self.tasks[key] = task

    def _save(self) -> bool:
        """Write the agent's state if it changed; False if it could not be (a full
        disk): it is tried again at the next save, which any change makes."""
        data = {"machine": self.machine, "token": self.token,
                "profile": self.profile.applied,
                "tasks": {k: asdict(t) for k, t in self.tasks.items()},
                "stopping": {k: s.record() for k, s in self.stopping.items()}}
        if data == self._saved:
            return True  # (most steps change nothing: no write, no fsync)
        tmp = None
        try:
            fd, tmp = tempfile.mkstemp(dir=self.data_dir, prefix=".agent.")
            with os.fdopen(fd, "w") as f:
                json.dump(data, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.state_path)
        except OSError as exc:
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
            self.log.error("agent state not saved", path=str(self.state_path),
                           error=str(exc))
            return False
        self._saved = data  # (only once it is written)
        return True

    # -- the control plane -----------------------------------------------------------------
    def _call(self, method: str, path: str, token: str | None, body: Any = None,
              params: dict[str, Any] | None = None, wait: float = 0.0) -> Any:
        """Any front end will do: the one that answered last first, then the others. One
        that cannot be reached, or answers that it cannot serve now (502-504: a replica
        without a leader, say), is passed over."""
        last: Exception | str | None = None
        n = len(self.urls)
        for k in range(n):
            i = (self._url + k) % n
            url = self.urls[i]
            try:
                r = self._request(method, url + path, body, params, token, wait)
            except httpx.TransportError as exc:
                last = exc
                continue
            if r.status_code in (502, 503, 504) and k < n - 1:
                last = f"{url} answered {r.status_code}"
                continue
            r.raise_for_status()
            self._url = i
            return r.json()
        raise ConnectionError(f"no control plane reachable at {', '.join(self.urls)}: {last}")

    def _runtime_key(self, key: str) -> str:
        """The runtime's key of task ``key``: it carries the machine and the data dir
        (agents of several machines may share a host, and its cgroup hierarchy)."""
        return f"{self.prefix}/{key}"

    def _request(self, method: str, url: str, body: Any, params: dict[str, Any] | None,
                 token: str | None, wait: float) -> httpx.Response:
        """One request, answered whole within its deadline (the client's timeout and
        the long-poll's wait, doubled) or failed: httpx bounds each read, and a server
        that sends a byte now and then would hold the agent's loop forever. At the
        deadline the client is closed (which ends the request) and made anew."""
        expired = threading.Event()
        with self._deadline_lock:
            client = self.http
            read = client.timeout.read
            deadline = time.monotonic() + 2 * ((read or 30.0) + wait)
            if self._watchdog is None:
                self._watchdog = threading.Thread(target=self._watch, daemon=True,
                                                  name=f"plait-deadlines-{self.machine}")
                self._watchdog.start()
            self._deadlines[expired] = (deadline, client)
        try:
            return client.request(method, url, json=body, params=params,
                                  headers={"Authorization": f"Bearer {token}"},
                                  timeout=read + wait if read is not None else None)
        except Exception as exc:
            if expired.is_set():
                raise httpx.ReadTimeout(f"{url}: no whole answer within the deadline"
                                        ) from exc
            raise
        finally:
            with self._deadline_lock:
                self._deadlines.pop(expired, None)

    def _watch(self) -> None:
        """Close the client of any request past its deadline, and put a new one in its
        place (checked twice a second: one thread for the agent's life, not one per
        request)."""
        while not self._closing.wait(WATCH_SECONDS):
            now = time.monotonic()
            with self._deadline_lock:
                for expired, (deadline, client) in list(self._deadlines.items()):
                    if deadline <= now and not expired.is_set():
                        expired.set()
                        client.close()
                        if self.http is client:
                            self.http = httpx.Client(timeout=client.timeout,
                                                     verify=self._verify)

    def join(self) -> None:
        if self.token is not None:
            return
        if not self.join_token:
            raise ValueError("this agent has no machine credential yet: give the join token "
                             "(--join-token-file, or PLAIT_JOIN_TOKEN)")
        try:
            self.token = self._call("POST", "/v1/agents/join", self.join_token,
                                    {"machine": self.machine, **self.describe})["token"]
        except httpx.HTTPStatusError as exc:
            if exc.response.status_code >= 500:
                raise
            reason, heard = "", None
            try:
                answer = exc.response.json()
                reason = str(answer.get("message", ""))
                ago = answer.get("heard_seconds_ago")
                if isinstance(ago, int | float) and not isinstance(ago, bool):
                    heard = float(ago)
            except (ValueError, AttributeError):
                pass
            raise JoinRefused(self.machine, exc.response.status_code,
                              reason or exc.response.text[:200], heard) from None
        self._save()

    # -- one step --------------------------------------------------------------------------
    def step(self, now: float | None = None, wait: float = 0.0) -> None:
        """Pull the desired set (a long-poll of up to ``wait`` seconds when the agent
        has one already: it returns as soon as the set changes), converge, report."""
        self.join()
        self._stopped()
        self._fence()
        desired: dict[str, Any] | None = None
        try:
            desired = self._pull(wait, self.generation)
        except (ConnectionError, httpx.HTTPStatusError, BadDesired) as exc:
            self._pulled(exc)
        else:
            self._pulled(desired)
        now = time.monotonic() if now is None else now
        if desired is None:
            self._supervise(now)
            return
        self.profile.tick(now, idle=not self.handles and not self.stopping)
        self._converge(desired, now)
        self._supervise(now)
        self.runtime.rotate_logs()  # (the agent keeps the whole logs, rotated)
        self._report(now)
        self._save()

    def _pull(self, wait: float, since: int | None) -> dict[str, Any]:
        """The machine's desired set: a long-poll of up to ``wait`` seconds when
        ``since`` (the generation the agent has) is known."""
        params = {"wait": wait, "since": since} if wait and since is not None else None
        sent = self.fence_clock()
        desired: dict[str, Any] = self._call(
            "GET", f"/v1/machines/{self.machine}/desired", self.token, params=params,
            wait=wait if params else 0.0)
        checked = checked_desired(desired)
        checked["_pulled_at"] = sent  # (asked for then: what the fence reads)
        return checked

    def _pulled(self, desired: dict[str, Any] | Exception) -> None:
        """What a pull of the desired set brought: the set, or the error that it could
        not be had (then everything keeps running, as it is)."""
        if isinstance(desired, Exception):
            if (isinstance(desired, httpx.HTTPStatusError)
                    and desired.response.status_code == 401 and self.token is not None):
                self._refused(time.monotonic())
                return
            self.refused_since = None  # (refusals in a row only: another failure ends them)
            if self.reachable:
                self.log.warning("control plane unreachable; tasks keep running",
                                 error=str(desired))
            self.reachable = False
            self.generation = None
            return
        self.refused_since = None
        if not self.reachable:
            self.log.info("control plane reachable", tasks=len(desired["tasks"]))
        self.reachable = True
        self.profile.want(desired)
        self.generation = desired.get("generation")

    def _refused(self, now: float) -> None:
        """The control plane refused this machine's credential. After ``REVOKED_AFTER``
        seconds of refusals in a row the agent joins again with its join token, and
        the answer says what happened. Refused because another agent of this machine
        is alive (409): that one took the machine over and runs its tasks, so this
        one stops them (their files kept), as if the desired set had dropped them,
        and asks to join again at each heartbeat (two copies of a task must not
        run). Joined: the credential had been revoked (an admin), or the region's
        store lost it; the tasks go on. Anything else (no join token, the join
        refused for another reason, no answer): nothing is stopped, and it is tried
        again after another ``REVOKED_AFTER``. A refusal alone never stops a task:
        a control plane that refuses every agent for a while (a store restored from
        an old backup, a proxy that drops the header) must not stop the region."""
        self.reachable = False
        self.generation = None
        if self.refused_since is None:
            self.refused_since = now
            self.log.warning("the control plane refuses this machine's credential",
                             join_again_after_seconds=REVOKED_AFTER)
            return
        if now < self._rejoin_at or now - self.refused_since < REVOKED_AFTER:
            return
        self._rejoin_at = now + REVOKED_AFTER  # (the next try, if this one settles nothing)
        held, self.token = self.token, None
        try:
            self.join()
        except JoinRefused as exc:
            # (heard since this agent's own beats were refused, and the control plane's
            # cache of credentials let them in: another agent's)
            other = exc.heard_ago is not None and (
                exc.heard_ago < now - self.refused_since - CREDENTIAL_CACHE_SLACK)
            if exc.status != 409 or not other:
                self.token = held
                self.log.error("this machine's credential is refused, and so is its join: "
                               "its tasks keep running", error=str(exc))
                return
            self.log.error("another agent runs this machine (its credential replaced this "
                           "one's): this agent's tasks are stopped, and it asks to join "
                           "again", error=str(exc), tasks=len(self.tasks))
            for key in list(self.tasks):
                self._remove(key, "another agent runs this machine", keep_files=True)
            self.refused_since = None
            self._save()
        except (ConnectionError, httpx.HTTPError, ValueError, OSError) as exc:
            self.token = held  # (no join token, or no answer: as it was)
            self.log.error("this machine's credential is refused, and joining again "
                           "failed: its tasks keep running", error=str(exc))
        else:
            self.refused_since = None
            self.log.warning("this machine's credential was refused: joined again with a "
                             "new one, its tasks kept", tasks=len(self.tasks))

    def _converge(self, desired: dict[str, Any], now: float) -> None:
        """Converge the tasks to the desired set (starts, restarts on a new revision,
        stops of what left it)."""
        want = {f"{a['job']}.{a['index']}": a for a in desired["tasks"]}
        # (what left the set, and the request behind it: for the log)
        left = {f"{s['job']}.{s['index']}": s.get("request_id")
                for s in desired.get("stopping", ())}
        plan = converge({k: t.revision for k, t in self.tasks.items()},
                        {k: int(a["revision"]) for k, a in want.items()})
        for key in plan.remove:
            self._remove(key, "no longer assigned", left.get(key))  # stopped (fencing)
        for key in plan.replace:
            # a new revision: restart on it
            self._stop(key, reason=f"revision {want[key]['revision']}",
                       cause=want[key].get("request_id"))
            old = self.tasks[key]
            old.revision = want[key]["revision"]
            old.restarts, old.next_start, old.exit_code = 0, 0.0, None
            old.final = False
        for key, a in want.items():
            task = self.tasks.get(key)
            if task is None:  # (plan.add)
                task = self.tasks[key] = Task(a["job"], a["index"], a["revision"],
                                              _some_port(self.advertise))
            restart = a["spec"].get("restart") or {}
            task.policy = restart.get("policy", "always")
            task.max_retries = int(restart.get("max_retries", 3))
            task.fence = _fence_seconds(a["spec"])
            if task.fenced_at is not None and task.rejoined_at is not None and (
                    desired.get("_pulled_at", float("-inf")) >= task.rejoined_at):
                # still assigned here in a set asked for after the agent reached the
                # control plane again: the fence is lifted (``plait.model.fence``)
                self.log.info("task fence lifted", job=task.job, index=task.index)
                task.fenced_at = task.rejoined_at = None
            self.specs[key] = a["spec"]
            if a.get("credential"):
                self.credentials[key] = a["credential"]
            else:  # (a control plane that sends none: the task has none)
                self.credentials.pop(key, None)
            if key not in self.handles and key not in self.stopping and (
                    now >= task.next_start and task.exit_code is None):
                # (once a stop of its key has finished)
                self._start(task, a["spec"], a.get("request_id"))

    def _start(self, task: Task, spec: dict[str, Any], cause: str | None = None) -> None:
        """Start the task's process; ``cause``: the id of the request that assigned
        it (for the log). Nothing starts before the machine carries the host profile
        its desired set names (started by a later turn, once it does)."""
        if not self.profile.may_start() or not self._may_start(task):
            # (started once the machine carries it, or once its fence allows)
            task.cause = cause or task.cause
            return
        cause, task.cause = cause or task.cause, None
        home = self.data_dir / "tasks" / task.key
        res = spec["resources"]
        try:
            # (a full disk, or every port held by some task: a failed start, not a
            # failed turn of the loop, which would stop the machine's heartbeats)
            home.mkdir(parents=True, exist_ok=True)
            if not task.port or not _port_free(self.advertise, task.port):
                # taken meanwhile (by another process's connection, say): a new one,
                # which the next status report publishes in discovery
                task.port = _free_port(self.advertise)
            env = self._env(task, spec)
            # runtime keys carry the machine and the data dir: agents of several
            # machines may share a host (`plait up`), and with it the cgroup hierarchy
            handle = self.runtime.start(
                self._runtime_key(task.key), spec["command"], list(spec.get("args", [])), env,
                home, float(res["cpu"]), max(16, int(float(res.get("memory_gb", 0)) * 1024)))
        except (OSError, RuntimeError, ValueError) as exc:  # reported as a failed start
            self.log.error("task start failed", job=task.job, index=task.index,
                           revision=task.revision, request_id=cause, error=str(exc))
            self._exit(task, 127, time.monotonic())  # as the shell reports it
            return
        self.log.info("task started", job=task.job, index=task.index, revision=task.revision,
                      request_id=cause, pid=handle.pid, port=task.port,
                      restarts=task.restarts)
        self.handles[task.key] = handle
        task.handle = handle.to_dict()
        if task.fence is not None:
            self._guard()  # (in the lease before anything may freeze the agent)
        # saved at once, before anything that may block or fail (a report to the
        # control plane): an agent killed after this start adopts the process when it
        # comes back, and never starts a second copy of the task
        if not self._save():
            # a start the agent cannot remember (its disk is full) is not kept: an
            # agent restarted would not know the process and start a second copy
            self.handles.pop(task.key, None)
            task.handle = None
            self.runtime.stop(handle, grace=0.0)
            self.log.error("task start undone: the agent's state could not be saved",
                           job=task.job, index=task.index, revision=task.revision)
            self._exit(task, 127, time.monotonic())
            return
        self._dirty = True
        self.metrics.starts.inc()
        self.prober.forget(task.key)  # unhealthy until its probe passes
        task.healthy = False

    # -- the fence (jobs that ask for at most one copy: ``plait.model.fence``) -----------
    def _may_start(self, task: Task) -> bool:
        """A task of a job with a fence starts only under a lease that holds, and not
        after its fence stopped it before a desired set pulled since the agent reached
        the control plane again lists it."""
        if task.fence is None:
            return True
        return task.fenced_at is None and fence.may_start(task.fence, self.contact,
                                                          self.fence_clock())

    def _fence(self) -> None:
        """Stop the tasks whose fence ran out: the agent has not reached the control
        plane for their job's ``fence.seconds`` (their machine may be failed, and
        the tasks placed elsewhere from ``fence.replace_at`` on)."""
        now = self.fence_clock()
        for key in list(self.handles):
            task = self.tasks[key]
            if task.fence is None or fence.verdict(task.fence, self.contact, now) is (
                    fence.Verdict.RUN):
                continue
            self._stop(key, reason=f"fenced: the control plane not reached for "
                       f"{task.fence:g}s", grace=fence.FENCE_KILL_GRACE)
            task.fenced_at, task.rejoined_at = now, None
            self._dirty = True
        self._guard()

    def _guard(self) -> None:
        """Write the lease file for the fence keeper (when the agent's lease or its
        fenced processes changed), and make sure a keeper runs while there are any."""
        tasks = {k: {"seconds": t.fence, "handle": t.handle} for k, t in self.tasks.items()
                 if t.fence is not None and t.handle is not None}
        for k, st in self.stopping.items():
            if st.fence is not None:
                tasks[f"{k}@stopping"] = {"seconds": st.fence, "handle": st.handle}
        lease = {"agent": self._me, "contact": self.contact, "tasks": tasks}
        if lease != self._lease and (tasks or (self._lease or {}).get("tasks")):
            try:
                fencekeeper.write_lease(self.data_dir, lease)
                self._lease = lease
            except OSError as exc:
                self.log.error("fence lease not written", error=str(exc))
        if tasks:
            self._keeper()

    def _keeper(self) -> None:
        """Start a fence keeper unless one holds the data dir's lock (looked at once a
        second at most)."""
        now = time.monotonic()
        if now - self._keeper_checked < 1.0:
            return
        self._keeper_checked = now
        if self._keeper_proc is not None and self._keeper_proc.poll() is None:
            return
        fd = os.open(self.data_dir / fencekeeper.LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return  # (one runs: left by the agent before, say)
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)
        (self.data_dir / "logs").mkdir(exist_ok=True)
        with open(self.data_dir / "logs" / "fencekeeper.log", "ab") as out:
            self._keeper_proc = subprocess.Popen(
                [sys.executable, "-m", "plait.agent.fencekeeper", str(self.data_dir)],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True, close_fds=True)
        self.log.info("fence keeper started", pid=self._keeper_proc.pid)

    def _env(self, task: Task, spec: dict[str, Any]) -> dict[str, str]:
        # of the agent's own environment only what locates and localizes a program: the
        # rest (its PLAIT_* settings, a cloud's keys, a proxy's password) is not the tasks'
        host = {k: v for k in TASK_HOST_ENV if (v := os.environ.get(k)) is not None}
        host.setdefault("PATH", os.defpath)
        # (the task's own credential, never one its spec names: a job's env is every
        # task's; bound to the endpoint discovery has for it)
        endpoint = self._endpoint(task)
        own = self.credentials.get(task.key)
        return {**host, **{k: v for k, v in spec.get("env", {}).items()
                           if k != "PLAIT_TASK_CREDENTIAL"},
                **({"PLAIT_TASK_CREDENTIAL": endpoint_credential(own, endpoint)}
                   if own else {}),
                "PLAIT_TASK_ENDPOINT": endpoint,
                "PLAIT_PORT": str(task.port),
                "PLAIT_JOB": task.job, "PLAIT_TASK_INDEX": str(task.index),
                "PLAIT_MACHINE": self.machine,
                **({"PLAIT_FAULT_DOMAIN": str(self.describe["fault_domain"])}
                   if self.describe.get("fault_domain") else {}),
                "PLAIT_DATA_DIR": str(self.data_dir / "tasks" / task.key)}

    def _endpoint(self, task: Task) -> str:
        """The task's endpoint as its status reports it to discovery (host:port)."""
        return f"{self.advertise}:{task.port}"

    def _supervise(self, now: float) -> None:
        """Notice exits and apply the restart policy: ``always`` starts the task again
        after a backoff; ``on-failure`` too, unless it exited 0 or used its retries;
        ``never`` does not. A task not started again is final."""
        for key, handle in list(self.handles.items()):
            code = self.runtime.poll(handle)
            if code is None:
                continue
            task = self.tasks[key]
            for _ in range(16):  # what it printed last (a batch task's result) is kept
                data, task.log_offset = self.runtime.read_log(handle, task.log_offset,
                                                              CHUNK_BYTES)
                if not data:
                    break
                self._output.append({"job": task.job, "index": task.index,
                                     "data": data.decode(errors="replace")})
            # a SIGKILL this agent did not send (its stops are not polled here) and
            # that the memory cgroup does not count as out of memory
            task.killed = (code == -signal.SIGKILL
                           and self.runtime.oom_killed(handle) is False)
            # what its main process left running goes with it (its cgroups, its process
            # group), as a container's processes do: it would hold the task's groups
            # (no restart could start) or run on as a second copy beside the restart
            with contextlib.suppress(OSError, RuntimeError):
                self.runtime.stop(handle, grace=0)
            self.metrics.exits.labels("killed" if task.killed else "exited").inc()
            del self.handles[key]
            task.handle = None
            self._exit(task, code, now)
            self.log.info("task exited", job=task.job, index=task.index,
                          revision=task.revision, exit_code=code, killed=task.killed,
                          final=task.final, restarts=task.restarts)
        for task in self.tasks.values():
            if task.exit_code is not None and not task.final and now >= task.next_start:
                task.exit_code = None  # started again on the next step

    def _exit(self, task: Task, code: int, now: float) -> None:
        """The restart policy, after an exit (or a start that failed)."""
        self._dirty = True
        task.exit_code = code
        wait = restart_after(task.policy, task.max_retries, code, task.restarts)
        if wait is None:
            task.final = True
            return
        task.restarts += 1
        task.next_start = now + wait

    def _stop(self, key: str, remove: bool = False, reason: str = "",
              cause: str | None = None, grace: float | None = None) -> None:
        """Stop the task in the background (its heartbeats report it ``stopping`` until
        its process is gone); ``remove``: then forget its cgroups, logs and files.
        ``reason`` and ``cause`` (the id of the request behind it) are logged."""
        handle = self.handles.pop(key, None)
        task = self.tasks.get(key)
        if task is not None:
            task.handle = None
        if handle is None:
            if remove and key not in self.stopping:
                self._clean(key)
            return
        spec = self.specs.get(key) or {}
        if grace is None:
            grace = float(spec.get("kill_timeout_seconds", DEFAULT_KILL_TIMEOUT))
        assert task is not None
        self.log.info("task stopping", job=task.job, index=task.index, revision=task.revision,
                      reason=reason, request_id=cause, pid=handle.pid, grace_s=grace)
        self._stop_later(key, Stopping(task.job, task.index, task.revision, handle.to_dict(),
                                       grace, remove, fence=task.fence), handle)

    def _stop_later(self, key: str, stopping: Stopping, handle: Handle | None) -> None:
        def stop() -> None:
            if handle is not None:
                self.runtime.stop(handle, grace=stopping.grace)
            if stopping.remove:
                self._clean(key)
        stopping.future = self._stops.submit(stop)
        stopping.future.add_done_callback(lambda _: self.wakeup.set())
        self.stopping[key] = stopping
        self._dirty = True

    def _stopped(self) -> None:
        """Forget the stops that have finished (the next report leaves them out: the
        control plane then takes them as stopped)."""
        for key, stopping in list(self.stopping.items()):
            if stopping.future is not None and stopping.future.done():
                del self.stopping[key]
                self._dirty = True
                error = stopping.future.exception()
                if error is not None:
                    self.log.error("task stop failed", job=stopping.job, index=stopping.index,
                                   revision=stopping.revision, error=str(error))

    def _clean(self, key: str) -> None:
        self.runtime.cleanup(self._runtime_key(key))
        shutil.rmtree(self.data_dir / "tasks" / key, ignore_errors=True)

    def _remove(self, key: str, reason: str, cause: str | None = None,
                keep_files: bool = False) -> None:
        """Stop the task and forget it (``keep_files``: its files stay on disk)."""
        self._stop(key, remove=not keep_files, reason=reason, cause=cause)
        self.tasks.pop(key, None)
        self.specs.pop(key, None)
        self.credentials.pop(key, None)
        self.prober.forget(key)
        self._cpu.pop(key, None)

    def _healthy(self, task: Task, now: float) -> bool:
        spec = self.specs.get(task.key)
        probe = spec.get("health") if spec else None
        if not probe:
            return True  # no probe: healthy while the process runs
        # (an HTTP probe needs no environment: not built for it)
        key = self._runtime_key(task.key)
        return self.prober.check(task.key, probe, self.advertise, task.port,
                                 self._env(task, spec or {}) if probe.get("command") else {},
                                 self.data_dir / "tasks" / task.key, now + PROBE_SLACK,
                                 wrap=lambda argv, env, cwd: self.runtime.probe_command(
                                     key, argv, env, cwd))

    def _cores(self, key: str, handle: Any, now: float) -> float | None:
        """The cores the task used since the last report (its CPU time over the wall
        time between two reports at least half a second apart); None until known."""
        try:
            used = self.runtime.cpu_seconds(handle)
        except (OSError, ValueError, AttributeError):
            used = None
        if used is None:
            self._cpu.pop(key, None)
            return None
        before = self._cpu.get(key)
        if before is None or used < before[1]:  # (a restarted task: a new count)
            self._cpu[key] = (now, used, None)
            return None
        if now - before[0] < 0.5:
            return before[2]
        cores = round(max(0.0, used - before[1]) / (now - before[0]), 3)
        self._cpu[key] = (now, used, cores)
        return cores

    def _output_of(self, handle: Any, offset: int) -> tuple[bytes, int]:
        """A task's output after ``offset`` for the control plane, at most
        ``CHUNK_BYTES``: the control plane keeps the last ``CHUNK_BYTES`` of each task's
        output, so a task more than two of those behind (a burst of megabytes) is sent its
        newest half of that, after a line that says how much was left out here
        (its agent keeps all of it). It took 45 s of reports to bring a 5 MB line's
        next lines to ``plait task logs``."""
        data, after = self.runtime.read_log(handle, offset, CHUNK_BYTES)
        if len(data) < CHUNK_BYTES:
            return data, after
        _, end = self.runtime.read_log(handle, 1 << 62, 0)  # (where its output ends)
        if end - after <= CHUNK_BYTES:  # (a report or two behind: sent in order)
            return data, after
        keep = CHUNK_BYTES // 2  # (the newest part, and the note before it, in the tail)
        left_out = end - keep - offset
        data, after = self.runtime.read_log(handle, end - keep, keep)
        note = (f"\n[plait: {left_out} bytes of output not sent here (the control plane "
                f"keeps the last {CHUNK_BYTES // 1024} KiB of a task's output; its agent's "
                "log keeps all of it)]\n")
        return note.encode() + data, after

    def _report(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        self._dirty = False  # (what changes from here on is told by the next report)
        statuses: list[dict[str, Any]] = []
        chunks, self._output = self._output, []
        for key, task in self.tasks.items():
            handle = self.handles.get(key)
            if handle is not None:
                task.healthy = self._healthy(task, now)
                status = {"job": task.job, "index": task.index, "revision": task.revision,
                          "phase": "running", "healthy": task.healthy,
                          "endpoint": self._endpoint(task)}
                cores = self._cores(key, handle, now)
                if cores is not None:
                    status["cpu"] = cores
                statuses.append(status)
                data, offset = self._output_of(handle, task.log_offset)
                if data:
                    chunks.append({"job": task.job, "index": task.index,
                                   "data": data.decode(errors="replace")})
                    task.log_offset = offset
            elif task.fenced_at is not None and task.exit_code is None:
                # stopped by its fence, not started again yet: down, to start again
                statuses.append({"job": task.job, "index": task.index,
                                 "revision": task.revision, "phase": "exited",
                                 "healthy": False, "exit_code": -signal.SIGTERM,
                                 "final": False, "killed": False})
            elif task.exit_code is not None:
                statuses.append({"job": task.job, "index": task.index,
                                 "revision": task.revision, "phase": "exited",
                                 "healthy": False, "exit_code": task.exit_code,
                                 "final": task.final, "killed": task.killed})
        for stopping in self.stopping.values():
            statuses.append({"job": stopping.job, "index": stopping.index,
                             "revision": stopping.revision, "phase": "stopping",
                             "healthy": False})
        try:
            # output first: the control plane takes a task's output only while the task
            # is on this machine, and a final status takes a batch task off it
            for batch in _batches(chunks):
                try:
                    self._call("POST", f"/v1/machines/{self.machine}/output", self.token,
                               {"chunks": batch})
                except httpx.HTTPStatusError as exc:  # refused: dropped, never a retry loop
                    self.log.warning("output refused", chunks=len(batch), error=str(exc))
            body: dict[str, Any] = {"tasks": statuses}
            sent = self.fence_clock()  # (the lease counts from the send: see model.fence)
            profile = self.profile.report()
            if profile is not None:
                body["profile"] = profile
            ack = self._call("POST", f"/v1/machines/{self.machine}/status", self.token, body)
            generation = ack.get("generation") if isinstance(ack, dict) else None
            # (a set newer than the long-poll brought: pulled at once by the run loop)
            self._newer = generation is not None and generation != self.generation
            self.metrics.reports.labels("sent").inc()
            self.contact = sent
            self._renewed = self.fence_clock()
            for task in self.tasks.values():
                if task.fenced_at is not None and task.rejoined_at is None:
                    task.rejoined_at = self._renewed
                    # (a desired set pulled from now on may start it again: pulled now)
                    self._newer = True
            # the control plane took the finished tasks off this machine as it took the
            # report: forget them now, so a rerun it asks for is started, not reported
            # as finished again
            for key in [k for k, t in self.tasks.items() if t.final]:
                self._remove(key, "finished")
            self._guard()  # (the keeper reads the renewed lease)
        except (ConnectionError, httpx.HTTPStatusError):
            self.reachable = False
            self.metrics.reports.labels("failed").inc()
            # sent with the next report (the agent keeps the whole logs on disk; this is
            # only the control plane's tail, so a long outage keeps the newest chunks)
            self._output = (chunks + self._output)[-256:]

    def run(self, interval: float = 1.0, stop: Any = None) -> None:
        """Run until ``stop`` (a threading.Event) is set. The desired set is
        long-polled on a thread of its own (``_poll``); this loop sleeps until
        something is due -- the next report (every ``interval`` seconds: the
        heartbeat), the next probe, a restart after its backoff -- or until it is
        woken: the long-poll answered, a task's process exited, a probe may have
        changed a task's health, a stop finished. Whatever changed is reported at
        once."""
        stop = stop if stop is not None else threading.Event()
        poll = max(interval, LONG_POLL_SECONDS)
        halt = threading.Event()  # (this run ended: its poller ends too)
        poller: threading.Thread | None = None
        next_report = 0.0
        try:
            while not stop.is_set():
                now = time.monotonic()
                try:
                    if self.token is None:
                        self.join()
                    if poller is None:
                        poller = threading.Thread(target=self._poll,
                                                  args=(poll, interval, stop, halt),
                                                  daemon=True,
                                                  name=f"plait-poll-{self.machine}")
                        poller.start()
                    if self._tick(now, now >= next_report):
                        next_report = now + interval
                except JoinRefused as exc:  # (asked again at the next heartbeat)
                    # (said once, then each minute while the reason stays the same)
                    said, at = self._join_refused
                    if exc.reason.split(" (heard", 1)[0] != said or now - at >= 60:
                        self.log.error("join refused", error=str(exc))
                        self._join_refused = (exc.reason.split(" (heard", 1)[0], now)
                    self.reachable = False
                    next_report = now + interval
                except (ConnectionError, httpx.HTTPError) as exc:
                    self.log.warning("step failed: control plane unreachable",
                                     error=str(exc))
                    self.reachable = False
                    next_report = now + interval
                except Exception:  # the agent keeps its tasks running, whatever broke
                    self.log.exception("step failed")
                    self.reachable = False
                    next_report = now + interval
                self.wakeup.keep({k: h.pid for k, h in self.handles.items()})
                self.wakeup.wait(self._sleep(time.monotonic(), next_report, interval))
        finally:
            halt.set()

    def _tick(self, now: float, report_due: bool) -> bool:
        """One turn of the run loop: take the desired set if the long-poll brought
        one, notice exits, restart what is due, start the probes that are due;
        report if the heartbeat is due or anything changed. True if it reported."""
        self._stopped()
        self._fence()
        with self._inbox_lock:
            pulled, self._inbox = self._inbox, None
        if pulled is not None:
            same = (not isinstance(pulled, Exception) and self.generation is not None
                    and pulled.get("generation") == self.generation)
            self._pulled(pulled)
            if not isinstance(pulled, Exception) and not same:
                # (the same generation is the same set: a long-poll that timed out)
                self._converge(pulled, now)
        self._supervise(now)
        if self.profile.tick(now, idle=not self.handles and not self.stopping):
            self._dirty = True
        self._restart(now)
        for key in self.handles:
            task = self.tasks[key]
            healthy = self._healthy(task, now)
            if healthy != task.healthy:
                task.healthy = healthy
                self._dirty = True
        if not (report_due or self._dirty):
            return False
        self.runtime.rotate_logs()  # (the agent keeps the whole logs, rotated)
        self._report(now)
        if self._newer:
            # the control plane has a newer set than the long-poll brought (it waits
            # on a replica that stopped leading, say): pulled now, not after its wait
            self._newer = False
            desired = self._pull(0.0, None)
            self._pulled(desired)
            self._converge(desired, now)
            self._report(now)
        self._save()
        return True

    def _restart(self, now: float) -> None:
        """Start again the tasks whose restart backoff has passed (new tasks come with
        a new desired set)."""
        for key, task in self.tasks.items():
            spec = self.specs.get(key)
            if (spec is not None and task.exit_code is None and not task.final
                    and key not in self.handles and key not in self.stopping
                    and now >= task.next_start):
                self._start(task, spec)

    def _sleep(self, now: float, next_report: float, interval: float) -> float:
        """How long the run loop may sleep: until the next report, probe or restart
        is due (at most ``interval``: a stop is noticed within it)."""
        due = min(next_report, now + interval)
        probe = self.prober.next_due(now + PROBE_SLACK)
        if probe is not None:
            due = min(due, probe - PROBE_SLACK)
        for task in self.tasks.values():
            if task.exit_code is not None and not task.final:
                due = min(due, task.next_start)
        retry = self.profile.next_due()
        if retry is not None:
            due = min(due, retry)
        return max(0.0, due - now)

    def _poll(self, wait: float, interval: float, stop: threading.Event,
              halt: threading.Event) -> None:
        """The desired set's long-poll, on a thread of its own: each answer (the set,
        or why there was none) is handed to the run loop, which is woken. It waits up
        to ``wait`` seconds for a change of the set it has; after a failure it asks
        again (without waiting for a change) after ``interval`` seconds."""
        since: int | None = None
        while not (stop.is_set() or halt.is_set()):
            got: dict[str, Any] | Exception
            try:
                got = self._pull(wait, since)
                since = got.get("generation")
            except Exception as exc:  # (handed over: the loop logs it)
                got, since = exc, None
            with self._inbox_lock:
                if not (isinstance(got, Exception) and isinstance(self._inbox, dict)):
                    self._inbox = got  # (a set not taken yet is not lost to an error)
            self.wakeup.set()
            if isinstance(got, Exception):
                halt.wait(interval)

    def phases(self) -> dict[str, int]:
        """How many of its tasks are running, exited (waiting for a restart or
        final) and stopping."""
        tasks = list(self.tasks.values())
        running = sum(1 for t in tasks if t.key in self.handles)
        exited = sum(1 for t in tasks if t.key not in self.handles and t.exit_code is not None)
        return {"running": running, "exited": exited, "stopping": len(self.stopping)}

    def close(self) -> None:
        """Let go of the data dir (another agent may take it) and of the prober; the
        tasks run on, for the next agent to adopt."""
        self._closing.set()
        self.prober.close()
        self.profile.close()
        self.wakeup.close()
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None

    def shutdown(self) -> None:
        """Stop every task (Ctrl-C of `plait up`), keeping nothing running."""
        for key in list(self.handles):
            self._stop(key, reason="agent shutting down")
        for stopping in list(self.stopping.values()):
            if stopping.future is not None:
                stopping.future.result()
        self._stopped()
        self._guard()
        self._save()
