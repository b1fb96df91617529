"""Credentials in URLs, hidden wherever a URL is shown.

A TaskController's or a push gate's URL may carry a credential: a ``user:password@``
before its host, or a query parameter such as ``?token=...`` or ``&X-Amz-Signature=``.
The stored spec keeps the URL as given (the control plane calls it); everything that
shows one (a job's or a push's view, an event, an error) shows it through
``redact_url`` or ``redact_text``: the password (or a user alone, which is often a
token) and the values of secret-looking parameters become ``***``.

Purely computational (no parsing library: text in, text out); never raises.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

#: what a hidden credential is shown as
MASK = "***"

#: a parameter whose name holds one of these (case and ``-``/``_`` aside) is secret
_SECRET_WORDS = ("key", "token", "secret", "passw", "signature", "credential", "session",
                 "cookie")
#: ... or whose name is one of these, or has one as a ``_``-separated word
_SECRET_PARTS = frozenset({"sig", "pwd", "pass", "auth", "authorization", "code", "jwt",
                           "bearer", "otp", "hmac"})

#: a URL in free text (an event's message, an error): up to a space (a quote or a
#: bracket after it is taken off again; a URL holds no space: plait refuses one that
#: does)
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://\S+")
_ESCAPE = re.compile(r"%([0-9A-Fa-f]{2})")


def secret_param(name: str) -> bool:
    """Does a query parameter of this name look like a credential? (``api_key``,
    ``token``, ``access_token``, ``X-Amz-Signature``, ``password``, ``sig``...)"""
    plain = _ESCAPE.sub(lambda m: chr(int(m.group(1), 16)), name).lower().replace("-", "_")
    return (any(w in plain for w in _SECRET_WORDS)
            or any(p in _SECRET_PARTS for p in plain.split("_")))


def _params(text: str) -> str:
    """``a=1&token=x`` as ``a=1&token=***`` (each ``&``- or ``;``-separated pair)."""
    out = []
    for pair in re.split(r"([&;])", text):
        name, eq, value = pair.partition("=")
        out.append(f"{name}={MASK}" if eq and value and secret_param(name) else pair)
    return "".join(out)


def redact_url(url: str) -> str:
    """``url`` with its credentials shown as ``***``: the password of a
    ``user:password@`` (a user alone: all of it), and the values of secret-looking
    query (and fragment) parameters. Everything else is kept as written."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    ends = [i for i in (rest.find(c) for c in "/?#") if i >= 0] if sep else [0]
    end = min(ends, default=len(rest))
    authority, tail = rest[:end], rest[end:]
    userinfo, at, host = authority.rpartition("@")
    if at:
        user, colon, _ = userinfo.partition(":")
        authority = (f"{user}:{MASK}" if colon else MASK) + "@" + host
    before, hashed, fragment = tail.partition("#")
    path, asked, query = before.partition("?")
    tail = path + asked + _params(query) + hashed + (_params(fragment)
                                                    if "=" in fragment else fragment)
    return (scheme + sep if sep else "") + authority + tail


def redact_text(text: str) -> str:
    """Free text (a message) with every URL in it redacted (``redact_url``)."""
    if "://" not in text:
        return text
    def one(m: re.Match[str]) -> str:  # (punctuation after a URL ends the sentence)
        url = m.group(0)
        kept = url.rstrip(".,:;!?)]}>'\"`")
        return redact_url(kept) + url[len(kept):]
    return _URL.sub(one, text)


def shown_spec(spec: Mapping[str, Any]) -> dict[str, Any]:
    """A job spec's JSON form as shown (its ``task_controller`` redacted)."""
    out = dict(spec)
    if isinstance(out.get("task_controller"), str):
        out["task_controller"] = redact_url(out["task_controller"])
    return out


def shown_intent(stored: Mapping[str, Any]) -> dict[str, Any]:
    """A stored push's or canary's JSON form as shown: its spec's ``task_controller``,
    its gate's ``url`` and its status's ``message`` redacted."""
    out = dict(stored)
    intent = out.get("intent")
    if isinstance(intent, Mapping):
        intent = dict(intent)
        if isinstance(intent.get("spec"), Mapping):
            intent["spec"] = shown_spec(intent["spec"])
        gate = intent.get("gate")
        if isinstance(gate, Mapping) and isinstance(gate.get("url"), str):
            intent["gate"] = {**gate, "url": redact_url(gate["url"])}
        out["intent"] = intent
    status = out.get("status")
    if isinstance(status, Mapping) and isinstance(status.get("message"), str):
        out["status"] = {**status, "message": redact_text(status["message"])}
    return out


__all__ = ["MASK", "redact_text", "redact_url", "secret_param", "shown_intent",
           "shown_spec"]
