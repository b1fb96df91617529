"""The scheduler's events kept as rows until read: read like the list of events they
replace, each event made once."""

from plait.scheduler.eventrows import EventRows
from plait.scheduler.records import SchedulerEvent


def rows() -> EventRows:
    events = EventRows(lambda machine: f"m{machine:07d}")
    events.add((1.0, "web", "created", "2 tasks, version 1", None, None, None, None, None,
                "alice", "req-1"))
    events.add((2.0, "web", "op_started", None, 1, 7, "update", "update to version 2",
                "approved", None, "req-2"))
    events.append(SchedulerEvent(3.0, "web", "deleting", "stopping 2 tasks"))
    return events


def test_rows_read_as_the_events_they_stand_for():
    events = rows()
    assert len(events) == 3
    assert events[0] == SchedulerEvent(1.0, "web", "created", "2 tasks, version 1",
                                       actor="alice", request="req-1")
    # the machine by name, an operation's message made from its fields
    assert events[1] == SchedulerEvent(2.0, "web", "op_started",
                                       "task 1: update (update to version 2)", 1,
                                       "m0000007", "update", "update to version 2",
                                       "approved", None, "req-2")
    assert [e.kind for e in events] == ["created", "op_started", "deleting"]
    assert events[-1].message == "stopping 2 tasks"
    assert [e.time for e in events[1:]] == [2.0, 3.0]


def test_each_row_becomes_one_event_and_stays_it():
    events = rows()
    first = list(events)
    assert all(type(e) is SchedulerEvent for e in events.rows)
    assert all(a is b for a, b in zip(first, events, strict=True))


def test_draining_and_trimming_work_like_a_list():
    events = rows()
    drained, events[:] = list(events), []
    assert len(drained) == 3 and len(events) == 0 and list(events) == []
    events = rows()
    del events[:2]
    assert [e.kind for e in events] == ["deleting"]
    assert events == [SchedulerEvent(3.0, "web", "deleting", "stopping 2 tasks")]


def test_a_task_message_is_prefixed_with_its_task_when_read():
    from plait.scheduler.eventrows import TaskMessage
    events = EventRows(lambda machine: f"m{machine}")
    shared = TaskMessage("serving version 1")
    for task in (3, 4):
        events.add((1.0, "web", "task_ready", shared, task, 2, None, None, None, None, None))
    assert [e.message for e in events] == ["task 3: serving version 1",
                                           "task 4: serving version 1"]
    assert all(type(e.message) is str for e in events)


def test_taking_the_rows_gives_each_events_fields_and_empties_them():
    from dataclasses import astuple

    from plait.scheduler.eventrows import TaskMessage
    events = rows()
    events.add((4.0, "web", "task_ready", TaskMessage("serving version 2"), 0, 3, None,
                None, None, None, None))
    ready = SchedulerEvent(4.0, "web", "task_ready", "task 0: serving version 2", 0,
                           "m0000003")
    expected = [astuple(e) for e in [*rows(), ready]]
    held = events.rows  # (the pass appends to the list it holds)
    assert events.take() == expected
    assert len(events) == 0 and held is events.rows and held == []
    events.add((5.0, "db", "created", "1 tasks, version 1", None, None, None, None, None,
                None, None))
    assert [e.job for e in events] == ["db"]
