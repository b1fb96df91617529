"""Stores with ZooKeeper's semantics: the embedded SQLite backend (this package) and,
for a control plane that spans hosts, ZooKeeper."""

from plait.store.protocol import Election, Namespace, Op, Session, Store, Transaction
from plait.store.sqlite import SqliteStore

__all__ = ["Election", "Namespace", "Op", "Session", "SqliteStore", "Store", "Transaction"]
