"""``PlaneApi``: the control plane as the HTTP layer (``plait.api``) sees it, a small set
of named commands and queries.

The API calls the control plane only through this class, and never takes its lock:
whatever must be read under the lock is a method of the part that owns it, named
here. Each method is one call into one part (``cp.<part>.<method>``), so this file
is the one place to change when a part changes shape; it holds no logic of its own
beyond putting a command's event next to it.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from plait.server.controlplane.autoscaling import JobAutoscale
from plait.server.controlplane.gateway import desired_wire
from plait.server.controlplane.listing import JOB_STATES, parse_states
from plait.server.controlplane.owners import LimitsBody

if TYPE_CHECKING:
    from plait.jcp.intents import CanaryIntent, PushIntent, SizingIntent
    from plait.metrics import Metrics
    from plait.model import Entitlement, JobSpec
    from plait.model.hostprofile import HostProfile, HostProfileSpec
    from plait.model.machine import Machine
    from plait.persist.scheduler import JobDoc
    from plait.scheduler.records import Assignment, TaskStatus
    from plait.server.auth import Principal, Role, TokenInfo
    from plait.server.controlplane import ControlPlane
    from plait.server.controlplane.creates import Pending
    from plait.server.controlplane.waiters import Waiters
    from plait.server.events import Event
    from plait.sidekick.book import Applied
    from plait.store.protocol import Store

__all__ = [
    "JOB_STATES", "JobAutoscale", "LimitsBody", "PlaneApi", "desired_wire", "parse_states",
]


class PlaneApi:
    """The commands and queries of one control plane (``ControlPlane``) that its API
    serves, by resource."""

    def __init__(self, cp: ControlPlane) -> None:
        self._cp = cp

    # -- the process ---------------------------------------------------------------------
    @property
    def metrics(self) -> Metrics:
        return self._cp.metrics

    @property
    def store(self) -> Store:
        return self._cp.store

    def clock(self) -> float:
        return self._cp.clock()

    def record(self, source: str, kind: str, message: str, **fields: Any) -> None:
        self._cp.record(source, kind, message, **fields)

    def start(self) -> None:
        self._cp.loop.start()

    def stop(self) -> None:
        self._cp.loop.stop()

    def close_store(self) -> None:
        self._cp.store.close()

    def follow_leadership(self, leading: Callable[[], bool]) -> None:
        """``plait_leader`` and the long-polls follow whether this replica leads."""
        self._cp.leading = leading

    def leading(self) -> bool:
        return self._cp.leading()

    def health(self) -> tuple[bool, str]:
        return self._cp.loop.health()

    def passes(self) -> tuple[int, int]:
        """(passes made, passes failed)."""
        return self._cp.steps, self._cp.failures

    # -- tokens --------------------------------------------------------------------------
    def verify_cached(self, token: str) -> Principal | None:
        return self._cp.tokens.verify_cached(token)

    def verify(self, token: str) -> Principal:
        return self._cp.tokens.verify(token)

    def create_token(self, role: Role, name: str, description: str
                     ) -> tuple[TokenInfo, str]:
        info, token = self._cp.tokens.create(role, name, self._cp.clock(), description)
        self._cp.record("auth", "token_created",
                        f"{info.role.value} token {info.id} for {info.name}")
        return info, token

    def tokens(self) -> list[TokenInfo]:
        return self._cp.tokens.list()

    def revoke_token(self, token_id: str) -> TokenInfo:
        info = self._cp.tokens.revoke(token_id)
        self._cp.record("auth", "token_revoked",
                        f"token {token_id} ({info.role.value} {info.name})")
        return info

    def rotate_token(self, token_id: str) -> tuple[TokenInfo, str]:
        info, token = self._cp.tokens.rotate(token_id, self._cp.clock())
        self._cp.record("auth", "token_rotated", f"token {token_id} replaced by {info.id}")
        return info, token

    # -- entitlements and owners ---------------------------------------------------------
    def entitlement_owner(self, name: str) -> str | None:
        """The owner of an entitlement of this control plane (None: no such one)."""
        found = self._cp.allocator.entitlements.get(name)
        return None if found is None else found.owner

    def entitlement_names(self) -> list[str]:
        return list(self._cp.allocator.entitlements)

    def entitlements_of(self, owner: str) -> set[str]:
        return {e.name for e in list(self._cp.allocator.entitlements.values())
                if e.owner == owner}

    def entitlement_count(self) -> int:
        return len(self._cp.allocator.entitlements)

    def define_entitlement(self, ent: Entitlement) -> bool:
        return self._cp.commands.define_entitlement(ent)

    def quota_warnings(self, ent: Entitlement) -> list[str]:
        return self._cp.commands.quota_warnings(ent)

    def entitlement_view(self, name: str) -> dict[str, Any]:
        return self._cp.views.entitlement_view(name)

    def delete_entitlement(self, name: str) -> dict[str, Any]:
        return self._cp.commands.delete_entitlement(name)

    def owner_limits(self) -> dict[str, Any]:
        return self._cp.owners.views()

    def owner_limits_of(self, owner: str) -> dict[str, Any]:
        return self._cp.owners.view(owner)

    def set_owner_limits(self, owner: str, body: LimitsBody) -> dict[str, Any]:
        return self._cp.owners.set(owner, body)

    # -- jobs ----------------------------------------------------------------------------
    def job(self, name: str) -> JobDoc:
        return self._cp.jobs.get(name)

    def job_names_cached(self) -> set[str]:
        return self._cp.jobs.names_cached()

    def job_view(self, name: str) -> dict[str, Any]:
        return self._cp.views.job_view(name)

    def job_page(self, win: Any, entitlements: set[str] | None,
                 states: Any) -> tuple[list[bytes], Any]:
        return self._cp.views.index.page(win, entitlements, states)

    def plan(self, spec: JobSpec, may_change: Callable[[str], None]) -> dict[str, Any]:
        return self._cp.views.plan(spec, may_change)

    def submit_create(self, spec: JobSpec) -> Future[tuple[JobDoc, bool]]:
        return self._cp.commands.submit_create(spec)

    def prepare_create(self, spec: JobSpec) -> Pending:
        return self._cp.commands.prepare_create(spec)

    def commit_creates(self, prepared: list[Pending]) -> bool:
        """Store prepared creates together here and now if nothing else waits (True),
        else hand them to the committer (False: their answers come later)."""
        if self._cp.creates.commit_here(prepared):
            return True
        self._cp.commands.submit_prepared([p for p in prepared if not p.answer.done()])
        return False

    def create_job(self, spec: JobSpec) -> tuple[JobDoc, bool]:
        return self._cp.commands.create_job(spec)

    def update_job(self, spec: JobSpec) -> JobDoc:
        return self._cp.commands.update_job(spec)

    def sizing_of(self, name: str) -> Any:
        """The job's sizing intent (None: its spec sizes it)."""
        return self._cp.jcp.record(name).sizing

    def resize_job(self, name: str, task_count: int) -> JobDoc:
        return self._cp.commands.resize_job(name, task_count)

    def rollback_job(self, name: str, version: int) -> JobDoc:
        return self._cp.commands.rollback_job(name, version)

    def move_job(self, name: str, entitlement: str) -> JobDoc:
        return self._cp.commands.move_job(name, entitlement)

    def restart_job(self, name: str, index: int | None = None) -> JobDoc:
        return self._cp.commands.restart_job(name, index)

    def resume_job(self, name: str) -> JobDoc:
        return self._cp.commands.resume_job(name)

    def delete_job(self, name: str) -> JobDoc:
        return self._cp.commands.delete_job(name)

    def controller_key(self, name: str) -> str:
        return self._cp.controllers.controller_key(name)

    def tasks_view(self, name: str) -> list[dict[str, Any]]:
        return self._cp.views.tasks_view(name)

    def task_logs(self, name: str, index: int, after: int,
                  limit: int) -> tuple[str, int, int, str | None]:
        return self._cp.gateway.task_logs(name, index, after, limit)

    def discovery(self, name: str) -> list[dict[str, Any]]:
        return self._cp.views.discovery(name)

    # -- autoscaling and the Job Control Plane's intents ---------------------------------
    def put_autoscale(self, name: str, body: JobAutoscale) -> dict[str, Any]:
        return self._cp.autoscaling.put(name, body)

    def autoscale_view(self, name: str) -> dict[str, Any]:
        return self._cp.autoscaling.view(name)

    def delete_autoscale(self, name: str) -> None:
        self._cp.autoscaling.delete(name)

    def push_load(self, name: str, value: float) -> dict[str, Any]:
        return self._cp.autoscaling.push_load(name, value)

    def intents(self, name: str) -> dict[str, Any]:
        return self._cp.jcp.intents(name)

    def put_push(self, name: str, intent: PushIntent) -> dict[str, Any]:
        return self._cp.jcp.put_push(name, intent)

    def push_view(self, name: str) -> dict[str, Any]:
        return self._cp.jcp.push_view(name)

    def abort_push(self, name: str) -> dict[str, Any]:
        return self._cp.jcp.abort_push(name)

    def gate_verdict(self, name: str, passed: bool, message: str) -> dict[str, Any]:
        return self._cp.jcp.gate_verdict(name, passed, message)

    def put_sizing(self, name: str, intent: SizingIntent) -> dict[str, Any]:
        return self._cp.jcp.put_sizing(name, intent)

    def sizing_view(self, name: str) -> dict[str, Any]:
        return self._cp.jcp.sizing_view(name)

    def delete_sizing(self, name: str) -> dict[str, Any]:
        return self._cp.jcp.delete_sizing(name)

    def put_canary(self, name: str, canary: str, intent: CanaryIntent) -> dict[str, Any]:
        return self._cp.jcp.put_canary(name, canary, intent)

    def canary_view(self, name: str, canary: str) -> dict[str, Any]:
        return self._cp.jcp.canary_view(name, canary)

    def delete_canary(self, name: str, canary: str) -> dict[str, Any]:
        return self._cp.jcp.delete_canary(name, canary)

    # -- host profiles -------------------------------------------------------------------
    def profiles(self) -> list[HostProfile]:
        return self._cp.profiles.current()

    def profile(self, name: str, version: int | None = None) -> HostProfile:
        return self._cp.profiles.get(name, version)

    def profile_versions(self, name: str) -> list[HostProfile]:
        return self._cp.profiles.versions(name)

    def profile_diff(self, name: str, other: str, version: int | None,
                     other_version: int | None) -> dict[str, Any]:
        return self._cp.profiles.diff(name, other, version, other_version)

    def set_host_profile(self, spec: HostProfileSpec) -> tuple[HostProfile, bool]:
        return self._cp.profiles.put(spec)

    def delete_host_profile(self, name: str) -> None:
        self._cp.profiles.delete(name)

    def profile_users(self, name: str) -> list[tuple[str, str]]:
        """(entitlement, owner) of every entitlement naming the profile."""
        return self._cp.profiles.naming(name)

    def machines_of(self, entitlements: list[str]) -> int:
        return self._cp.profiles.machines_of(entitlements)

    # -- machines and maintenance --------------------------------------------------------
    def machine_index(self, machine: str) -> int:
        """The machine's index (NotFound: not in the region)."""
        return self._cp.machine_index(machine)

    def machines(self, states: Any, entitlement: str | None, offset: int, limit: int,
                 after: str | None, loaned: bool) -> tuple[list[dict[str, Any]], int, Any]:
        return self._cp.views.machines(states, entitlement, offset, limit, after, loaned)

    def machine_summary(self) -> dict[str, Any]:
        return self._cp.views.machine_summary()

    def machine(self, machine: str) -> dict[str, Any]:
        return self._cp.views.machine(machine)

    def fail_machine(self, machine: str) -> str:
        return self._cp.machine_ops.fail_machine(machine)

    def repair_machine(self, machine: str) -> list[str]:
        return self._cp.machine_ops.repair_machine(machine)

    def cordon(self, machine: str, cordoned: bool) -> dict[str, Any]:
        return self._cp.machine_ops.cordon(machine, cordoned)

    def drain(self, machine: str, deadline_seconds: float | None, to: str) -> str:
        return self._cp.machine_ops.drain(machine, deadline_seconds, to)

    def register_machine(self, machine: Machine) -> bool:
        return self._cp.machine_ops.register(machine)

    def schedule_maintenance(self, machines: list[str], start: float | None,
                             duration: float, reason: str) -> str:
        """A maintenance of ``machines`` from ``start`` (None: now)."""
        at = self._cp.clock() if start is None else start
        return self._cp.machine_ops.schedule_maintenance(machines, at, duration, reason)

    def maintenance(self) -> list[dict[str, Any]]:
        return self._cp.machine_ops.maintenance()

    def cancel_maintenance(self, event: str) -> dict[str, Any]:
        return self._cp.machine_ops.cancel_maintenance(event)

    # -- shards --------------------------------------------------------------------------
    def handoff(self, entitlement: str, shard: int) -> int:
        return self._cp.membership.handoff(entitlement, shard)

    def reload(self, entitlement: str | None) -> None:
        self._cp.membership.reload(entitlement)

    def shard(self) -> int | None:
        return self._cp.config.shard

    # -- events --------------------------------------------------------------------------
    def events(self, after: int, limit: int, entitlements: set[str] | None,
               **filters: Any) -> tuple[list[Event], int | None]:
        return self._cp.events.query(after, limit, entitlements=entitlements, **filters)

    def last_event(self) -> int:
        return self._cp.events.last_seq

    # -- agents --------------------------------------------------------------------------
    def check_owned(self, machine: str) -> None:
        """TransientError unless this shard hears the machine's agent."""
        self._cp.membership.check_owned(machine)

    def heard_ago(self, machine: str) -> float | None:
        return self._cp.gateway.heard_ago(machine)

    def heartbeat_timeout(self) -> float:
        return self._cp.config.heartbeat_timeout

    def issue_machine_token(self, machine: str, joined_with: str) -> tuple[TokenInfo, str]:
        """The machine's own credential (a previous one revoked), its join recorded."""
        info, token, replaced = self._cp.tokens.issue_machine(machine, self._cp.clock(),
                                                              f"joined with {joined_with}")
        self._cp.record("auth", "machine_joined", f"{machine} (credential {info.id}"
                        + (f", replacing {replaced}, now revoked)" if replaced else ")"),
                        machine=machine)
        self._cp.gateway.joined(machine)
        return info, token

    @property
    def waiters(self) -> Waiters:
        return self._cp.gateway.waiters

    def desired_generation(self, machine: str) -> int:
        return self._cp.gateway.desired_generation(machine)

    def desired_kept(self, machine: str) -> list[Assignment] | None:
        """The machine's desired set as the last pass kept it (None: not kept yet)."""
        return self._cp.gateway.desired_kept(machine)

    def desired(self, machine: str) -> list[Assignment]:
        """The machine's desired set, read under the lock (blocking)."""
        return self._cp.gateway.desired(machine)

    def profile_kept(self, machine: str) -> dict[str, Any] | None:
        return self._cp.gateway.profile_kept(machine)

    def stops_kept(self, machine: str) -> Any:
        return self._cp.gateway.stops_kept(machine)

    def credentials_ready(self) -> bool:
        """Can ``credentials`` be made without a store read?"""
        return self._cp.controllers.secret_read()

    def credentials(self, tasks: list[Assignment]) -> list[str | None]:
        return self._cp.gateway.credentials(tasks)

    def task_output(self, machine: str, chunks: list[tuple[str, int, str]]) -> int:
        return self._cp.gateway.task_output(machine, chunks)

    def report(self, machine: str, statuses: list[TaskStatus],
               endpoints: dict[tuple[str, int], str], profile: Applied | None,
               cpu: dict[tuple[str, int], float]) -> None:
        self._cp.gateway.report(machine, statuses, endpoints, profile, cpu)
