"""The distributed store: ZooKeeper 3.8 through kazoo, for a control plane that spans
hosts. kazoo does the hard parts (session keep-alive, reconnection, watch re-arming,
the Election recipe, transactions); this module only maps plait's
Store protocol onto it.

Sessions are kazoo clients: an ephemeral key belongs to the client that created
it and vanishes when that client's ZooKeeper session ends.

With credentials (``zk://hosts?auth_file=PATH``, the file holding ``user:password``),
every client authenticates with them (ZooKeeper's digest scheme) and every znode
plait creates carries an ACL that grants them, and nobody else, every right: a
client without them can neither read the tokens' hashes nor write anything. Watches cover a key and
its direct children (kazoo's DataWatch and ChildrenWatch re-arm themselves);
events arrive on kazoo's thread.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import (
    BadVersionError,
    ConnectionLoss,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    OperationTimeoutError,
    SessionExpiredError,
)
from kazoo.protocol.states import KazooState
from kazoo.recipe.election import Election
from kazoo.recipe.watchers import ChildrenWatch, DataWatch
from kazoo.security import make_digest_acl

from plait.errors import Conflict, NotFound, TransientError, ValidationError
from plait.store.protocol import Transaction, WatchCallback, check_key, check_value

#: (user, password) of ZooKeeper's digest scheme
Credentials = tuple[str, str]


def read_credentials(path: str) -> Credentials:
    """``user:password`` from a file (its first line)."""
    from plait.errors import ValidationError

    try:
        with open(path, encoding="utf-8") as f:
            line = f.readline().strip()
    except OSError as exc:
        raise ValidationError("store", f"cannot read the ZooKeeper credentials in {path}: "
                                       f"{exc.strerror}") from None
    user, sep, password = line.partition(":")
    if not sep or not user or not password:
        raise ValidationError("store", f"{path} must hold user:password (ZooKeeper digest)")
    return user, password


def _client(hosts: str, timeout: float, auth: Credentials | None = None) -> KazooClient:
    if auth is None:
        client = KazooClient(hosts=hosts, timeout=timeout)
    else:
        user, password = auth
        client = KazooClient(hosts=hosts, timeout=timeout,
                             auth_data=[("digest", f"{user}:{password}")],
                             default_acl=[make_digest_acl(user, password, all=True)])
    try:
        client.start(timeout=max(timeout, 5.0))
    except Exception as exc:  # kazoo raises its own timeout type
        raise TransientError(f"ZooKeeper at {hosts} is unreachable: {exc}", 1.0) from exc
    return client


class ZkSession:
    def __init__(self, hosts: str, ttl: float, auth: Credentials | None = None) -> None:
        self.client = _client(hosts, ttl, auth)
        self.id = f"{self.client.client_id[0]:x}"

    def alive(self) -> bool:
        return bool(self.client.state == KazooState.CONNECTED)

    def heartbeat(self) -> None:
        """Nothing to do: kazoo pings ZooKeeper to keep the session alive."""

    def close(self) -> None:
        self.client.stop()
        self.client.close()


class ZkElection:
    """kazoo's Election recipe. A contender thread runs ``Election.run`` (it blocks,
    queued behind the current leader's lock node, and is woken by ZooKeeper when that
    node goes); once elected it holds the leadership until ``resign`` or until its
    session is lost, then queues again (on a new session once kazoo has one).

    ``campaign`` says whether this contender leads *now*: elected, and its connection
    up. While the connection is suspended the session may already have expired on the
    ensemble, which elects another leader, so a suspended leader does not act as one.
    """

    def __init__(self, name: str, identity: str, session: ZkSession) -> None:
        self.client = session.client
        self.path = f"/_elections/{name}"
        self.identity = identity
        self._election = Election(self.client, self.path, identity)
        self._leading = threading.Event()
        self._release = threading.Event()
        self._closed = False
        self._thread: threading.Thread | None = None
        self.client.add_listener(self._state)

    def _state(self, state: str) -> None:
        if state == KazooState.LOST:  # the session and its lock node are gone
            self._release.set()

    def _hold(self) -> None:
        self._leading.set()
        try:
            self._release.wait()
        finally:
            self._leading.clear()

    def _contend(self) -> None:
        while not self._closed:
            self._release.clear()
            try:
                self._election.run(self._hold)
            except Exception:  # the connection went while queued: queue again
                if not self._closed:
                    time.sleep(0.05)

    def campaign(self, wait: float = 1.0) -> bool:
        """Join the election (the first call) and say whether this contender leads.
        The first call waits up to ``wait`` seconds for the outcome."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._contend, daemon=True,
                                            name=f"plait-election-{self.identity}")
            self._thread.start()
            self._leading.wait(wait)
        return self._leading.is_set() and self.client.state == KazooState.CONNECTED

    def fence(self) -> tuple[str, int] | None:
        """A write made only while this contender leads checks this key and version:
        its lock node, which goes with its session (so a deposed leader still
        running cannot write over its successor's state)."""
        lock = self._election.lock
        if not self._leading.is_set() or lock.node is None:
            return None
        return f"{lock.path}/{lock.node}", 0

    def leader(self) -> str | None:
        contenders = self._election.contenders()
        return str(contenders[0]) if contenders else None

    def resign(self) -> None:
        self._closed = True
        self._election.cancel()
        self._release.set()
        if self._thread is not None:
            self._thread.join(timeout=10)


#: the largest transaction sent (bytes): under the 16 MiB jute.maxbuffer plait's
#: ensembles run with (decision 106), less room for the request's own framing
MAX_TXN_BYTES = 16 * 1024 * 1024 - 64 * 1024
#: what a read may meet while the ensemble is out of reach (kazoo reconnects meanwhile)
_UNREACHABLE = (ConnectionLoss, SessionExpiredError, OperationTimeoutError)


def _reading(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A read that met a lost connection says so as a ``TransientError`` (an API
    answers 503 with Retry-After, not 500). Writes keep kazoo's errors: a lost
    connection leaves a write's outcome unknown, which only its caller can settle."""
    @functools.wraps(fn)
    def read(self: ZkStore, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(self, *args, **kwargs)
        except _UNREACHABLE as exc:
            raise TransientError(f"ZooKeeper at {self.hosts}: {type(exc).__name__}; "
                                 "retry", 1.0) from exc
    return read


class ZkStore:
    def __init__(self, hosts: str, timeout: float = 10.0,
                 auth: Credentials | None = None) -> None:
        self.hosts, self.timeout, self.auth = hosts, timeout, auth
        self.client = _client(hosts, timeout, auth)

    def warnings(self) -> list[str]:
        """What its operator should know of how this store is secured."""
        if self.auth is not None:
            return []
        return [f"the ZooKeeper store zk://{self.hosts} has no credentials (no "
                "?auth_file=PATH): its znodes carry no ACL, so anyone who reaches ZooKeeper "
                "can read the tokens' hashes and rewrite jobs, entitlements and tokens"]

    @_reading
    def get(self, key: str) -> tuple[bytes, int]:
        try:
            data, stat = self.client.get(check_key(key))
        except NoNodeError:
            raise NotFound("key", key) from None
        return bytes(data), int(stat.version)

    @_reading
    def get_many(self, keys: list[str]) -> dict[str, tuple[bytes, int]]:
        """Several keys in one go: the reads are pipelined (sent together, answered
        together), so N keys cost about one round trip, not N. Missing keys are left
        out."""
        pending = [(k, self.client.get_async(check_key(k))) for k in keys]
        found: dict[str, tuple[bytes, int]] = {}
        for key, result in pending:
            try:
                data, stat = result.get(timeout=self.timeout)
            except NoNodeError:
                continue
            found[key] = (bytes(data), int(stat.version))
        return found

    @_reading
    def exists(self, key: str) -> bool:
        return self.client.exists(check_key(key)) is not None

    @_reading
    def is_ephemeral(self, key: str) -> bool:
        stat = self.client.exists(check_key(key))
        return stat is not None and bool(stat.ephemeralOwner)

    def create(self, key: str, value: bytes, session: ZkSession | None = None) -> int:
        client = session.client if session is not None else self.client
        try:
            client.create(check_key(key), check_value(key, value), ephemeral=session is not None,
                          makepath=True)
        except NodeExistsError:
            raise Conflict(f"key {key}", "absent", "exists") from None
        return 0

    def set(self, key: str, value: bytes, version: int) -> int:
        try:
            stat = self.client.set(check_key(key), check_value(key, value), version=version)
        except NoNodeError:
            raise NotFound("key", key) from None
        except BadVersionError:
            raise Conflict(f"key {key} version", version, self._version(key)) from None
        return int(stat.version)

    def delete(self, key: str, version: int) -> None:
        try:
            self.client.delete(check_key(key), version=version)
        except NoNodeError:
            raise NotFound("key", key) from None
        except BadVersionError:
            raise Conflict(f"key {key} version", version, self._version(key)) from None
        except NotEmptyError:
            raise Conflict(f"key {key}", "no children", "has children") from None

    def _version(self, key: str) -> int | None:
        stat = self.client.exists(key)
        return None if stat is None else int(stat.version)

    @_reading
    def children(self, prefix: str) -> list[str]:
        try:
            return sorted(self.client.get_children(check_key(prefix)))
        except NoNodeError:
            return []

    def commit(self, txn: Transaction, session: ZkSession | None = None) -> None:
        """One ZooKeeper multi-op: all of it or nothing. One larger than
        ``MAX_TXN_BYTES`` is refused before it is sent (the ensemble would drop the
        connection every other request shares)."""
        client = session.client if session is not None else self.client
        size = 0
        for op in txn.ops:
            check_value(op.key, op.value)
            size += len(op.key) + len(op.value or b"") + 32
        if size > MAX_TXN_BYTES:
            raise ValidationError("transaction", f"{size:,} bytes, over the {MAX_TXN_BYTES:,} "
                                  "a ZooKeeper request may carry here (the ensemble's "
                                  "jute.maxbuffer must be at least 16 MiB: decision 106)")
        created = {op.key for op in txn.ops if op.kind == "create"}
        parents: dict[str, None] = {}
        for op in txn.ops:  # ZooKeeper wants parents in place; make the missing ones
            if op.kind == "create":
                parent = op.key.rsplit("/", 1)[0]
                while parent and parent in created:
                    parent = parent.rsplit("/", 1)[0]
                if parent:
                    parents[parent] = None
        for parent in parents:  # (once each: a batch of creates shares one parent)
            client.ensure_path(parent)
        t = client.transaction()
        for op in txn.ops:
            if op.kind == "create":
                t.create(op.key, op.value, ephemeral=op.ephemeral)
            elif op.kind == "set":
                t.set_data(op.key, op.value, version=op.version)
            elif op.kind == "delete":
                t.delete(op.key, version=op.version)
            else:
                t.check(op.key, op.version)
        results = t.commit()
        failures = [r for r in results if isinstance(r, Exception)]
        if failures:
            first = next((r for r in failures if type(r).__name__ != "RolledBackError"),
                         failures[0])
            raise Conflict("transaction", "every step to apply", type(first).__name__)

    def sync(self) -> None:
        """Let this client's server catch up with the ensemble's leader (a read after
        another client's write then sees it)."""
        self.client.sync("/")

    def leader_of(self, name: str) -> str | None:
        """The identity of election ``name``'s leader, read without campaigning."""
        contenders = Election(self.client, f"/_elections/{name}").contenders()
        return str(contenders[0]) if contenders else None

    def watch(self, key: str, callback: WatchCallback) -> Callable[[], None]:
        """Fire ``callback(path)`` after every change of ``key`` or a direct child."""
        key = check_key(key)
        self.client.ensure_path(key)
        active = threading.Event()
        active.set()
        watched: set[str] = set()

        def data_watch(path: str) -> None:
            def on_data(data: Any, stat: Any, event: Any = None) -> bool:
                if not active.is_set():
                    return False
                if event is not None:
                    callback(path)
                return stat is not None or path == key

            DataWatch(self.client, path, on_data)

        def on_children(children: list[str], event: Any = None) -> bool:
            if not active.is_set():
                return False
            current = {f"{key}/{c}" for c in children}
            for path in sorted(current - watched):
                watched.add(path)
                data_watch(path)
                if event is not None:
                    callback(path)
            for path in sorted(watched - current):
                watched.discard(path)
                callback(path)
            return True

        data_watch(key)
        ChildrenWatch(self.client, key, on_children, send_event=True)
        return active.clear

    def poll(self) -> int:
        """Nothing to do: ZooKeeper pushes watch events (kept for the protocol)."""
        return 0

    def session(self, ttl: float) -> ZkSession:
        return ZkSession(self.hosts, ttl, self.auth)

    def election(self, name: str, identity: str, session: ZkSession) -> ZkElection:
        return ZkElection(name, identity, session)

    def close(self) -> None:
        self.client.stop()
        self.client.close()
