"""The region job mix: the paper's extremes and a long tail (behaviour only)."""

import numpy as np

from plait.sim.jobmix import region_mix


def test_a_million_machines_get_the_papers_region():
    mix = region_mix(1_000_000)
    assert abs(mix.tasks - 2_000_000) <= 20_000
    assert mix.largest_job == 15_000
    assert mix.largest_entitlement == 60_000
    quotas = np.array([e.quota.machines for e in mix.entitlements])
    sizes = np.array([j.task_count for j in mix.jobs])
    assert quotas.sum() == 900_000  # 90% of the region: a free pool is left
    # a long tail: most jobs are small, most entitlements a tiny share of the largest
    assert np.median(sizes) <= 10 and (sizes >= 1_000).sum() >= 50
    assert np.median(quotas) <= 0.01 * quotas.max()
    # the largest job sits in the largest entitlement
    biggest = max(mix.jobs, key=lambda j: j.task_count)
    assert biggest.entitlement == mix.entitlements[0].name


def test_every_entitlements_jobs_fit_its_quota():
    mix = region_mix(20_000, seed=5)
    asked: dict[str, float] = {}
    for job in mix.jobs:
        asked[job.entitlement] = asked.get(job.entitlement, 0) + (
            job.task_count * job.resources.cpu)
    for ent in mix.entitlements:
        # about half the quota's RRU (16 per machine), 1-RRU jobs at most a little more
        assert asked[ent.name] <= 0.7 * 16 * ent.quota.machines


def test_a_smaller_region_gets_the_same_mix_scaled_down_and_a_seed_repeats_it():
    mix = region_mix(10_000, seed=2)
    assert mix.largest_entitlement == 600 and mix.largest_job == 150
    assert abs(mix.tasks - 20_000) <= 500
    again = region_mix(10_000, seed=2)
    assert again.jobs == mix.jobs and again.entitlements == mix.entitlements
    assert region_mix(10_000, seed=3).jobs != mix.jobs
