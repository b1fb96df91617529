"""The agent's client of the control plane: any of its front ends will do, and no
request outlives its deadline (a server that drips its answer a byte at a time would
otherwise hold the agent's loop forever)."""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx

from plait.tls import verify as tls_verify

#: how often the requests' deadlines are checked (seconds)
WATCH_SECONDS = 0.5


class JoinRefused(RuntimeError):
    """The control plane refused this agent's join: ``status`` (its HTTP status) and
    ``reason`` (its answer's message)."""

    def __init__(self, machine: str, status: int, reason: str,
                 heard_ago: float | None = None) -> None:
        #: (a 409 for a live agent of the machine) how long ago the control plane
        #: heard that agent
        self.status, self.reason, self.heard_ago = status, reason, heard_ago
        super().__init__(f"joining as machine {machine} was refused ({status}): {reason}")



class ControlPlaneClient:
    """Requests to the control plane's front ends (``urls``): the one that answered
    last first. Requests have deadlines, watched by one thread for the client's life."""

    def __init__(self, machine: str, urls: list[str], timeout: float = 5.0,
                 ca_file: str | None = None) -> None:
        self.machine = machine
        self.urls = [u.rstrip("/") for u in urls]
        self._url = 0  # the front end that answered last
        # (loading the system's CA bundle costs a tenth of a second of cpu: only for
        # https, and only when no CA file of the control plane is given)
        self._verify = tls_verify(
            ca_file, "https:" if any(u.startswith("https:") for u in self.urls) else "http:")
        self.http = httpx.Client(timeout=timeout, verify=self._verify)
        #: requests under way: their deadlines, clients, and whether they expired
        #: (``_request``; the watchdog thread closes what runs past its deadline)
        self._deadlines: dict[threading.Event, tuple[float, httpx.Client]] = {}
        self._deadline_lock = threading.Lock()
        self._watchdog: threading.Thread | None = None
        self._closing = threading.Event()

    def close(self) -> None:
        self._closing.set()

    def call(self, method: str, path: str, token: str | None, body: Any = None,
              params: dict[str, Any] | None = None, wait: float = 0.0) -> Any:
        """Any front end will do: the one that answered last first, then the others. One
        that cannot be reached, or answers that it cannot serve now (502-504: a replica
        without a leader, say), is passed over."""
        last: Exception | str | None = None
        n = len(self.urls)
        for k in range(n):
            i = (self._url + k) % n
            url = self.urls[i]
            try:
                r = self._request(method, url + path, body, params, token, wait)
            except httpx.TransportError as exc:
                last = exc
                continue
            if r.status_code in (502, 503, 504) and k < n - 1:
                last = f"{url} answered {r.status_code}"
                continue
            r.raise_for_status()
            self._url = i
            return r.json()
        raise ConnectionError(f"no control plane reachable at {', '.join(self.urls)}: {last}")

    def _request(self, method: str, url: str, body: Any, params: dict[str, Any] | None,
                 token: str | None, wait: float) -> httpx.Response:
        """One request, answered whole within its deadline (the client's timeout and
        the long-poll's wait, doubled) or failed: httpx bounds each read, and a server
        that sends a byte now and then would hold the agent's loop forever. At the
        deadline the client is closed (which ends the request) and made anew."""
        expired = threading.Event()
        with self._deadline_lock:
            client = self.http
            read = client.timeout.read
            deadline = time.monotonic() + 2 * ((read or 30.0) + wait)
            if self._watchdog is None:
                self._watchdog = threading.Thread(target=self._watch, daemon=True,
                                                  name=f"plait-deadlines-{self.machine}")
                self._watchdog.start()
            self._deadlines[expired] = (deadline, client)
        try:
            return client.request(method, url, json=body, params=params,
                                  headers={"Authorization": f"Bearer {token}"},
                                  timeout=read + wait if read is not None else None)
        except Exception as exc:
            if expired.is_set():
                raise httpx.ReadTimeout(f"{url}: no whole answer within the deadline"
                                        ) from exc
            raise
        finally:
            with self._deadline_lock:
                self._deadlines.pop(expired, None)

    def _watch(self) -> None:
        """Close the client of any request past its deadline, and put a new one in its
        place (checked twice a second: one thread for the agent's life, not one per
        request)."""
        while not self._closing.wait(WATCH_SECONDS):
            now = time.monotonic()
            with self._deadline_lock:
                for expired, (deadline, client) in list(self._deadlines.items()):
                    if deadline <= now and not expired.is_set():
                        expired.set()
                        client.close()
                        if self.http is client:
                            self.http = httpx.Client(timeout=client.timeout,
                                                     verify=self._verify)

