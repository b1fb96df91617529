"""Tasks registering with Shard Manager: a registration signed with the key of the
process it names, checked against the application, and what it changes (a new
process starts empty; one the service restored says which shards it serves)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import pydantic
from fastapi import HTTPException
from fastapi.exceptions import RequestValidationError

from plait import logconfig
from plait.errors import ValidationError
from plait.shardmanager import credentials
from plait.shardmanager.apps import (
    START_SKEW,
    SUPERSEDED_KEPT,
    App,
    Registration,
    Superseded,
    TaskInfo,
    going_down,
)
from plait.shardmanager.credentials import registration_secret, task_key
from plait.shardmanager.statefile import StateFile
from plait.shardmanager.taskcalls import TaskCaller

log = logconfig.get("plait.shardmanager")


class Registrar:
    def __init__(self, token: str, clock: Callable[[], float], apps: dict[str, App],
                 hold: Callable[[str], contextlib.AbstractContextManager[App]],
                 changed: Callable[[App], None], caller: TaskCaller,
                 files: StateFile) -> None:
        self.token = token
        self.clock = clock
        self.apps = apps
        self.hold = hold
        #: an application's map changed (``ShardManager._changed``)
        self.changed = changed
        self.caller = caller
        self.files = files

    def register_signed(self, name: str, body: bytes, signature: str | None) -> dict[str, Any]:
        """A registration as sent: its body signed with the key of the process it names
        (``credentials``); what ``register`` answers."""
        try:
            reg = Registration.model_validate_json(body)
        except pydantic.ValidationError as exc:
            raise RequestValidationError([
                {"loc": ("body", *e.get("loc", ())), "msg": e.get("msg", "invalid"),
                 "type": e.get("type", "")} for e in exc.errors()[:20]]) from None
        # (an application not defined: checked as one without a controller key, so
        # that a caller without its secret cannot tell it from a bad signature)
        app = self.apps.get(name)
        controller_key = app.spec.controller_key if app is not None else None
        key = task_key(registration_secret(self.token, name, controller_key, reg.job,
                                           reg.index, reg.endpoint), name, reg.job,
                       reg.index, reg.incarnation)
        try:
            stamp = credentials.verify(key, signature, body, self.clock())
        except ValidationError as exc:
            how = (f"application {name} has its job's controller key: a task signs with "
                   "its own PLAIT_TASK_CREDENTIAL (set by plait's agent), good for its "
                   "own job and index, and its own endpoint (its PLAIT_TASK_ENDPOINT) "
                   f"only; this registration names endpoint "
                   f"{credentials.host_port(reg.endpoint)}"
                   if controller_key is not None else
                   "a registration is signed with the task's key, from the "
                   "application's task secret (plait shardmanager token APP)")
            raise HTTPException(401, f"{exc}: {how}") from None
        return self.register(name, reg, stamp, verified=True,
                             controller_key=controller_key)

    def register(self, name: str, reg: Registration, signed: int = 0, verified: bool = False,
                 controller_key: str | None = None) -> dict[str, Any]:
        """(``signed``: the signature's timestamp; a registration signed before the
        last one of the same process is a replay. ``verified``: its signature was
        checked with ``controller_key``, which the application must still have.)"""
        now = self.clock()
        if reg.started is not None and reg.started > now + START_SKEW:
            raise ValidationError("started", f"{reg.started:.0f} is "
                                  f"{reg.started - now:.0f}s past this service's clock (at "
                                  f"most {START_SKEW:g}s ahead: a process starts before it "
                                  "registers)")
        self.caller.check_endpoint(reg.endpoint)
        with self.hold(name) as app:
            if verified and app.spec.controller_key != controller_key:
                raise HTTPException(409, f"application {name} was defined again meanwhile "
                                         "with another controller key: register again")
            if reg.job != app.spec.job:
                raise ValidationError("job", f"application {name} is served by job "
                                             f"{app.spec.job}, not {reg.job}")
            if reg.index >= app.spec.task_limit():
                raise ValidationError("index", f"task {reg.index}: job {app.spec.job} has "
                                      f"{app.spec.task_limit()} tasks (AppSpec.tasks; "
                                      "define the application again after a resize)")
            have = app.tasks.get(reg.index)
            if reg.incarnation in app.superseded.get(reg.index, ()):
                raise Superseded(name, reg.index, reg.incarnation, have)
            fresh = have is None or have.incarnation != reg.incarnation
            if not fresh and have is not None and signed < have.signed:
                raise HTTPException(401, f"{credentials.SIGNATURE_HEADER}: signed before "
                                         "this process's last registration (a replay)")
            started = (reg.started if reg.started is not None
                       else have.started if have is not None and not fresh else now)
            if have is not None and fresh:
                # two processes of one task index: plait replaced the one that started
                # first (its machine failed or was cut off, so it runs on, an orphan);
                # the other is plait's. Neither registers again as the other beats
                older, newer = ((reg.incarnation, have) if started < have.started
                                else (have.incarnation, None))
                kept = app.superseded.setdefault(reg.index, [])
                kept.append(older)
                del kept[:-SUPERSEDED_KEPT]
                self.files.dirty = True
                log.warning("task superseded", app=name, task=reg.index, incarnation=older)
                if newer is not None:
                    raise Superseded(name, reg.index, reg.incarnation, newer)
            info = TaskInfo(reg.endpoint, reg.incarnation, reg.domains, now, started,
                            signed)
            if have is not None and not fresh:
                info.failures, info.next_try = have.failures, have.next_try
                info.logged_at, info.quiet = have.logged_at, have.quiet
                if have.endpoint != reg.endpoint:
                    info.failures = info.next_try = 0  # (somewhere new: tried at once)
            app.tasks[reg.index] = info
            if fresh:
                # a new process starts empty; a process Shard Manager had no record of
                # (a service that kept no data dir) serves what it says
                app.restored.pop(reg.index, None)
                says = set(reg.shards) if have is None else set()
                for shard, tasks in app.ready.items():
                    if reg.index in tasks and shard not in says:
                        tasks.discard(reg.index)
                for shard in says:
                    if shard in app.shard_set:
                        app.ready.setdefault(shard, set()).add(reg.index)
                self.changed(app)
            elif reg.index in app.restored:
                self.confirm(app, reg.index, reg.shards)
            return {"app": name, "index": reg.index, "generation": app.generation}

    def confirm(self, app: App, task: int, says: Sequence[str]) -> None:
        """(Under the app's lock.) A restored task said which shards it serves: those
        the saved map gave it are published again."""
        had = app.restored.pop(task, set())
        info = app.tasks.get(task)
        if info is not None:
            info.confirmed = True
        leaving = going_down(app)
        for shard in had & set(says):
            if task not in leaving:
                app.ready.setdefault(shard, set()).add(task)
        log.info("task confirmed", app=app.name, task=task,
                 replicas=len(had & set(says)), of=len(had))
        self.changed(app)
