"""A record too large for one store value, as parts: its tasks split into records of
at most a given size (the scheduler's state records and the allocator's placements,
past ``PART_BYTES`` each; the caller writes a header that counts the parts)."""

from __future__ import annotations

from collections.abc import Mapping
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
