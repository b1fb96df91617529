"""Small ready-made worlds for tests, the CLI and benchmarks."""

from __future__ import annotations

from typing import Any

from plait.model import Entitlement, JobSpec, Quota, parse
from plait.model.topology import Fleet, RegionSpec, generate
from plait.scheduler import SchedulerConfig
from plait.sim.agents import BehaviourFn, default_behaviour
from plait.sim.harness import Simulation


def job_spec(name: str, tasks: int, entitlement: str = "ent", cpu: float = 1,
             memory_gb: float = 2, command: str = "serve", **fields: Any) -> JobSpec:
    return parse(JobSpec, {"name": name, "entitlement": entitlement, "task_count": tasks,
                           "resources": {"cpu": cpu, "memory_gb": memory_gb},
                           "command": command, **fields})


def world(fleet: Fleet | None = None, machines: int = 48, quota: int | None = None,
          behaviour: BehaviourFn = default_behaviour,
          config: SchedulerConfig | None = None, entitlements: tuple[str, ...] = ("ent",),
          ) -> Simulation:
    """A simulation over a small generated region (2 DCs x 3 MSBs by default) with
    entitlements that may take the whole region."""
    if fleet is None:
        fleet = generate(RegionSpec.sized(machines, dcs=2, msbs_per_dc=3, rows_per_msb=1,
                                          racks_per_row=2))
    sim = Simulation(fleet, behaviour=behaviour, config=config)
    for name in entitlements:
        sim.allocator.define(Entitlement(name=name, owner="owner",
                                         quota=Quota(machines=quota or len(fleet))))
    return sim
