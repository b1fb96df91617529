"""Running the control plane with its API: ``plait serve``, and an in-process server
for tests and benchmarks."""

from __future__ import annotations

import os
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

import uvicorn

from plait import tracing
from plait.api.app import create_app
from plait.clientconfig import ClientConfig
from plait.localprocs import free_port_block
from plait.server.controlplane import ControlPlane, ControlPlaneConfig
from plait.server.leader import SESSION_TIMEOUT, Leadership
from plait.server.limits import uvicorn_options
from plait.store.backup import open_store
from plait.store.protocol import Store


def store_for(data_dir: str | Path, url: str | None = None) -> Store:
    """The store at ``url`` (sqlite:///path, zk://hosts), or SQLite in ``data_dir``."""
    if url:
        store: Store = open_store(url)
        return tracing.store(store)
    path = Path(data_dir)
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, 0o700)
    local: Store = open_store(f"sqlite://{(path / 'plait.db').resolve()}")
    return tracing.store(local)


@dataclass
class Started:
    url: str
    control_plane: ControlPlane
    #: the admin token, when this start created it (first start)
    admin_token: str | None
    config_path: Path | None
    #: the client context written (another name when the asked one was another region's)
    context: str | None = None


class AsgiServer:
    """An ASGI app served by uvicorn in a thread of this process."""

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0,
                 log_level: str = "warning") -> None:
        self.host = host
        self.port = port or free_port_block(1, host)
        self.url = f"http://{host}:{self.port}"
        self._serve(app, log_level)

    def _serve(self, app: Any, log_level: str) -> None:
        config = uvicorn.Config(app, host=self.host, port=self.port, log_level=log_level,
                                access_log=False, **uvicorn_options())
        self.server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    def start(self, timeout: float = 30.0) -> Self:
        self._thread = threading.Thread(target=self.server.run, name="plait-api", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the API did not start on {self.url}")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=30)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class ApiServer(AsgiServer):
    """The API and the control-plane loop in this process, uvicorn in a thread."""

    def __init__(self, cp: ControlPlane, host: str = "127.0.0.1", port: int = 0,
                 log_level: str = "warning", replica: bool = False,
                 session_timeout: float = SESSION_TIMEOUT) -> None:
        """``replica``: one of the control plane's replicas, leading or following (an
        election in the store), rather than its only process."""
        self.cp = cp
        self.host = host
        self.port = port or free_port_block(1, host)
        self.url = f"http://{host}:{self.port}"
        cp.controllers.serving_at(self.url)
        self.leadership = Leadership(cp, self.url, session_timeout=session_timeout) \
            if replica else None
        self._serve(create_app(cp, leadership=self.leadership), log_level)

    def stop(self) -> None:
        self.cp.gateway.waiters.close()  # (agents' long-polls answered: none held up)
        super().stop()
        self.cp.jcp.gates.close()


def prepare(data_dir: str | Path, store_url: str | None = None,
            config: ControlPlaneConfig | None = None, host: str = "127.0.0.1", port: int = 7070,
            write_config: bool = True, context: str = "local",
            config_path: Path | None = None, scheme: str = "http") -> Started:
    """Open the store and the control plane; at first start create the admin token and
    write it, with the URL, to the client configuration (mode 0600)."""
    cp = ControlPlane(store_for(data_dir, store_url), config)
    url = f"{scheme}://{host}:{port}"
    token = cp.bootstrap_admin()
    written = None
    if token is not None:
        # kept beside the store too, so a lost client configuration can be recovered
        admin_file = Path(data_dir) / "admin-token"
        admin_file.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=admin_file.parent, prefix=".admin-token.")  # 0600
        with os.fdopen(fd, "w") as f:
            f.write(token + "\n")
        os.replace(tmp, admin_file)
    if write_config:
        client = ClientConfig.load(config_path)
        context = client.own_context(context, url)
        old = client.contexts.get(context)
        if token is None and old is not None:
            token = old.token  # the same region again: keep its token
        if token is None:
            admin_file = Path(data_dir) / "admin-token"
            token = admin_file.read_text().strip() if admin_file.exists() else None
        client.set_context(context, url, token, ca_file=config.ca_file if config else None)
        written = client.save(config_path)
    return Started(url, cp, token, written, context if write_config else None)
