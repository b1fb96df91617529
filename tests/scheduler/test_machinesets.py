"""Machines' desired and placed sets as tuples read like the dict and set they
replaced, and a machine with no task left has no entry."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from plait.model.task import TaskRef
from plait.scheduler import Assignment, machinesets
from plait.scheduler.machinesets import (
    DesiredSet,
    PlacedSet,
    desire,
    desire_all,
    place,
    place_all,
    undesire,
    undesire_all,
    unplace,
    unplace_all,
)
from plait.scheduler.records import Assigned
from plait.sim.scenarios import job_spec, world

SPECS = {"web": job_spec("web", 3), "db": job_spec("db", 3)}


def _a(job: str, index: int, version: int = 1) -> Assignment:
    return Assignment(job, index, version, version, SPECS[job])


def _s(job: str, version: int = 1) -> Assigned:
    return Assigned(job, version, version, SPECS[job])


def test_a_desired_set_reads_like_a_dict_keyed_by_task_ref():
    desired: dict[int, DesiredSet] = {}
    desire(desired, 7, TaskRef("web", 0), _s("web"))
    desire(desired, 7, TaskRef("db", 0), _s("db"))
    desire(desired, 7, TaskRef("web", 1), _s("web"))
    got = desired[7]
    assert TaskRef("web", 1) in got and TaskRef("web", 2) not in got and "web" not in got
    assert got.get(TaskRef("db", 0)) == _a("db", 0) and got.get(TaskRef("db", 1)) is None
    assert [(r.job, r.index) for r, _ in got.items()] == [("web", 0), ("db", 0), ("web", 1)]
    assert got.keys() == [TaskRef("web", 0), TaskRef("db", 0), TaskRef("web", 1)]
    assert len(got) == 3 and list(got.values()) == [_a("web", 0), _a("db", 0), _a("web", 1)]
    # a new assignment of a task replaces its old one where it was (as a dict does)
    desire(desired, 7, TaskRef("db", 0), _s("db", 2))
    assert [a.spec_version for a in desired[7]] == [1, 2, 1]
    before = desired[7]
    undesire(desired, 7, TaskRef("db", 0))
    assert [(a.job, a.index) for a in desired[7]] == [("web", 0), ("web", 1)]
    assert len(before) == 3  # a set handed out earlier never changes
    assert desired[7] == DesiredSet((_s("web"), 0, _s("web"), 1))
    undesire(desired, 7, TaskRef("db", 0))  # (not there: nothing happens)
    undesire(desired, 7, TaskRef("web", 0))
    undesire(desired, 7, TaskRef("web", 1))
    assert 7 not in desired


def test_a_placed_set_holds_each_task_once_and_empties_away():
    placed: dict[int, PlacedSet] = {}
    place(placed, 3, TaskRef("web", 0))
    place(placed, 3, TaskRef("web", 0))
    place(placed, 3, TaskRef("web", 1))
    assert placed[3] == (TaskRef("web", 0), TaskRef("web", 1))
    assert list(placed[3]) == [TaskRef("web", 0), TaskRef("web", 1)] == placed[3].refs()
    assert TaskRef("web", 1) in placed[3] and TaskRef("web", 2) not in placed[3]
    assert len(placed[3]) == 2
    assert tuple.__len__(placed[3]) == 4  # flat (job, index) pairs, no TaskRef kept
    unplace(placed, 3, TaskRef("web", 0))
    unplace(placed, 3, TaskRef("web", 5))
    assert placed[3] == (TaskRef("web", 1),)
    unplace(placed, 3, TaskRef("web", 1))
    assert placed == {}


def test_several_tasks_of_a_job_leave_a_machine_as_one_at_a_time_would():
    def filled() -> dict[int, DesiredSet]:
        desired: dict[int, DesiredSet] = {}
        for job, index in [("web", 0), ("db", 1), ("web", 1), ("web", 2), ("db", 2)]:
            desire(desired, 7, TaskRef(job, index), _s(job))
        return desired

    one, many = filled(), filled()
    for index in (1, 2, 5):  # (web/5 is not there)
        undesire(one, 7, TaskRef("web", index))
    before = many[7]
    undesire_all(many, 7, "web", {1, 2, 5})
    assert many == one and list(many[7].items()) == [
        (TaskRef("web", 0), _a("web", 0)), (TaskRef("db", 1), _a("db", 1)),
        (TaskRef("db", 2), _a("db", 2))]
    assert len(before) == 5  # a set handed out earlier never changes
    kept = many[7]
    undesire_all(many, 7, "web", {7})  # none there: the set is left as it was
    assert many[7] is kept
    undesire_all(many, 7, "web", {0})
    undesire_all(many, 7, "db", {1, 2})
    assert 7 not in many  # a machine left with no task has no entry
    undesire_all(many, 7, "db", {1})  # (no entry: nothing to do)
    assert many == {}


@given(st.lists(st.tuples(st.sampled_from(["web", "db", "api"]), st.integers(0, 4)),
                max_size=24, unique=True),
       st.sampled_from(["web", "db", "api", "nosuch"]), st.integers(0, 5))
def test_a_task_is_found_in_a_set_of_any_size(tasks, job, index):
    """A machine packed with small tasks holds dozens; a look-up finds the task's own
    pair (its job and index both) however many the set holds, or nothing."""
    pairs: list[object] = []
    for name, i in tasks:
        pairs += [Assigned(name, 1, 1, SPECS.get(name, SPECS["web"])), i]
    got = DesiredSet(tuple(pairs))
    assert (TaskRef(job, index) in got) == ((job, index) in tasks)
    found = got.get(TaskRef(job, index))
    assert (found is None) == ((job, index) not in tasks)
    if found is not None:
        assert (found.job, found.index) == (job, index)


@given(st.integers(0, 700), st.lists(st.tuples(st.sampled_from(["web", "db"]),
                                                st.integers(0, 700)), max_size=40),
       st.sampled_from(["big", "web", "db", "nosuch"]), st.integers(0, 701))
def test_a_task_is_found_among_hundreds_of_one_jobs(big, others, job, index):
    """Hundreds of one job's tasks on a machine, other jobs' tasks with the same
    indices among them: both sets find the task's own pair, or nothing."""
    tasks = list(dict.fromkeys([*(("big", i) for i in range(big)), *others]))
    pairs: list[object] = []
    placed: list[object] = []
    for name, i in tasks:
        pairs += [Assigned(name, 1, 1, SPECS.get(name, SPECS["web"])), i]
        placed += [name, i]
    ref, there = TaskRef(job, index), (job, index) in tasks
    got = DesiredSet(tuple(pairs))
    assert (ref in got) == there
    found = got.get(ref)
    assert (found is not None) == there
    if found is not None:
        assert (found.job, found.index) == (job, index)
    assert (ref in PlacedSet(tuple(placed))) == there
    assert got.by_job().get(job, set()) == {i for name, i in tasks if name == job}



@given(st.lists(st.tuples(st.sampled_from(["web", "db"]), st.integers(0, 9),
                          st.integers(1, 2)), max_size=30),
       st.lists(st.tuples(st.integers(0, 12), st.integers(1, 3)), max_size=12),
       st.sets(st.integers(0, 12), max_size=8))
def test_many_of_a_jobs_tasks_change_a_machine_as_one_at_a_time_would(there, new, gone):
    """An update of a job of small tasks re-assigns hundreds on one machine: the
    ``*_all`` changes rebuild each set once, and leave it as one change per task
    would, order included."""
    def filled() -> tuple[dict[int, DesiredSet], dict[int, PlacedSet]]:
        desired: dict[int, DesiredSet] = {}
        placed: dict[int, PlacedSet] = {}
        for job, index, version in there:
            desire(desired, 7, TaskRef(job, index), _s(job, version))
            place(placed, 7, TaskRef(job, index))
        return desired, placed

    items = {index: _s("web", version) for index, version in new}
    (d1, p1), (d2, p2) = filled(), filled()
    for index, assigned in items.items():
        desire(d1, 7, TaskRef("web", index), assigned)
        place(p1, 7, TaskRef("web", index))
    desire_all(d2, 7, "web", items)
    place_all(p2, 7, "web", items.keys())
    assert d2 == d1 and p2 == p1  # (the raw pairs compared: order included)
    for index in gone:
        undesire(d1, 7, TaskRef("web", index))
        unplace(p1, 7, TaskRef("web", index))
    undesire_all(d2, 7, "web", gone)
    unplace_all(p2, 7, "web", gone)
    assert d2 == d1 and p2 == p1  # (a machine left with no task has no entry, in both)


def test_resizing_a_job_packed_on_few_machines_rebuilds_each_machines_sets_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A resize makes a version that runs as the last: every task's desired set
    names it. One rebuild of a machine's set per task cost the square of its tasks
    (a job of 100,000 small tasks on 8 machines: a 65 s pass); now one per machine."""
    sim = world(machines=6)
    s = sim.scheduler
    spec = job_spec("web", 240, cpu=0.01, memory_gb=0.01)
    s.create_job(spec, 0)
    assert sim.run_until(lambda: len(s.discovery("web")) == 240, 300)
    on = {m for m, placed in s.placed.items() if len(placed)}
    assert len(on) <= 6
    built = []

    class Counted(DesiredSet):
        __slots__ = ()

        def __new__(cls, pairs: Any) -> Counted:
            built.append(1)
            return super().__new__(cls, pairs)

    monkeypatch.setattr(machinesets, "DesiredSet", Counted)
    s.resize("web", 239, sim.now)
    assert sim.run_until(lambda: len(s.job("web").tasks) == 239 and all(
        a.spec_version == 2 for d in s.desired.values() for a in d), 300)
    assert len(built) <= 3 * len(on), len(built)
