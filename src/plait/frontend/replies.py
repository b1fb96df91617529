"""The front end's own answers: a JSON reply, a refusal (``Refused``, raised and
answered in plait's error shape), and the reading of a request's JSON body and
numeric query parameters."""

from __future__ import annotations

import json
from typing import Any

from starlette.types import Send

from plait import fastjson


def reply(status: int, body: dict[str, Any],
          headers: list[tuple[bytes, bytes]] | None = None) -> tuple[int, bytes, list[Any]]:
    data = json.dumps(body).encode()
    return status, data, [(b"content-type", b"application/json"), *(headers or [])]


async def send_reply(send: Send, status: int, data: bytes, headers: list[Any]) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [*headers, (b"content-length", str(len(data)).encode())]})
    await send({"type": "http.response.body", "body": data})


def error_reply(status: int, kind: str, message: str, retry: bool = False,
                field: str | None = None) -> tuple[int, bytes, list[Any]]:
    body = {"error": kind, "message": message} | ({"field": field} if field else {})
    return reply(status, body, [(b"retry-after", b"1")] if retry else None)


class Refused(Exception):
    def __init__(self, status: int, kind: str, message: str, retry: bool = False,
                 field: str | None = None) -> None:
        super().__init__(message)
        self.reply = error_reply(status, kind, message, retry, field)


def whole(query: dict[str, str], key: str, default: int) -> int:
    """A query parameter that is a whole number >= 0 (as the shards take it), or its
    default when absent; anything else (an empty value too) is refused naming it."""
    raw = query.get(key)
    if raw is None:
        return default
    # ("¹" is a digit to isdigit; int() refuses thousands of digits, and an events
    # cursor of many shards has a few hundred at most)
    if not (raw.strip().isascii() and raw.strip().isdigit() and len(raw.strip()) <= 400):
        raise Refused(422, "invalid", f"{key}: {raw[:40]!r} is not a whole number >= 0",
                      field=key)
    return int(raw)


def json_object(body: bytes) -> dict[str, Any]:
    """A request body's JSON object ({} for anything else: the shard's answer names
    the problem)."""
    try:
        data = fastjson.loads(body or b"{}")
    except ValueError:  # (nested too deeply too: the shard's answer names it)
        return {}
    return data if isinstance(data, dict) else {}
