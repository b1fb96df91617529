"""Signed TaskControl calls: a controller can tell that a request comes from its
region's control plane, for its own job, recently.

Every job has its own key, derived from the region's TaskControl secret (created at
the first start and kept under ``/auth`` in the store; the job's owner reads the
key with ``plait job controller-key JOB`` or ``GET /v1/jobs/{job}/controller-key``)::

    key = hex(HMAC-SHA256(secret, "plait taskcontrol v1\\0" + job))

Each request carries two headers::

    Plait-Job: web
    Plait-Signature: t=1767225600,v1=<hex HMAC-SHA256(bytes.fromhex(key), b"<t>." + body)>

where ``body`` is the exact bytes of the request body. A controller verifies with
``verify(key, headers["Plait-Signature"], body, now=time.time())``; without plait
installed, the same check is a few lines::

    import hashlib, hmac, time
    def verify(key: str, header: str, body: bytes, tolerance: float = 300) -> bool:
        parts = dict(p.split("=", 1) for p in header.split(","))
        t, sig = parts["t"], parts["v1"]
        want = hmac.new(bytes.fromhex(key), t.encode() + b"." + body,
                        hashlib.sha256).hexdigest()
        return hmac.compare_digest(want, sig) and abs(time.time() - int(t)) <= tolerance

The timestamp bounds a replay to the tolerance; the request's ``sequence_number``,
which only grows, lets a controller refuse a replay within it.

The same key gives each task of the job a credential of its own. The control plane
gives the task's agent the task's credential; the agent binds it to the endpoint
plait's discovery has for the task (``host:port``: the machine's advertised address
and the task's ``PLAIT_PORT``, which the agent picks) and sets the result in the
task's environment as ``PLAIT_TASK_CREDENTIAL``, beside ``PLAIT_TASK_ENDPOINT``::

    agent's    = "ptc_" + hex(HMAC-SHA256(bytes.fromhex(key),
                                          "plait task credential v1\\0" + job + "/" + index))
    credential = "ptc_" + hex(HMAC-SHA256(agent's,
                                          "plait task credential v2\\0" + lower(host:port)))

A task holds its own credential only, good for its own endpoint; the job's
controller (which has the key) derives any task's for the endpoint it names, so a
task can prove to it which task it is and that the endpoint is its own
(``task_credential``; Shard Manager's registrations use it).

This module is pure: the time is passed in.
"""

from __future__ import annotations

import hashlib
import hmac

from plait.errors import ValidationError

SIGNATURE_HEADER = "Plait-Signature"
JOB_HEADER = "Plait-Job"
#: how far a signature's timestamp may be from the verifier's clock
DEFAULT_TOLERANCE = 300.0
_KEY_CONTEXT = b"plait taskcontrol v1\0"
_TASK_CONTEXT = b"plait task credential v1\0"
_ENDPOINT_CONTEXT = b"plait task credential v2\0"
#: what every task credential starts with (a secret scanner can tell one)
CREDENTIAL_PREFIX = "ptc_"


class SignatureError(ValidationError):
    """A TaskControl request whose signature is missing, malformed, wrong or stale."""

    def __init__(self, message: str) -> None:
        super().__init__(SIGNATURE_HEADER, message)


def key_name(job: str, uid: str) -> str:
    """What a job's key is derived from: its name and the id of this job (``JobDoc.uid``),
    so a job made later under the same name has a key of its own. A job stored before
    jobs had ids (uid ``""``) keeps the key of its name."""
    return f"{job}#{uid}" if uid else job


def job_key(secret: bytes, job: str) -> str:
    """The job's signing key (hex), derived from the region's secret."""
    return hmac.new(secret, _KEY_CONTEXT + job.encode(), hashlib.sha256).hexdigest()


def task_credential(job_key: str, job: str, index: int, endpoint: str | None = None) -> str:
    """The credential of task ``index`` of ``job`` from the job's key (``job_key``,
    hex): with ``endpoint`` (``host:port``), the one the task holds when discovery has
    it there (its ``PLAIT_TASK_CREDENTIAL``); without, the one its agent is given
    (``endpoint_credential`` makes the task's from it). Another task's credential,
    another job's, or one for another endpoint, cannot be derived from it."""
    message = _TASK_CONTEXT + f"{job}/{int(index)}".encode()
    agents = CREDENTIAL_PREFIX + hmac.digest(bytes.fromhex(job_key), message, "sha256").hex()
    return agents if endpoint is None else endpoint_credential(agents, endpoint)


def endpoint_credential(credential: str, endpoint: str) -> str:
    """The task's own credential (``PLAIT_TASK_CREDENTIAL``): its agent's
    ``credential`` bound to ``endpoint``, the ``host:port`` discovery has for it
    (the host compared without case)."""
    message = _ENDPOINT_CONTEXT + endpoint.lower().encode()
    return CREDENTIAL_PREFIX + hmac.digest(credential.encode(), message, "sha256").hex()


def sign(key: str, body: bytes, now: float) -> str:
    """The ``Plait-Signature`` header value for ``body`` sent at ``now``."""
    t = str(int(now))
    mac = hmac.new(bytes.fromhex(key), t.encode() + b"." + body, hashlib.sha256).hexdigest()
    return f"t={t},v1={mac}"


def verify(key: str, header: str | None, body: bytes, now: float,
           tolerance: float = DEFAULT_TOLERANCE) -> None:
    """Raise ``SignatureError`` unless ``header`` signs ``body`` with ``key`` within
    ``tolerance`` seconds of ``now``."""
    if not header:
        raise SignatureError("the request is not signed")
    try:
        parts = dict(p.strip().split("=", 1) for p in header.split(","))
        t, mac = parts["t"], parts["v1"]
        stamp = int(t)
    except (ValueError, KeyError):
        raise SignatureError("malformed signature header: expected t=<seconds>,v1=<hex>") \
            from None
    want = hmac.new(bytes.fromhex(key), t.encode() + b"." + body, hashlib.sha256).hexdigest()
    if not hmac.compare_digest(want, mac):
        raise SignatureError("the signature does not match the body")
    if abs(now - stamp) > tolerance:
        raise SignatureError(f"the signature is {abs(now - stamp):.0f}s old "
                             f"(at most {tolerance:g}s accepted)")
