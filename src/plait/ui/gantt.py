"""A job's ops chart (the Gantt chart of Twine's UI): a row per task, a bar per
operation on it, drawn from the region's events and nothing else.

Pure: events in (as the API gives them), rows of bars out, and the SVG that draws
them. A task's bar opens with the event that starts an operation (``op_started``,
``task_placed``, ``task_lost``, ``task_exited``, ``task_killed``, ``deadline_stop``) and
closes when the task serves again (``task_ready``), finishes (``task_finished``) or is
removed (``task_removed``). A task has one bar open at a time: an event that starts a
different operation closes the open bar where it begins; one that continues the same
operation (a lost task's move, say) adds to it. A bar still open is drawn up to now.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

OPENS = frozenset({"op_started", "task_placed", "task_lost", "task_exited", "task_killed",
                   "deadline_stop"})
CLOSES = frozenset({"task_ready", "task_finished", "task_removed"})
#: the operations a bar can be, and their colours (the legend's order)
COLOURS: dict[str, str] = {
    "start": "#4c9a2a", "update": "#2f6fdb", "restart": "#8e44ad", "move": "#e67e22",
    "stop": "#7f8c8d", "maintenance": "#c9a227", "failure": "#d63031",
}


@dataclass
class Bar:
    task: int
    op: str
    start: float
    end: float | None = None
    machine: str | None = None
    reason: str | None = None
    decision: str | None = None
    #: where the task ran when the bar closed (a move's or a failure's new machine)
    ended_on: str | None = None
    #: the events that make it, oldest first: (time, kind, message)
    notes: list[tuple[float, str, str]] = field(default_factory=list)

    def detail(self, now: float) -> str:
        end = self.end if self.end is not None else now
        lines = [f"task {self.task}: {self.op}, {end - self.start:.1f} s"
                 + ("" if self.end is not None else " (under way)")]
        if self.machine and self.ended_on and self.ended_on != self.machine:
            lines.append(f"machine: {self.machine} -> {self.ended_on}")
        elif self.machine or self.ended_on:
            lines.append(f"machine: {self.machine or self.ended_on}")
        if self.reason:
            lines.append(f"reason: {self.reason}")
        if self.decision:
            lines.append(f"decision: {self.decision}")
        lines.extend(f"+{t - self.start:.1f}s {kind}: {message}"
                     for t, kind, message in self.notes[-6:])
        return "\n".join(lines)


def bars(events: Iterable[Mapping[str, Any]]) -> dict[int, list[Bar]]:
    """Each task's bars, oldest first, from a job's events (any order)."""
    rows: dict[int, list[Bar]] = {}
    open_: dict[int, Bar] = {}
    for e in sorted(events, key=lambda e: (float(e["time"]), int(e.get("seq") or 0))):
        task, kind = e.get("task"), e.get("kind")
        if task is None or kind not in OPENS | CLOSES:
            continue
        t = float(e["time"])
        note = (t, str(kind), str(e.get("message", "")))
        bar = open_.get(task)
        if kind in CLOSES:
            if bar is not None:
                bar.end = t
                bar.ended_on = e.get("machine") or bar.ended_on
                bar.notes.append(note)
                del open_[task]
            continue
        op = str(e.get("op") or "update")
        if bar is not None and bar.op == op:  # the same operation goes on
            bar.notes.append(note)
            bar.machine = e.get("machine") or bar.machine
            bar.decision = e.get("decision") or bar.decision
            continue
        if bar is not None:
            bar.end = t
        bar = open_[task] = Bar(task, op, t, None, e.get("machine"), e.get("reason"),
                                e.get("decision"), notes=[note])
        rows.setdefault(task, []).append(bar)
    return dict(sorted(rows.items()))


def _ticks(t0: float, t1: float, count: int = 6) -> list[float]:
    span = max(t1 - t0, 1e-9)
    raw = span / count
    step = next(s for s in (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200,
                            21600, 43200, 86400, float("inf")) if s >= raw)
    if step == float("inf"):
        step = span
    first = t0 - t0 % step + (step if t0 % step else 0)
    out: list[float] = []
    t = first
    while t <= t1 and len(out) < 50:
        out.append(t)
        t += step
    return out


def svg(rows: Mapping[int, list[Bar]], now: float, width: int = 960, row: int = 16,
        label: int = 64) -> str:
    """The chart as an SVG document: one row per task, bars coloured by operation,
    each with its details as a tooltip (``<title>``) and as data attributes."""
    starts = [b.start for bs in rows.values() for b in bs]
    if not starts:
        return ('<svg xmlns="http://www.w3.org/2000/svg" class="gantt" width="400" '
                'height="30"><text x="4" y="20">no operations recorded</text></svg>')
    t0 = min(starts)
    t1 = max([now, *(b.end for bs in rows.values() for b in bs if b.end is not None)])
    span = max(t1 - t0, 1.0)
    plot = width - label - 8
    height = 24 + row * len(rows) + 4

    def x(t: float) -> float:
        return label + (t - t0) / span * plot

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="gantt" width="{width}" '
           f'height="{height}" viewBox="0 0 {width} {height}" data-t0="{t0:.3f}">']
    for tick in _ticks(t0, t1):
        tx = x(tick)
        out.append(f'<line x1="{tx:.1f}" y1="16" x2="{tx:.1f}" y2="{height}" '
                   f'class="tick"/><text x="{tx:.1f}" y="12" class="tick-label" '
                   f'text-anchor="middle">+{tick - t0:.0f}s</text>')
    for n, (task, task_bars) in enumerate(rows.items()):
        y = 24 + n * row
        out.append(f'<text x="{label - 6}" y="{y + row - 4}" text-anchor="end" '
                   f'class="row-label">task {task}</text>')
        for b in task_bars:
            x0 = x(b.start)
            x1 = x(b.end if b.end is not None else now)
            colour = COLOURS.get(b.op, "#555")
            detail = html.escape(b.detail(now))
            out.append(
                f'<rect class="bar op-{html.escape(b.op)}" x="{x0:.1f}" y="{y + 2}" '
                f'width="{max(x1 - x0, 2):.1f}" height="{row - 4}" fill="{colour}" '
                f'data-task="{task}" data-op="{html.escape(b.op)}" '
                f'data-start="{b.start:.3f}" data-end="'
                f'{"" if b.end is None else f"{b.end:.3f}"}" data-detail="{detail}">'
                f'<title>{detail}</title></rect>')
    out.append("</svg>")
    return "".join(out)
