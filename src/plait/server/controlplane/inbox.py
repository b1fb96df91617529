"""What arrives between passes, for the next pass to take: the names of jobs whose
records changed, the records of creates just stored, agents' reports and heartbeats,
the TaskControl answers the dispatcher handed back, and the wake-up that starts a
pass now.

``Inbox`` is their one owner; requests and agents put, the pass takes (each take
swaps the list out, so nothing is held long under ``lock``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from plait.scheduler.records import TaskStatus
from plait.sidekick.book import Applied
from plait.taskcontrol.protocol import ControllerAnswer

if TYPE_CHECKING:
    from plait.persist.scheduler import JobDoc

#: stored creates kept for the pass at most (beyond, the pass parses what it reads)
STORED_KEPT = 10_000

#: (machine, its tasks' statuses, their endpoints, when it reported, the host profile
#: it applied: None from an agent that does not say, the cores each task used)
Report = tuple[str, list[TaskStatus], dict[tuple[str, int], str], float, Applied | None,
               dict[tuple[str, int], float]]


class Wake(threading.Event):
    """The loop's wake-up: an event that also keeps when it was last set (monotonic
    seconds; ``Loop.run`` ends a burst's wait once none came for a moment)."""

    def __init__(self) -> None:
        super().__init__()
        self.at = float("-inf")

    def set(self) -> None:
        self.at = time.monotonic()
        super().set()


class Inbox:
    def __init__(self) -> None:
        #: guards what is put here (never held long)
        self.lock = threading.Lock()
        #: the jobs whose records changed since the last pass took them
        self.jobs: set[str] = set()
        #: set to start the next pass now
        self.wake = Wake()
        #: called with each job put (the listing reads its record again)
        self.touch: Callable[[str], None] = lambda job: None
        self._reports: list[Report] = []
        self._beats: dict[str, float] = {}
        #: what each machine reported last (its statuses, endpoints and profile): a
        #: report that repeats it wakes no pass
        self._last: dict[str, tuple[list[TaskStatus], dict[tuple[str, int], str],
                                    Applied | None]] = {}
        self._answers: list[ControllerAnswer] = []
        #: the records of creates stored since the pass last took them: the pass
        #: reads them back, and takes their parsed specs from here
        self._stored: dict[str, JobDoc] = {}

    # -- jobs ----------------------------------------------------------------------------
    def notify(self, job: str) -> None:
        """A job's record changed: apply it on the next pass, which starts now."""
        self.touch(job)
        with self.lock:
            self.jobs.add(job)
        self.wake.set()

    def notify_many(self, jobs: Iterable[str]) -> None:
        """Jobs' records changed (a batch of creates): one wake of the pass for all."""
        jobs = list(jobs)
        if jobs:
            for job in jobs:
                self.touch(job)
            with self.lock:
                self.jobs.update(jobs)
            self.wake.set()

    def take_jobs(self) -> set[str]:
        with self.lock:
            jobs, self.jobs = self.jobs, set()
        return jobs

    def stored(self, docs: Iterable[JobDoc]) -> None:
        """Creates stored (by the committer): their records, for the next pass."""
        with self.lock:
            if len(self._stored) > STORED_KEPT:  # (no pass takes them: a follower)
                self._stored.clear()
            for doc in docs:
                self._stored[doc.name] = doc

    def take_stored(self) -> dict[str, JobDoc]:
        with self.lock:
            stored, self._stored = self._stored, {}
        return stored

    # -- agents --------------------------------------------------------------------------
    def report(self, report: Report) -> None:
        """An agent's heartbeat and report; wakes the pass when it says something new
        (not a repeat of the machine's last report)."""
        machine, statuses, endpoints, now, profile, _ = report
        said = (statuses, endpoints, profile)
        with self.lock:
            self._beats[machine] = now
            self._reports.append(report)
            new = self._last.get(machine) != said
            if new:
                self._last[machine] = said
        if new:
            self.wake.set()

    def take_reports(self) -> tuple[list[Report], dict[str, float]]:
        """The reports and heartbeats put since the last take (the pass's input)."""
        with self.lock:
            reports, self._reports = self._reports, []
            beats, self._beats = self._beats, {}
        return reports, beats

    def beats(self) -> dict[str, float]:
        """The heartbeats not taken yet (a copy)."""
        with self.lock:
            return dict(self._beats)

    def beat_of(self, machine: str) -> float | None:
        with self.lock:
            return self._beats.get(machine)

    # -- TaskControl ---------------------------------------------------------------------
    def answer(self, answer: ControllerAnswer) -> None:
        with self.lock:
            self._answers.append(answer)
        self.wake.set()

    def take_answers(self) -> list[ControllerAnswer]:
        with self.lock:
            answers, self._answers = self._answers, []
        return answers
