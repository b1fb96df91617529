"""The CLI's HTTP client: finds the API from the client configuration and turns every
failure into one line and an exit code.

Exit codes: 0 done; 1 the API refused or the operation failed (conflict, not found,
halted rollout, timeout); 2 bad input (a malformed file or request, HTTP 422);
3 the API cannot be reached; 4 not authenticated or not allowed (401/403).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx

from plait.clientconfig import ClientConfig
from plait.tls import verify as tls_verify

EXIT_FAILED, EXIT_INVALID, EXIT_UNREACHABLE, EXIT_DENIED = 1, 2, 3, 4


class CliError(Exception):
    def __init__(self, message: str, code: int = EXIT_FAILED) -> None:
        self.message = message
        self.code = code
        super().__init__(message)


@dataclass
class Target:
    context: str | None = None
    url: str | None = None
    token: str | None = None


class Api:
    def __init__(self, target: Target, timeout: float = 30.0) -> None:
        try:
            ctx = ClientConfig.load().resolve(target.context, target.url, target.token)
        except Exception as exc:
            raise CliError(str(exc), EXIT_INVALID) from None
        self.url = ctx.url
        headers = {"Authorization": f"Bearer {ctx.token}"} if ctx.token else {}
        try:
            verify = tls_verify(ctx.ca_file, ctx.url)
        except Exception as exc:
            raise CliError(str(exc), EXIT_INVALID) from None
        self.http = httpx.Client(base_url=ctx.url, headers=headers, timeout=timeout,
                                 verify=verify)

    def call(self, method: str, path: str, **kw: Any) -> Any:
        try:
            r = self.http.request(method, path, **kw)
        except httpx.TransportError as exc:
            raise CliError(f"cannot reach the API at {self.url}: {exc}", EXIT_UNREACHABLE) \
                from None
        if r.status_code >= 400:
            try:
                body = r.json()
                message = body.get("message") or body.get("detail") or r.text
            except ValueError:
                message = r.text.strip() or r.reason_phrase
            code = {401: EXIT_DENIED, 403: EXIT_DENIED, 422: EXIT_INVALID,
                    413: EXIT_INVALID}.get(r.status_code, EXIT_FAILED)
            raise CliError(f"{message} (HTTP {r.status_code})", code)
        return r.json()

    def get(self, path: str, **params: Any) -> Any:
        return self.call("GET", path, params={k: v for k, v in params.items() if v is not None})

    def post(self, path: str, body: Any = None, **params: Any) -> Any:
        return self.call("POST", path, json=body,
                         params={k: v for k, v in params.items() if v is not None})

    def put(self, path: str, body: Any, **params: Any) -> Any:
        return self.call("PUT", path, json=body,
                         params={k: v for k, v in params.items() if v is not None})

    def delete(self, path: str) -> Any:
        return self.call("DELETE", path)
