"""The embedded store: one SQLite file, safe across processes on one host.

WAL journal, ``synchronous=FULL`` (a write is acknowledged only once it is on
disk), every write in ``BEGIN IMMEDIATE`` with a busy timeout. Sessions are rows
with an expiry that their owner heartbeats; an expired session's ephemeral keys are
invisible at once and deleted by the next write. Every change appends to a change
log, which watchers poll (``poll()``, or a background poller) so that a change made
by another process is seen too; watches are level-triggered.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from plait.errors import Conflict, NotFound
from plait.store.protocol import (
    Op,
    Transaction,
    WatchCallback,
    WouldBlock,
    check_key,
    check_value,
)

SCHEMA = """
CREATE TABLE IF NOT EXISTS nodes (
    path TEXT PRIMARY KEY, parent TEXT NOT NULL, value BLOB NOT NULL,
    version INTEGER NOT NULL, session TEXT
);
CREATE INDEX IF NOT EXISTS nodes_parent ON nodes(parent);
CREATE INDEX IF NOT EXISTS nodes_session ON nodes(session);
CREATE TABLE IF NOT EXISTS sessions (id TEXT PRIMARY KEY, expires REAL NOT NULL);
CREATE TABLE IF NOT EXISTS changes (zxid INTEGER PRIMARY KEY AUTOINCREMENT, path TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""
SCHEMA_VERSION = "1"
#: change-log rows kept for watchers that poll late
CHANGES_KEPT = 10_000
LIVE = "(n.session IS NULL OR n.session IN (SELECT id FROM sessions WHERE expires > ?))"
#: ``LIVE`` in a statement on ``nodes`` without an alias (an update)
_LIVE_ROW = "(session IS NULL OR session IN (SELECT id FROM sessions WHERE expires > ?))"
#: plain creates in a row of one transaction written by one statement from this many
_MANY_CREATES = 3


def _parent(key: str) -> str:
    return key.rsplit("/", 1)[0] or "/"


class SqliteSession:
    def __init__(self, store: SqliteStore, ttl: float) -> None:
        self.store, self.ttl = store, ttl
        self.id = uuid.uuid4().hex
        with store._write() as cur:
            cur.execute("INSERT INTO sessions VALUES (?, ?)", (self.id, store.clock() + ttl))

    def heartbeat(self) -> None:
        with self.store._write() as cur:
            cur.execute("UPDATE sessions SET expires = ? WHERE id = ?",
                        (self.store.clock() + self.ttl, self.id))
            if cur.rowcount == 0:
                raise NotFound("session", self.id)

    def alive(self) -> bool:
        row = self.store._read("SELECT expires FROM sessions WHERE id = ?", (self.id,))
        return bool(row) and row[0][0] > self.store.clock()

    def close(self) -> None:
        with self.store._write() as cur:
            self.store._end_sessions(cur, [self.id])


class SqliteElection:
    """A host-local lease: the leader holds an ephemeral key of its session."""

    def __init__(self, store: SqliteStore, name: str, identity: str,
                 session: SqliteSession) -> None:
        self.store, self.identity, self.session = store, identity, session
        self.key = check_key(f"/_elections/{name}/leader")

    def campaign(self) -> bool:
        """Whether this session holds the lease (taking it when no live session
        does). A replica campaigns every poll (20 times a second), so the lease is
        read first: only a lease that is free takes a write transaction (which the
        store's other writers, a leader's passes and creates, would wait for)."""
        holder = self._holder()
        if holder is not None:
            return holder == self.session.id
        try:
            self.store.create(self.key, self.identity.encode(), self.session)
            return True
        except Conflict:  # (taken meanwhile, or held by a session that lapsed just now)
            return self._holder() == self.session.id

    def _holder(self) -> str | None:
        """The live session that holds the lease, if any."""
        rows = self.store._read(f"SELECT n.session FROM nodes n WHERE n.path = ? AND {LIVE}",
                                (self.key, self.store.clock()))
        return str(rows[0][0]) if rows and rows[0][0] is not None else None

    def fence(self) -> tuple[str, int] | None:
        """None: a lease key is created again (version 0) by the next leader, so its
        version cannot tell leaders apart; on one host a lapsed leader is a paused
        process, and its writes are the store's compare-and-swaps alone."""
        return None

    def leader(self) -> str | None:
        try:
            value, _ = self.store.get(self.key)
        except NotFound:
            return None
        return value.decode()

    def resign(self) -> None:
        with self.store._write() as cur:
            cur.execute("DELETE FROM nodes WHERE path = ? AND session = ?",
                        (self.key, self.session.id))
            if cur.rowcount:
                cur.execute("INSERT INTO changes(path) VALUES (?)", (self.key,))


class SqliteStore:
    #: reads are local (a file on this host, read on a connection of their own, WAL:
    #: never behind a writer), so an event loop may make them itself rather than hand
    #: them to a thread (the front end does)
    local_reads = True

    def __init__(self, path: str, busy_timeout: float = 30.0,
                 clock: Callable[[], float] = time.time) -> None:
        self.path, self.clock = path, clock
        private = path != ":memory:" and not path.startswith("file:")
        if private:  # it holds token hashes: 0600 from its creation, whatever the umask
            os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
        self._db = sqlite3.connect(path, timeout=busy_timeout, isolation_level=None,
                                   check_same_thread=False)
        self._lock = threading.RLock()
        self._busy_ms = int(busy_timeout * 1000)
        #: this thread's writes do not wait (``nowait``)
        self._nowait = threading.local()
        self._db.execute("PRAGMA journal_mode=WAL")
        if private:  # (SQLite gives the -wal and -shm files the database's mode)
            for suffix in ("", "-wal", "-shm"):
                with contextlib.suppress(OSError):  # (another user's file: left alone)
                    os.chmod(path + suffix, 0o600)
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(SCHEMA)
        # reads on a connection of their own (WAL: they see the last commit and never
        # wait for a write's fsync, which holds the writing connection's lock); an
        # in-memory database is one connection's alone, so it reads on that one
        self._rdb, self._rlock = self._db, self._lock
        if private:
            self._rdb = sqlite3.connect(path, timeout=busy_timeout, isolation_level=None,
                                        check_same_thread=False)
            self._rlock = threading.RLock()
        self._watches: list[tuple[str, WatchCallback]] = []
        self._parents: set[str] = set()
        self._new_parents: list[str] = []
        rows = self._read("SELECT coalesce(max(zxid), 0) FROM changes", ())
        self._seen = int(rows[0][0])
        self._poller: threading.Thread | None = None
        self._stop = threading.Event()
        with self._write() as cur:
            cur.execute("INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)",
                        (SCHEMA_VERSION,))

    # -- plumbing ------------------------------------------------------------------------
    @contextmanager
    def nowait(self, within: float = 0.0) -> Iterator[None]:
        """The first write of this thread within raises ``WouldBlock`` rather than wait
        more than ``within`` seconds for another thread's write or another process's;
        besides, it waits only for the fsync of its own commit (an event loop may write
        itself when that is all it waits for). Once it began, the scope's further
        writes wait as any does: what a caller half wrote is finished, never left."""
        before = getattr(self._nowait, "within", None)
        self._nowait.within = max(0.0, within)
        try:
            yield
        finally:
            self._nowait.within = before

    def _begin(self, cur: sqlite3.Cursor, within: float | None) -> None:
        if within is None:
            cur.execute("BEGIN IMMEDIATE")
            return
        self._db.execute(f"PRAGMA busy_timeout = {int(within * 1000)}")
        try:
            cur.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:  # (SQLITE_BUSY: another process writes)
            raise WouldBlock(f"the store's file is being written: {exc}") from None
        finally:
            self._db.execute(f"PRAGMA busy_timeout = {self._busy_ms}")

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Cursor]:
        within: float | None = getattr(self._nowait, "within", None)
        if not (self._lock.acquire() if within is None else self._lock.acquire(timeout=within)):
            raise WouldBlock("the store is being written by another thread")
        try:
            cur = self._db.cursor()
            self._begin(cur, within)
            self._nowait.within = None  # (begun: the scope's next writes wait)
            self._new_parents = []
            self._changes: list[tuple[str]] = []
            try:
                yield cur
                if self._changes:  # (the change log's rows of the write, in one call)
                    cur.executemany("INSERT INTO changes(path) VALUES (?)", self._changes)
                cur.execute("COMMIT")
            except BaseException:
                cur.execute("ROLLBACK")
                raise
            # keys known to exist, so later creates below them skip re-inserting them
            # (keys that hold children are never deleted by plait)
            self._parents.update(self._new_parents)
        finally:
            self._lock.release()
        # nothing to tell otherwise (watches level-trigger on register); a write that
        # must not wait leaves them to the next poll (they level-trigger)
        if self._watches and within is None:
            self.poll()

    def _read(self, sql: str, args: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        with self._rlock:
            return self._rdb.execute(sql, args).fetchall()

    def _end_sessions(self, cur: sqlite3.Cursor, ids: list[str]) -> None:
        for sid in ids:
            gone = cur.execute("SELECT path FROM nodes WHERE session = ?", (sid,)).fetchall()
            cur.execute("DELETE FROM nodes WHERE session = ?", (sid,))
            cur.execute("DELETE FROM sessions WHERE id = ?", (sid,))
            cur.executemany("INSERT INTO changes(path) VALUES (?)", gone)

    def _expire(self, cur: sqlite3.Cursor) -> None:
        expired = [r[0] for r in cur.execute("SELECT id FROM sessions WHERE expires <= ?",
                                             (self.clock(),)).fetchall()]
        self._end_sessions(cur, expired)

    def _changed(self, cur: sqlite3.Cursor, key: str) -> None:
        self._changes.append((key,))  # (written before the commit: ``_write``)

    # -- reading ---------------------------------------------------------------------------
    def get(self, key: str) -> tuple[bytes, int]:
        rows = self._read(f"SELECT n.value, n.version FROM nodes n WHERE n.path = ? AND {LIVE}",
                          (check_key(key), self.clock()))
        if not rows:
            raise NotFound("key", key)
        return bytes(rows[0][0]), int(rows[0][1])

    def get_many(self, keys: list[str]) -> dict[str, tuple[bytes, int]]:
        """Several keys (missing ones left out); one query per 500 keys."""
        found: dict[str, tuple[bytes, int]] = {}
        for i in range(0, len(keys), 500):
            chunk = [check_key(k) for k in keys[i:i + 500]]
            rows = self._read(f"SELECT n.path, n.value, n.version FROM nodes n WHERE n.path IN "
                              f"({','.join('?' * len(chunk))}) AND {LIVE}",
                              (*chunk, self.clock()))
            found.update((path, (bytes(value), int(version))) for path, value, version in rows)
        return found

    def is_ephemeral(self, key: str) -> bool:
        rows = self._read("SELECT session FROM nodes WHERE path = ?", (check_key(key),))
        return bool(rows) and rows[0][0] is not None

    def exists(self, key: str) -> bool:
        try:
            self.get(key)
        except NotFound:
            return False
        return True

    def children(self, prefix: str) -> list[str]:
        rows = self._read(f"SELECT n.path FROM nodes n WHERE n.parent = ? AND {LIVE} "
                          "ORDER BY n.path", (check_key(prefix), self.clock()))
        return [r[0].rsplit("/", 1)[1] for r in rows]

    def snapshot(self) -> list[tuple[str, bytes]]:
        """Every persistent key and its value, read in one transaction (consistent
        even while other processes write); parents before children."""
        with self._lock:
            cur = self._db.cursor()
            cur.execute("BEGIN")
            try:
                rows = cur.execute("SELECT path, value FROM nodes WHERE session IS NULL "
                                   "ORDER BY length(path) - length(replace(path, '/', '')), "
                                   "path").fetchall()
            finally:
                cur.execute("COMMIT")
        return [(str(p), bytes(v)) for p, v in rows
                if not str(p).startswith("/_elections")]  # elections are session-bound

    # -- writing -----------------------------------------------------------------------------
    def _apply(self, cur: sqlite3.Cursor, op: Op, session: SqliteSession | None) -> int:
        key = op.key
        if op.kind == "create":
            return self._create(cur, op, session)
        if op.kind == "set" and op.version != -1:
            # the usual case in one statement: the key is live at that version
            cur.execute(f"UPDATE nodes SET value = ?, version = version + 1 WHERE path = ? "
                        f"AND version = ? AND {_LIVE_ROW}",
                        (op.value, key, op.version, self.clock()))
            if cur.rowcount == 1:
                self._changed(cur, key)
                return op.version + 1
            # (else missing, or at another version: the read below says which)
        row = cur.execute(f"SELECT n.version FROM nodes n WHERE n.path = ? AND {LIVE}",
                          (key, self.clock())).fetchone()
        if row is None:
            raise NotFound("key", key)
        if op.version != -1 and row[0] != op.version:
            raise Conflict(f"key {key} version", op.version, row[0])
        if op.kind == "set":
            cur.execute("UPDATE nodes SET value = ?, version = version + 1 WHERE path = ?",
                        (op.value, key))
            self._changed(cur, key)
            return int(row[0]) + 1
        if op.kind == "delete":
            self._parents.discard(key)
            cur.execute("DELETE FROM nodes WHERE path = ?", (key,))
            self._changed(cur, key)
            return -1
        return int(row[0])  # check

    def _create(self, cur: sqlite3.Cursor, op: Op, session: SqliteSession | None) -> int:
        """A create: one insert when the key is free (the common case); a key that is
        taken is a conflict, unless it is an expired session's ephemeral key, which
        the new one replaces."""
        key = op.key
        if op.ephemeral and session is None:
            raise Conflict(f"key {key}", "a session for an ephemeral key", None)
        # missing parents are created empty (kazoo's makepath=True)
        parent = _parent(key)
        while parent != "/" and parent not in self._parents:
            cur.execute("INSERT OR IGNORE INTO nodes VALUES (?, ?, x'', 0, NULL)",
                        (parent, _parent(parent)))
            self._new_parents.append(parent)
            parent = _parent(parent)
        row = (key, _parent(key), op.value, session.id if op.ephemeral and session else None)
        try:
            cur.execute("INSERT INTO nodes VALUES (?, ?, ?, 0, ?)", row)
        except sqlite3.IntegrityError:  # the key is taken: live, or an expired ephemeral
            live = cur.execute(f"SELECT 1 FROM nodes n WHERE n.path = ? AND {LIVE}",
                               (key, self.clock())).fetchone()
            if live is not None:
                raise Conflict(f"key {key}", "absent", "exists") from None
            cur.execute("DELETE FROM nodes WHERE path = ?", (key,))
            cur.execute("INSERT INTO nodes VALUES (?, ?, ?, 0, ?)", row)
        self._changed(cur, key)
        return 0

    def _create_many(self, cur: sqlite3.Cursor, ops: list[Op]) -> None:
        """Plain creates (not ephemeral) that follow each other in a transaction, in
        one statement (a pass stores a few hundred: its events, new jobs' state). If
        a key is taken, none of them is kept and each is made as ``_create`` makes it,
        which gives the same outcome and error as one at a time."""
        before = len(self._new_parents)
        made: set[str] = set()  # (parents made for this batch)
        cur.execute("SAVEPOINT creates")
        try:
            for op in ops:
                parent = _parent(op.key)
                while parent != "/" and parent not in self._parents and parent not in made:
                    cur.execute("INSERT OR IGNORE INTO nodes VALUES (?, ?, x'', 0, NULL)",
                                (parent, _parent(parent)))
                    self._new_parents.append(parent)
                    made.add(parent)
                    parent = _parent(parent)
            cur.executemany("INSERT INTO nodes VALUES (?, ?, ?, 0, NULL)",
                            [(op.key, _parent(op.key), op.value) for op in ops])
        except sqlite3.IntegrityError:
            cur.execute("ROLLBACK TO creates")
            cur.execute("RELEASE creates")
            del self._new_parents[before:]
            for op in ops:
                self._create(cur, op, None)
            return
        cur.execute("RELEASE creates")
        self._changes.extend((op.key,) for op in ops)

    def create(self, key: str, value: bytes, session: SqliteSession | None = None) -> int:
        op = Op("create", check_key(key), check_value(key, value), ephemeral=session is not None)
        with self._write() as cur:
            self._expire(cur)
            return self._apply(cur, op, session)

    def set(self, key: str, value: bytes, version: int) -> int:
        with self._write() as cur:
            self._expire(cur)
            return self._apply(cur, Op("set", check_key(key), check_value(key, value), version),
                               None)

    def delete(self, key: str, version: int) -> None:
        with self._write() as cur:
            self._expire(cur)
            self._apply(cur, Op("delete", check_key(key), version=version), None)

    def commit(self, txn: Transaction, session: SqliteSession | None = None) -> None:
        """All of ``txn`` or nothing: the first failing step raises and rolls back."""
        for op in txn.ops:
            check_value(op.key, op.value)
        with self._write() as cur:
            self._expire(cur)
            ops, i = txn.ops, 0
            while i < len(ops):
                j = i
                while j < len(ops) and ops[j].kind == "create" and not ops[j].ephemeral:
                    j += 1
                if j - i >= _MANY_CREATES:
                    self._create_many(cur, ops[i:j])
                    i = j
                else:
                    self._apply(cur, ops[i], session)
                    i += 1
            cur.execute("DELETE FROM changes WHERE zxid <= (SELECT max(zxid) FROM changes) - ?",
                        (CHANGES_KEPT,))

    # -- sessions and elections ----------------------------------------------------------------
    def session(self, ttl: float) -> SqliteSession:
        return SqliteSession(self, ttl)

    def election(self, name: str, identity: str, session: SqliteSession) -> SqliteElection:
        return SqliteElection(self, name, identity, session)

    # -- watches ---------------------------------------------------------------------------------
    def leader_of(self, name: str) -> str | None:
        """The identity of election ``name``'s leader, read without campaigning."""
        try:
            value, _ = self.get(f"/_elections/{name}/leader")
        except NotFound:
            return None
        return value.decode()

    def watch(self, key: str, callback: WatchCallback) -> Callable[[], None]:
        entry = (check_key(key), callback)
        with self._lock:
            self._watches.append(entry)

        def cancel() -> None:
            with self._lock:
                if entry in self._watches:
                    self._watches.remove(entry)

        return cancel

    def poll(self) -> int:
        """Fire the watches of every change since the last poll (by any process);
        expired sessions count as changes of their ephemeral keys."""
        now = self.clock()
        with self._rlock:  # (on the reading connection: never behind a write's fsync)
            # (sessions first, then their keys by the session index: SQLite's own plan
            # scanned every key of the store, at every poll)
            expired = self._rdb.execute(
                "SELECT n.path FROM sessions s CROSS JOIN nodes n ON n.session = s.id "
                "WHERE s.expires <= ?", (now,)).fetchall()
            rows = self._rdb.execute("SELECT zxid, path FROM changes WHERE zxid > ? "
                                     "ORDER BY zxid", (self._seen,)).fetchall()
            if rows:
                self._seen = int(rows[-1][0])
            watches = list(self._watches)
        paths = [r[1] for r in rows] + [r[0] for r in expired]
        fired = 0
        for path in dict.fromkeys(paths):
            for key, callback in watches:
                if path == key or path.startswith(key.rstrip("/") + "/"):
                    callback(path)
                    fired += 1
        return fired

    def start_polling(self, interval: float = 0.2) -> None:
        def loop() -> None:
            while not self._stop.wait(interval):
                self.poll()

        self._poller = threading.Thread(target=loop, name="plait-store-poll", daemon=True)
        self._poller.start()

    def close(self) -> None:
        self._stop.set()
        if self._poller is not None:
            self._poller.join(timeout=5)
        if self._rdb is not self._db:
            self._rdb.close()
        self._db.close()
