"""A task record's seldom-set fields, kept apart, read and write like the others; a
job's task sets share one empty set until something is added; per-version values
of a job kept without containers while it has one version."""

import copy
import pickle

import pytest

from plait.model.job import JobSpec
from plait.model.resources import Resources
from plait.model.task import TaskState
from plait.scheduler.records import NO_TASKS, JobRecord, TaskRecord

APART = {"parked": "mx-1", "lost_since": 5.0, "exit_code": 3, "unhealthy_since": 7.5,
         "served": True}


def test_a_new_record_holds_nothing_apart_and_reads_the_defaults():
    rec = TaskRecord(4, 2)
    assert rec.apart is None
    assert (rec.parked, rec.lost_since, rec.exit_code, rec.unhealthy_since,
            rec.served) == (None, None, None, None, False)
    rec.parked = None  # writing a default makes nothing
    rec.served = False
    assert rec.apart is None


@pytest.mark.parametrize("name", sorted(APART))
def test_each_field_kept_apart_reads_back_and_is_dropped_at_its_default(name):
    rec = TaskRecord(4, 2, TaskState.RUNNING, 9, True, True)
    setattr(rec, name, APART[name])
    assert getattr(rec, name) == APART[name] and rec.apart is not None
    rec.exit_code = 0  # a second field set: both kept
    setattr(rec, name, None if name != "served" else False)
    rec.exit_code = None
    assert rec.apart is None
    assert rec == TaskRecord(4, 2, TaskState.RUNNING, 9, True, True)


def test_all_sixteen_fields_by_position_compare_and_print_like_the_dataclass():
    args = (1, 2, TaskState.RUNNING, 9, True, True, None, True, False, "mx", 1.0, 2.0, 0,
            3.0, True, "h:1")
    rec = TaskRecord(*args)
    assert (rec.index, rec.spec_version, rec.state, rec.machine, rec.serving, rec.healthy,
            rec.op, rec.op_costly, rec.restart, rec.parked, rec.lost_since,
            rec.healthy_since, rec.exit_code, rec.unhealthy_since, rec.served,
            rec.endpoint) == args
    assert rec == TaskRecord(*args) and rec != TaskRecord(*args[:-1], "h:2")
    assert repr(rec).startswith("TaskRecord(index=1, spec_version=2, state=")
    assert "parked='mx'" in repr(rec) and "endpoint='h:1'" in repr(rec)
    with pytest.raises(TypeError):
        hash(rec)


def job(name: str = "web") -> JobRecord:
    spec = JobSpec(name=name, entitlement="e", task_count=2, command="serve",
                   resources=Resources(cpu=1, memory_gb=1))
    return JobRecord(name, "e", [spec], 1)


def test_task_sets_share_one_empty_set_until_added_to():
    a, b = job("a"), job("b")
    assert a.lost is b.in_progress is a.failed_tasks is NO_TASKS
    assert not a.lost and 3 not in a.in_progress and sorted(a.failed_tasks) == []
    a.lost.discard(3)  # reading and removing work as on any empty set
    with pytest.raises(TypeError):
        a.lost.add(3)
    a.add_lost(3)
    a.add_in_progress(4)
    a.add_failed(5)
    assert (a.lost, a.in_progress, a.failed_tasks) == ({3}, {4}, {5})
    assert b.lost is b.in_progress is b.failed_tasks is NO_TASKS and not NO_TASKS
    assert copy.copy(NO_TASKS) is copy.deepcopy(NO_TASKS) is NO_TASKS
    assert pickle.loads(pickle.dumps(NO_TASKS)) is NO_TASKS


def test_per_version_values_of_a_one_version_job_and_of_a_second_version():
    j = job()
    assert j.revision(1) == 1 and j._revisions is None
    first = j.assigned(1)
    assert j.assigned(1) is first and j._assigned is None
    spec2 = j.versions[0].model_copy(update={"task_count": 3})
    j.versions.append(spec2)
    j.target = 2
    assert j.revision(2) == 1  # a resize only: runs the same way as version 1
    second = j.assigned(2)
    assert j.assigned(2) is second and j.assigned(1) is first
    assert (second.spec_version, second.revision, second.spec) == (2, 1, spec2)
    j.cause = "req-9"  # a new cause: a new Assigned, shared again from then on
    again = j.assigned(1)
    assert again is not first and again.cause == "req-9" and j.assigned(1) is again
    j.pin_revision(1, 1)
    assert j.revision(1) == 1
    same = j.same_as(2)
    same[1] = True
    assert j.same_as(2) is same and j.same_as(1) == {}
