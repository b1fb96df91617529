"""The agents' gateway: a machine joins (``/v1/agents/join``, with the cluster's join
token), then with its own credential long-polls its desired task set, reports its
tasks and sends what they print (``/v1/machines/{machine}/...``). A machine's
credential acts for that machine alone (an admin's for any)."""

import asyncio
import contextlib
from typing import Annotated, Any

from fastapi import Query, Request, Response
from fastapi.concurrency import run_in_threadpool

from plait.api.auth import Gate, Guard, Who
from plait.api.bodies import Join
from plait.api.common import Plane, resource
from plait.client import types as t
from plait.errors import NotFound, Taken, TransientError, ValidationError
from plait.model import Resources
from plait.model.agentwire import Output, Report
from plait.model.machine import FaultDomain, Machine
from plait.scheduler.records import TaskStatus
from plait.server.auth import Principal, Role
from plait.server.controlplane.facade import PlaneApi, desired_wire
from plait.sidekick.book import Applied

router = resource(["agents"])


def acts_for(who: Principal, machine: str) -> bool:
    """May ``who`` act for ``machine``'s agent (its own credential, or an admin)?"""
    return who.role is Role.ADMIN or (who.role is Role.MACHINE and who.name == machine)


def machine_only(guard: Gate, request: Request, who: Principal, machine: str) -> None:
    if not acts_for(who, machine):
        raise guard.refuse(request, 403, f"{who} may not act for machine {machine}")


@router.post("/v1/agents/join", response_model=t.Joined, status_code=201)
def join(body: Join, who: Who, request: Request, api: Plane,
         guard: Guard) -> dict[str, Any]:
    """Trade the cluster join token for this machine's own credential."""
    if who.role is not Role.JOIN:
        raise guard.refuse(request, 403, f"{who} is not a join token")
    try:
        api.machine_index(body.machine)
    except NotFound:
        pass
    else:
        # (a machine's agent is heard by the shard that manages it: another shard
        # answers 503, and the front end asks again where the map now says)
        api.check_owned(body.machine)
        ago = api.heard_ago(body.machine)
        if ago is not None:  # (the join token does not make its holder that machine)
            raise Taken(f"machine {body.machine}", (
                f"machine {body.machine} has a live agent (heard {ago:.1f}s ago): a "
                "second agent cannot join as it. Stop that agent first (a machine "
                f"silent for {api.heartbeat_timeout():g}s may be joined again), or "
                "start this one with that agent's data dir, which holds the "
                "machine's credential"), heard_seconds_ago=round(ago, 3))
    if body.fault_domain is not None:
        assert body.cpu is not None and body.memory_gb is not None and body.type
        api.register_machine(Machine(
            id=body.machine, type=body.type, fault_domain=FaultDomain.parse(body.fault_domain),
            resources=Resources(cpu=body.cpu, memory_gb=body.memory_gb,
                                disk_gb=body.disk_gb)))
    else:
        try:
            api.machine_index(body.machine)
        except NotFound:
            raise ValidationError(
                "machine", f"machine {body.machine!r} is not in the region: start its agent "
                "with --fault-domain, --cpu, --memory-gb and --type to register it") from None
    info, token = api.issue_machine_token(body.machine, who.token_id)
    return {"machine": body.machine, "token": token, "id": info.id}


async def wait_for_change(api: PlaneApi, machine: str, since: int, wait: float) -> None:
    """Until the machine's desired set is past generation ``since``, or ``wait``
    seconds: woken by the pass when the set changes (registered before the generation
    is read: no change is missed), no timer while it waits."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    waiters = api.waiters
    with waiters.waiting(machine) as changed:
        while (not waiters.closed and api.leading()
               and api.desired_generation(machine) == since):
            left = deadline - loop.time()
            if left <= 0:
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), left)
            changed.clear()
    if not api.leading():  # (a set this replica kept may be stale by now)
        raise TransientError("this replica stopped leading while the request "
                             "waited: ask again")


@router.get("/v1/machines/{machine}/desired", response_model=t.DesiredSet)
async def desired(machine: str, who: Who, request: Request, api: Plane, guard: Guard,
                  wait: Annotated[float, Query(ge=0, le=60)] = 0.0,
                  since: Annotated[int | None, Query(ge=0)] = None) -> Response:
    """The machine's desired task set, which its agent converges to. A long-poll: with
    ``since`` (the ``generation`` of the set the agent has) and ``wait``, the answer
    comes when the set changes, or after ``wait`` seconds."""
    machine_only(guard, request, who, machine)
    api.machine_index(machine)
    if wait and since is not None:
        await wait_for_change(api, machine, since, wait)
    # (the generation is read first: never newer than the tasks)
    generation = api.desired_generation(machine)
    tasks = api.desired_kept(machine)
    if tasks is None:  # not kept yet: read under the control plane's lock
        tasks = await run_in_threadpool(api.desired, machine)
    profile = api.profile_kept(machine)
    # each task's own credential (its PLAIT_TASK_CREDENTIAL), made as it is served
    credentials = (api.credentials(tasks) if api.credentials_ready()
                   else await run_in_threadpool(api.credentials, tasks))
    return Response(desired_wire(machine, generation, tasks, credentials,
                                 api.stops_kept(machine), profile).model_dump_json(),
                    media_type="application/json")


@router.post("/v1/machines/{machine}/output", response_model=t.OutputAck)
def output(machine: str, body: Output, who: Who, request: Request, api: Plane,
           guard: Guard) -> dict[str, Any]:
    """An agent sends what its tasks printed (kept as a tail per task)."""
    machine_only(guard, request, who, machine)
    taken = api.task_output(machine, [(c.job, c.index, c.data) for c in body.chunks])
    return {"machine": machine, "accepted": taken, "refused": len(body.chunks) - taken}


def take_report(api: PlaneApi, machine: str, body: Report) -> dict[str, Any]:
    """An agent's report taken (applied by the next pass): the route's and the hot
    path's (``fastpaths``) one way to take it."""
    api.report(machine, [TaskStatus(t.job, t.index, t.revision, t.phase, t.healthy,
                                    t.exit_code, t.final, t.killed) for t in body.tasks],
               {(t.job, t.index): t.endpoint for t in body.tasks if t.endpoint},
               None if body.profile is None else Applied(
                   body.profile.name, body.profile.version, body.profile.error,
                   body.profile.failures),
               {(t.job, t.index): t.cpu for t in body.tasks if t.cpu is not None})
    return {"machine": machine, "accepted": len(body.tasks),
            "generation": api.desired_generation(machine)}


@router.post("/v1/machines/{machine}/status", response_model=t.StatusAck)
async def status(machine: str, body: Report, who: Who, request: Request, api: Plane,
                 guard: Guard) -> dict[str, Any]:
    """An agent's report of the tasks on its machine (taken at once, never blocking:
    applied by the next pass)."""
    machine_only(guard, request, who, machine)
    return take_report(api, machine, body)
