"""A record too large for one store value, as parts: its tasks split into records of
at most a given size (the scheduler's state records and the allocator's placements,
past ``PART_BYTES`` each; the caller writes a header that counts the parts)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from plait import fastjson


def task_parts(tasks: Mapping[str, Any], limit: int) -> list[bytes]:
    """``tasks`` (key -> row) as parts ``{"tasks": {...}}`` of at most ``limit`` bytes
    each (a row larger than that alone makes a part of its own), in their order."""
    parts: list[bytes] = []
    chunk: dict[str, Any] = {}
    size = 0
    for key, row in tasks.items():
        item = len(key) + len(fastjson.dumps(row)) + 6
        if chunk and size + item > limit - 64:
            parts.append(fastjson.dumps({"tasks": chunk}, sort_keys=True))
            chunk, size = {}, 0
        chunk[key] = row
        size += item
    parts.append(fastjson.dumps({"tasks": chunk}, sort_keys=True))
    return parts


def index_parts(indices: Iterable[int], rows: Mapping[str, Any], per_part: int,
                limit: int) -> list[bytes]:
    """The rows of ``indices`` (``rows``: by the index as a string) as parts: part
    ``k`` holds the indices ``k * per_part`` up to the next (empty if none is left
    there), so a change to a few rows changes their parts only, whatever is added or
    taken out elsewhere; a part past ``limit`` bytes is split further (``task_parts``)."""
    chunks: list[dict[str, Any]] = []
    for index in sorted(indices):
        k = index // per_part
        while len(chunks) <= k:
            chunks.append({})
        key = str(index)
        chunks[k][key] = rows[key]
    parts: list[bytes] = []
    for chunk in chunks:
        part = fastjson.dumps({"tasks": chunk}, sort_keys=True)
        parts += [part] if len(part) <= limit else task_parts(chunk, limit)
    return parts
