import json
import re

from typer.testing import CliRunner

from plait import __version__
from plait.cli.main import app

runner = CliRunner()


def test_version():
    res = runner.invoke(app, ["version"])
    assert res.exit_code == 0 and res.stdout.strip() == __version__


def test_region_describe_json():
    res = runner.invoke(app, ["region", "describe", "--machines", "1200", "--dcs", "2",
                              "--msbs-per-dc", "3", "--json"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)
    assert summary["machines"] == 1200 and summary["dcs"] == 2 and summary["msbs"] == 6
    assert sum(summary["types"].values()) == 1200
    assert summary["index_bytes_per_machine"] <= 300


def test_demo_runs_a_region_then_walks_figure7_and_benchmarks():
    res = runner.invoke(app, ["demo", "--machines", "2000", "--jobs", "20"])
    assert res.exit_code == 0, res.output
    out = " ".join(res.stdout.split())  # (the console wraps long lines)
    # plait up with real agents: web.yaml's 6 servers answer on their endpoints
    answers = out.split("each endpoint answers HTTP:")[1].split("a rolling update")[0]
    assert len(re.findall(r"\b200\b", answers)) == 6, answers
    assert "answer on other machines" in out  # after a machine died with its tasks
    assert "succeeded / failed / running │ 4 / 0 / 0" in out  # the batch job
    assert "result: 1999999000000" in out  # its output, shipped by the agent
    assert "plait up stopped (sigint, exit 0); 0 processes were left over" in out
    assert "claimed ['m" in res.stdout and "released ['m" in res.stdout
    assert '"job_allocations_per_s"' in res.stdout


def test_bad_flag_is_refused_with_a_message():
    res = runner.invoke(app, ["bench", "allocator", "--repeat-ratio", "2"])
    assert res.exit_code != 0
    assert "repeat-ratio" in res.output


def test_sim_rollout_with_a_controller_and_failures():
    res = runner.invoke(app, ["sim", "rollout", "--tasks", "12", "--machines", "30",
                              "--controller", "one-at-a-time", "--fail", "1", "--json"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    assert summary["finished"] and summary["serving"] == 12
    assert summary["tasks_lost"] >= 1


def test_sim_rollout_of_a_crashing_version_halts():
    res = runner.invoke(app, ["sim", "rollout", "--tasks", "8", "--crash", "--json"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    assert summary["halted"] and not summary["finished"]


def test_sim_rollout_refuses_an_unknown_controller():
    res = runner.invoke(app, ["sim", "rollout", "--controller", "magic"])
    assert res.exit_code == 2
    assert "--controller" in res.output


def test_region_flags_out_of_range_are_one_line_errors():
    res = runner.invoke(app, ["bench", "allocator", "--dcs", "100", "--machines", "1000"])
    assert res.exit_code == 2
    assert "dcs" in res.output and "Traceback" not in res.output


def test_admin_backup_and_restore(tmp_path):
    from plait.store import SqliteStore

    src = tmp_path / "a.db"
    s = SqliteStore(str(src))
    s.create("/scheduler/jobs/web", b"v1")
    s.create("/broker/dc1/m1", b"free")
    s.close()
    backup = tmp_path / "backup.json"
    res = runner.invoke(app, ["admin", "backup", str(backup), "--store", f"sqlite://{src}"])
    assert res.exit_code == 0, res.output
    dst = tmp_path / "b.db"
    res = runner.invoke(app, ["admin", "restore", str(backup), "--store", str(dst)])
    assert res.exit_code == 0, res.output
    restored = SqliteStore(str(dst))
    assert restored.get("/scheduler/jobs/web")[0] == b"v1"
    assert restored.children("/broker/dc1") == ["m1"]
    restored.close()
    again = runner.invoke(app, ["admin", "restore", str(backup), "--store", str(dst)])
    assert again.exit_code == 2 and "empty store" in " ".join(again.output.split())
    (tmp_path / "junk.json").write_text("{not json")
    bad = runner.invoke(app, ["admin", "restore", str(tmp_path / "junk.json"),
                              "--store", str(tmp_path / "c.db")])
    assert bad.exit_code == 2 and "junk.json" in bad.output


def test_admin_backup_finds_the_data_dirs_store_refuses_a_missing_one_and_is_private(
        tmp_path, monkeypatch):
    import stat

    from plait.server.serve import store_for

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PLAIT_STORE", raising=False)
    out = tmp_path / "backup.json"
    # no store in ./.plait: refused, nothing written, no empty store made
    res = runner.invoke(app, ["admin", "backup", str(out)])
    assert res.exit_code == 2 and "no store" in " ".join(res.output.split())
    assert not out.exists() and not (tmp_path / ".plait").exists()
    res = runner.invoke(app, ["admin", "backup", str(out), "--store", str(tmp_path / "x.db")])
    assert res.exit_code == 2 and not (tmp_path / "x.db").exists()
    # the data dir's store (0700 dir, 0600 files) is found without --store
    st = store_for(tmp_path / ".plait")
    st.create("/auth/tokens/t1", b"hash")
    st.close()
    assert stat.S_IMODE((tmp_path / ".plait").stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / ".plait" / "plait.db").stat().st_mode) == 0o600
    res = runner.invoke(app, ["admin", "backup", str(out)])
    assert res.exit_code == 0, res.output
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    assert "/auth/tokens/t1" in out.read_text()
    # a store with nothing in it: no empty backup, and a failure exit
    empty = tmp_path / "empty"
    store_for(empty).close()
    out.unlink()
    res = runner.invoke(app, ["admin", "backup", str(out), "--data-dir", str(empty)])
    assert res.exit_code == 2 and "holds nothing" in res.output and not out.exists()


def test_a_sqlite_store_is_private_whatever_the_umask(tmp_path):
    import os
    import stat

    from plait.store import SqliteStore

    old = os.umask(0o022)
    try:
        s = SqliteStore(str(tmp_path / "s.db"))
        s.create("/k", b"v")
        s.close()
    finally:
        os.umask(old)
    for f in tmp_path.iterdir():
        assert stat.S_IMODE(f.stat().st_mode) == 0o600, f


def test_agent_flags_are_checked_before_it_starts(tmp_path):
    base = ["agent", "--machine-id", "h1", "--control-plane", "http://127.0.0.1:9",
            "--data-dir", str(tmp_path)]
    res = runner.invoke(app, [*base, "--runtime", "docker"])
    assert res.exit_code == 2 and "unknown agent runtime 'docker'" in res.output
    res = runner.invoke(app, [*base, "--fault-domain", "r/dc1/msb1/row1/rack1", "--cpu", "8"])
    assert res.exit_code == 2
    assert "needs --memory-gb, --type too" in " ".join(res.output.split())
    # the join token never on the command line (ps shows it): a file or the environment
    res = runner.invoke(app, [*base, "--join-token", "plait_x_y"])
    assert res.exit_code == 2 and "No such option" in res.output
    res = runner.invoke(app, [*base, "--join-token-file", str(tmp_path / "missing")])
    assert res.exit_code == 2 and "cannot read the join token" in " ".join(res.output.split())


def test_bad_spec_files_are_one_line_errors(tmp_path):
    import os

    def deploy(path) -> str:
        res = runner.invoke(app, ["--url", "http://127.0.0.1:9", "--token", "t",
                                  "job", "deploy", str(path)])
        assert res.exit_code == 2, (path, res.output)
        assert "Traceback" not in res.output
        assert res.exception is None or isinstance(res.exception, SystemExit)
        return " ".join(res.output.split())

    cases = {
        "empty.yaml": b"",
        "binary.yaml": bytes(range(256)) * 4,
        "nul.yaml": b"name: web\x00\n",
        "huge.yaml": b"a: " + b"x" * (2 << 20) + b"\n",
        "deep.yaml": b"[" * 200_000,
        "deep.json": b'{"a":' * 100_000 + b"1" + b"}" * 100_000,
        "hidden.yaml": b"a: it's [" + b"[" * 100_000 + b"\n",
        "twice.yaml": b"name: x\nentitlement: web\nname: web\n",
        "twice.json": b'{"name": "x", "entitlement": "web", "name": "web"}',
        "nested-twice.yaml": b"name: x\nresources: {cpu: 1, cpu: 2}\n",
        "indented.yaml": b"name: web\n  bad: [\n",
    }
    said = {}
    for name, data in cases.items():
        (tmp_path / name).write_bytes(data)
        said[name] = deploy(tmp_path / name)
    assert "is empty" in said["empty.yaml"]
    assert "not UTF-8" in said["binary.yaml"] and "NUL" in said["nul.yaml"]
    assert "larger than" in said["huge.yaml"]
    assert "nested too deeply" in said["deep.yaml"] or "not valid YAML" in said["deep.yaml"]
    assert "nested too deeply" in said["deep.json"]
    # where and what, on one line (the parser's own text had a newline, shown as \n)
    assert "is not valid YAML: line 2, column 6: mapping values are not allowed" in said[
        "indented.yaml"] and "\\n" not in said["indented.yaml"]
    assert "nested too deeply" in said["hidden.yaml"]  # (a quote inside a plain scalar)
    for name in ("twice.yaml", "twice.json", "nested-twice.yaml"):
        assert "given twice" in said[name], said[name]
    if os.path.exists("/dev/zero"):  # read up to a bound, never to the end
        assert "larger than" in deploy("/dev/zero")


def test_a_malformed_url_and_a_missing_join_token_are_one_line_errors(tmp_path, monkeypatch):
    monkeypatch.delenv("PLAIT_JOIN_TOKEN", raising=False)
    for url in ("http://[::1", "http://h:port", "ftp://h", "nonsense"):
        res = runner.invoke(app, ["--url", url, "--token", "t", "job", "list"])
        assert res.exit_code == 2 and "url" in res.output, (url, res.output)
        assert res.exception is None or isinstance(res.exception, SystemExit)
    res = runner.invoke(app, ["agent", "--machine-id", "h1", "--control-plane",
                              "http://127.0.0.1:9", "--data-dir", str(tmp_path / "a")])
    assert res.exit_code == 2 and "join token" in " ".join(res.output.split())
    assert isinstance(res.exception, SystemExit)


def test_url_and_token_work_after_the_verb_too():
    from plait.cli.main import hoist

    assert hoist(["plait", "job", "list", "--url", "http://a", "--token=t", "-o", "json"]) \
        == ["plait", "--url", "http://a", "--token=t", "job", "list", "-o", "json"]
    assert hoist(["plait", "--context", "c", "job", "show", "web", "--url", "http://a"]) \
        == ["plait", "--context", "c", "--url", "http://a", "job", "show", "web"]
    # plait context has options of these names: left alone; so is what follows --
    assert hoist(["plait", "context", "set", "x", "--url", "http://a"]) == [
        "plait", "context", "set", "x", "--url", "http://a"]
    assert hoist(["plait", "job", "deploy", "--", "--url"]) == [
        "plait", "job", "deploy", "--", "--url"]


def test_a_rollouts_bar_counts_only_the_new_versions_tasks_and_says_why_unplaced(
        monkeypatch):
    """``--wait``'s bar: before the new version is applied, the old version's updated
    tasks are not the new one's (the bar was full, and its clock stopped, from the
    start); a job that cannot be placed says why while it waits."""
    import io

    from rich.console import Console

    import plait.cli.jobs as jobs
    from plait.cli.common import err

    base = {"task_count": 6, "version": 2, "unavailable": 0, "serving": 6, "halted": None,
            "batch": False, "unplaced_reason": None, "settled": False}
    answers = iter([
        {**base, "applied_version": 1, "updated": 6},
        {**base, "applied_version": 2, "updated": 2, "unavailable": 2, "serving": 4,
         "unplaced_reason": "no machine satisfies the hard requirements with room"},
        {**base, "applied_version": 2, "updated": 6, "settled": True},
    ])
    seen = []

    class Fake:
        def get(self, path):
            return next(answers)
    import rich.progress

    original = rich.progress.Progress.update

    def spy(self, task_id, **fields):
        if "completed" in fields:
            seen.append((fields["completed"], fields.get("detail")))
        return original(self, task_id, **fields)
    monkeypatch.setattr(rich.progress.Progress, "update", spy)
    screen = io.StringIO()
    monkeypatch.setattr(err, "_console", Console(file=screen, width=200))
    monkeypatch.setattr(jobs.time, "sleep", lambda s: None)
    job = jobs.follow(Fake(), "web", timeout=60)
    assert job["settled"]
    assert [c for c, _ in seen] == [0, 2, 6]
    assert "unplaced: no machine satisfies" in seen[1][1]
    # not a terminal (a CI job's log): a line for each change, where a bar shows nothing
    lines = [line for line in screen.getvalue().splitlines() if line.startswith("web v2: ")]
    assert lines == [
        "web v2: 0/6 0 unavailable, 6 serving",
        "web v2: 2/6 2 unavailable, 4 serving; unplaced: no machine satisfies the hard "
        "requirements with room",
        "web v2: 6/6 0 unavailable, 6 serving"], screen.getvalue()


def test_wait_on_a_new_version_is_not_ended_by_the_old_ones_halt(monkeypatch):
    """A fix rolled forward after a halted rollout: until it is applied, the job still
    says the old version halted; ``--wait`` failed at once with that halt."""
    import io

    import pytest
    from rich.console import Console

    import plait.cli.jobs as jobs
    from plait.cli.client import CliError
    from plait.cli.common import err

    base = {"task_count": 3, "version": 3, "unavailable": 1, "serving": 2, "batch": False,
            "unplaced_reason": None, "settled": False, "updated": 0,
            "halted": "1 task of version 2 failed to become healthy"}
    answers = iter([
        {**base, "applied_version": 2},
        {**base, "applied_version": 3, "halted": None, "updated": 1},
        {**base, "applied_version": 3, "halted": None, "updated": 3, "unavailable": 0,
         "serving": 3, "settled": True},
    ])

    class Fake:
        def get(self, path):
            return next(answers)
    monkeypatch.setattr(err, "_console", Console(file=io.StringIO(), width=200))
    monkeypatch.setattr(jobs.time, "sleep", lambda s: None)
    assert jobs.follow(Fake(), "web", timeout=60)["settled"]
    # the new version's own halt ends the wait, as before
    answers = iter([{**base, "applied_version": 3,
                     "halted": "1 task of version 3 failed to become healthy"}])
    with pytest.raises(CliError, match="rollout of web halted: 1 task of version 3"):
        jobs.follow(Fake(), "web", timeout=60)


def test_a_tables_values_are_never_cut_short(monkeypatch):
    # on an 80-column terminal, or a pipe, `plait token list` showed "295882b68bf8f…":
    # an id no one could copy into `plait token revoke`
    import io

    from rich.console import Console

    from plait.cli.common import out, rows

    screen = io.StringIO()
    monkeypatch.setattr(out, "_console", Console(file=screen, width=60))
    token_id = "295882b68bf8f0f3a8e1c2d4"
    name = "a-rather-long-owner-name-that-does-not-fit"
    rows(["id", "role", "name", "created"], [[token_id, "owner", name, "2026-11-28 04:30"]])
    text = screen.getvalue()
    assert token_id in text and "…" not in text
    assert "".join(line.split("│")[3].strip() for line in text.splitlines()
                   if line.count("│") == 5) == name  # folded over lines, not cut


def test_wait_says_what_a_job_waits_on_when_it_gives_up(monkeypatch):
    # a job whose TaskController acked nothing ended with "did not settle within 20s",
    # its reason only in the event log
    import io

    import pytest
    from rich.console import Console

    import plait.cli.jobs as jobs
    from plait.cli.client import CliError
    from plait.cli.common import err

    waiting = {"task_count": 3, "version": 2, "applied_version": 2, "updated": 0,
               "unavailable": 0, "serving": 3, "halted": None, "batch": False,
               "unplaced_reason": None, "settled": False,
               "error": "its TaskController acked nothing: no whole reply within the 5s "
                        "deadline"}

    class Fake:
        def get(self, path):
            return waiting
    monkeypatch.setattr(err, "_console", Console(file=io.StringIO(), width=200))
    monkeypatch.setattr(jobs.time, "sleep", lambda s: None)
    with pytest.raises(CliError) as raised:
        jobs.follow(Fake(), "tc", timeout=0)
    assert str(raised.value.args[0]) == (
        "tc did not settle within 0s (its TaskController acked nothing: no whole reply "
        "within the 5s deadline)")


def test_values_in_brackets_are_printed_as_they_are(monkeypatch):
    # a controller's refusal, 'expected {"ack": [op ids]}', was printed
    # 'expected {"ack": }': Rich took the brackets for markup
    import io

    from rich.console import Console
    from rich.text import Text

    from plait.cli.common import kv_table, out, rows

    screen = io.StringIO()
    monkeypatch.setattr(out, "_console", Console(file=screen, width=200))
    said = 'acked nothing: expected {"ack": [op ids]} and [bold]no more[/bold]'
    rows(["job", "message"], [["tc", said]])
    kv_table({"message": said, "styled": Text.from_markup("[bold]50%[/bold]")})
    text = screen.getvalue()
    assert text.count('expected {"ack": [op ids]} and [bold]no more[/bold]') == 2, text
    assert "[bold]50%" not in text and "50%" in text  # (markup asked for is kept)


def test_a_tables_times_are_local_times_at_any_depth() -> None:
    import time

    from plait.cli.common import readable_times

    t = 1_790_000_000.5
    local = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))
    shown = readable_times({"decided_at": t, "load": {"time": t, "value": 3.0},
                            "events": [{"start": t, "end": None}], "interval_seconds": 300,
                            "created": True, "time": 12.0})
    assert shown == {"decided_at": local, "load": {"time": local, "value": 3.0},
                     "events": [{"start": local, "end": None}], "interval_seconds": 300,
                     "created": True, "time": 12.0}


def test_a_loan_being_revoked_shows_its_deadline_as_a_local_time() -> None:
    import time

    from plait.cli.machines import _loan

    t = 1_790_000_000.0
    assert _loan({"loan": {"revoking": True, "deadline": t}}) == (
        "revoking: tasks off by " + time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)))
    assert _loan({"loan": {"revoking": False}}) == "on loan" and _loan({}) == ""


def test_a_task_parked_for_maintenance_says_which_one_in_its_row(capsys) -> None:
    from plait.cli.jobs import _task_rows

    base = {"version": 1, "machine": "m1", "serving": False, "healthy": False,
            "operation": None, "exit_code": None}
    _task_rows([{**base, "index": 0, "state": "stopped", "parked": "mx-7"},
                {**base, "index": 1, "state": "stopped"}])
    shown = " ".join(capsys.readouterr().out.split())
    assert "maintenance mx-7" in shown and "starts when it ends" in shown
    assert shown.count("maintenance") == 1


def test_what_a_tenant_wrote_reaches_the_terminal_as_text(capsys) -> None:
    """An event's message, a table's cell and an error hold a tenant's words: their
    control characters are escaped (no colour, cursor move, window title or forged
    line), and brackets are printed as they are."""
    import pytest
    import typer

    from plait.cli.common import CliError, guarded, kv_table, rows
    from plait.cli.jobs import _task_rows

    evil = "gate said no\x1b[31m\n2026-01-01 00:00:00  admin  forged\x07 [op ids]\u202e"
    rows(["what"], [[evil]])
    kv_table({"message": evil})
    _task_rows([{"index": 0, "state": evil, "version": 1, "machine": None,
                 "serving": False, "healthy": False, "operation": None, "exit_code": None}])

    @guarded
    def fails() -> None:
        raise CliError(evil)
    with pytest.raises(typer.Exit):
        fails()
    printed = capsys.readouterr()
    for text in (printed.out, printed.err):
        assert "\x1b[31m" not in text and "\x07" not in text
        assert "\\x1b[31m" in text and "\\n2026-01-01" in text and "\u202e" not in text
    assert "[op ids]" in " ".join(printed.err.split())  # (folded at the terminal's width)
