"""Shard Manager's data directory: the maps (``shardmanager.json``, at most once a
second), the acked operations (``in-flight.json``, before an ack goes out) and the
reserved generations (``generations.json``, before a generation past them is
published), and reading them back after a restart."""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from plait.shardmanager.apps import App, AppSpec, TaskInfo
from plait.shardmanager.layout import Layout
from plait.taskcontrol.protocol import (
    op_from_wire,
)


class StateFile:
    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._file_lock = threading.Lock()
        self._saved_at = 0.0
        #: the maps changed since the last save
        self.dirty = False

    def save(self, apps: dict[str, App],
             hold: Callable[[str], contextlib.AbstractContextManager[App]],
             force: bool = False) -> None:
        """The maps of every application (``hold``: an application under its lock),
        when they changed, at most once a second unless ``force``."""
        if self.path is None or not (self.dirty or force):
            return
        now = time.monotonic()
        if not force and now - self._saved_at < 1.0:
            return
        self.dirty = False
        saved: dict[str, Any] = {}
        for name in list(apps):
            with hold(name) as app:
                ready = {s: set(ts) for s, ts in app.ready.items()}
                for t, shards in app.restored.items():  # (not confirmed: still theirs)
                    for s in shards:
                        ready.setdefault(s, set()).add(t)
                saved[name] = {
                    "spec": app.spec.model_dump(mode="json"),
                    "generation": app.generation, "sequence": app.sequence,
                    "ready": {s: sorted(ts) for s, ts in ready.items() if ts},
                    "groups": {} if app.layout is None else {
                        str(t): g for t, g in app.layout.groups.items()},
                    "replicas": {} if app.layout is None else {
                        s: list(ts) for s, ts in app.layout.replicas.items()},
                    "load": dict(app.load),
                    "evacuate": {str(t): n for t, n in app.controller.evacuate.items()},
                    "tasks": {str(t): {"endpoint": i.endpoint, "incarnation": i.incarnation,
                                       "domains": list(i.domains), "started": i.started,
                                       "signed": i.signed}
                              for t, i in app.tasks.items()},
                    "superseded": {str(t): list(i) for t, i in app.superseded.items()}}
        self._saved_at = now
        with self._file_lock:
            _write(self.path, {"schema": 1, "apps": saved})

    def save_in_flight(self, apps: dict[str, App]) -> None:
        """(Under an app's lock.) The acked, not completed operations of every
        application, on disk before the answer that acks them goes out (small: one per
        task at most)."""
        if self.path is None:
            return
        with self._file_lock:
            _write(self.path.with_name("in-flight.json"), {"schema": 1, "apps": {
                name: list(app.in_flight_wire) for name, app in list(apps.items())}})

    def save_generations(self, apps: dict[str, App]) -> None:
        """(Under an app's lock.) Every application's reserved generation, on disk
        before a generation past the last reservation is published."""
        if self.path is None:
            return
        with self._file_lock:
            _write(self.path.with_name("generations.json"), {"schema": 1, "apps": {
                name: app.reserved for name, app in list(apps.items())}})

    def read(self, make: Callable[[str, AppSpec], App], now: float) -> list[App]:
        """The applications as last saved (none without a data directory)."""
        if self.path is None or not self.path.exists():
            return []
        data = json.loads(self.path.read_text())
        flying: dict[str, Any] = {}
        with contextlib.suppress(FileNotFoundError):
            flying = json.loads(self.path.with_name("in-flight.json").read_text())["apps"]
        reserved: dict[str, Any] = {}
        with contextlib.suppress(FileNotFoundError):
            reserved = json.loads(self.path.with_name("generations.json").read_text())["apps"]
        return [_restore(make(name, AppSpec.model_validate(saved["spec"])), saved,
                         flying.get(name, ()), int(reserved.get(name, 0)), now)
                for name, saved in data.get("apps", {}).items()]


def _restore(app: App, saved: dict[str, Any], flying: Any, reserved: int, now: float) -> App:
    """An application as saved (``now``: each task has TASK_TIMEOUT from then to
    register again)."""
    # past every generation it may have published (reserved before it was)
    app.generation = max(app.generation, int(saved.get("generation", 0)),
                         reserved)
    app.reserved = app.generation
    app.sequence = int(saved.get("sequence", -1))
    app.load = {s: float(v) for s, v in saved.get("load", {}).items()}
    app.controller.evacuate = {int(t): str(n)
                               for t, n in saved.get("evacuate", {}).items()}
    for wire in flying:
        op = op_from_wire(wire)
        app.controller.in_flight[op.op_id] = op
    app.in_flight_wire = list(flying)
    app.tasks = {int(t): TaskInfo(str(i["endpoint"]), str(i["incarnation"]),
                                  tuple(i["domains"]), now,
                                  float(i.get("started", 0.0)),
                                  int(i.get("signed", 0)), confirmed=False)
                 for t, i in saved.get("tasks", {}).items()}
    # the replicas the saved map gave each task: published once it confirms them
    app.restored = {t: set() for t in app.tasks}
    for s, ts in saved.get("ready", {}).items():
        for t in ts:
            if t in app.restored and s in app.shard_set:
                app.restored[t].add(s)
    app.superseded = {int(t): [str(x) for x in i]
                      for t, i in saved.get("superseded", {}).items()}
    if saved.get("replicas"):
        app.layout = Layout({s: tuple(ts) for s, ts in saved["replicas"].items()},
                            {int(t): int(g) for t, g in saved["groups"].items()})
    return app


def _write(path: Path, data: Any) -> None:
    """``data`` as JSON at ``path``, whole or not at all, readable by the owner only
    (it holds the jobs' controller keys), flushed to disk."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(data))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
