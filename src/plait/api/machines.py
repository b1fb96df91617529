"""``/v1/machines`` and ``/v1/maintenance``: the region's machines and their
maintenance (admin). An agent's own calls about its machine are ``agents``'."""

from typing import Annotated, Any

from fastapi import Body, Query

from plait import paging
from plait.api.auth import Admin
from plait.api.bodies import Drain, Maintenance
from plait.api.common import Continue, Plane, resource
from plait.client import types as t
from plait.model.machine import MachineState
from plait.paging import BadRequest
from plait.server.controlplane.facade import parse_states

router = resource()


@router.get("/v1/machines", response_model=t.MachineList, tags=["machines"])
def list_machines(who: Admin, api: Plane, state: str | None = None,
                  entitlement: str | None = None, loaned: bool = False,
                  offset: Annotated[int, Query(ge=0)] = 0,
                  limit: Annotated[int, Query(ge=1, le=1000)] = 100,
                  cont: Continue = None) -> dict[str, Any]:
    """Machines in the region's order (generated, then registered), ``limit`` at a
    time: the next page from ``continue`` (the token of the last; null at the end), or
    at ``offset``. ``total``: every machine that passes the filters (``loaned``: only
    machines on loan to elastic entitlements)."""
    scope = paging.scope_of("machines", state=state, entitlement=entitlement,
                            loaned="1" if loaned else None)
    after = None if not cont else str(paging.decode(cont, scope))
    if after is not None and offset:
        raise BadRequest("offset", "give either offset or continue")
    states = parse_states(state, tuple(s.value for s in MachineState))
    found, total, last = api.machines(states, entitlement, offset, limit, after, loaned)
    return {"machines": found, "total": total, "offset": offset,
            "continue": None if last is None else paging.encode(last, scope)}


@router.get("/v1/machines/summary", response_model=t.MachineSummary, tags=["machines"])
def machine_summary(who: Admin, api: Plane) -> dict[str, Any]:
    """Machines counted by data center, MSB, state and entitlement (null: free), read
    without walking the machines one by one (the web UI's region page)."""
    return api.machine_summary()


@router.get("/v1/machines/{machine}", response_model=t.MachineView, tags=["machines"])
def get_machine(machine: str, who: Admin, api: Plane) -> dict[str, Any]:
    return api.machine(machine)


@router.post("/v1/machines/{machine}/fail", response_model=t.MachineEvent, tags=["machines"])
def fail_machine(machine: str, who: Admin, api: Plane) -> dict[str, Any]:
    """Mark a machine failed (as the health check would): its tasks move."""
    return {"machine": machine, "event": api.fail_machine(machine)}


@router.post("/v1/machines/{machine}/repair", response_model=t.MachineRepair,
             tags=["machines"])
def repair_machine(machine: str, who: Admin, api: Plane) -> dict[str, Any]:
    return {"machine": machine, "ended": api.repair_machine(machine)}


@router.post("/v1/machines/{machine}/cordon", response_model=t.MachineView,
             tags=["machines"])
def cordon(machine: str, who: Admin, api: Plane) -> dict[str, Any]:
    """No new tasks on the machine; the ones there keep running."""
    return api.cordon(machine, True)


@router.post("/v1/machines/{machine}/uncordon", response_model=t.MachineView,
             tags=["machines"])
def uncordon(machine: str, who: Admin, api: Plane) -> dict[str, Any]:
    return api.cordon(machine, False)


@router.post("/v1/machines/{machine}/drain", response_model=t.MachineEvent,
             tags=["machines"])
def drain(machine: str, who: Admin, api: Plane,
          body: Annotated[Drain | None, Body()] = None) -> dict[str, Any]:
    """Cordon, then move the tasks off through TaskControl; at the deadline what is
    left is stopped. Once empty, the machine goes back to the free pool (``to:
    free``) or stays out of service until uncordoned (``maintenance``, the
    default)."""
    return {"machine": machine, "event": api.drain(
        machine, body.deadline_seconds if body else None, body.to if body else "maintenance")}


@router.post("/v1/maintenance", response_model=t.MaintenanceCreated, tags=["maintenance"],
             status_code=201)
def schedule_maintenance(body: Maintenance, who: Admin, api: Plane) -> dict[str, Any]:
    return {"event": api.schedule_maintenance(body.machines, body.start,
                                              body.duration_seconds, body.reason)}


@router.get("/v1/maintenance", response_model=t.MaintenanceList, tags=["maintenance"])
def list_maintenance(who: Admin, api: Plane) -> dict[str, Any]:
    return {"events": api.maintenance()}


@router.delete("/v1/maintenance/{event}", response_model=t.MaintenanceCancelled,
               tags=["maintenance"])
def cancel_maintenance(event: str, who: Admin, api: Plane) -> dict[str, Any]:
    """Cancel a planned maintenance: not started, it is withdrawn (its notices stop,
    its machines' cordons are lifted; ``state`` cancelled); under way, it ends now
    (its machines are back in service; ``state`` ended)."""
    return api.cancel_maintenance(event)
