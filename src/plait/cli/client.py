"""The CLI's API access: ``plait.client.Client`` (failover between a context's URLs,
retries of 503s with backoff) with every failure turned into one line and an exit
code.

Exit codes: 0 done; 1 the API refused or the operation failed (conflict, not found,
halted rollout, timeout); 2 bad input (a malformed file or request, HTTP 422);
3 the API cannot be reached; 4 not authenticated or not allowed (401/403).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from plait.client.client import ApiError, Client, Unreachable
from plait.clientconfig import ClientConfig

EXIT_FAILED, EXIT_INVALID, EXIT_UNREACHABLE, EXIT_DENIED = 1, 2, 3, 4


class CliError(Exception):
    """``status``: the HTTP status of the API's refusal it stands for, if one."""

    def __init__(self, message: str, code: int = EXIT_FAILED,
                 status: int | None = None) -> None:
        self.message = message
        self.code = code
        self.status = status
        super().__init__(message)


def q(segment: object) -> str:
    """A name as one segment of an API path: ``nosuch/../victim`` stays a name (which
    the API refuses), never a path to another object."""
    return quote(str(segment), safe="")


@dataclass
class Target:
    context: str | None = None
    url: str | None = None
    token: str | None = None


class Api:
    def __init__(self, target: Target, timeout: float = 30.0) -> None:
        try:
            ctx = ClientConfig.load().resolve(target.context, target.url, target.token)
            # one or two calls per command: the standard library's HTTP client
            # starts sooner than httpx
            self.client = Client(ctx.urls, ctx.token, ctx.ca_file, timeout=timeout,
                                 transport="stdlib", quiet=True)
        except Exception as exc:
            raise CliError(str(exc), EXIT_INVALID) from None

    def call(self, method: str, path: str, json: Any = None,
             params: dict[str, Any] | None = None) -> Any:
        try:
            return self.client.request(method, path, json=json, params=params)
        except Unreachable as exc:
            raise CliError(f"cannot reach the API: {exc}", EXIT_UNREACHABLE) from None
        except ApiError as exc:
            code = {401: EXIT_DENIED, 403: EXIT_DENIED, 422: EXIT_INVALID,
                    413: EXIT_INVALID}.get(exc.status, EXIT_FAILED)
            if exc.status == 400 and exc.kind == "invalid":  # (a bad page or filter)
                code = EXIT_INVALID
            raise CliError(str(exc), code, exc.status) from None
        except OSError as exc:  # (a CA file that cannot be read, ...)
            raise CliError(str(exc), EXIT_INVALID) from None

    def get(self, path: str, **params: Any) -> Any:
        return self.call("GET", path, params=params)

    def post(self, path: str, body: Any = None, **params: Any) -> Any:
        return self.call("POST", path, json=body, params=params)

    def pages(self, path: str, field: str, limit: int, token: str | None = None,
              one: bool = False, **params: Any) -> Iterator[tuple[list[Any], str | None]]:
        """Each page of a list (``limit`` items, from ``token``) and the token of the
        next, following them to the end (or only the first page, with ``one``)."""
        while True:
            body = self.get(path, limit=limit, **params,
                            **({"continue": token} if token else {}))
            token = body.get("continue")
            yield body[field], token
            if one or not token:
                return

    def put(self, path: str, body: Any, **params: Any) -> Any:
        return self.call("PUT", path, json=body, params=params)

    def delete(self, path: str) -> Any:
        return self.call("DELETE", path)
