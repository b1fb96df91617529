"""Backup and restore of a whole store, and opening a store from a URL.

A backup is one JSON document: every persistent key with its value (base64);
ephemeral keys belong to live sessions and are left out. ``SqliteStore`` takes the
snapshot inside one read transaction, so it is consistent even while others write;
on ZooKeeper the tree is walked key by key (quiesce writers for a consistent copy).
A restore goes only into an empty store and writes everything in one transaction.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from plait.errors import Conflict, ValidationError
from plait.store.protocol import Store, Transaction
from plait.store.sqlite import SCHEMA_VERSION, SqliteStore

FORMAT = 1


def open_store(url: str) -> Any:
    """``sqlite:///path/plait.db`` (or a plain path) or ``zk://host:port[,host:port]``
    (``?auth_file=PATH``: ZooKeeper digest credentials, and ACLs on every znode)."""
    if url.startswith("zk://"):
        from urllib.parse import parse_qs

        from plait.store.zookeeper import ZkStore, read_credentials

        hosts, _, query = url[len("zk://"):].partition("?")
        params = parse_qs(query)
        unknown = set(params) - {"auth_file"}
        if unknown or not hosts:
            raise ValidationError("store", "expected zk://host:port[,host:port]"
                                           "[?auth_file=PATH]")
        files = params.get("auth_file")
        return ZkStore(hosts.rstrip("/"), auth=read_credentials(files[0]) if files else None)
    if url.startswith("sqlite://"):
        url = url[len("sqlite://"):]
    if not url:
        raise ValidationError("store", "expected sqlite:///path or zk://host:port")
    return SqliteStore(url)


def store_warnings(store: Store) -> list[str]:
    """What the operator should know of how ``store`` is secured (a ZooKeeper store
    without credentials): logged at start, and in ``/healthz``'s ``warnings``."""
    said = getattr(store, "warnings", None)  # (a traced store passes it through)
    return list(said()) if callable(said) else []


def _walk(store: Store, key: str, out: list[tuple[str, bytes]]) -> None:
    for child in store.children(key):
        path = f"{key.rstrip('/')}/{child}"
        if path.startswith("/zookeeper") or path.startswith("/_elections"):
            continue  # ZooKeeper's own tree; elections are session-bound
        if store.is_ephemeral(path):  # type: ignore[attr-defined]
            continue  # belongs to a live session
        value, _ = store.get(path)
        out.append((path, value))
        _walk(store, path, out)


def snapshot(store: Any) -> list[tuple[str, bytes]]:
    """Every persistent key and its value, parents before children."""
    if isinstance(store, SqliteStore):
        return store.snapshot()
    out: list[tuple[str, bytes]] = []
    _walk(store, "/", out)
    return out


def backup(store: Any) -> dict[str, Any]:
    keys = snapshot(store)
    return {
        "plait_backup": FORMAT,
        "schema_version": SCHEMA_VERSION,
        "keys": [{"key": k, "value": base64.b64encode(v).decode()} for k, v in keys],
    }


def restore(store: Any, document: Any) -> int:
    """Load a backup into an empty store; returns the number of keys written."""
    if not isinstance(document, dict) or document.get("plait_backup") != FORMAT:
        raise ValidationError("plait_backup", f"not a plait backup of format {FORMAT}")
    keys = document.get("keys")
    if not isinstance(keys, list):
        raise ValidationError("keys", "expected a list of {key, value}")
    if snapshot(store):
        raise Conflict("store", "empty", "has keys: restore only into an empty store")
    txn = Transaction()
    for k, entry in enumerate(keys):
        try:
            txn.create(str(entry["key"]), base64.b64decode(entry["value"], validate=True))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValidationError(f"keys[{k}]", f"malformed entry: {exc}") from None
    store.commit(txn)
    return len(keys)


def dumps(document: dict[str, Any]) -> str:
    return json.dumps(document, indent=1, sort_keys=True)
