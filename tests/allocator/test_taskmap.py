"""The allocator's per-task maps read and write like the dicts they replace."""

import pytest

from plait.allocator.taskmap import CodedMap, MachineMap


def test_a_machine_map_behaves_like_a_dict_of_task_to_machine():
    m = MachineMap()
    ref: dict[int, int] = {}
    for t, machine in [(3, 70_000), (0, 5), (1, 0), (7, 12)]:
        m[t] = machine
        ref[t] = machine
    assert m == ref and len(m) == 4 and bool(m)
    assert m.get(3) == 70_000 and m.get(2) is None and m.get(99, -5) == -5
    assert 1 in m and 2 not in m and 99 not in m and "1" not in m
    assert list(m) == [0, 1, 3, 7]  # (in task order)
    assert m.items() == [(0, 5), (1, 0), (3, 70_000), (7, 12)]
    assert m.values() == [5, 0, 70_000, 12]
    del m[7]
    assert m.pop(3) == 70_000 and len(m) == 2 and 3 not in m
    with pytest.raises(KeyError):
        del m[3]
    with pytest.raises(KeyError):
        _ = m[3]
    m.update([(2, 9)])
    assert dict(m.items()) == {0: 5, 1: 0, 2: 9}
    del m[0], m[1], m[2]
    assert not m and m.items() == []


def test_a_coded_map_keeps_each_distinct_value_once():
    units = CodedMap[tuple[int, int, int]]()
    units.fill(range(4), (1000, 2048, 0))
    units[5] = (2000, 4096, 0)
    units[2] = (1000, 2048, 0)  # equal, not the same object: the same code
    assert units == {0: (1000, 2048, 0), 1: (1000, 2048, 0), 2: (1000, 2048, 0),
                     3: (1000, 2048, 0), 5: (2000, 4096, 0)}
    assert set(units) == {0, 1, 2, 3, 5}
    assert units.pop(1) == (1000, 2048, 0)
    assert units.values() == [(1000, 2048, 0)] * 3 + [(2000, 4096, 0)]
    assert len(units._table) == 2
