"""At most one copy of a task: the fence rule of jobs that ask for it (pure).

A job with ``fence: {seconds: F}`` in its spec asks that two copies of one of its
tasks never run at once, even while the agent of the task's machine is cut off or
frozen. Two sides keep that promise, each by the same clock-free arithmetic here:

* the machine's side (the real agent, its fence keeper process, and the simulated
  agent): a lease, renewed at every heartbeat the control plane took, counted from
  when that heartbeat was *sent*. Once the lease is ``F`` seconds old the task gets
  SIGTERM; ``FENCE_KILL_GRACE`` seconds later, SIGKILL (``verdict``). It is not
  started again until the agent has reached the control plane and pulled a desired
  set that still lists it.
* the control plane's side: a task of such a job on a failed machine leaves that
  machine's desired set at once, and is placed elsewhere only once
  ``F + FENCE_KILL_GRACE + FENCE_MARGIN`` seconds have passed since the machine's
  last heartbeat (``replace_at``), and never in the pass that found the machine
  failed (``may_replace``).

A heartbeat is received after it was sent, so the agent's lease always ends before
the control plane's count does; ``FENCE_MARGIN`` covers what lies between the kill
and the process being gone (the keeper's poll, the kernel's delivery) and the rates
of two machines' clocks. Kubernetes gives StatefulSets the same guarantee by never
replacing a pod before its node is known to be gone.
"""

from __future__ import annotations

import enum

#: seconds between the SIGTERM of a fenced task and its SIGKILL (whatever the job's
#: ``kill_timeout_seconds``: a fence cannot wait for a slow shutdown)
FENCE_KILL_GRACE = 1.0
#: seconds the control plane waits beyond the SIGKILL before it counts a fenced copy
#: gone
FENCE_MARGIN = 2.0


class Verdict(enum.StrEnum):
    """What the machine's side does with a fenced task now."""

    RUN = "run"  # the lease holds: the task may run
    TERM = "term"  # the lease ran out: stop it (SIGTERM)
    KILL = "kill"  # and the grace too: SIGKILL whatever is left


def verdict(seconds: float, contact: float | None, now: float) -> Verdict:
    """The machine's side of the fence for a task of a job with ``fence.seconds``
    ``seconds``: ``contact`` is when the last heartbeat the control plane took was
    sent (None: none since the agent started, and no lease kept on disk), ``now``
    on the same clock."""
    if contact is None:
        return Verdict.KILL
    age = now - contact
    if age < seconds:
        return Verdict.RUN
    if age < seconds + FENCE_KILL_GRACE:
        return Verdict.TERM
    return Verdict.KILL


def may_start(seconds: float, contact: float | None, now: float) -> bool:
    """Whether the agent may start (or restart) a fenced task now: only under a
    lease that holds (it must also have pulled a desired set listing the task after
    the last time the lease ran out: the agent keeps that)."""
    return verdict(seconds, contact, now) is Verdict.RUN


def replace_at(seconds: float, heard: float) -> float:
    """When the control plane may place elsewhere a fenced task of a machine last
    heard (its last heartbeat taken) at ``heard``: by then its copy there is gone,
    whether its agent runs, hangs or is dead."""
    return heard + seconds + FENCE_KILL_GRACE + FENCE_MARGIN


def may_replace(seconds: float, heard: float | None, lost_since: float,
                started: float | None, now: float) -> bool:
    """Whether the control plane may now place elsewhere a fenced task that was lost
    at ``lost_since`` (its machine found failed). ``heard``: the machine's last
    heartbeat this scheduler took (None: none since it started, at ``started``; a
    heartbeat taken by a replica that led before is then counted as at the later of
    the loss and this start). Never in the pass that found the loss (``now`` equal
    to ``lost_since``): a heartbeat taken while that pass ran is read by the next,
    and the task left its machine's desired set in that pass, so an agent that
    heard the control plane again cannot start it from a set read before."""
    if now <= lost_since:
        return False
    basis = heard if heard is not None else max(lost_since, started or lost_since)
    return now >= replace_at(seconds, basis)
