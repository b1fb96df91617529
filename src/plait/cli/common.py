"""What the ``plait`` verbs share: the API client, output, errors, time parsing.

The verbs that talk to a control plane: serve, entitlement, job, task,
machine, maintenance, events, token, context.

Every verb finds the API URL and token in the client configuration (a named context;
``--context`` picks another), overridable by ``PLAIT_URL``/``PLAIT_TOKEN`` and by
``--url``/``--token``. Lists print tables; ``--output json`` prints the API's JSON
for scripts. Errors are one line on stderr and a non-zero exit code (see
``plait.cli.client``).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from plait.cli.client import EXIT_INVALID, Api, CliError, Target
from plait.errors import PlaitError

if TYPE_CHECKING:  # (imported where used: `plait agent` starts without the model)
    from rich.console import Console

    from plait.model import JobSpec


class _Console:
    """A Rich console made at first use (a command that prints nothing through it
    does not import Rich)."""

    def __init__(self, stderr: bool = False) -> None:
        self._stderr = stderr
        self._console: Console | None = None

    @property
    def console(self) -> Console:
        if self._console is None:
            from rich.console import Console

            stream = sys.stderr if self._stderr else sys.stdout
            # a pipe (a script, a file, grep) takes tables at their own width: nothing
            # folded to the 80 columns Rich assumes when there is no terminal
            wide = not self._stderr and not stream.isatty() and "COLUMNS" not in os.environ
            self._console = Console(stderr=self._stderr, width=4096 if wide else None)
        return self._console

    def __getattr__(self, name: str) -> Any:
        return getattr(self.console, name)


err = _Console(stderr=True)


#: control characters (C0, DEL, C1) as escapes: what a tenant wrote (an event's
#: message, a gate's verdict, a job's error) reaches an admin's terminal as text, never
#: as an escape sequence that recolours it, moves its cursor, retitles its window or
#: forges another line (a task's logs are the task's own output: printed as they are)
_ESCAPES = {c: (f"\\x{c:02x}" if c not in (9, 10, 13) else {9: "\\t", 10: "\\n",
                                                             13: "\\r"}[c])
            for c in (*range(32), *range(127, 160))}


def safe(text: str) -> str:
    """``text`` with its control characters escaped (``\\x1b``, ``\\n``), and its
    invisible format characters (a right-to-left override, a zero-width space) as
    ``\\u202e``: they can make a line read as another."""
    if text.isprintable():
        return text
    import unicodedata

    return "".join(f"\\u{ord(c):04x}" if unicodedata.category(c) == "Cf" else c
                   for c in text.translate(_ESCAPES))


def say(text: str) -> None:
    """One plain line on stderr (what most verbs print: no Rich needed)."""
    print(text, file=sys.stderr, flush=True)


out = _Console()
target = Target()

def _output_format(value: str) -> str:
    if value not in ("table", "json"):  # checked before anything is sent
        raise typer.BadParameter(f"must be table or json, not {value!r}")
    return value


Output = Annotated[str, typer.Option("--output", "-o", help="table or json",
                                     callback=_output_format)]
Wait = Annotated[bool, typer.Option("--wait", help="follow the rollout until it settles")]
Timeout = Annotated[float, typer.Option("--timeout", help="seconds --wait waits at most")]


def guarded(fn: Callable[..., None]) -> Callable[..., None]:
    """Run a verb; a failure becomes one line on stderr and its exit code."""
    import functools

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> None:
        try:
            fn(*args, **kwargs)
        except CliError as exc:
            _error_line(exc.message)
            raise typer.Exit(exc.code) from None
        except PlaitError as exc:
            _error_line(str(exc))
            raise typer.Exit(EXIT_INVALID) from None
    return run


def _error_line(message: str) -> None:
    """``error: MESSAGE`` on stderr, the message as it is (a server's words may hold
    brackets, or a tenant's control characters: escaped)."""
    from rich.text import Text

    err.print(Text.assemble(("error:", "red"), " ", safe(message)), highlight=False)


def api() -> Api:
    return Api(target)


def emit(data: Any, output: str, table: Callable[[Any], object]) -> None:
    if output == "json":
        print(json.dumps(data, indent=2, sort_keys=True))
    elif output == "table":
        table(data)
    else:
        raise CliError(f"--output must be table or json, not {output!r}", EXIT_INVALID)


#: fields that hold a time (Unix seconds), shown as a local time in tables
TIME_FIELDS = frozenset({"created", "time", "decided_at", "deadline", "start", "end",
                         "since", "until", "updated", "applied_at"})


def readable_times(value: Any, key: str | None = None) -> Any:
    """``value`` with every time field (``TIME_FIELDS``, at any depth) a local time as
    ``_when`` writes it: what a table shows (``--output json`` keeps the numbers)."""
    if isinstance(value, dict):
        return {k: readable_times(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [readable_times(v) for v in value]
    if key in TIME_FIELDS and isinstance(value, (int, float)) and not isinstance(
            value, bool) and 1e9 <= value < 1e11:
        return _when(float(value))
    return value


def kv_table(data: dict[str, Any], title: str | None = None) -> None:
    """A key-value table. Values are shown as they are, times as local times
    (``readable_times``): a message holding ``[...]`` is not read as markup (a
    ``rich.text.Text`` value keeps its own styles)."""
    from rich.table import Table
    from rich.text import Text

    t = Table(title=title, show_header=False)
    for key, value in data.items():
        if not isinstance(value, Text):
            value = readable_times(value, key)
        t.add_row(safe(key), value if isinstance(value, Text) else Text(
            safe(value if isinstance(value, str) else json.dumps(value))))
    out.print(t)


def rows(columns: list[str], items: list[list[Any]], title: str | None = None) -> None:
    from rich.table import Table
    from rich.text import Text

    t = Table(title=title)
    cells = [["" if v is None else safe(str(v)) for v in item] for item in items]
    for k, c in enumerate(columns):
        # nothing is cut to an ellipsis (an id to copy, a name): a narrow terminal or a
        # pipe folds long values; the first column (what a row is) is never folded
        widest = max((len(row[k]) for row in cells), default=0)
        t.add_column(c, overflow="fold", no_wrap=k == 0,
                     min_width=max(len(c), widest) if k == 0 else None)
    for row in cells:
        t.add_row(*map(Text, row))  # (as they are: "[op ids]" is not markup)
    out.print(t)


class Columns:
    """A table printed as it comes, page after page: plain columns, as wide as the
    first page needs (wider when a later value needs it), so the first rows of a long
    list show at once and a pipe reads lines."""

    def __init__(self, columns: list[str]) -> None:
        self.columns = columns
        self.widths = [len(c) for c in columns]
        self.started = False

    def add(self, items: list[list[Any]]) -> None:
        cells = [["" if v is None else safe(str(v)) for v in item] for item in items]
        for row in cells:
            self.widths = [max(w, len(v)) for w, v in zip(self.widths, row, strict=True)]
        lines = [] if self.started else [self._line(self.columns)]
        self.started = True
        lines += [self._line(row) for row in cells]
        if lines:
            print("\n".join(lines), flush=True)

    def _line(self, values: list[str]) -> str:
        return "  ".join(v.ljust(w) for v, w in zip(values, self.widths, strict=True)).rstrip()

    def end(self) -> None:
        if not self.started:
            self.add([])


Pages = Iterable[tuple[list[Any], str | None]]


def gathered(pages: Pages) -> tuple[list[Any], str | None]:
    """Every item of ``pages`` and the last page's continue token."""
    found: list[Any] = []
    token = None
    for items, nxt in pages:
        found.extend(items)
        token = nxt
    return found, token


def tabulated(pages: Pages, columns: list[str], row: Callable[[Any], list[Any]]) -> str | None:
    """Print ``pages`` as one table, each page as it comes; the last page's token."""
    table = Columns(columns)
    token = None
    for items, nxt in pages:
        table.add([row(item) for item in items])
        token = nxt
    table.end()
    return token


def load_documents(path: Path) -> list[dict[str, Any]]:
    """The mappings in a YAML file: one, several documents, or a list under any key
    (read by ``plait.cli.specfile``: bounded, text only, no duplicate keys)."""
    from plait.cli import specfile

    try:
        docs = specfile.parse_yaml(specfile.read(path), path)
    except specfile.SpecError as exc:
        raise CliError(str(exc), EXIT_INVALID) from None
    found: list[Any] = []
    for doc in docs:
        if isinstance(doc, list):
            found.extend(doc)
        elif isinstance(doc, dict) and len(doc) == 1 and isinstance(next(iter(doc.values())),
                                                                    list):
            found.extend(next(iter(doc.values())))
        else:
            found.append(doc)
    for item in found:
        if not isinstance(item, dict):
            raise CliError(f"{path}: expected mappings, found {type(item).__name__}",
                           EXIT_INVALID)
    if not found:
        raise CliError(f"{path} is empty", EXIT_INVALID)
    return found


def job_spec_from(path: Path) -> JobSpec:
    from plait.model import JobSpec, parse

    docs = load_documents(path)
    if len(docs) != 1:
        raise CliError(f"{path} holds {len(docs)} jobs; give one per file", EXIT_INVALID)
    try:
        return parse(JobSpec, docs[0])
    except PlaitError as exc:
        raise CliError(f"{path}: {exc}", EXIT_INVALID) from None


def parse_duration(text: str) -> float:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", text)
    if not m:
        raise CliError(f"{text!r} is not a duration like 90, 90s, 10m, 2h or 1d", EXIT_INVALID)
    return float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]


def parse_time(text: str) -> float:
    """``now``, ``+10m`` (from now), a unix time, or an ISO 8601 time."""
    if text == "now":
        return time.time()
    if text.startswith("+"):
        return time.time() + parse_duration(text[1:])
    try:
        return float(text)
    except ValueError:
        pass
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        raise CliError(f"{text!r} is not a time (now, +10m, unix seconds or ISO 8601)",
                       EXIT_INVALID) from None
    if when.tzinfo is None:
        when = when.astimezone()
    return when.timestamp()


def _when(t: float | None) -> str:
    if t is None:
        return "-"
    return dt.datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S")


def refuse(exc: PlaitError) -> typer.Exit:
    """Bad input: say what is wrong, in one line, and exit 2 (as a usage error)."""
    _error_line(str(exc))
    return typer.Exit(EXIT_INVALID)
