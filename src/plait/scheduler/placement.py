"""Stage 4 of a job's reconcile: what to ask the allocator for.

Tasks without a machine (new, resized up, replaced after a stop, moved off a failed
machine) are placed by version: one allocation request per spec version, since
versions may ask for different resources. A task still holding a machine keeps it if
the allocator finds it usable (an update in place); one on a failed or cordoned
machine is moved. ``apply`` submits the requests (the allocator commits them with
optimistic concurrency) and puts what was placed into its machine's desired set.
"""

from __future__ import annotations

from collections.abc import Container

from plait.allocator import AllocationRequest
from plait.model.task import TaskState
from plait.scheduler.plans import PlacementPlan
from plait.scheduler.records import JobRecord


def plan_placement(job: JobRecord, canaries: Container[str] = ()) -> PlacementPlan:
    """The allocation requests for the job's pending tasks, oldest version first.
    ``canaries``: the canary entitlements of the job's entitlement (a version bound to
    one is placed there: a code + config + host-profile canary, decision 103)."""
    plan = PlacementPlan()
    count, pending_state = job.spec.task_count, TaskState.PENDING
    keep = job.surges  # (surge tasks are placed like the job's own)
    pending = [r for r in job.tasks.values() if r.state is pending_state and (
        r.index < count or (keep is not None and r.index in keep))]
    if not pending:
        return plan
    by_version: dict[int, list[int]] = {}
    ent, versions = job.entitlement, job.versions
    for rec in pending:
        version = rec.spec_version
        bound = versions[version - 1].entitlement
        goal = job.target_of(rec.index)
        if (bound != ent and (bound not in canaries or goal != version)) or (
                version != goal and rec.op is None):
            # waiting for a machine at a version of the entitlement the job left (never
            # placed, or moved off a failed machine), or of a canary that ended, or at
            # a version an update has replaced since with no operation under way (a
            # task never placed: a version that never fitted waited for room in vain
            # after an update that fits): it runs nowhere, so it starts at its goal
            # version directly
            plan.retarget.append(rec.index)
            version = goal
        by_version.setdefault(version, []).append(rec.index)
    for version, indices in sorted(by_version.items()):
        spec = versions[version - 1]
        where = spec.entitlement if spec.entitlement in canaries else ent
        plan.requests.append((version, AllocationRequest.of(
            job.name, where, spec.resources, allocate=sorted(indices),
            policy=spec.policy)))
    return plan
