"""Shard Manager's calls to an application's tasks (add, drop, probe): signed with
the task's key, to an address the policy allows, bounded in size and time."""

from __future__ import annotations

import contextlib
import json
import secrets
import socket
import time
from collections.abc import Callable
from typing import Any

import httpx

from plait.errors import ValidationError
from plait.shardmanager import credentials
from plait.shardmanager.apps import CALL_BYTES, CALL_TIMEOUT, MAX_REGISTRATION, App
from plait.shardmanager.credentials import registration_secret, task_key
from plait.taskcontrol.urlpolicy import UrlPolicy


class TaskCaller:
    def __init__(self, token: str, policy: UrlPolicy, clock: Callable[[], float]) -> None:
        self.token = token
        #: where task endpoints may be
        self.policy = policy
        self.clock = clock
        self.http = httpx.Client(timeout=CALL_TIMEOUT, trust_env=False)

    def call(self, app: App | None, shard: str, task: int, op: str,
             peers: list[str]) -> tuple[bool, str, Any]:
        """Whether the task's process answered the call, which process it was, and
        what it said or why it did not answer (its answer read up to ``CALL_BYTES``,
        the whole call within ``CALL_TIMEOUT``; signed with the process's key, to an
        address the policy allows)."""
        with app.lock if app is not None else contextlib.nullcontext():
            info = app.tasks.get(task) if app is not None else None
            job = app.spec.job if app is not None else ""
            controller_key = app.spec.controller_key if app is not None else None
        if info is None or app is None:
            return False, "", "no such task"
        if op == "probe":
            method, path, body = "GET", "/sm/shards", b""
        else:
            data: dict[str, Any] = {"shard": shard, "nonce": secrets.token_hex(16)}
            if op == "add":
                data["peers"] = peers
            method, path, body = "POST", f"/sm/{op}", json.dumps(data).encode()
        deadline = time.monotonic() + CALL_TIMEOUT
        limit = MAX_REGISTRATION if op == "probe" else CALL_BYTES  # (a list of shards)
        try:
            key = task_key(registration_secret(self.token, app.name, controller_key, job, task,
                                               info.endpoint), app.name, job, task,
                           info.incarnation)
            self.check_resolved(info.endpoint)  # (each call: a name may resolve anew)
            signature = credentials.sign(key, credentials.call_message(method, path, body),
                                         self.clock())
            with self.http.stream(method, f"{info.endpoint}{path}", content=body, headers={
                    credentials.SIGNATURE_HEADER: signature,
                    "Content-Type": "application/json"}) as r:
                answer = b""
                for chunk in r.iter_bytes():
                    answer += chunk
                    if len(answer) > limit or time.monotonic() > deadline:
                        raise ValueError(f"answer over {limit} B or {CALL_TIMEOUT} s")
                status = r.status_code
        except (httpx.HTTPError, httpx.InvalidURL, ValueError, OSError, ValidationError) as exc:
            return False, info.incarnation, f"{type(exc).__name__}: {exc}"
        if not 200 <= status < 300:
            return False, info.incarnation, (
                f"HTTP {status}: {answer[:200].decode('utf-8', 'replace')}")
        try:  # (the process that answered: the client library says which it is)
            said = json.loads(answer)
            incarnation = said.get("incarnation") if isinstance(said, dict) else None
        except ValueError:
            said, incarnation = None, None
        return True, str(incarnation or info.incarnation), said

    def check_resolved(self, url: str) -> None:
        """(Off the locks: it may resolve a name.) A ``ValidationError`` unless every
        address the endpoint's host has now is one the policy allows."""
        host, port = self.policy.host(url)
        literal = self.policy.literal(host)
        if literal is not None:
            addresses = [str(literal)]
        else:
            try:
                infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            except OSError as exc:
                raise ValidationError("endpoint", f"{host} does not resolve: {exc}") from None
            addresses = sorted({str(i[4][0]) for i in infos})
        self.policy.check(url, addresses)

    def check_endpoint(self, url: str) -> None:
        """Refuse an endpoint the address policy refuses (a literal address, or a
        metadata name; a name is checked on what it resolves to at each call)."""
        try:
            host, _ = self.policy.host(url)
            literal = self.policy.literal(host)
            if literal is not None:
                self.policy.check(url, [str(literal)])
        except ValidationError as exc:
            raise ValidationError("endpoint", exc.message.replace(
                "controller URL", "task endpoint").replace(
                "plait serve --controller-networks",
                "plait shardmanager serve --task-networks")) from None
        except ValueError as exc:  # (urlsplit's: a bracket not closed, say)
            raise ValidationError("endpoint", f"{url!r} is not a URL: {exc}") from None
