"""Lists read in pages, in the manner of Kubernetes' list chunking.

A list route takes ``limit`` (items per page, 1 to ``MAX_LIMIT``) and ``continue``
(the opaque token of the previous page). Items come in a stable order by their key
(a job's or an entitlement's name, a task's index, a token's id); a page holds the
first ``limit`` items, after the token's key, that pass the filters, and
``continue`` names the last of them, or is null at the end. Because a token holds a
key, not a position, a list changed between two pages loses nothing: every item
present from the first page to the last is listed exactly once, an item created
meanwhile is listed if its key comes after the page that was read, and a deleted
one is simply absent.

A token is bound to its list and filters (a digest of them): one used with other
filters is refused, so a caller never reads a page of one list as a page of
another. It holds no owner: each page is filtered by the caller's rights again, so
a token made up by hand shows nothing its caller could not list anyway.

Without ``limit`` or ``continue`` a route answers the whole list in its former
shape (no ``continue`` key); with either, the answer carries ``continue``.

The front end of a sharded region (``plait.frontend.router``) merges shards' pages:
the order is by key across shards, so it asks every shard for the same page (the
same token: a key is the region's, not a shard's), merges the answers by key, and
keeps the first ``limit``.

Pure: no I/O.
"""

from __future__ import annotations

import base64
import binascii
import bisect
import hashlib
import json
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from plait.errors import ValidationError

#: items per page when a caller gives a ``continue`` token and no ``limit`` (and the
#: page size of the SDK's and the CLI's iterators)
DEFAULT_LIMIT = 500
#: the most items one page holds
MAX_LIMIT = 5000

Key = str | int
T = TypeVar("T")


class BadRequest(ValidationError):
    """A list's query that names a page or a size it cannot be (an HTTP 400 naming
    the parameter)."""


@dataclass(frozen=True)
class Window:
    """Which items a request asks for: ``limit`` per page (None: the whole list, in
    the former shape) after the key ``after`` (None: from the start)."""

    limit: int | None
    after: Key | None
    scope: str

    @property
    def paged(self) -> bool:
        return self.limit is not None


def scope_of(kind: str, **filters: str | None) -> str:
    """What a token is bound to: the list and its filters (those given)."""
    given = sorted((k, v) for k, v in filters.items() if v is not None)
    return kind + "?" + "&".join(f"{k}={v}" for k, v in given)


def _digest(scope: str) -> str:
    return hashlib.sha256(scope.encode()).hexdigest()[:16]


def encode(after: Key, scope: str) -> str:
    """The token of the page after key ``after``."""
    raw = json.dumps({"v": 1, "after": after, "scope": _digest(scope)},
                     separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def parse_limit(raw: str | None) -> int | None:
    if raw is None:
        return None
    text = raw.strip()
    # (ASCII digits only: "¹" and other digits of Unicode pass isdigit, not int; and
    # few of them: int() refuses thousands of digits)
    if not (text.isascii() and text.isdigit() and len(text) <= 12) or not (
            1 <= int(text) <= MAX_LIMIT):
        raise BadRequest("limit", f"{raw!r} is not a whole number from 1 to "
                                  f"{MAX_LIMIT}")
    return int(text)


def decode(token: str, scope: str) -> Key:
    """The key a token of ``scope`` starts after; a ``BadRequest`` naming
    ``continue`` for anything else."""
    try:
        padded = token.strip() + "=" * (-len(token.strip()) % 4)
        data = json.loads(base64.urlsafe_b64decode(padded.encode()))
        after = data["after"]
        ok = (isinstance(data, dict) and data.get("v") == 1
              and isinstance(after, (str, int)) and not isinstance(after, bool))
    except (ValueError, TypeError, KeyError, binascii.Error, RecursionError):
        ok = False  # (RecursionError: JSON nested deeper than the parser goes)
    if not ok:
        raise BadRequest("continue", "not a continue token of this API (pass "
                                     "the `continue` of the previous page as it is)")
    if data.get("scope") != _digest(scope):
        raise BadRequest("continue", "the token was made for another list or "
                                     "other filters; list again from the start without it")
    return after  # type: ignore[no-any-return]


def window(limit: str | None, token: str | None, scope: str) -> Window:
    """The page a request asks for (``BadRequest`` for a bad ``limit`` or token)."""
    size = parse_limit(limit)
    after = None if token is None or token == "" else decode(token, scope)
    if size is None and token is not None:
        size = DEFAULT_LIMIT
    return Window(size, after, scope)


def page(keys: Sequence[Key], win: Window, wanted: Callable[[Key], T | None]
         ) -> tuple[list[T], str | None]:
    """The page of ``win`` over ``keys`` (sorted): each key after ``win.after`` is
    offered to ``wanted``, which returns its item or None (filtered out); stops once
    the page is full and one more item is known to follow. Returns the items and the
    next token (None: nothing follows)."""
    if win.after is not None and keys and type(win.after) is not type(keys[0]):
        raise BadRequest("continue", "not a continue token of this list")
    start = 0 if win.after is None else bisect.bisect_right(keys, win.after)
    found: list[T] = []
    last: Key | None = None
    for key in keys[start:]:
        item = wanted(key)
        if item is None:
            continue
        if win.limit is not None and len(found) >= win.limit:
            return found, encode(last, win.scope) if last is not None else None
        found.append(item)
        last = key
    return found, None


def merged(pages: Iterable[Mapping[str, Any]], field: str, key: Callable[[Any], Key],
           win: Window) -> tuple[list[Any], str | None]:
    """Shards' pages of one list (each sorted by ``key``, each the same window)
    merged by key: the first ``win.limit`` items, and the token after the last of
    them (None when no shard has more)."""
    import heapq

    pages = list(pages)
    items: Iterator[Any] = heapq.merge(*(p[field] for p in pages), key=key)
    everything = list(items)
    if win.limit is None:
        return everything, None
    kept = everything[:win.limit]
    more = len(everything) > win.limit or any(p.get("continue") for p in pages)
    if not kept or not more:
        return kept, None
    return kept, encode(key(kept[-1]), win.scope)
