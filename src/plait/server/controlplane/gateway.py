"""The agent gateway: what agents call (their desired sets, heartbeats with their
tasks' statuses, output). A heartbeat is taken at once and applied by the next pass,
and a desired set is read from what the last pass left, so no agent call waits for a
pass (decision 45)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from plait.errors import NotFound
from plait.model.agentwire import DesiredSet, DesiredTask, ProfileTarget, StoppingTask
from plait.model.task import TaskRef
from plait.scheduler.records import Assignment, Stops, TaskStatus
from plait.server.controlplane.inbox import Report
from plait.sidekick.book import Applied
from plait.taskcontrol.signing import task_credential

if TYPE_CHECKING:
    from plait.server.controlplane.controllers import Controllers
    from plait.server.controlplane.inbox import Inbox
    from plait.server.controlplane.membership import Membership
    from plait.server.controlplane.published import Published
    from plait.server.controlplane.regionstate import RegionState
    from plait.server.logs import TaskLogs

#: the most jobs' keys kept for their tasks' credentials (past it, they are made again)
JOB_KEYS_KEPT = 65_536


def desired_wire(machine: str, generation: int, tasks: Sequence[Assignment],
                 credentials: Sequence[str | None], stops: Stops,
                 profile: dict[str, Any] | None) -> DesiredSet:
    """A machine's desired set as its agent parses it (``plait.model.agentwire``): its
    parts are the control plane's own valid records, so they are not validated again."""
    return DesiredSet.model_construct(
        machine=machine, generation=generation,
        tasks=[DesiredTask.model_construct(job=a.job, index=a.index, version=a.spec_version,
                                           revision=a.revision, spec=a.spec,
                                           request_id=a.cause, credential=c)
               for a, c in zip(tasks, credentials, strict=True)],
        stopping=[StoppingTask.model_construct(job=ref.job, index=ref.index, request_id=cause)
                  for ref, cause in stops],
        profile=None if profile is None else ProfileTarget.model_construct(**profile))


class AgentGateway:
    def __init__(self, state: RegionState, inbox: Inbox, published: Published,
                 membership: Membership, controllers: Controllers, logs: TaskLogs) -> None:
        self.state, self.inbox, self.published = state, inbox, published
        self.membership, self.controllers, self.logs = membership, controllers, logs
        #: the long-polls of desired sets, woken when their machine's set changes
        #: (``Published.waiters``)
        self.waiters = published.waiters
        #: job key name (``signing.key_name``) -> the job's key, for its tasks'
        #: credentials (``credentials``)
        self._job_keys: dict[str, str] = {}

    def take(self) -> tuple[list[Report], dict[str, float]]:
        """The reports and heartbeats taken since the last pass (the pass's input)."""
        return self.inbox.take_reports()

    def desired(self, machine: str) -> list[Assignment]:
        """The machine's desired set: as the last pass left it (no lock), or read under
        the lock when no pass has touched it since this replica started leading."""
        kept = self.desired_kept(machine)
        if kept is not None:
            return kept
        with self.state.lock:
            self.membership.check_owned(machine)
            found = self.state.scheduler.desired_for(machine)
            # kept for the next reads (the pass changes sets and generations under
            # the lock, so the two read here go together)
            self.published.keep(machine, (
                self.desired_generation(machine), found, self.state.scheduler.stops_for(machine),
                self.state.scheduler.profile_wire(self.state.fleet.index_of(machine))))
            return found

    def credentials(self, tasks: Sequence[Assignment]) -> list[str | None]:
        """Each task's credential (its ``PLAIT_TASK_CREDENTIAL``: ``signing.
        task_credential`` with its job's TaskControl key), None for a task of a job
        this control plane holds no record of. Made when a machine's desired set is
        served, never by a pass: one HMAC a task (the job's key is kept). Reads the
        region's secret from the store at its first use (``Controllers.secret_read``)."""
        names = self.state.persist.key_names
        keys = self._job_keys
        found: list[str | None] = []
        for a in tasks:
            name = names.get(a.job)
            if name is None:
                found.append(None)
                continue
            key = keys.get(name)
            if key is None:
                if len(keys) >= JOB_KEYS_KEPT:
                    keys.clear()  # (deleted jobs' keys go: the rest are made again)
                key = keys[name] = self.controllers.key_of(name)
            found.append(task_credential(key, a.job, a.index))
        return found

    def desired_kept(self, machine: str) -> list[Assignment] | None:
        """The machine's desired set as kept for its current generation, or None (a
        read that never blocks: the agents' long-poll answers from it)."""
        self.membership.check_owned(machine)
        kept = self.published.kept(machine)
        if kept is not None and kept[0] == self.desired_generation(machine):
            return kept[1]
        return None

    def stops_kept(self, machine: str) -> Stops:
        """The tasks being stopped on the machine (it left their desired set), with the
        request id behind each, as kept with its desired set (none when not kept)."""
        kept = self.published.kept(machine)
        if kept is not None and kept[0] == self.desired_generation(machine):
            return kept[2]
        return []

    def profile_kept(self, machine: str) -> dict[str, Any] | None:
        """The host profile the machine must carry, as kept with its desired set (a
        read that never blocks: the set read just before kept it)."""
        kept = self.published.kept(machine)
        if kept is not None:
            return kept[3]
        return self.state.scheduler.profile_wire(self.state.fleet.index_of(machine))

    def desired_generation(self, machine: str) -> int:
        """Changes whenever the machine's desired set may have changed (a plain read:
        an agent's long-poll checks it without the lock)."""
        return self.published.generation_of(machine)

    def task_output(self, machine: str, chunks: list[tuple[str, int, str]]) -> int:
        """An agent's output of the tasks on its machine; output of a task the machine
        does not hold (any more) is refused. Returns the chunks taken."""
        with self.state.lock:
            m = self.membership.check_owned(machine)
            placed = self.state.scheduler.placed.get(m, ())
            taken = [(job, index, text) for job, index, text in chunks
                     if TaskRef(job, index) in placed]
            # (kept under the lock: a pass that finishes a job's deletion forgets its
            # output under it too, so none of it outlives the job)
            for job, index, text in taken:
                self.logs.append(job, index, machine, text)
        return len(taken)

    def task_logs(self, job: str, index: int, after: int,
                  limit: int) -> tuple[str, int, bool, str | None]:
        doc = self.state.jobs.get(job)
        count = doc.spec.task_count
        if index >= count and not self.logs.holds(job, index):
            # (a task past the job's size whose output is still kept, from before a
            # shrink, is read as any other)
            raise NotFound("task", f"{job}/{index}", f"job {job} has no task {index} (it "
                           f"has {'tasks 0..' + str(count - 1) if count else 'no tasks'})")
        return self.logs.read(job, index, after, limit)

    def report(self, machine: str, statuses: list[TaskStatus],
               endpoints: dict[tuple[str, int], str] | None = None,
               profile: Applied | None = None,
               usage: dict[tuple[str, int], float] | None = None) -> None:
        """An agent's heartbeat: its tasks' statuses and where they listen (and the
        cores each used, for autoscaling). Taken at once, without waiting for a pass
        (decision 45): the heartbeat counts from now, the statuses are applied by the
        next pass. A report that says something new wakes the pass; one that repeats
        the machine's last report (an agent's heartbeat while nothing changes) waits
        for the next pass that is due anyway (decision 111)."""
        self.membership.check_owned(machine)
        now = self.state.clock()
        # (the CPU figures go to autoscaling from the pass, for the tasks placed
        # on this machine only: a machine speaks for its own tasks, no other's)
        self.inbox.report((machine, statuses, dict(endpoints or {}), now, profile,
                           dict(usage or {})))

    def wait_for_agents(self, machines: list[str], timeout: float) -> int:
        """Wait (at most ``timeout`` seconds) until every machine's agent has
        heartbeated since this call; returns how many have."""
        since = self.state.clock()
        deadline = time.monotonic() + timeout
        while True:
            beats = self.inbox.beats()
            with self.state.lock:
                beating = sum(1 for m in machines if max(
                    self.state.liveness.last.get(m, since), beats.get(m, since)) > since)
            if beating == len(machines) or time.monotonic() > deadline:
                return beating
            time.sleep(0.05)

    def heard_ago(self, machine: str) -> float | None:
        """Seconds since this control plane last heard the machine's agent, when that
        is within the heartbeat timeout (its agent is alive); None otherwise: never
        heard since this replica began leading (a machine watched at start-up, whose
        agent is only expected back, is not heard), or silent past the timeout."""
        now = self.state.clock()
        beat = self.inbox.beat_of(machine)
        with self.state.lock:
            live = self.state.liveness
            seen = [beat] if beat is not None else []
            if machine in live.heard and machine in live.last:
                seen.append(live.last[machine])
            timeout = live.timeout
        if not seen or now - max(seen) > timeout:
            return None
        return max(0.0, now - max(seen))

    def joined(self, machine: str) -> None:
        with self.state.lock:
            if self.membership.owns(self.state.machine_index(machine)):
                self.state.liveness.watch(machine, self.state.clock())
