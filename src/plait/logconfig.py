"""The logs of plait's processes: structured (structlog), one format per process.

Every long-running process (``plait serve``, ``plait frontend``, ``plait agent``,
``plait up`` and what it starts) calls ``configure`` once, first thing. From then on
each line it writes carries a timestamp, the level, the logger's name, the process's
component and the event, plus the id of the API request being handled when there is
one (``plait.requestid.current``) and whatever fields the caller gave:

* JSON, one object a line, when the output is not a terminal (a file, a pipe, a
  journal): ``{"event": "request", "method": "POST", ..., "request_id": "...",
  "level": "info", "logger": "plait.access.frontend", "component": "frontend",
  "timestamp": "2026-01-01T12:00:00.000000Z"}``;
* readable lines on a terminal.

``PLAIT_LOG_FORMAT=json|console`` overrides the choice, ``PLAIT_LOG_LEVEL`` sets the
level (debug, info, warning, error; info by default). Records of the standard
library's ``logging`` (uvicorn, kazoo, modules with ``logging.getLogger``) go through
the same renderer, so a process writes one format.

Code logs through ``get(name)``: a structlog logger whose events reach the standard
library's ``logging``. Until ``configure`` is called (a program that imports plait as
a library, a test) they are handled as that program's logging says: plait adds no
handler of its own there.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import IO, Any

import structlog
from structlog.typing import EventDict, Processor, WrappedLogger

from plait import requestid

FORMAT_ENV = "PLAIT_LOG_FORMAT"
LEVEL_ENV = "PLAIT_LOG_LEVEL"
FORMATS = ("json", "console")
LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
          "error": logging.ERROR, "critical": logging.CRITICAL}
#: libraries that log every request they make at info: heard from at warning
QUIET = ("httpx", "httpcore", "hpack", "multipart")

#: the component this process runs (``configure``'s), put on every line
_component: str | None = None


def get(name: str) -> Any:
    """The logger ``name`` (``plait.agent``, ``plait.access.frontend``, ...):
    ``log.info("event", field=value, ...)``."""
    return structlog.get_logger(name)


def _request_id(logger: WrappedLogger, method: str, event: EventDict) -> EventDict:
    """The id of the API request being handled, unless the caller named one (a
    ``request_id`` of None is left out)."""
    if event.get("request_id") is None:
        rid = requestid.current.get()
        if rid is None:
            event.pop("request_id", None)
        else:
            event["request_id"] = rid
    return event


def _add_component(logger: WrappedLogger, method: str, event: EventDict) -> EventDict:
    if _component is not None:
        event.setdefault("component", _component)
    return event


#: what every line gets, whether it was logged through structlog or ``logging``
_SHARED: list[Processor] = [
    structlog.stdlib.add_log_level,
    structlog.stdlib.add_logger_name,
    _add_component,
    _request_id,
    structlog.processors.TimeStamper(fmt="iso", utc=True),
]

# structlog's events go to the standard library's logging, which filters them by
# level first (an event below it costs a level check) and renders them in the
# handlers ``configure`` installs
structlog.configure(
    processors=[
        structlog.stdlib.filter_by_level,
        structlog.stdlib.PositionalArgumentsFormatter(),
        *_SHARED,
        structlog.processors.StackInfoRenderer(),
        structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
    ],
    logger_factory=structlog.stdlib.LoggerFactory(),
    wrapper_class=structlog.stdlib.BoundLogger,
    cache_logger_on_first_use=True,
)


def formatter(fmt: str, colors: bool = False) -> logging.Formatter:
    """The formatter that renders every record (structlog's and ``logging``'s) as
    ``fmt``: ``json`` or ``console``."""
    if fmt not in FORMATS:
        raise ValueError(f"log format {fmt!r}: json or console")
    final: list[Processor] = [structlog.stdlib.ProcessorFormatter.remove_processors_meta]
    if fmt == "json":
        final += [structlog.processors.format_exc_info, structlog.processors.JSONRenderer()]
    else:
        final.append(structlog.dev.ConsoleRenderer(
            colors=colors, exception_formatter=structlog.dev.plain_traceback))
    return structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[structlog.stdlib.ExtraAdder(), *_SHARED], processors=final)


class _Stderr(logging.StreamHandler):  # type: ignore[type-arg]
    """A handler on whatever ``sys.stderr`` is when a record is written (a test's
    capture, or the process's own), never on a stream closed since."""

    @property
    def stream(self) -> IO[str]:
        return sys.stderr

    @stream.setter
    def stream(self, value: object) -> None:
        pass


def _is_terminal(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def choose_format(stream: IO[str] | None = None, fmt: str | None = None) -> str:
    """``fmt``, else ``PLAIT_LOG_FORMAT``, else console on a terminal and JSON
    otherwise (``stream``: where the lines go; None for a file)."""
    fmt = (fmt or os.environ.get(FORMAT_ENV) or "").strip().lower()
    if fmt in FORMATS:
        return fmt
    return "console" if stream is not None and _is_terminal(stream) else "json"


def choose_level(level: str | None = None) -> int:
    """``level``, else ``PLAIT_LOG_LEVEL``, else info (an unknown name is info)."""
    name = (level or os.environ.get(LEVEL_ENV) or "info").strip().lower()
    return LEVELS.get(name, logging.INFO)


def configure(component: str, *, stream: IO[str] | None = None, file: Path | None = None,
              fmt: str | None = None, level: str | None = None) -> None:
    """Send this process's logs, as one format, to ``stream`` (standard error by
    default), or to ``file`` with warnings and errors also on standard error. Called
    again, it replaces what it set up before (and leaves other handlers alone)."""
    global _component
    _component = component
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, "_plait", False)]:
        root.removeHandler(old)
        old.close()
    handlers: list[logging.Handler] = []
    out: logging.Handler
    if file is not None:
        file.parent.mkdir(parents=True, exist_ok=True)
        out = logging.FileHandler(file, encoding="utf-8")
        out.setFormatter(formatter(choose_format(None, fmt)))
        handlers.append(out)
        said = _Stderr()
        said.setLevel(logging.WARNING)
        said.setFormatter(formatter(choose_format(sys.stderr, fmt), _is_terminal(sys.stderr)))
        handlers.append(said)
    else:
        out = _Stderr() if stream is None else logging.StreamHandler(stream)
        target = sys.stderr if stream is None else stream
        chosen = choose_format(target, fmt)
        out.setFormatter(formatter(chosen, chosen == "console" and _is_terminal(target)))
        handlers.append(out)
    for handler in handlers:
        handler._plait = True  # type: ignore[attr-defined]
        root.addHandler(handler)
    threshold = choose_level(level)
    root.setLevel(threshold)
    for name in QUIET:
        logging.getLogger(name).setLevel(max(threshold, logging.WARNING))
    logging.captureWarnings(True)


def configured() -> bool:
    return _component is not None


def reset() -> None:
    """Take out what ``configure`` set up (tests)."""
    global _component
    _component = None
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, "_plait", False)]:
        root.removeHandler(old)
        old.close()
    root.setLevel(logging.WARNING)
    logging.captureWarnings(False)
