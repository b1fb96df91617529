"""The web UI writes quotas as people do ("12 machines", "200 RRU"), on the
entitlements page and the overview alike, never with Python's ``None`` or a float's
``.0``. The UI runs in-process against a stand-in for the region's API that answers
the few reads these pages make, as the real API answers them (both quota fields, the
unset one null)."""

from __future__ import annotations

import asyncio
import re
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from plait.ui.app import Ui, _quota

TOKEN = "plait_admin_token_for_the_ui"


def entitlement(name: str, machines: int | None = None, rru: float | None = None) -> dict[str, Any]:
    return {"name": name, "owner": "web-team", "quota": {"machines": machines, "rru": rru},
            "host_profile": None, "lends": False, "elastic": None, "machines": 0,
            "rru": 0.0, "jobs": []}


ENTITLEMENTS = [entitlement("web", machines=12), entitlement("one", machines=1),
                entitlement("shared", rru=200.0), entitlement("half", rru=12.5),
                entitlement("vast", rru=2_500_000.0)]


def stand_in_api() -> Starlette:
    def answer(body: dict[str, Any]):
        async def endpoint(request: Request) -> JSONResponse:
            if request.headers.get("authorization") != f"Bearer {TOKEN}":
                return JSONResponse({"error": "unauthorized"}, status_code=401)
            return JSONResponse(body)
        return endpoint
    return Starlette(routes=[
        Route("/v1/whoami", answer({"role": "admin", "name": "admin"})),
        Route("/v1/entitlements", answer({"entitlements": ENTITLEMENTS})),
        Route("/v1/jobs", answer({"jobs": []})),
        Route("/v1/machines/summary", answer({"total": 0, "cells": []})),
    ])


def logged_in_get(path: str) -> httpx.Response:
    """Log in to the UI with the admin token as a browser's form does, then get a page."""
    async def run() -> httpx.Response:
        ui = Ui(stand_in_api())
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=ui),
                                     base_url="http://plait.test") as client:
            r = await client.post("/ui/login", data={"token": TOKEN, "next": path})
            assert r.status_code == 303, r.text
            page = await client.get(path)
        await ui.close()
        return page
    # on a thread of its own: the browser tests' Playwright keeps an event loop running
    # on this one
    with ThreadPoolExecutor(1) as thread:
        return thread.submit(asyncio.run, run()).result(timeout=60)


def quota_cells(page: str) -> dict[str, str]:
    """Each entitlement row's quota cell (the table's third column), by name."""
    rows = re.findall(r'<tr data-entitlement="([^"]+)">.*?</td><td>[^<]*</td>\s*<td>([^<]*)</td>',
                      page, re.S)
    return dict(rows)


@pytest.mark.parametrize("page", ["/ui/entitlements", "/ui/"])
def test_pages_show_quotas_as_people_write_them(page: str) -> None:
    r = logged_in_get(page)
    assert r.status_code == 200, r.text
    assert quota_cells(r.text) == {"web": "12 machines", "one": "1 machine",
                                   "shared": "200 RRU", "half": "12.5 RRU",
                                   "vast": "2500000 RRU"}
    assert "None" not in r.text


def test_a_quota_the_model_would_not_take_is_shown_without_its_empty_fields() -> None:
    assert _quota({"machines": 3, "rru": None}) == "3 machines"
    assert _quota({"machines": None, "gpus": 4}) == "gpus 4"  # a field of a later API
    assert _quota(None) == _quota({}) == ""
