"""Chaos in CI, bounded: a region under seeded random SIGKILLs of tasks, agents and
the control plane while its job is updated and resized loses no acknowledged write,
never lists two copies of one task, converges, and leaves no process behind."""

from plait.bench import chaos


def test_random_kills_lose_nothing_and_leave_nothing():
    figures = chaos.run(seconds=25, seed=7, machines=4)
    assert figures["kills"] >= 3, figures  # (the seeded schedule kills)
    assert figures["acknowledged"] >= 3, figures
    assert figures["lost"] == 0, figures
    assert figures["samples"] > 0 and figures["double_serving_samples"] == 0, figures
    assert figures["converge_s"] is not None, figures  # within the liveness bound
    assert figures["orphans"] == 0, figures
