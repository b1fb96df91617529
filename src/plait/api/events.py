"""``/v1/events``: the region's event log, oldest first; an owner sees only its own
entitlements' events."""

from typing import Annotated, Any

from fastapi import Query, Response

from plait import fastjson
from plait.api.auth import Guard, User
from plait.api.common import Plane, resource
from plait.client import types as t
from plait.server.events import Event

router = resource(["events"])


def _event(e: Event) -> dict[str, Any]:
    return {"seq": e.seq, "time": e.time, "source": e.source, "kind": e.kind,
            "message": e.message, "job": e.job, "entitlement": e.entitlement,
            "machine": e.machine, "actor": e.actor, "task": e.task, "op": e.op,
            "reason": e.reason, "decision": e.decision, "request": e.request}


@router.get("/v1/events", response_model=t.EventPage)
def events(who: User, api: Plane, guard: Guard, after: Annotated[int, Query(ge=0)] = 0,
           limit: Annotated[int, Query(ge=1, le=1000)] = 100, job: str | None = None,
           kind: str | None = None, source: str | None = None,
           entitlement: str | None = None, machine: str | None = None,
           since: Annotated[float | None, Query(ge=0)] = None,
           task: Annotated[int | None, Query(ge=0)] = None, actor: str | None = None,
           request: Annotated[str | None, Query(alias="request_id")] = None,
           ) -> Response:
    """Events oldest first; page with ``after`` = the ``next`` of the last page.
    Filters: a job's ``task`` (its index), the ``actor`` (``owner:alice``,
    ``scheduler``), the API request that caused them (``request_id``)."""
    found, cursor = api.events(after, limit, guard.owned(who), job=job, kind=kind,
                               source=source, entitlement=entitlement, machine=machine,
                               since=since, task=task, actor=actor, request=request)
    # (written as the model says, not checked against it again: a poll of the log,
    # from the UI or a watcher, costs what reading the events does)
    return Response(fastjson.dumps({"events": [_event(e) for e in found],
                                    "next": cursor, "last_seq": api.last_event()}),
                    media_type="application/json")
