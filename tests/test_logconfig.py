"""plait.logconfig: one format per process (JSON lines off a terminal, readable lines
on one, or as PLAIT_LOG_FORMAT says), the level PLAIT_LOG_LEVEL gives, the standard
library's records rendered the same way, and the request id on every line logged
while a request is handled."""

from __future__ import annotations

import io
import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from plait import logconfig, requestid

#: a process that configures its logging (as a daemon does) and logs through
#: structlog and through the standard library, inside and outside a request
PROGRAM = """
import logging
from plait import logconfig, requestid
logconfig.configure("probe")
log = logconfig.get("plait.probe")
log.info("started", machines=3)
token = requestid.current.set("req-7")
logging.getLogger("kazoo.client").warning("connection %s", "lost")
log.debug("hidden unless debug")
requestid.current.reset(token)
"""


def run(env: dict[str, str], stderr: int | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("PLAIT_LOG")}
    return subprocess.run([sys.executable, "-c", PROGRAM], env={**base, **env},
                          stderr=stderr if stderr is not None else subprocess.PIPE,
                          stdout=subprocess.PIPE, text=True, timeout=60, check=True)


def test_off_a_terminal_each_line_is_a_json_object_with_the_fields() -> None:
    done = run({})
    assert done.stdout == ""  # logs go to stderr
    lines = [json.loads(line) for line in done.stderr.splitlines()]
    assert [line["event"] for line in lines] == ["started", "connection lost"]
    started, lost = lines
    for line in lines:
        assert line["component"] == "probe"
        assert line["timestamp"].endswith("Z") and "T" in line["timestamp"]
    assert (started["level"], started["logger"], started["machines"]) == (
        "info", "plait.probe", 3)
    assert "request_id" not in started  # (outside a request)
    # a record of the standard library's logging, in the same shape
    assert (lost["level"], lost["logger"], lost["request_id"]) == (
        "warning", "kazoo.client", "req-7")


def test_the_level_comes_from_plait_log_level() -> None:
    events = [json.loads(line)["event"] for line in run(
        {"PLAIT_LOG_LEVEL": "debug"}).stderr.splitlines()]
    assert events == ["started", "connection lost", "hidden unless debug"]
    events = [json.loads(line)["event"] for line in run(
        {"PLAIT_LOG_LEVEL": "warning"}).stderr.splitlines()]
    assert events == ["connection lost"]


def test_forced_console_output_is_readable_lines_not_json() -> None:
    lines = run({"PLAIT_LOG_FORMAT": "console"}).stderr.splitlines()
    assert len(lines) == 2
    for line in lines:
        with pytest.raises(ValueError):
            json.loads(line)
    assert "started" in lines[0] and "machines=3" in lines[0] and "[plait.probe]" in lines[0]
    assert "connection lost" in lines[1] and "request_id=req-7" in lines[1]
    assert "warning" in lines[1]


def test_on_a_terminal_the_lines_are_readable_and_json_when_forced() -> None:
    def said(env: dict[str, str]) -> str:
        main, sub = os.openpty()
        try:
            run(env, stderr=sub)
            os.close(sub)
            sub = -1
            chunks = []
            while True:
                try:
                    chunk = os.read(main, 65536)
                except OSError:  # (the terminal's other end is closed: all read)
                    break
                if not chunk:
                    break
                chunks.append(chunk)
            return b"".join(chunks).decode(errors="replace")
        finally:
            os.close(main)
            if sub >= 0:
                os.close(sub)

    text = said({})
    plain = re.sub(r"\x1b\[[0-9;]*m", "", text)  # (coloured, on a terminal)
    assert plain != text
    assert "started" in plain and "machines=3" in plain and '{"' not in plain
    forced = [json.loads(line) for line in said({"PLAIT_LOG_FORMAT": "json"}).splitlines()
              if line.strip()]
    assert [line["event"] for line in forced] == ["started", "connection lost"]


def test_a_file_takes_every_line_and_stderr_the_warnings(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    logconfig.configure("up", file=tmp_path / "logs" / "up.log", fmt="json")
    log = logconfig.get("plait.test")
    log.info("quiet", n=1)
    log.warning("loud", n=2)
    lines = [json.loads(line) for line in (tmp_path / "logs" / "up.log").read_text()
             .splitlines()]
    assert [(x["event"], x["n"], x["component"]) for x in lines] == [
        ("quiet", 1, "up"), ("loud", 2, "up")]
    err = capsys.readouterr().err
    assert "loud" in err and "quiet" not in err


def test_configuring_again_replaces_its_handler_and_leaves_others_alone() -> None:
    other = logging.NullHandler()
    root = logging.getLogger()
    root.addHandler(other)
    try:
        first, second = io.StringIO(), io.StringIO()
        logconfig.configure("a", stream=first, fmt="json")
        logconfig.configure("b", stream=second, fmt="json")
        logconfig.get("plait.test").info("once")
        logconfig.flush()  # (lines are written by a thread of the writer's own)
        assert first.getvalue() == ""
        assert json.loads(second.getvalue())["component"] == "b"
        assert other in root.handlers
        logconfig.reset()
        assert other in root.handlers and not logconfig.configured()
    finally:
        root.removeHandler(other)


def test_an_exception_is_one_json_line_with_its_traceback() -> None:
    out = io.StringIO()
    logconfig.configure("x", stream=out, fmt="json")
    token = requestid.current.set("req-9")
    try:
        try:
            raise RuntimeError("store down")
        except RuntimeError:
            logconfig.get("plait.test").exception("pass failed")
    finally:
        requestid.current.reset(token)
    (line,) = out.getvalue().splitlines()
    record = json.loads(line)
    assert record["event"] == "pass failed" and record["level"] == "error"
    assert record["request_id"] == "req-9"
    assert "RuntimeError: store down" in record["exception"]


def test_the_format_choice() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    old = os.environ.pop(logconfig.FORMAT_ENV, None)
    try:
        assert logconfig.choose_format(Tty()) == "console"
        assert logconfig.choose_format(io.StringIO()) == "json"
        assert logconfig.choose_format(None) == "json"  # (a file)
        assert logconfig.choose_format(Tty(), "json") == "json"
        os.environ[logconfig.FORMAT_ENV] = "console"
        assert logconfig.choose_format(io.StringIO()) == "console"
        os.environ[logconfig.FORMAT_ENV] = "xml"  # (not a format: the default choice)
        assert logconfig.choose_format(io.StringIO()) == "json"
    finally:
        os.environ.pop(logconfig.FORMAT_ENV, None)
        if old is not None:
            os.environ[logconfig.FORMAT_ENV] = old
    assert logconfig.choose_level("DEBUG") == logging.DEBUG
    assert logconfig.choose_level("nonsense") == logging.INFO


def test_lines_are_written_in_order_by_the_writer_and_all_of_them_at_flush() -> None:
    out = io.StringIO()
    logconfig.configure("x", stream=out, fmt="json", level="info")
    log = logconfig.get("plait.test")
    for i in range(2000):
        log.info("line", n=i)
        if i == 1000:
            logging.getLogger("kazoo.client").warning("a library's record")
    log.warning("last")  # written at once, after everything queued before it
    lines = [json.loads(x) for x in out.getvalue().splitlines()]
    assert [x["n"] for x in lines if x["event"] == "line"] == list(range(2000))
    assert [x["event"] for x in lines].index("a library's record") == 1001
    assert lines[-1]["event"] == "last" and lines[-1]["level"] == "warning"
    logconfig.reset()


def test_a_server_writes_its_queued_lines_when_it_reports_its_shutdown() -> None:
    import asyncio

    from plait.frontend.requestlog import RequestLog

    out = io.StringIO()
    logconfig.configure("x", stream=out, fmt="json", level="info")
    sent: list[str] = []

    async def app(scope, receive, send):  # (a lifespan that logs, then completes)
        logconfig.get("plait.test").info("shutting down")
        await send({"type": "lifespan.shutdown.complete"})

    async def send(message):
        sent.append(out.getvalue())

    async def receive():
        return {"type": "lifespan.shutdown"}

    asyncio.run(RequestLog(app, api="test")({"type": "lifespan"}, receive, send))
    assert '"shutting down"' in sent[0]  # written before the server says it is done
    logconfig.reset()



def test_a_json_line_is_ascii_json_whatever_its_values_hold() -> None:
    """The lines are orjson's where it can, the standard library's (ASCII, escaped)
    where a value holds a character beyond ASCII, a lone surrogate or an integer beyond
    64 bits; what neither knows is rendered by the fallback given."""
    event = {"event": "request", "n": 3, "ratio": 0.5, "none": None, "list": [1, "a"],
             7: "a key that is not a string"}
    line = logconfig._json_line(event, default=repr)
    assert json.loads(line) == {**{k: v for k, v in event.items() if k != 7},
                                "7": "a key that is not a string"}
    for value in ("é → ✓", "\ud800", 2 ** 70):
        line = logconfig._json_line({"event": "x", "value": value}, default=repr)
        assert line.isascii()
        assert json.loads(line) == {"event": "x", "value": value}
    line = logconfig._json_line({"event": "x", "thing": object()}, default=lambda o: "obj")
    assert json.loads(line) == {"event": "x", "thing": "obj"}
