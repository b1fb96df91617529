"""plait push, plait canary: the Job Control Plane's intents (plait job intents and
sizing are in plait.cli.jobs).

``plait push JOB --spec FILE --stages 10,50,100`` pushes a spec in stages with a
health gate between them; ``plait push status JOB`` and ``plait push abort JOB`` read
and stop it. With ``--wait`` a live display follows each stage; with
``--gate-command CMD`` the gate is a command run here after each stage (exit 0
passes), its verdict posted to the control plane.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from plait.cli.client import EXIT_FAILED, EXIT_INVALID, Api, CliError, q
from plait.cli.common import Output, Timeout, api, emit, err, guarded, kv_table, say
from plait.cli.jobs import _job_document

#: how long a gate command may run, and how much of its output is kept
GATE_COMMAND_TIMEOUT = 600.0
GATE_OUTPUT = 2000


def _stages(text: str) -> list[int]:
    """The percentages of ``--stages``: ASCII digits only (``int`` would take ``+50``,
    ``5_0`` or other scripts' digits, which the API's strict integers do not)."""
    parts = [s.strip() for s in text.split(",") if s.strip()]
    if not all(p.isascii() and p.isdigit() for p in parts):
        raise CliError(f"--stages: percentages separated by commas, e.g. 10,50,100; not "
                       f"{text!r}", EXIT_INVALID)
    stages = [int(p) for p in parts]
    if not stages:
        raise CliError("--stages: at least one percentage", EXIT_INVALID)
    return stages


def _push_table(d: dict[str, Any]) -> None:
    from rich.text import Text

    s, i = d["status"], d["intent"]
    stages = " -> ".join(f"[bold]{p}%[/bold]" if n == s["stage"] else f"{p}%"
                         for n, p in enumerate(i["stages"]))
    gate = i.get("gate") or {}
    kv_table({"job": d["job"], "stages": Text.from_markup(stages), "phase": s["phase"],
              "holds": f"{d['percent']}% of the job", "version": str(s["version"]),
              "tasks": f"{s['ready']} of {s['want']} ready", "message": s["message"],
              "gate": gate.get("url") or ("external" if gate.get("external") else "none"),
              "by": d.get("actor") or "-"}, f"push of {d['job']}")


def push(
    job: Annotated[str, typer.Argument(help="the job (or: status JOB, abort JOB)")],
    second: Annotated[str | None, typer.Argument(metavar="[JOB]", show_default=False,
                                                 help="the job, after status or abort")
                      ] = None,
    spec: Annotated[Path | None, typer.Option(help="the spec file to push")] = None,
    stages: Annotated[str, typer.Option(help="percentages of the job, e.g. 10,50,100")
                      ] = "100",
    soak: Annotated[float, typer.Option(min=0, help="seconds a stage stays healthy "
                                                    "before its gate")] = 60.0,
    stage_timeout: Annotated[float, typer.Option(
        min=1, help="a stage not healthy by then rolls the push back")] = 1800.0,
    gate: Annotated[str | None, typer.Option(
        help="a URL the control plane asks after each stage (2xx passes)")] = None,
    gate_command: Annotated[str | None, typer.Option(
        help="a command run here after each stage (exit 0 passes); needs --wait")] = None,
    wait: Annotated[bool, typer.Option("--wait", help="follow the push stage by stage")
                    ] = False,
    timeout: Timeout = 3600.0,
    output: Output = "table",
) -> None:
    """Push a spec to a job in stages with a health gate between them; a failing gate
    rolls it back. ``plait push status JOB`` shows where it stands, ``plait push abort
    JOB`` stops it."""
    guarded(_push)(job, second, spec, stages, soak, stage_timeout, gate, gate_command,
                   wait, timeout, output)


def _push(job: str, second: str | None, spec: Path | None, stages: str, soak: float,
          stage_timeout: float, gate: str | None, gate_command: str | None, wait: bool,
          timeout: float, output: str) -> None:
    a = api()
    if job in ("status", "abort") and second is not None:
        path = f"/v1/jobs/{q(second)}/push"
        data = a.post(f"{path}/abort") if job == "abort" else a.get(path)
        emit(data, output, _push_table)
        return
    if second is not None:
        raise CliError(f"one job at a time (got {job!r} and {second!r}); plait push "
                       "status|abort JOB", EXIT_INVALID)
    if spec is None:
        raise CliError("--spec: the spec file to push", EXIT_INVALID)
    if gate is not None and gate_command is not None:
        raise CliError("--gate or --gate-command, not both", EXIT_INVALID)
    if gate_command is not None and not wait:
        raise CliError("--gate-command runs here after each stage: it needs --wait",
                       EXIT_INVALID)
    body: dict[str, Any] = {"spec": _job_document(spec), "stages": _stages(stages),
                            "soak_seconds": soak, "stage_timeout_seconds": stage_timeout}
    if gate is not None:
        body["gate"] = {"url": gate}
    elif gate_command is not None:
        body["gate"] = {"external": True}
    try:
        data = a.put(f"/v1/jobs/{q(job)}/push", body)
    except CliError as exc:
        if exc.code == EXIT_INVALID and exc.message.startswith("spec"):  # (the file's)
            raise CliError(f"{spec}: {exc.message}", exc.code) from None
        raise  # (--stages, --soak, --gate: the flags' own)
    if not wait:
        emit(data, output, _push_table)
        return
    final = follow_push(a, job, timeout, gate_command)
    emit(final, output, _push_table)
    if final["status"]["phase"] in ("rolled_back", "aborted"):
        raise CliError(f"push of {job} {final['status']['phase'].replace('_', ' ')}: "
                       f"{final['status']['message']}", EXIT_FAILED)


def follow_push(a: Api, job: str, timeout: float, gate_command: str | None) -> dict[str, Any]:
    """A live bar per stage until the push completes, holds or rolls back; runs the
    gate command when a stage waits for it."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    path = f"/v1/jobs/{q(job)}/push"
    deadline = time.monotonic() + timeout
    bars: dict[int, Any] = {}
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("{task.fields[detail]}"), console=err.console) as progress:
        while True:
            d: dict[str, Any] = a.get(path)
            s, stages = d["status"], d["intent"]["stages"]
            stage = s["stage"]
            for n in range(stage + 1):
                if n not in bars:
                    bars[n] = progress.add_task(f"stage {n + 1} ({stages[n]}%)", total=None,
                                                detail="")
            for n in range(stage):
                progress.update(bars[n], total=1, completed=1, detail="passed")
            progress.update(bars[stage], total=max(s["want"], 1),
                            completed=min(s["ready"], max(s["want"], 1)),
                            detail=f"{s['phase']}: {s['message']}")
            if s["phase"] in ("completed", "holding", "rolled_back", "aborted"):
                return d
            if s["phase"] == "gating" and gate_command is not None:
                passed, message = _run_gate(gate_command, job, stage)
                progress.update(bars[stage], detail=f"gate: {message}")
                try:
                    a.post(f"{path}/gate", {"passed": passed, "message": message})
                except CliError as exc:  # (another verdict came first)
                    progress.update(bars[stage], detail=f"gate: {exc.message}")
            if time.monotonic() > deadline:
                raise CliError(f"push of {job} still at stage {stage + 1} ({s['phase']}) "
                               f"after {timeout:g}s (plait push status {job})", EXIT_FAILED)
            time.sleep(0.5)


def _run_gate(command: str, job: str, stage: int) -> tuple[bool, str]:
    """Run the gate command (a shell command line: it is the user's own, run as the
    user, with PLAIT_JOB and PLAIT_STAGE set); exit 0 passes."""
    import os

    env = {**os.environ, "PLAIT_JOB": job, "PLAIT_STAGE": str(stage + 1)}
    try:
        done = subprocess.run(command, shell=True, capture_output=True, text=True,
                              timeout=GATE_COMMAND_TIMEOUT, env=env, check=False)
    except subprocess.TimeoutExpired:
        return False, f"{command!r} ran past {GATE_COMMAND_TIMEOUT:g}s"
    said = (done.stdout + done.stderr).strip()[-GATE_OUTPUT:]
    if done.returncode == 0:
        return True, f"{command!r} exited 0" + (f": {said}" if said else "")
    return False, f"{command!r} exited {done.returncode}" + (f": {said}" if said else "")


push_app = typer.Typer()
push_app.command()(push)


# -- canaries ------------------------------------------------------------------------------
canary_app = typer.Typer(help="Canaries: a spec on some of a job's tasks for a while.",
                         no_args_is_help=True)


def _canary_table(d: dict[str, Any]) -> None:
    i = d["intent"]
    kv_table({"job": d["job"], "canary": d["name"], "tasks": str(i["tasks"]),
              "hardware": i.get("hardware") or "any",
              "host profile": i.get("host_profile") or "the entitlement's",
              **({"entitlement": d["entitlement"]} if d.get("entitlement") else {}),
              "version": ("made at the next pass" if d.get("version") is None
                          else str(d["version"])),
              "until": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(d["until"]))),
              "by": d.get("actor") or "-"},
             f"canary {d['name']} of {d['job']}")


@canary_app.command("start")
@guarded
def canary_start(
    job: str, name: str,
    spec: Annotated[Path, typer.Option(help="the spec file the canary runs")],
    tasks: Annotated[int, typer.Option(min=1, help="how many tasks run it")] = 1,
    hardware: Annotated[str | None, typer.Option(
        help="run it on tasks placed on this machine type (moved there if needed)")] = None,
    host_profile: Annotated[str | None, typer.Option(
        "--host-profile", help="run it on machines of its own switched to this host "
                               "profile (a code + config + host-profile canary)")] = None,
    duration: Annotated[float, typer.Option(min=1, help="seconds it runs")] = 3600.0,
    output: Output = "table",
) -> None:
    """Run a spec on some of a job's tasks (never the push's) for a while."""
    body = {"spec": _job_document(spec), "tasks": tasks, "hardware": hardware,
            "host_profile": host_profile, "duration_seconds": duration}
    emit(api().put(f"/v1/jobs/{q(job)}/canaries/{q(name)}", body), output, _canary_table)


@canary_app.command("end")
@guarded
def canary_end(job: str, name: str, output: Output = "table") -> None:
    """End a canary now: its tasks go back to the job's spec."""
    data = api().delete(f"/v1/jobs/{q(job)}/canaries/{q(name)}")
    emit(data, output, lambda d: say(f"canary {name} of {job} ended"))


@canary_app.command("show")
@guarded
def canary_show(job: str, name: str, output: Output = "table") -> None:
    emit(api().get(f"/v1/jobs/{q(job)}/canaries/{q(name)}"), output, _canary_table)
