"""Parts of the control plane built with just their collaborators, hand-made here (no
ControlPlane, no HTTP, no threads): what each asks of the state owners and what it
leaves for the next pass."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from plait.autoscaler import AutoscalePolicy
from plait.errors import Conflict, ValidationError
from plait.jcp.intents import SizingIntent
from plait.model import Entitlement, JobSpec, Quota, RegionSpec, parse
from plait.model.machine import FaultDomain, Machine, MachineState
from plait.model.resources import Resources
from plait.server.controlplane.autoscaling import Autoscaling, JobAutoscale
from plait.server.controlplane.commands import JobCommands
from plait.server.controlplane.config import ControlPlaneConfig
from plait.server.controlplane.inbox import Inbox
from plait.server.controlplane.jcp import JobControlPlane
from plait.server.controlplane.machine_ops import MachineOps
from plait.server.controlplane.owners import LimitsBody, Owners
from plait.server.controlplane.recorder import EventRecorder
from plait.server.controlplane.regionstate import RegionState
from plait.server.events import NewEvent
from plait.store.sqlite import SqliteStore

REGION = RegionSpec.sized(8, dcs=2, msbs_per_dc=1, rows_per_msb=1, racks_per_row=2)


class Log:
    def __init__(self) -> None:
        self.stored: list[NewEvent] = []

    def append(self, events: list[NewEvent]) -> list[object]:
        self.stored.extend(events)
        return []


class NoMetrics:
    def event(self, kind: str, n: int = 1) -> None:
        pass


class Wired:
    """The state owners a part is built on, over an in-memory store."""

    def __init__(self, **config: Any) -> None:
        self.now = 1000.0
        self.state = RegionState(SqliteStore(":memory:"),
                                 ControlPlaneConfig(region=REGION, **config), lambda: self.now)
        self.state.build(self.now)
        self.inbox = Inbox()
        self.log = Log()
        self.recorder = EventRecorder(self.log, lambda: self.now, NoMetrics(),  # type: ignore[arg-type]
                                      100, self.state.held_entitlement_of)

    def kinds(self) -> list[str]:
        return [e.kind for e in self.recorder.pending()]


class Profiles:
    """``HostProfiles`` as the commands use it: every entitlement's profile exists."""

    def __init__(self) -> None:
        self.checked: list[str] = []

    def check_entitlement(self, ent: Entitlement) -> None:
        self.checked.append(ent.name)


class Controllers:
    def __init__(self) -> None:
        self.urls: list[str] = []

    def check_controller_url(self, url: str) -> None:
        self.urls.append(url)


class Creates:
    lock = threading.RLock()


class Views:
    def machine_view(self, m: int) -> dict[str, Any]:
        return {"index": m}


def commands(w: Wired) -> tuple[JobCommands, Profiles, Controllers]:
    profiles, controllers = Profiles(), Controllers()
    return JobCommands(w.state, w.inbox, w.recorder, Views(),  # type: ignore[arg-type]
                       Creates(), controllers, profiles), profiles, controllers  # type: ignore[arg-type]


def spec(name: str, **more: Any) -> JobSpec:
    return parse(JobSpec, {"name": name, "entitlement": "web", "task_count": 2,
                           "resources": {"cpu": 1, "memory_gb": 1}, "command": "serve",
                           **more})


# -- JobCommands ---------------------------------------------------------------------------
def test_an_entitlement_is_defined_in_the_allocator_and_recorded_once():
    w = Wired()
    jobs, profiles, _ = commands(w)
    ent = Entitlement(name="web", owner="alice", quota=Quota(machines=2))
    assert jobs.define_entitlement(ent) is True
    assert jobs.define_entitlement(ent) is False  # (the same again: nothing to do)
    assert w.state.allocator.entitlements["web"] == ent and profiles.checked == ["web", "web"]
    assert w.kinds() == ["entitlement_created"]
    with pytest.raises(Conflict):
        jobs.define_entitlement(Entitlement(name="web", owner="bob", quota=Quota(machines=2)))
    with pytest.raises(ValidationError):
        jobs.define_entitlement(Entitlement(name="db", owner="alice", quota=Quota(machines=1),
                                            pin_dc="atlantis"))
    assert "db" not in w.state.allocator.entitlements


def test_a_created_job_is_stored_and_left_in_the_inbox_for_the_next_pass():
    w = Wired()
    jobs, _, controllers = commands(w)
    touched: list[str] = []
    w.inbox.touch = touched.append
    with pytest.raises(ValidationError):
        jobs.create_job(spec("api"))  # (no such entitlement yet)
    assert not w.inbox.wake.is_set() and w.state.jobs.names() == []
    jobs.define_entitlement(Entitlement(name="web", owner="alice", quota=Quota(machines=2)))
    doc, created = jobs.create_job(spec("api", task_controller="http://tc.example:8080/"))
    assert created and doc.name == "api" and w.state.jobs.get("api").spec.task_count == 2
    assert controllers.urls == ["http://tc.example:8080/"]
    assert w.inbox.wake.is_set() and touched == ["api"] and w.inbox.take_jobs() == {"api"}
    _, again = jobs.create_job(spec("api", task_controller="http://tc.example:8080/"))
    assert not again and w.inbox.take_jobs() == set()  # (the same create: nothing new)
    jobs.resize_job("api", 5)
    assert w.state.jobs.get("api").spec.task_count == 5 and w.inbox.take_jobs() == {"api"}


# -- MachineOps ----------------------------------------------------------------------------
def machine_ops(w: Wired, rebuilt: list[float]) -> MachineOps:
    return MachineOps(w.state, w.inbox, w.recorder, Views(),  # type: ignore[arg-type]
                      rebuild=rebuilt.append)


def test_a_failed_machine_is_failed_in_the_brokers_once_until_repaired():
    w = Wired()
    ops = machine_ops(w, [])
    name = w.state.fleet.name(3)
    event = ops.fail_machine(name, "disk on fire")
    assert w.state.region.broker_of(3).state(3) is MachineState.FAILED
    assert w.inbox.wake.is_set() and w.kinds() == ["machine_failed"]
    with pytest.raises(Conflict):
        ops.fail_machine(name)
    assert ops.repair_machine(name) == [event]
    assert w.state.region.broker_of(3).state(3) is MachineState.HEALTHY
    assert w.kinds() == ["machine_failed", "machine_repaired"]
    with pytest.raises(Conflict):
        ops.repair_machine(name)


def test_a_cordon_is_set_in_the_brokers_and_answered_with_the_machines_view():
    w = Wired()
    ops = machine_ops(w, [])
    assert ops.cordon(w.state.fleet.name(2), True) == {"index": 2}
    assert w.state.region.broker_of(2).cordoned(2)
    ops.cordon(w.state.fleet.name(2), False)
    assert not w.state.region.broker_of(2).cordoned(2)
    assert w.kinds() == ["machine_cordoned", "machine_uncordoned"]


def test_a_new_machine_is_stored_and_the_region_rebuilt_a_known_one_is_not():
    w = Wired()
    rebuilt: list[float] = []
    ops = machine_ops(w, rebuilt)
    known = w.state.fleet.machine(0)
    assert ops.register(known) is False and rebuilt == []
    new = Machine(id="m-new", type=known.type, fault_domain=known.fault_domain,
                  resources=Resources(cpu=16, memory_gb=64, disk_gb=1024))
    assert ops.register(new) is True and rebuilt == [w.now]
    assert "m-new" in w.state.meta.children("/machines")
    w.state.build(w.now)  # (what the rebuild does: the new machine joins)
    assert w.state.known("m-new") and w.kinds()[-1] == "machine_registered"
    elsewhere = Machine(id="m-far", type=known.type,
                        fault_domain=FaultDomain.parse("region9/dc1/msb1/row1/rack1"),
                        resources=known.resources)
    with pytest.raises(ValidationError):
        ops.register(elsewhere)


# -- Owners --------------------------------------------------------------------------------
def test_an_owners_limits_are_stored_recorded_and_read_back():
    w = Wired(owner_max_jobs=10, owner_max_tasks=100)
    owners = Owners(w.state, w.recorder)
    assert owners.limits("alice") == (10, 100)
    view = owners.set("alice", LimitsBody(jobs=3))
    assert view["jobs"] == 3 and view["tasks"] == 100 and view["set"] == {"jobs": 3}
    assert w.kinds() == ["owner_limits_set"]
    assert Owners(w.state, w.recorder).limits("alice") == (3, 100)  # (read from the store)
    with pytest.raises(ValidationError):
        owners.set("not a name!", LimitsBody(jobs=1))


# -- the Job Control Plane and the autoscaler ---------------------------------------------
def intents(w: Wired) -> tuple[JobControlPlane, Autoscaling, JobCommands]:
    """The Job Control Plane and the autoscaler on the state owners, the commands and
    the owners' limits; a job "api" of 2 tasks in an entitlement of 8 machines."""
    jobs, profiles, controllers = commands(w)
    owners = Owners(w.state, w.recorder)
    jcp = JobControlPlane(w.state, w.inbox, w.recorder, jobs, controllers,  # type: ignore[arg-type]
                          profiles, owners)  # type: ignore[arg-type]
    autoscaling = Autoscaling(w.state, w.inbox, w.recorder, owners, jcp)
    jobs.define_entitlement(Entitlement(name="web", owner="alice", quota=Quota(machines=8)))
    jobs.create_job(spec("api"))
    w.inbox.take_jobs()
    return jcp, autoscaling, jobs


def test_a_sizing_intent_is_stored_and_its_reconcile_resizes_the_job():
    w = Wired()
    jcp, _, _ = intents(w)
    view = jcp.put_sizing("api", SizingIntent(task_count=4), actor="alice")
    assert view["size"] == 4 and jcp.records["api"].sizing is not None
    assert w.state.jobs.get("api").spec.task_count == 2  # (the reconcile resizes it)
    assert w.inbox.wake.is_set() and jcp.due(w.now)
    jcp.reconcile(w.now)
    assert w.state.jobs.get("api").spec.task_count == 4 and w.inbox.take_jobs() == {"api"}
    assert [k for k in w.kinds() if k != "entitlement_created"] == ["sizing_set", "resized"]
    assert jcp.reconciler.reconciles == 1
    jcp.delete_sizing("api")
    assert "api" not in jcp.records and not jcp.ns.exists("/api")


def test_the_autoscalers_decision_is_a_sizing_intent_the_reconcile_applies():
    w = Wired()
    jcp, autoscaling, _ = intents(w)
    autoscaling.put("api", JobAutoscale(interval_seconds=60, policy=AutoscalePolicy(
        metric="external", target_utilization=0.5, max_tasks=6, history_weight=0)))
    autoscaling.push_load("api", 2.5, at=w.now)
    autoscaling.decide(w.now)
    sizing = jcp.record("api").sizing
    assert sizing is not None and sizing.actor == "autoscaler"
    assert sizing.intent.size == 5 and "autoscaled" in w.kinds()
    jcp.reconcile(w.now)
    assert w.state.jobs.get("api").spec.task_count == 5
    autoscaling.delete("api")  # (its sizing intent goes with it)
    assert jcp.record("api").sizing is None
