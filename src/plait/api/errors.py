"""The API's errors: one JSON shape for every refusal (``{"error": kind, "message":
..., "field": ...}``), the handlers that give it to plait's exceptions and the
framework's own, and the body limit (413)."""

from __future__ import annotations

import json
import urllib.parse
from typing import Any

import pydantic
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from plait.errors import (
    Conflict,
    NotFound,
    PlaitError,
    Taken,
    TooLarge,
    TransientError,
    ValidationError,
)
from plait.frontend.proxy import MAX_BODY, read_body, replaying
from plait.paging import BadRequest
from plait.server.auth import AuthError


class ErrorBody(pydantic.BaseModel):
    """The body of every error response."""

    error: str = pydantic.Field(description="the kind: unauthorized, forbidden, not_found, "
                                "conflict, too_large, invalid, rejected, unavailable")
    message: str
    field: str | None = pydantic.Field(default=None, description="the offending field, for "
                                       "invalid (a dotted path)")


#: the error responses, documented on every operation
ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorBody, "description": "Refused by the control plane"},
    401: {"model": ErrorBody, "description": "No valid bearer token"},
    403: {"model": ErrorBody, "description": "Outside the token's rights"},
    404: {"model": ErrorBody, "description": "No such object (or path)"},
    409: {"model": ErrorBody, "description": "Conflicts with the current state"},
    413: {"model": ErrorBody, "description": f"Request body over {MAX_BODY} bytes"},
    422: {"model": ErrorBody, "description": "Malformed request; the field is named"},
    503: {"model": ErrorBody, "description": "Store unavailable; retry after Retry-After"},
}

#: problems of a malformed request named in its answer at most
MAX_PROBLEMS = 10

_HTTP_KINDS = {400: "invalid", 401: "unauthorized", 403: "forbidden", 404: "not_found",
               405: "method_not_allowed", 413: "too_large"}


def error(status: int, kind: str, message: str, field: str | None = None,
          headers: dict[str, str] | None = None) -> JSONResponse:
    body: dict[str, Any] = {"error": kind, "message": message}
    if field:
        body["field"] = field
    return JSONResponse(body, status_code=status, headers=headers)


def error_bytes(kind: str, message: str) -> bytes:
    return json.dumps({"error": kind, "message": message}).encode()


def _too_large() -> JSONResponse:
    return error(413, "too_large", f"request body over {MAX_BODY} bytes")


class BodyLimit:
    """Refuse bodies over ``MAX_BODY`` with a 413: by their Content-Length, before a
    byte of them is read; a chunked body (no length) is read up to the limit here,
    then handed on whole, or refused as soon as it passes the limit (plain ASGI:
    cheaper than an HTTP middleware on every request)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        size = dict(scope["headers"]).get(b"content-length")
        if size is not None:
            if not size.isdigit() or int(size) > MAX_BODY:
                await _too_large()(scope, receive, send)
                return
            await self.app(scope, receive, send)
            return
        body = await read_body(receive, MAX_BODY)
        if body is None:
            await _too_large()(scope, receive, send)
            return
        await self.app(scope, replaying(body, receive), send)


async def _auth(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, AuthError)
    headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
    return error(exc.status, "unauthorized" if exc.status == 401 else "forbidden",
                 exc.reason, headers=headers)


async def _invalid(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ValidationError)
    return error(422, "invalid", str(exc), exc.field)


async def _bad_page(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, BadRequest)
    return error(400, "invalid", str(exc), exc.field)


async def _missing(request: Request, exc: Exception) -> JSONResponse:
    return error(404, "not_found", str(exc))


async def _conflict(request: Request, exc: Exception) -> JSONResponse:
    answer = error(409, "conflict", str(exc))
    if isinstance(exc, Taken) and exc.details:
        body = {**json.loads(bytes(answer.body)), **exc.details}
        return JSONResponse(body, status_code=409)
    return answer


async def _too_large_error(request: Request, exc: Exception) -> JSONResponse:
    return error(413, "too_large", str(exc))


async def _transient(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, TransientError)
    return error(503, "unavailable", str(exc),
                 headers={"Retry-After": str(max(1, round(exc.retry_after)))})


async def _plait(request: Request, exc: Exception) -> JSONResponse:
    return error(400, "rejected", str(exc))


async def _http(request: Request, exc: Exception) -> JSONResponse:
    """The framework's own errors (unknown path, wrong method, unreadable body) in
    the same shape as ours."""
    assert isinstance(exc, HTTPException)
    if exc.status_code == 400 and exc.detail == "There was an error parsing the body":
        # not even text (FastAPI reads JSON errors as 422 already)
        return error(422, "invalid", "the request body is not valid JSON (UTF-8)")
    kind = _HTTP_KINDS.get(exc.status_code, "error")
    raw = request.scope.get("raw_path") or b""
    if exc.status_code == 404 and b"%2f" in raw.lower():
        # (a name with a '/' in it, escaped: the path is read unescaped, and names
        # another path; no object can be named so)
        named = [urllib.parse.unquote(p) for p in raw.decode("latin-1").split("/")
                 if "%2f" in p.lower()]
        return error(404, kind, f"no object is named {named[0][:128]!r}: a name has "
                                "no '/' (1-64 of a-z 0-9 . _ -, starting and ending "
                                "with a letter or digit)")
    return error(exc.status_code, kind, str(exc.detail),
                 headers=dict(exc.headers) if exc.headers else None)


async def _malformed(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = exc.errors()
    first = errors[0] if errors else {}
    if first.get("type") == "json_invalid":
        reason = first.get("ctx", {}).get("error", "JSON decode error")
        if "UTF-8" in reason:  # (fastjson.NotUtf8: the encoding named, no position)
            return error(422, "invalid", f"the request body is not valid JSON (UTF-8): "
                                         f"{reason}")
        return error(422, "invalid", f"the request body is not valid JSON: {reason} "
                                     f"(at character {first['loc'][-1]})")
    # every problem, not the first alone: a misspelt field is both a required one
    # missing and an unknown one given, and the second says which
    said = []
    for e in errors[:MAX_PROBLEMS]:
        where = ".".join(str(p) for p in e.get("loc", ())
                         if p not in ("body", "query", "path"))
        msg = str(e.get("msg", "invalid")).removeprefix("Value error, ")  # (a validator's)
        if not where and tuple(e.get("loc", ())) == ("body",) and e.get("type") == "missing":
            msg = "the request body is empty: a JSON object is required"
        said.append(f"{where}: {msg}" if where else msg)
    if len(errors) > MAX_PROBLEMS:
        said.append(f"and {len(errors) - MAX_PROBLEMS} more")
    field = ".".join(str(p) for p in first.get("loc", ())
                     if p not in ("body", "query", "path"))
    return error(422, "invalid", "; ".join(said), field)


def install(app: FastAPI) -> None:
    """Every error of ``app`` answered in the one shape."""
    for kind, handler in ((AuthError, _auth), (ValidationError, _invalid),
                          (BadRequest, _bad_page), (NotFound, _missing),
                          (Conflict, _conflict), (TooLarge, _too_large_error),
                          (TransientError, _transient), (PlaitError, _plait),
                          (HTTPException, _http), (RequestValidationError, _malformed)):
        app.add_exception_handler(kind, handler)
