"""The ops chart's rules (plait.ui.gantt), on hand-made events."""

from plait.ui import gantt


def ev(seq, time, kind, task=None, op=None, machine=None, message="", **more):
    return {"seq": seq, "time": time, "kind": kind, "task": task, "op": op,
            "machine": machine, "message": message, **more}


def test_bars_open_close_continue_and_split():
    events = [
        ev(1, 0.0, "created"),  # a job event: no bar
        ev(2, 1.0, "task_placed", 0, "start", "m1"),
        ev(3, 3.0, "task_ready", 0, machine="m1"),
        ev(4, 5.0, "task_lost", 0, "failure", "m1"),
        ev(5, 5.5, "op_started", 0, "failure", "m1", decision="acked"),  # the same: goes on
        ev(6, 9.0, "task_ready", 0, machine="m2"),
        ev(7, 10.0, "op_started", 0, "update", "m2", reason="update to version 2"),
        ev(8, 11.0, "task_exited", 0, "failure", "m2"),  # a different one: splits
        ev(9, 12.0, "task_ready", 0, machine="m2"),
        ev(10, 2.0, "task_placed", 1, "start", "m3"),  # (out of order: sorted by time)
        ev(11, 20.0, "op_started", 1, "maintenance", "m3"),  # still open
    ]
    rows = gantt.bars(events)
    assert sorted(rows) == [0, 1]
    got = [(b.op, b.start, b.end) for b in rows[0]]
    assert got == [("start", 1.0, 3.0), ("failure", 5.0, 9.0), ("update", 10.0, 11.0),
                   ("failure", 11.0, 12.0)]
    failure = rows[0][1]
    assert (failure.machine, failure.ended_on, failure.decision) == ("m1", "m2", "acked")
    assert "m1 -> m2" in failure.detail(100.0)
    assert rows[0][2].reason == "update to version 2"
    # a task never ready before its maintenance: the start bar ends where it begins
    assert [(b.op, b.end) for b in rows[1]] == [("start", 20.0), ("maintenance", None)]
    assert "(under way)" in rows[1][-1].detail(30.0)


def test_a_close_without_an_open_bar_and_unknown_kinds_draw_nothing():
    assert gantt.bars([ev(1, 1.0, "task_ready", 0), ev(2, 2.0, "rollout_done"),
                       ev(3, 3.0, "something_new", 0, "update")]) == {}


def test_the_svg_has_a_rect_per_bar_with_escaped_details():
    rows = gantt.bars([
        ev(1, 0.0, "task_placed", 0, "start", "m1"),
        ev(2, 1.0, "task_ready", 0, machine="m1"),
        ev(3, 2.0, "op_started", 0, "update", "m1", reason="<script>alert(1)</script>"),
    ])
    svg = gantt.svg(rows, now=4.0)
    assert svg.count("<rect ") == 2
    assert 'data-op="start"' in svg and 'data-op="update"' in svg
    assert "<script>" not in svg and "&lt;script&gt;" in svg
    assert 'data-end=""' in svg  # the update is under way: drawn up to now
    assert "no operations recorded" in gantt.svg({}, now=1.0)
