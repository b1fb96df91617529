"""The task lifecycle as a transition table, one comment per edge.

States are ``plait.model.TaskState``; events are what the scheduler learns or
decides. An event that has no edge from the current state changes nothing (agent
reports can be late or repeated), and ``advance`` says so by returning ``None``.
"""

from __future__ import annotations

import enum

from plait.model.task import TaskState as S


class Event(enum.StrEnum):
    ALLOCATED = "allocated"  # the allocator gave the task a machine
    STARTING = "starting"  # its agent reports the process starting
    RUNNING = "running"  # its agent reports the process running
    EXITED = "exited"  # the process exited on its own (crash or finish)
    STOP = "stop"  # the scheduler takes it out of its machine's desired set
    STOPPED = "stopped"  # its agent reports it stopped (or no longer has it)
    REPLACE = "replace"  # after a stop: it wants a machine again (new version, move)
    LOST = "lost"  # its machine became unavailable
    RECOVERED = "recovered"  # its machine is back before the task was moved
    SUCCEEDED = "succeeded"  # a batch task exited 0; its agent will not start it again
    GAVE_UP = "gave_up"  # a batch task exited non-zero with no retries left
    RERUN = "rerun"  # a finished batch task is wanted again (restart, new version)


TRANSITIONS: dict[tuple[S, Event], S] = {
    # placement: the task is in its machine's desired set from here on
    (S.PENDING, Event.ALLOCATED): S.ALLOCATED,
    # the agent picked it up
    (S.ALLOCATED, Event.STARTING): S.STARTING,
    (S.ALLOCATED, Event.RUNNING): S.RUNNING,
    (S.STARTING, Event.RUNNING): S.RUNNING,
    # a crash: the agent restarts it (restart policy); it is unavailable meanwhile.
    # From allocated: its process could not be started at all (a command that does not
    # exist: exit 127, as a shell says), a failure like any other
    (S.ALLOCATED, Event.EXITED): S.FAILED,
    (S.STARTING, Event.EXITED): S.FAILED,
    (S.RUNNING, Event.EXITED): S.FAILED,
    (S.FAILED, Event.STARTING): S.STARTING,
    (S.FAILED, Event.RUNNING): S.RUNNING,
    # planned stop (update, restart, move, resize, maintenance), always after the
    # task was disabled in service discovery
    (S.ALLOCATED, Event.STOP): S.STOPPING,
    (S.STARTING, Event.STOP): S.STOPPING,
    (S.RUNNING, Event.STOP): S.STOPPING,
    (S.FAILED, Event.STOP): S.STOPPING,
    (S.STOPPING, Event.STOPPED): S.STOPPED,
    # a stop forced by a maintenance deadline: nothing to wait for
    (S.STOPPING, Event.LOST): S.STOPPED,
    # stopped for an update/restart/move: place it again
    (S.STOPPED, Event.REPLACE): S.PENDING,
    (S.STOPPED, Event.ALLOCATED): S.ALLOCATED,
    # its machine failed: the copy there is unreachable; it waits for a move
    (S.ALLOCATED, Event.LOST): S.LOST,
    (S.STARTING, Event.LOST): S.LOST,
    (S.RUNNING, Event.LOST): S.LOST,
    (S.FAILED, Event.LOST): S.LOST,
    (S.STOPPED, Event.LOST): S.LOST,
    # the machine came back first: the task is expected there again
    (S.LOST, Event.RECOVERED): S.ALLOCATED,
    # moved off the lost machine
    (S.LOST, Event.REPLACE): S.PENDING,
    # a batch task finished (restart policy on-failure or never): out of its
    # machine's desired set, its resources given back
    (S.ALLOCATED, Event.SUCCEEDED): S.SUCCEEDED,
    (S.STARTING, Event.SUCCEEDED): S.SUCCEEDED,
    (S.RUNNING, Event.SUCCEEDED): S.SUCCEEDED,
    (S.FAILED, Event.SUCCEEDED): S.SUCCEEDED,
    (S.ALLOCATED, Event.GAVE_UP): S.DEAD,
    (S.STARTING, Event.GAVE_UP): S.DEAD,
    (S.RUNNING, Event.GAVE_UP): S.DEAD,
    (S.FAILED, Event.GAVE_UP): S.DEAD,
    # it finished while its machine was unreachable, or while being stopped (or moved
    # off a lost machine, not placed again yet): what ran is done, nothing to run again
    (S.LOST, Event.SUCCEEDED): S.SUCCEEDED,
    (S.LOST, Event.GAVE_UP): S.DEAD,
    (S.STOPPING, Event.SUCCEEDED): S.SUCCEEDED,
    (S.STOPPING, Event.GAVE_UP): S.DEAD,
    (S.PENDING, Event.SUCCEEDED): S.SUCCEEDED,
    (S.PENDING, Event.GAVE_UP): S.DEAD,
    # run a finished task again: the job was restarted or updated to a new runtime
    (S.SUCCEEDED, Event.RERUN): S.PENDING,
    (S.DEAD, Event.RERUN): S.PENDING,
}


def advance(state: S, event: Event) -> S | None:
    """The next state, or ``None`` if ``event`` does not apply in ``state``."""
    return TRANSITIONS.get((state, event))


#: states in which a task counts as unavailable for pacing (a running task that is
#: not healthy or not serving counts too; see ``Scheduler``)
DOWN = frozenset({S.PENDING, S.ALLOCATED, S.STARTING, S.STOPPING, S.STOPPED, S.FAILED, S.LOST})

#: a finished batch task: neither available nor unavailable (it holds no machine and
#: nothing waits for it), so pacing does not count it
FINISHED = frozenset({S.SUCCEEDED, S.DEAD})
