"""The first part of ``plait demo``: a whole region on this box, as a user runs it.

``plait up`` starts in a process of its own (a control plane and one agent process per
machine), and the demo drives it with the CLI's own verbs, as one would from another
terminal: entitlements, ``examples/web.yaml`` (six real HTTP servers) with its tasks
and their discovery endpoints, a rolling update, a machine that dies with its tasks,
and ``examples/batch.yaml``. It ends with Ctrl-C of ``plait up``, which stops every
agent and task.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import typer
from rich.console import Console


def _answers(endpoint: str) -> int | str:
    try:
        return httpx.get(f"http://{endpoint}/", timeout=5).status_code
    except httpx.HTTPError as exc:
        return type(exc).__name__


def region_demo(out: Console, run_cli: Callable[[list[str]], int | None],
                examples: Path, machines: int = 6) -> None:
    from plait.harness.region import LocalRegion

    def run(*args: str) -> None:
        out.print(f"[bold cyan]$ plait {' '.join(args)}")
        code = run_cli(list(args))
        if code not in (None, 0):
            raise typer.Exit(code)

    out.rule(f"[bold]plait up: a region of {machines} machines on this box, each an agent "
             "process")
    started = time.monotonic()
    with LocalRegion(machines, heartbeat_timeout=3.0) as region:
        region.wait_ready(120)
        out.print(f"$ plait up --machines {machines}: API on {region.url}, {machines} agents "
                  f"joined and heartbeating after {time.monotonic() - started:.1f}s")
        saved = {k: os.environ.get(k) for k in ("PLAIT_URL", "PLAIT_TOKEN")}
        os.environ["PLAIT_URL"], os.environ["PLAIT_TOKEN"] = region.url, region.token
        try:
            run("entitlement", "create", str(examples / "entitlements.yaml"))
            run("job", "deploy", str(examples / "web.yaml"), "--wait", "--timeout", "120")
            run("job", "show", "web")
            run("discover", "web")
            found = region.get("/v1/discovery/web")["endpoints"]
            out.print("each endpoint answers HTTP: " + ", ".join(
                f"{e['endpoint']} {_answers(e['endpoint'])}" for e in found))

            out.rule("[bold]a rolling update, one task at a time (max_unavailable 1)")
            v2 = region.dir / "web-v2.yaml"
            v2.write_text((examples / "web.yaml").read_text().replace(
                'PYTHONUNBUFFERED: "1"', 'PYTHONUNBUFFERED: "1", RELEASE: "2"'))
            run("job", "deploy", str(v2), "--dry-run")
            run("job", "deploy", str(v2), "--wait", "--timeout", "120")

            out.rule("[bold]a machine dies: its agent and its tasks are killed at once")
            victim = found[0]["machine"]
            lost = sorted(e["index"] for e in found if e["machine"] == victim)
            region.kill_machine(victim)
            killed = time.monotonic()
            out.print(f"killed machine {victim} (tasks {lost}); waiting for the heartbeat "
                      "timeout (3 s) and the tasks to answer elsewhere ...")

            def recovered() -> bool:
                now = {e["index"]: e for e in region.get("/v1/discovery/web")["endpoints"]}
                return all(i in now and now[i]["machine"] != victim
                           and _answers(now[i]["endpoint"]) == 200 for i in lost)
            region.wait(recovered, 120, "the lost tasks answer elsewhere")
            out.print(f"tasks {lost} answer on other machines {time.monotonic() - killed:.1f}s "
                      "after the kill")
            run("machine", "show", victim)
            run("discover", "web")

            out.rule("[bold]a batch job: tasks that finish (restart policy on-failure)")
            run("job", "deploy", str(examples / "batch.yaml"), "--wait", "--timeout", "120")
            run("job", "show", "batch")
            run("task", "logs", "batch", "0")
            run("events", "--job", "web", "--limit", "12")
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        out.print("Ctrl-C of plait up: its agents stop their tasks ...")
    out.print(f"plait up stopped ({region.stopped_by}, exit {region.exit_code}); "
              f"{region.leftovers_killed} processes were left over")
