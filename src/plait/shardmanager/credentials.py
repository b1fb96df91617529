"""Who may do what at Shard Manager (pure: the time is passed in).

Every credential is derived from the service's token (``plait shardmanager serve
--token-file``) or from the job's TaskControl key, so Shard Manager keeps no list of
them::

    task secret(A)  = "smt_" + hex HMAC(token, "plait shardmanager app\\0" + A)
    read token(A)   = "smr_" + hex HMAC(token, "plait shardmanager read\\0" + A)
    credential(job, index, endpoint)
                    = plait.taskcontrol.signing.task_credential(controller key, job, index,
                                                                host:port of endpoint)
    task key(A, job, index, incarnation)
                    = hex HMAC(secret, "plait shardmanager task\\0" + A \\0 job
                                      \\0 index \\0 incarnation)
      where secret  = credential(job, index, endpoint) when A has a controller key,
                      else task secret(A)

* The **service's token** defines applications and reads their state.
* A task's **credential** is its own: plait's agent sets it in the task's environment
  (``PLAIT_TASK_CREDENTIAL``), and Shard Manager derives the credential of any task of
  the job from the job's controller key (``AppSpec.controller_key``, which makes it
  the job's TaskController). A task's credential is bound to the endpoint plait's
  discovery has for it (``PLAIT_TASK_ENDPOINT``, host:port), so Shard Manager derives
  it for the endpoint a registration names. An application with a controller key
  takes registrations signed with these only: a task cannot sign for another index,
  nor for another job's task, nor for an endpoint other than its own
  (``registration_secret``).
* The **task secret** of an application serves an application defined without a
  controller key (tasks that plait does not run, or an application that is not its
  job's TaskController): given to its tasks only (``PLAIT_SM_TOKEN`` or
  ``PLAIT_SM_TOKEN_FILE``; ``plait shardmanager token APP``), shared by all of them.
* Either secret is never sent: a task derives its **task key** from it (one per
  process: the incarnation is a random id the process picks) and signs each
  registration with it, over a timestamp and the exact body (``Plait-Signature:
  t=<seconds>,v1=<hex HMAC(key, t + "." + body)>``). Shard Manager derives the same
  key from the job, index and incarnation the body names, so a signature binds the
  whole registration (endpoint, start time, shards) to one process of one task index,
  for ``TOLERANCE`` seconds.
* Shard Manager's calls to a task (``/sm/add``, ``/sm/drop``, ``/sm/shards``) are
  signed with that task's key, over the method, the path and the body (which carries
  a fresh nonce the task remembers for the window: a captured call cannot be played
  again): an endpoint that is not the task learns nothing it could use elsewhere.
* The **read token** (``plait shardmanager token APP --reader``) reads the
  application's map, nothing else: clients get it, never the task secret.

What this does not do: tasks of an application without a controller key share its
task secret, so such a task can still sign for a sibling index (the service bounds
what a registration may say: an index under the job's task count, an endpoint the
address policy allows, a start time not in the future). A task's credential is as
safe as its environment: under the process runtime, another process of the same
user on its machine can read it (``/proc/PID/environ``); the sandbox runtime gives
each task its own pid namespace.
"""

from __future__ import annotations

import hashlib
import hmac
from urllib.parse import urlsplit

from plait.errors import ValidationError
from plait.taskcontrol.signing import task_credential

SIGNATURE_HEADER = "Plait-Signature"
#: how far a signature's timestamp may be from the verifier's clock (both ways)
TOLERANCE = 60.0


def _mac(key: bytes, message: bytes) -> str:
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def task_secret(token: str, app: str) -> str:
    """The secret of an application's tasks (what ``PLAIT_SM_TOKEN`` holds)."""
    return "smt_" + _mac(token.encode(), b"plait shardmanager app\0" + app.encode())


def read_token(token: str, app: str) -> str:
    """The bearer token of an application's clients: its map, read-only."""
    return "smr_" + _mac(token.encode(), b"plait shardmanager read\0" + app.encode())


def host_port(url: str) -> str:
    """The ``host:port`` of an endpoint URL, as discovery has a task's (an IPv6 host
    without brackets); a ``ValidationError`` (field ``endpoint``) when it has none."""
    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port
    except ValueError as exc:
        raise ValidationError("endpoint", f"{url!r}: {exc}") from None
    if not host or port is None:
        raise ValidationError("endpoint", f"{url!r} names no host:port (a task's is its "
                                          "PLAIT_TASK_ENDPOINT)")
    return f"{host}:{port}"


def registration_secret(token: str, app: str, controller_key: str | None, job: str,
                        index: int, endpoint: str) -> str:
    """What task ``index`` of ``job`` registering ``endpoint`` (a URL) derives its task
    keys from at application ``app``: its own credential for that endpoint's
    host:port when the application has a controller key (the job's), else the
    application's task secret."""
    if controller_key is not None:
        return task_credential(controller_key, job, index, host_port(endpoint))
    return task_secret(token, app)


def task_key(secret: str, app: str, job: str, index: int, incarnation: str) -> bytes:
    """The key of one process of one task: signs its registrations, and Shard
    Manager's calls to it."""
    context = "\0".join((app, job, str(index), incarnation)).encode()
    return bytes.fromhex(_mac(secret.encode(), b"plait shardmanager task\0" + context))


def sign(key: bytes, message: bytes, now: float) -> str:
    """The ``Plait-Signature`` value for ``message`` sent at ``now``."""
    t = str(int(now))
    return f"t={t},v1={_mac(key, t.encode() + b'.' + message)}"


def call_message(method: str, path: str, body: bytes) -> bytes:
    """What a signature on a call to a task covers: the method, the path, the body."""
    return f"{method.upper()} {path}\n".encode() + body


def verify(key: bytes, header: str | None, message: bytes, now: float,
           tolerance: float = TOLERANCE) -> int:
    """The signature's timestamp; a ``ValidationError`` (field ``Plait-Signature``)
    unless ``header`` signs ``message`` with ``key`` within ``tolerance`` of ``now``."""
    if not header:
        raise ValidationError(SIGNATURE_HEADER, "the request is not signed")
    try:
        parts = dict(p.strip().split("=", 1) for p in header.split(","))
        t, mac = parts["t"], parts["v1"]
        stamp = int(t)
    except (ValueError, KeyError):
        raise ValidationError(SIGNATURE_HEADER, "malformed: expected t=<seconds>,v1=<hex>") \
            from None
    if not hmac.compare_digest(_mac(key, t.encode() + b"." + message), mac):
        raise ValidationError(SIGNATURE_HEADER, "the signature does not match")
    if abs(now - stamp) > tolerance:
        raise ValidationError(SIGNATURE_HEADER, f"the signature is {abs(now - stamp):.0f}s "
                                                f"from this clock (at most {tolerance:g}s)")
    return stamp
