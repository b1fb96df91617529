"""plait job: deploy, inspect, update, resize, restart, roll back, move, delete."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from plait.cli.client import EXIT_FAILED, EXIT_INVALID, Api, CliError, q
from plait.cli.common import (
    Output,
    Timeout,
    Wait,
    _when,
    api,
    emit,
    err,
    gathered,
    guarded,
    job_spec_from,
    kv_table,
    load_documents,
    out,
    rows,
    safe,
    say,
    tabulated,
)
from plait.client.client import PAGE
from plait.client.status import JOB_STATES, NEVER_FITS, job_status
from plait.paging import MAX_LIMIT

# -- jobs ----------------------------------------------------------------------------------
job_app = typer.Typer(help="Jobs: deploy, inspect, update, resize, restart, roll back.",
                      no_args_is_help=True)


def _status(j: dict[str, Any]) -> str:
    return job_status(j).replace("-", " ")  # (rolling out)


JOB_COLUMNS = ["name", "entitlement", "version", "tasks", "running", "serving", "updated",
               "status"]


def _job_row(j: dict[str, Any]) -> list[Any]:
    return [j["name"], j["entitlement"], j["version"], j["task_count"],
            j["tasks"].get("running", 0), j["serving"], j["updated"], _status(j)]


def _plan_table(plan: dict[str, Any]) -> None:
    out.print(f"[bold]{plan['action']}[/bold] job {plan['job']}: "
              f"+{plan['tasks_added']} tasks, -{plan['tasks_removed']} tasks, "
              f"{plan['tasks_updated']} updated (" + (
                  f"at most {plan['max_unavailable']} unavailable at once)"
                  if plan["max_unavailable"] is not None else
                  "paced by its TaskController)" if plan.get("task_controller") else
                  "at most 1 unavailable at once: no cap and no TaskController)"))
    if plan["changes"]:
        rows(["field", "current", "new"], [
            [k, json.dumps(v["from"]), json.dumps(v["to"])] for k, v in plan["changes"].items()],
            title="spec changes")
    p = plan["placement"]
    out.print(f"placement now: {p['placeable']} placeable "
              f"({', '.join(f'{k}: {v}' for k, v in sorted(p['by_dc'].items())) or 'none'}), "
              f"{p['machines_to_claim']} machines to claim from the free pool, "
              f"{p['unplaced']} unplaced" + (f" ({p['unplaced_reason']})"
                                             if p["unplaced_reason"] else ""))


def follow(a: Api, name: str, timeout: float, deleting: bool = False) -> dict[str, Any]:
    """A live progress bar until the job settles (or is gone, for a delete)."""
    deadline = time.monotonic() + timeout
    last: dict[str, Any] = {}
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("{task.fields[detail]}"), TimeElapsedColumn(),
                  console=err.console) as progress:
        bar = progress.add_task(f"{name}", total=None, detail="")
        # (a bar shows nothing where the output is not a terminal, a CI job's log say:
        # there each change of the job's progress is a line of its own)
        lines = not err.console.is_terminal
        said = ""

        def show(**fields: Any) -> None:
            nonlocal said
            progress.update(bar, **fields)
            if lines:
                task = progress.tasks[0]
                line = (f"{task.description}: {int(task.completed)}/"
                        f"{int(task.total) if task.total is not None else '?'} "
                        f"{task.fields.get('detail', '')}").rstrip()
                if line != said:
                    said = line
                    err.print(line, markup=False, highlight=False)
        while True:
            try:
                job: dict[str, Any] = a.get(f"/v1/jobs/{q(name)}")
            except CliError as exc:
                if deleting and exc.status == 404:
                    show(total=1, completed=1, detail="deleted")
                    return last
                raise
            last = job
            if deleting:
                left = sum(job["tasks"].values())
                show(total=max(left, 1), completed=0, detail=f"{left} tasks left")
            elif job.get("batch"):  # a batch job: until every task exited 0
                show(total=job["task_count"], completed=job["succeeded"],
                     description=f"{name} v{job['version']}",
                     detail=f"{job['running']} running, {job['failed']} failed")
                if job["phase"] == "failed":
                    raise CliError(f"batch job {name} failed: {job['failed']} tasks exited "
                                   f"non-zero with no retries left (plait job show {name})",
                                   EXIT_FAILED)
                if job["phase"] == "complete" and job["applied_version"] == job["version"]:
                    return job
            else:
                # (until the new version is applied, "updated" counts the old one's tasks:
                # a bar full from the start, and Rich's clock stopped with it)
                done = job["updated"] if job.get("applied_version") == job["version"] else 0
                reason = job.get("unplaced_reason")
                error = job.get("error")
                show(total=job["task_count"], completed=done,
                     description=f"{name} v{job['version']}",
                     detail=f"{job['unavailable']} unavailable, {job['serving']} serving"
                            + (f"; unplaced: {reason}" if reason else "")
                            + (f"; {error}" if error else ""))
                # (until the new version is applied, a halt or a reason to wait in vain
                # is the old version's: the new one is what ends it)
                applied = job.get("applied_version") == job["version"]
                if job["halted"] and applied:
                    raise CliError(f"rollout of {name} halted: {job['halted']} "
                                   f"(plait job resume {name}, or roll back)", EXIT_FAILED)
                if applied and reason and reason.startswith(NEVER_FITS):  # (in vain)
                    raise CliError(f"{name} cannot be placed: {reason}. The job is stored "
                                   "and waits for such machines; change its resources or "
                                   f"requirements (plait job deploy), or plait job delete "
                                   f"{name}", EXIT_FAILED)
                if job["settled"]:
                    return job
            if time.monotonic() > deadline:
                why = "; ".join(str(w) for w in (job.get("unplaced_reason"), job.get("error"))
                                if w)
                raise CliError(f"{name} did not settle within {timeout:g}s" +
                               (f" ({why})" if why else ""), EXIT_FAILED)
            time.sleep(0.3)


@job_app.command("deploy")
@guarded
def job_deploy(file: Path, dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="show what would change, change nothing")] = False,
        wait: Wait = False, timeout: Timeout = 600.0, output: Output = "table") -> None:
    """Create the job in FILE, or roll out FILE as its new version (one PUT: the
    control plane validates the spec and says which field is wrong)."""
    body = _job_document(file)
    name = body.get("name")
    if not isinstance(name, str) or not name:
        raise CliError(f"{file}: name: a job needs a name", EXIT_INVALID)
    a = api()
    try:
        if dry_run:
            emit(a.post("/v1/jobs", body, dry_run="true"), output, _plan_table)
            return
        result = a.put(f"/v1/jobs/{q(name)}", body)
    except CliError as exc:
        if exc.code == EXIT_INVALID:
            raise CliError(f"{file}: {exc.message}", exc.code) from None
        raise
    if output == "table":
        how = ("created" if result.get("created") else
               "unchanged: the job runs this spec already" if result.get("unchanged")
               else "updated")
        say(f"job {name}: version {result['version']} stored ({how})")
    if wait:
        result = follow(a, name, timeout)
    if output == "json":
        emit(result, output, lambda d: None)


def _job_document(path: Path) -> dict[str, Any]:
    """The one job spec in a YAML or JSON file, as JSON (not validated here)."""
    docs = load_documents(path)
    if len(docs) != 1:
        raise CliError(f"{path} holds {len(docs)} jobs; give one per file", EXIT_INVALID)
    try:
        json.dumps(docs[0])
    except (TypeError, ValueError) as exc:
        raise CliError(f"{path}: {exc}", EXIT_INVALID) from None
    return docs[0]


@job_app.command("update")
@guarded
def job_update(file: Path, wait: Wait = False, timeout: Timeout = 600.0,
               output: Output = "table") -> None:
    """Roll out FILE as a new version of an existing job (refused for a job that does
    not exist: plait job deploy creates one)."""
    spec = job_spec_from(file)
    a = api()
    try:
        a.get(f"/v1/jobs/{q(spec.name)}")
    except CliError as exc:
        if exc.status != 404:
            raise
        raise CliError(f"job {spec.name} does not exist (an update changes an existing "
                       f"job; plait job deploy {file} creates it)", EXIT_FAILED, 404) from None
    result = a.put(f"/v1/jobs/{q(spec.name)}", spec.model_dump(mode="json"))
    say(f"job {spec.name}: version {result['version']} stored")
    if wait:
        result = follow(a, spec.name, timeout)
    if output == "json":
        emit(result, output, lambda d: None)


@job_app.command("list")
@guarded
def job_list(entitlement: Annotated[str | None, typer.Option()] = None,
             state: Annotated[str | None, typer.Option(
                 help=f"only jobs in this status ({', '.join(JOB_STATES)}; several: "
                      "comma-separated)")] = None,
             limit: Annotated[int | None, typer.Option(
                 min=1, max=MAX_LIMIT, help="at most this many jobs (one page); the "
                                           "token of the next page is printed")] = None,
             continue_: Annotated[str | None, typer.Option(
                 "--continue", help="the page after a --limit run (its token)")] = None,
             output: Output = "table") -> None:
    """The jobs you may see, by name, filtered on the server; read a page at a time
    and printed as each page comes."""
    if output not in ("table", "json"):
        raise CliError(f"--output must be table or json, not {output!r}", EXIT_INVALID)
    pages = api().pages("/v1/jobs", "jobs", limit or PAGE, continue_, one=limit is not None,
                        entitlement=entitlement, state=state)
    if output == "json":
        found, token = gathered(pages)
        print(json.dumps({"jobs": found, **({"continue": token} if limit else {})},
                         indent=2, sort_keys=True))
        return
    token = tabulated(pages, JOB_COLUMNS, _job_row)
    if limit is not None and token:
        say(f"more: plait job list --limit {limit} --continue {token}")


@job_app.command("show")
@guarded
def job_show(name: str, output: Output = "table") -> None:
    a = api()
    job = a.get(f"/v1/jobs/{q(name)}")
    tasks = a.get(f"/v1/jobs/{q(name)}/tasks")["tasks"]
    events = a.get("/v1/events", job=name, limit=1000)["events"][-10:]
    data = {**job, "task_list": tasks, "recent_events": events}

    def show(d: dict[str, Any]) -> None:
        moving = d.get("moving_from")
        kv_table({"name": d["name"], "entitlement": d["entitlement"] + (
                      f" (moving from {moving}: {d.get('on_entitlement', 0)}/{d['task_count']}"
                      " tasks there)" if moving else ""),
                  "version": f"{d['version']} (applied {d['applied_version']})",
                  "status": _status(d), "tasks": d["task_count"],
                  "states": ", ".join(f"{k} {v}" for k, v in sorted(d["tasks"].items())),
                  "serving": d["serving"], "unavailable": d["unavailable"],
                  **({"succeeded / failed / running":
                      f"{d['succeeded']} / {d['failed']} / {d['running']}"}
                     if d.get("batch") else {}),
                  "command": " ".join([d["spec"]["command"], *d["spec"]["args"]]),
                  "halted": d["halted"] or "-", "unplaced": d["unplaced_reason"] or "-",
                  "error": d.get("error") or "-"},
                 f"job {name}")
        _task_rows(d["task_list"], SHOW_TASKS, f"plait task list {name} --limit 0, or -o json")
        for e in d["recent_events"]:
            out.print(f"  {_when(e['time'])}  {e['kind']:18} {safe(e['message'])}",
                      highlight=False, markup=False)
    emit(data, output, show)


#: tasks ``plait job show`` draws at most (its states line counts them all)
SHOW_TASKS = 100


@job_app.command("history")
@guarded
def job_history(name: str, output: Output = "table") -> None:
    from plait.model.job import spans
    data = api().get(f"/v1/jobs/{q(name)}/history")
    emit(data, output, lambda d: rows(["#", "time", "operation", "what"], [
        [e["seq"], _when(e["time"]), e["op"], e["message"]] for e in d["operations"]],
        title=f"job {name}: {d['versions']} versions, kept {spans(d.get('kept', []))}"))


@job_app.command("controller-key")
@guarded
def job_controller_key(name: str, output: Output = "table") -> None:
    """The key the job's TaskController checks plait's calls with: each call carries
    Plait-Signature: t=<seconds>,v1=<hex HMAC-SHA256(key, "<t>." + body)>."""
    data = api().get(f"/v1/jobs/{q(name)}/controller-key")
    emit(data, output, lambda d: out.print(d["key"], highlight=False))


def _ack(a: Api, name: str, result: dict[str, Any], what: str, wait: bool, timeout: float,
         output: str, deleting: bool = False) -> None:
    if output == "table":
        say(f"job {name}: {what} stored (operation {result['operation']})")
    if wait:
        result = follow(a, name, timeout, deleting)
    if output == "json":
        emit(result, output, lambda d: None)


@job_app.command("resize")
@guarded
def job_resize(name: str, task_count: int, wait: Wait = False, timeout: Timeout = 600.0,
               output: Output = "table") -> None:
    a = api()
    _ack(a, name, a.post(f"/v1/jobs/{q(name)}/resize", {"task_count": task_count}),
         f"resize to {task_count}", wait, timeout, output)


#: a new autoscale policy's settings where the command names none
AUTOSCALE_DEFAULTS = {"metric": "cpu", "target_utilization": 0.6, "min_tasks": 1,
                      "max_tasks": 100_000, "scale_down_fraction": 0.1,
                      "history_weight": 0.5}
AUTOSCALE_INTERVAL = 300.0


@job_app.command("autoscale")
@guarded
def job_autoscale(
    name: str,
    target: Annotated[float | None, typer.Option(
        min=0.01, max=1.0, help="the utilization it sizes for [new policy: 0.6]")] = None,
    metric: Annotated[str | None, typer.Option(
        help="cpu: the CPU its agents report; external: the load pushed with plait job "
             "load [new policy: cpu]")] = None,
    min_tasks: Annotated[int | None, typer.Option(
        "--min", min=0, help="[new policy: 1]")] = None,
    max_tasks: Annotated[int | None, typer.Option(
        "--max", min=0, help="[new policy: 100000]")] = None,
    scale_down: Annotated[float | None, typer.Option(
        min=0.001, max=1.0, help="the most of its tasks it sheds per decision [new "
                                 "policy: 0.1]")] = None,
    history_weight: Annotated[float | None, typer.Option(
        min=0.0, max=1.0, help="weight of yesterday's and last week's load [new policy: "
                               "0.5]")] = None,
    interval: Annotated[float | None, typer.Option(
        min=1, help="seconds between decisions [new policy: 300]")] = None,
    show: Annotated[bool, typer.Option("--show", help="print the policy only (as with no "
                                                      "setting given)")] = False,
    off: Annotated[bool, typer.Option("--off", help="stop autoscaling the job")] = False,
    output: Output = "table",
) -> None:
    """Autoscale a job: its size follows its load (the CPU its tasks use, or the load
    pushed with ``plait job load``), for the target utilization, within [--min,
    --max]. The settings given change the job's policy; the others keep their values
    (a new policy's defaults, for a job without one). With no setting: the policy."""
    a = api()
    path = f"/v1/jobs/{q(name)}/autoscale"
    if off:
        a.delete(path)
        say(f"job {name}: autoscaling off (its size stays, and its sizing intent is gone: "
            "plait job resize sizes it)")
        return
    given = {k: v for k, v in {
        "metric": metric, "target_utilization": target, "min_tasks": min_tasks,
        "max_tasks": max_tasks, "scale_down_fraction": scale_down,
        "history_weight": history_weight}.items() if v is not None}
    if not show and (given or interval is not None):
        try:
            current = a.get(path)
        except CliError as exc:
            if "not found" not in exc.message:
                raise
            current = None
        policy = {**AUTOSCALE_DEFAULTS, **({k: current["policy"][k] for k in
                                            AUTOSCALE_DEFAULTS} if current else {}), **given}
        every = interval if interval is not None else (
            float(current["interval_seconds"]) if current else AUTOSCALE_INTERVAL)
        a.put(path, {"interval_seconds": every, "policy": policy})
    emit(a.get(path), output, lambda d: kv_table(d, f"autoscaling of {name}"))


@job_app.command("intents")
@guarded
def job_intents(name: str, output: Output = "table") -> None:
    """Every intent of the job (its spec, push, sizing, canaries) and the unified spec
    they make: which task runs which version."""
    emit(api().get(f"/v1/jobs/{q(name)}/intents"), output, intents_table)


@job_app.command("sizing")
@guarded
def job_sizing(
    name: str,
    task_count: Annotated[int | None, typer.Argument(min=0, help="the size to keep "
                                                     "(none: show the intent)")] = None,
    min_tasks: Annotated[int, typer.Option("--min", min=0)] = 0,
    max_tasks: Annotated[int, typer.Option("--max", min=0)] = 100_000,
    off: Annotated[bool, typer.Option("--off", help="remove the sizing intent")] = False,
    output: Output = "table",
) -> None:
    """The job's sizing intent: a task count within [--min, --max] that sizes it while
    set (the autoscaler writes one too)."""
    sizing(api(), name, task_count, min_tasks, max_tasks, off, output)


@job_app.command("load")
@guarded
def job_load(name: str, value: Annotated[float, typer.Argument(
        min=0, help="the load now, in tasks' worth of work (tasks x utilization)")],
        output: Output = "table") -> None:
    """Push a measurement of the job's load to its autoscaler."""
    data = api().post(f"/v1/jobs/{q(name)}/load", {"value": value})
    emit(data, output, lambda d: say(f"job {name}: load {d['value']:g} at {_when(d['time'])}"))


@job_app.command("restart")
@guarded
def job_restart(name: str, index: Annotated[int | None, typer.Option(
        help="restart one task only")] = None, wait: Wait = False, timeout: Timeout = 600.0,
        output: Output = "table") -> None:
    """Restart every task (or one), paced like an update and through TaskControl."""
    a = api()
    _ack(a, name, a.post(f"/v1/jobs/{q(name)}/restart", {"index": index}),
         "restart", wait, timeout, output)


@job_app.command("rollback")
@guarded
def job_rollback(name: str, version: int, wait: Wait = False, timeout: Timeout = 600.0,
                 output: Output = "table") -> None:
    """Roll out an earlier version again (as a new version)."""
    a = api()
    _ack(a, name, a.post(f"/v1/jobs/{q(name)}/rollback", {"version": version}),
         f"rollback to version {version}", wait, timeout, output)


@job_app.command("move")
@guarded
def job_move(name: str, to_entitlement: Annotated[str, typer.Option(
        "--to-entitlement", help="the entitlement to move the job to")],
        wait: Wait = False, timeout: Timeout = 600.0, output: Output = "table") -> None:
    """Move a job to another entitlement: every task is stopped and started again on
    that entitlement's machines, paced like an update (the bar counts tasks moved)."""
    a = api()
    _ack(a, name, a.post(f"/v1/jobs/{q(name)}/move", {"entitlement": to_entitlement}),
         f"move to entitlement {to_entitlement}", wait, timeout, output)


@job_app.command("resume")
@guarded
def job_resume(name: str, output: Output = "table") -> None:
    """Resume a halted rollout."""
    a = api()
    _ack(a, name, a.post(f"/v1/jobs/{q(name)}/resume"), "resume", False, 0, output)


@job_app.command("delete")
@guarded
def job_delete(name: str, wait: Wait = False, timeout: Timeout = 600.0,
               output: Output = "table") -> None:
    a = api()
    _ack(a, name, a.delete(f"/v1/jobs/{q(name)}"), "delete", wait, timeout, output, deleting=True)

def _task_rows(tasks: list[dict[str, Any]], limit: int = 0, more: str = "") -> None:
    """The tasks as a table: the first ``limit`` of them (0: all), then how many more
    there are and ``more``, how to see them (a table of 100,000 rows took minutes to
    draw)."""
    shown = tasks[:limit] if limit else tasks
    rows(["index", "state", "version", "machine", "serving", "healthy", "operation", "exit"], [
        [t["index"], t["state"] if not t.get("parked") else
         f"{t['state']} (maintenance {t['parked']}: starts when it ends)",
         t["version"], t["machine"] or "-",
         "yes" if t["serving"] else "no", "yes" if t["healthy"] else "no",
         t["operation"] or "-", "-" if t.get("exit_code") is None else t["exit_code"]]
        for t in shown])
    if len(shown) < len(tasks):
        out.print(f"... and {len(tasks) - len(shown):,} more tasks ({more})", highlight=False)


# -- intents and sizing (the Job Control Plane's intents of one job) -------------------
def intents_table(d: dict[str, Any]) -> None:
    push = d.get("push")
    kv_table({
        "job": d["job"],
        "job intent": f"version {d['job_intent']['version']}, "
                      f"{d['job_intent']['task_count']} tasks",
        "push": "-" if push is None else (
            f"version {push['status']['version']}: {push['percent']}% "
            f"({push['status']['phase']})"),
        "sizing": "-" if d.get("sizing") is None else (
            f"{d['sizing']['size']} tasks (by {d['sizing'].get('actor') or '-'})"),
        "canaries": ", ".join(f"{n}: {c['intent']['tasks']} tasks"
                              for n, c in d["canaries"].items()) or "-",
        "unified": ", ".join(f"{n} {r}" for r, n in sorted(d["unified"]["roles"].items())),
        "conflicts": "; ".join(d["conflicts"]) or "-",
    }, f"intents of {d['job']}")
    rows(["index", "role", "version", "running"],
         [[t["index"], t["role"], t["version"], t["running"] if t["running"] is not None
           else "-"] for t in d["unified"]["tasks"]])


def sizing(a: Api, job: str, task_count: int | None, lo: int, hi: int, off: bool,
           output: str) -> None:
    path = f"/v1/jobs/{q(job)}/sizing"
    if off:
        a.delete(path)
        say(f"job {job}: no sizing intent (its spec sizes it)")
        return
    data = a.get(path) if task_count is None else a.put(
        path, {"task_count": task_count, "min": lo, "max": hi})
    emit(data, output, lambda d: kv_table({
        "job": d["job"], "size": str(d["size"]), "asked": str(d["intent"]["task_count"]),
        "within": f"{d['intent']['min']}..{d['intent']['max']}",
        "by": d.get("actor") or "-"}, f"sizing of {job}"))
