"""JSON for the records and messages plait writes and reads on every create and every
pass: job records and their state, placements, events, the front end's batches of
creates and their answers (orjson, about ten times the standard library's speed on
these small objects).

The bytes are compact JSON (no spaces); every reader takes them as the standard
library's JSON and the other way round. What stays on ``json``: a digest made of a
record's JSON (``persist.scheduler.runtime_key``), whose stored values must not change,
and the answers FastAPI renders.

What orjson does not take goes to the standard library, so nothing it wrote before is
refused now: a string holding a lone surrogate (a ``"\\ud800"`` escape in some JSON a
tenant's TaskController answered) or an integer beyond 64 bits is written by ``json``,
and read back by it (orjson refuses the escape). A float that is not finite is written
as ``null`` (``json.dumps`` wrote ``NaN``, which is not JSON; no record holds one)."""

from __future__ import annotations

import json
from typing import Any

import orjson

_PLAIN = orjson.OPT_NON_STR_KEYS
_SORTED = orjson.OPT_NON_STR_KEYS | orjson.OPT_SORT_KEYS


def dumps(obj: Any, *, sort_keys: bool = False) -> bytes:
    """``obj`` as compact JSON bytes (its keys sorted with ``sort_keys``); a
    ``TypeError`` for what is not JSON, as ``json.dumps`` raises."""
    try:
        return orjson.dumps(obj, option=_SORTED if sort_keys else _PLAIN)
    except TypeError:  # (orjson's error is one) a lone surrogate, a big int, or no JSON
        return json.dumps(obj, sort_keys=sort_keys, separators=(",", ":")).encode()


class NotUtf8(json.JSONDecodeError):
    """JSON bytes that are not UTF-8 (UTF-16 or UTF-32, a byte order mark, or bytes
    no UTF-8 text holds): its message names what they are."""


def utf8(data: bytes | bytearray | memoryview) -> str:
    """``data`` as text, if it is UTF-8 without a byte order mark, as JSON between
    systems is (RFC 8259, section 8.1); else ``NotUtf8`` naming its encoding. (The
    standard library reads UTF-16 and UTF-32 JSON too, and a UTF-8 byte order mark:
    a request body in any of them was taken though the API says UTF-8.)"""
    raw = bytes(data)
    found = json.detect_encoding(raw)
    if found == "utf-8-sig":
        raise NotUtf8("the body starts with a byte order mark: JSON is UTF-8 without one",
                      "", 0)
    if found != "utf-8":
        raise NotUtf8(f"the body is {found.upper()}, not UTF-8: JSON is UTF-8", "", 0)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise NotUtf8(f"the body is not UTF-8: byte {raw[exc.start]:#04x} at {exc.start}",
                      "", exc.start) from None


def loads(data: bytes | bytearray | memoryview | str) -> Any:
    """Parse JSON; a ``ValueError`` naming the problem when it is not (``NotUtf8`` for
    bytes that are not UTF-8)."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:  # (what only the standard library reads, or garbage)
        try:
            return json.loads(data if isinstance(data, str) else utf8(data))
        except RecursionError:  # (nested deeper than either parser goes)
            raise ValueError("JSON nested too deeply to read") from None
