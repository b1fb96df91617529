"""What the API's router modules share: the control plane's facade as a dependency,
the parameters of lists, and the acknowledgement of a job operation."""

from __future__ import annotations

import functools
from enum import Enum
from typing import Annotated, Any

import pydantic
from fastapi import APIRouter, Depends, Path, Query, Request

from plait import paging
from plait.api.errors import ERRORS
from plait.api.jsonbody import Utf8Route
from plait.model import JobSpec
from plait.model.job import MAX_TASKS
from plait.server.controlplane.facade import PlaneApi

#: an object's name in a request body (an entitlement's, a token's)
NAME = Annotated[str, pydantic.StringConstraints(pattern=r"^[a-z0-9]([a-z0-9._-]{0,62}[a-z0-9])?$")]

#: a list's page size and the token of its next page (``plait.paging``); a
#: bad one is a 400 naming it
Limit = Annotated[str | None, Query(description=(
    f"items per page, 1 to {paging.MAX_LIMIT}: the answer then carries `continue`, the "
    "token of the next page (null at the end); without it (and without `continue`) "
    "every item"))]
Continue = Annotated[str | None, Query(alias="continue", description=(
    "the `continue` of the previous page, as it is (bound to the list and its filters)"))]
#: a task's index in a path (a job has at most ``MAX_TASKS``)
TaskIndex = Annotated[int, Path(ge=0, le=MAX_TASKS - 1)]


def resource(tags: list[str | Enum] | None = None) -> APIRouter:
    """A resource's router: its routes read bodies as UTF-8 JSON (``Utf8Route``) and
    document the API's error answers (``errors.ERRORS``), as the app's own do."""
    return APIRouter(route_class=Utf8Route, responses=ERRORS, tags=list(tags or ()))


async def plane(request: Request) -> PlaneApi:
    """The control plane the app serves (``create_app`` puts it in the app's state)."""
    api: PlaneApi = request.app.state.plane
    return api


Plane = Annotated[PlaneApi, Depends(plane)]


def ack(doc: Any, created: bool | None = None,
        unchanged: bool | None = None) -> dict[str, Any]:
    """The answer to a job operation: acknowledged once stored."""
    body = {"name": doc.name, "entitlement": doc.entitlement, "version": doc.target,
            "operation": doc.seq, "deleting": doc.deleting}
    if created is not None:
        body["created"] = created
    if unchanged is not None:
        body["unchanged"] = unchanged
    return body


@functools.lru_cache(maxsize=4096)
def spec_wire(spec: JobSpec) -> dict[str, Any]:
    """A spec's JSON form, made once per spec (every agent of a job's tasks is sent
    the same version; the result is only serialized, never changed)."""
    return spec.model_dump(mode="json")
