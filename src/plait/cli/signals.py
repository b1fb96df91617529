"""Signals of the long-running commands (``plait serve``, ``frontend``, ``scheduler``,
``agent``, ``up``).

A background job of a non-interactive shell (``plait serve &`` in a script) starts with
SIGINT ignored (POSIX), and an ignored signal stays ignored across ``exec``: Python
then installs no KeyboardInterrupt handler, and a ``kill -INT`` (what a supervisor or
a test harness sends for Ctrl-C) went unheard until the command's own handlers were
in place (uvicorn's, the agent's), or for good in a command blocked before that (a
ZooKeeper store that does not answer). Each of these commands calls ``as_foreground``
first: it stops on SIGINT and SIGTERM from its first line as if started in a terminal.
"""

from __future__ import annotations

import signal


def as_foreground() -> None:
    """SIGINT raises KeyboardInterrupt and SIGTERM ends the process, as for a command
    started in the foreground, even when whoever started it had them ignored (the
    command's own handlers, installed later, take over from these)."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if signal.getsignal(signal.SIGTERM) is signal.SIG_IGN:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
