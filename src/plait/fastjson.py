"""JSON for the records and messages plait writes and reads on every create and every
pass: job records and their state, placements, events, the front end's batches of
creates and their answers (orjson, about ten times the standard library's speed on
these small objects).

The bytes are compact JSON (no spaces); every reader takes them as the standard
library's JSON and the other way round. What stays on ``json``: a digest made of a
record's JSON (``persist.scheduler.runtime_key``), whose stored values must not change,
and the answers FastAPI renders.

Differences from ``json.dumps`` that matter: a float that is not finite is written as
``null`` (``json.dumps`` writes ``NaN``, which is not JSON; plait's records hold none);
an integer beyond 64 bits is refused (a ``TypeError``, as an object ``json.dumps``
cannot write is); keys that are not strings (an int) are written as strings, as
``json.dumps`` does."""

from __future__ import annotations

from typing import Any

import orjson

#: a parse error (a ``ValueError``, as ``json.JSONDecodeError`` is)
JSONDecodeError = orjson.JSONDecodeError

_PLAIN = orjson.OPT_NON_STR_KEYS
_SORTED = orjson.OPT_NON_STR_KEYS | orjson.OPT_SORT_KEYS


def dumps(obj: Any, *, sort_keys: bool = False) -> bytes:
    """``obj`` as compact JSON bytes (its keys sorted with ``sort_keys``)."""
    return orjson.dumps(obj, option=_SORTED if sort_keys else _PLAIN)


def loads(data: bytes | bytearray | memoryview | str) -> Any:
    """Parse JSON (a ``ValueError`` naming the problem when it is not)."""
    return orjson.loads(data)
