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

import atexit
import datetime
import json
import logging
import os
import sys
import threading
import time
from pathlib import Path
from queue import Empty, SimpleQueue
from typing import IO, Any

import orjson
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


#: bumped by every ``configure``/``reset``: a logger made before follows the change
_generation = 0


class _Logger:
    """A named logger that binds itself once per configuration (structlog's lazy
    proxy would do it on every call: a third of a line's cost)."""

    __slots__ = ("_gen", "_log", "_name")

    def __init__(self, name: str) -> None:
        self._name, self._gen, self._log = name, -1, None

    def _bound(self) -> Any:
        if self._gen != _generation:
            self._log = structlog.get_logger(self._name).bind()
            self._gen = _generation
        return self._log

    def debug(self, event: str, **kw: Any) -> Any:
        return self._bound().debug(event, **kw)

    def info(self, event: str, **kw: Any) -> Any:
        return self._bound().info(event, **kw)

    def warning(self, event: str, **kw: Any) -> Any:
        return self._bound().warning(event, **kw)

    def error(self, event: str, **kw: Any) -> Any:
        return self._bound().error(event, **kw)

    def exception(self, event: str, **kw: Any) -> Any:
        return self._bound().exception(event, **kw)

    def critical(self, event: str, **kw: Any) -> Any:
        return self._bound().critical(event, **kw)

    def log(self, level: int, event: str, **kw: Any) -> Any:
        return self._bound().log(level, event, **kw)

    def bind(self, **kw: Any) -> Any:
        """A logger with ``kw`` on every line (bound to the configuration of now)."""
        return self._bound().bind(**kw)


def get(name: str) -> Any:
    """The logger ``name`` (``plait.agent``, ``plait.access.frontend``, ...):
    ``log.info("event", field=value, ...)``."""
    return _Logger(name)


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

#: until ``configure`` runs (a program that uses plait as a library, a test),
#: structlog's events go to the standard library's logging, which filters them by level
#: first and renders them in whatever handlers that program set up
_LIBRARY: dict[str, Any] = {
    "processors": [
        structlog.stdlib.filter_by_level,
        structlog.stdlib.PositionalArgumentsFormatter(),
        *_SHARED,
        structlog.processors.StackInfoRenderer(),
        structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
    ],
    "logger_factory": structlog.stdlib.LoggerFactory(),
    "wrapper_class": structlog.stdlib.BoundLogger,
    # (not cached: a logger made before ``configure`` must follow it)
    "cache_logger_on_first_use": False,
}
structlog.configure(**_LIBRARY)

class _Lines:
    """Where structlog's events go once ``configure`` ran: each event, complete but
    not rendered, to its ``_Writer`` (a queue: the request that logged it does not
    wait for the rendering or the write); a warning or an error is written at once,
    after whatever is queued, and with ``loud`` also to standard error."""

    def __init__(self, name: str, out: _Writer, loud: _Writer | None) -> None:
        self.name, self._out, self._loud = name, out, loud

    def msg(self, event: EventDict) -> None:
        self._out.put(event)

    def now(self, event: EventDict) -> None:
        if self._loud is not None:
            self._loud.write_now(dict(event))
        self._out.write_now(event)

    debug = info = log = msg
    warning = warn = error = critical = exception = fatal = now


#: how often a writer's thread writes what was queued (seconds)
INTERVAL = 0.1


class _Writer:
    """Renders events and writes them as lines to a stream (the current
    ``sys.stderr`` when None), in the order they were logged: in batches, every
    ``INTERVAL`` from a thread of its own (no wake-up, render or write in the path of
    the request that logged), or at once (``write_now``, ``flush``). A SIGKILL loses
    what is still queued (at most ``INTERVAL``'s worth of info lines); ``flush`` runs
    at exit and when a server reports its shutdown."""

    def __init__(self, stream: IO[str] | None, render: Processor, owned: bool = False) -> None:
        """``owned``: the stream is this writer's to close (a file it opened)."""
        self._stream, self._owned = stream, owned
        self._render = render
        self._queue: SimpleQueue[EventDict] = SimpleQueue()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = False
        self._thread: threading.Thread | None = None

    def put(self, event: EventDict) -> None:
        self._queue.put(event)  # (the thread takes it within INTERVAL: no wake-up a line)
        if self._thread is None:
            self._start()

    def _start(self) -> None:
        with self._lock:
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(target=self._run, name="plait-log",
                                                 daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while not self._closed:
            self._wake.wait(INTERVAL)
            self.flush()

    def _line(self, event: EventDict) -> str:
        stamp = event.get("timestamp")
        if isinstance(stamp, float):
            event["timestamp"] = _iso(stamp)
        return str(self._render(None, event.pop("_method", "info"), event))

    def flush(self, also: EventDict | None = None, text: str | None = None) -> None:
        """Write what is queued (then ``also``, or the line ``text``), in order."""
        with self._lock:
            lines = []
            while True:
                try:
                    lines.append(self._line(self._queue.get_nowait()))
                except Empty:
                    break
            if also is not None:
                lines.append(self._line(also))
            if text is not None:
                lines.append(text)
            if lines:
                stream = self._stream if self._stream is not None else sys.stderr
                try:
                    stream.write("\n".join(lines) + "\n")
                    stream.flush()
                except (OSError, ValueError):  # (a closed stream: nothing to tell)
                    pass

    def write_now(self, event: EventDict) -> None:
        self.flush(also=event)

    def close(self) -> None:
        self._closed = True
        self._wake.set()
        self.flush()
        if self._owned and self._stream is not None:
            self._stream.close()


class _Handler(logging.Handler):
    """The standard library's records (uvicorn, kazoo, warnings), rendered as plait's
    lines and written through the same writer, after what it has queued."""

    def __init__(self, writer: _Writer, level: int = logging.NOTSET) -> None:
        super().__init__(level)
        self.writer = writer

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.writer.flush(text=self.format(record))
        except Exception:
            self.handleError(record)



def _iso(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _fields(logger: WrappedLogger, method: str, event: EventDict) -> EventDict:
    """What every line gets, in one step: the level, the logger's name, the process's
    component, the request being handled, the time (rendered by the writer)."""
    event["level"] = "warning" if method == "warn" else method
    event["_method"] = method
    event["logger"] = getattr(logger, "name", None)
    if _component is not None:
        event.setdefault("component", _component)
    if event.get("request_id") is None:
        rid = requestid.current.get()
        if rid is None:
            event.pop("request_id", None)
        else:
            event["request_id"] = rid
    event["timestamp"] = time.time()
    return event


def _unrendered(logger: WrappedLogger, method: str, event: EventDict) -> Any:
    """The last processor: the event itself goes to ``_Lines`` (rendered later)."""
    return (event,), {}


def _json_line(obj: Any, default: Any = None) -> str:
    """A log line's JSON: orjson's (a line is rendered for every request, and the
    standard library's took about a tenth of a create's CPU), ASCII as the standard
    library writes it; what orjson does not take, or a line with a character beyond
    ASCII (escaped, so a stream of any encoding takes it), the standard library's."""
    try:
        line = orjson.dumps(obj, default=default, option=orjson.OPT_NON_STR_KEYS).decode()
    except TypeError:
        return json.dumps(obj, default=default)
    return line if line.isascii() else json.dumps(obj, default=default)


def _renderer(fmt: str, colors: bool = False) -> Processor:
    if fmt == "json":
        json_render = structlog.processors.JSONRenderer(serializer=_json_line)
        exc = structlog.processors.format_exc_info

        def render(logger: WrappedLogger, method: str, event: EventDict) -> Any:
            return json_render(logger, method, exc(logger, method, event))
        return render
    return structlog.dev.ConsoleRenderer(colors=colors,
                                         exception_formatter=structlog.dev.plain_traceback)


#: the writers ``configure`` made (closed by the next ``configure`` or ``reset``)
_writers: list[_Writer] = []


def flush() -> None:
    """Write every line still queued (a server about to exit calls it)."""
    for writer in list(_writers):
        writer.flush()


atexit.register(flush)


def _native(out: _Writer, threshold: int, loud: _Writer | None = None) -> None:
    """structlog builds each event and hands it to its writer, filtered by level
    before any work (an event below the level costs a method call)."""
    _writers.append(out)
    if loud is not None:
        _writers.append(loud)

    def factory(name: str | None = None, *_: Any) -> _Lines:
        return _Lines(name or "", out, loud)

    structlog.configure(
        processors=[
            structlog.processors.StackInfoRenderer(),
            _exc_info,
            _fields,
            _unrendered,
        ],
        logger_factory=factory,
        wrapper_class=structlog.make_filtering_bound_logger(threshold),
        cache_logger_on_first_use=False,
    )


def _exc_info(logger: WrappedLogger, method: str, event: EventDict) -> EventDict:
    """The traceback of ``exception`` (``exc_info=True``), taken now: the writer
    renders it later, in another thread."""
    if event.get("exc_info") is True:
        event["exc_info"] = sys.exc_info()
    return event


def formatter(fmt: str, colors: bool = False) -> logging.Formatter:
    """The formatter that renders every record (structlog's and ``logging``'s) as
    ``fmt``: ``json`` or ``console``."""
    if fmt not in FORMATS:
        raise ValueError(f"log format {fmt!r}: json or console")
    final: list[Processor] = [structlog.stdlib.ProcessorFormatter.remove_processors_meta]
    if fmt == "json":
        final += [structlog.processors.format_exc_info,
                  structlog.processors.JSONRenderer(serializer=_json_line)]
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
    global _component, _generation
    _component = component
    _generation += 1
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, "_plait", False)]:
        root.removeHandler(old)
        old.close()
    for writer in _writers:
        writer.close()
    _writers.clear()
    threshold = choose_level(level)
    handlers: list[logging.Handler] = []
    out: logging.Handler
    if file is not None:
        file.parent.mkdir(parents=True, exist_ok=True)
        lines = _Writer(open(file, "a", encoding="utf-8"),  # noqa: SIM115 (closed later)
                        _renderer(choose_format(None, fmt)), owned=True)
        loud = _Writer(None, _renderer(choose_format(sys.stderr, fmt),
                                       _is_terminal(sys.stderr)))
        _native(lines, threshold, loud)
    else:
        target = sys.stderr if stream is None else stream
        chosen = choose_format(target, fmt)
        writer = _Writer(stream, _renderer(chosen, chosen == "console"
                                           and _is_terminal(target)))
        _native(writer, threshold)
    # the standard library's records (uvicorn, kazoo, warnings) in the same format,
    # through the same writers (in order with the rest)
    if file is not None:
        out = _Handler(lines)
        out.setFormatter(formatter(choose_format(None, fmt)))
        handlers.append(out)
        said = _Handler(loud, logging.WARNING)
        said.setFormatter(formatter(choose_format(sys.stderr, fmt), _is_terminal(sys.stderr)))
        handlers.append(said)
    else:
        out = _Handler(writer)
        out.setFormatter(formatter(chosen, chosen == "console" and _is_terminal(target)))
        handlers.append(out)
    for handler in handlers:
        handler._plait = True  # type: ignore[attr-defined]
        root.addHandler(handler)
    root.setLevel(threshold)
    for name in QUIET:
        logging.getLogger(name).setLevel(max(threshold, logging.WARNING))
    logging.captureWarnings(True)


def configured() -> bool:
    return _component is not None


def reset() -> None:
    """Take out what ``configure`` set up (tests)."""
    global _component, _generation
    _component = None
    _generation += 1
    structlog.configure(**_LIBRARY)
    for writer in _writers:
        writer.close()
    _writers.clear()
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, "_plait", False)]:
        root.removeHandler(old)
        old.close()
    root.setLevel(logging.WARNING)
    logging.captureWarnings(False)
