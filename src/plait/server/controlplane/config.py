"""A control plane's settings (``plait serve`` builds them from its options)."""

from __future__ import annotations

from dataclasses import dataclass, field

from plait.model import RegionSpec
from plait.scheduler import SchedulerConfig
from plait.server.events import Retention
from plait.taskcontrol.dispatch import DEFAULT_DEADLINE, DEFAULT_MAX_REPLY, DEFAULT_PER_TENANT


@dataclass(frozen=True)
class ControlPlaneConfig:
    #: the region's machines on first start (later starts use the stored one)
    region: RegionSpec = field(default_factory=lambda: RegionSpec.sized(
        48, dcs=2, msbs_per_dc=3, rows_per_msb=1, racks_per_row=2))
    #: seconds between reconcile passes (a job operation wakes the loop at once)
    tick_seconds: float = 0.5
    #: but passes start at least this far apart
    min_pass_gap: float = 0.05
    #: every this many passes, look at every stored job (a safety net for a missed
    #: wake-up)
    resync_passes: int = 600
    #: move long-lived objects out of the garbage collector's reach this often, and
    #: run a full collection this often (see ``ControlPlane._collect``)
    gc_freeze_seconds: float = 5.0
    gc_full_seconds: float = 600.0
    #: the longest a full collection may hold the interpreter, as estimated from the
    #: last one (a leader's lease is renewed every quarter of its 1 s session, and no
    #: thread renews it while a collection runs); a longer one is skipped
    gc_full_max_pause: float = 0.3
    #: run simulated agents on every machine (no real agents needed)
    sim_agents: bool = False
    #: seconds a simulated task takes to start (half that to stop)
    sim_start_seconds: float = 2.0
    retention: Retention = field(default_factory=Retention)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    #: how long a drain leaves TaskControl to move tasks before they are stopped
    drain_deadline_seconds: float = 300.0
    #: a machine whose agent has not heartbeated this long is unavailable (real agents)
    heartbeat_timeout: float = 5.0
    #: after the control plane starts, a machine whose agent has not heartbeated yet
    #: is unavailable only after this long (its agent may be starting too)
    startup_grace: float = 30.0
    #: more than this share of the machines heard from silent at once (at least
    #: ``silence_hold_min`` of them): none of them is failed, the path to the agents is
    #: the likelier fault (``plait.health.service``; decision 128). 1.0: never held
    silence_hold_fraction: float = 0.5
    silence_hold_min: int = 3
    #: the CA certificate https TaskControllers (and a leader, for a follower) are
    #: checked against (default: the system's authorities)
    ca_file: str | None = None
    #: run as this scheduler shard of the region (None: the whole region in one
    #: control plane); see ``plait.store.shard`` and decision 43
    shard: int | None = None
    #: TaskController calls (decision 45): the hard deadline of one call (connect to
    #: the reply's last byte), the largest reply read, how many calls at once
    controller_deadline: float = DEFAULT_DEADLINE
    controller_reply_bytes: int = DEFAULT_MAX_REPLY
    controller_concurrency: int = 64
    #: of which one owner's calls may hold at most this many at once (a tenant's slow
    #: controllers wait behind each other, not behind another tenant's)
    controller_concurrency_per_owner: int = DEFAULT_PER_TENANT
    #: the networks controller URLs may point into (``plait.taskcontrol.urlpolicy``;
    #: ``loopback`` and ``any`` are shorthands); loopback and link-local only when
    #: named explicitly
    controller_networks: tuple[str, ...] = ("any",)
    #: send them from a process of its own (``plait.taskcontrol.worker``), so their
    #: HTTP work never competes with the pass and the API for this process's
    #: interpreter; else from a thread of this process
    controller_process: bool = True
    #: count and time what the control plane does (``plait.metrics``); off, it holds a
    #: ``NullMetrics`` and /metrics is empty (``plait bench observability`` compares)
    metrics: bool = True
    #: the jobs whose per-job series /metrics shows on their own at most: those with
    #: the most tasks; the others' are summed (job ``_other``, ``plait.metrics``)
    metrics_jobs: int = 100
    #: the jobs, and the tasks in all, one owner may hold unless an admin set its own
    #: (``plait.server.controlplane.owners``)
    owner_max_jobs: int = 1_000
    owner_max_tasks: int = 50_000
