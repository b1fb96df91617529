"""A job's status in one word, from its view: what ``plait job list`` shows and what
``GET /v1/jobs?state=`` filters on (the control plane and the CLI read it here, so
they never disagree). Pure."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: every status a job can be in, first match wins (``status``)
JOB_STATES = ("deleting", "halted", "complete", "failed", "settled", "unplaced",
              "rolling-out", "converging")

#: how an unplaced reason starts when no machine of the region could ever take the
#: task (too big for every machine, or no machine of the types it requires): no room
#: that frees up places it, only other machines (``plait.allocator.policy.NEVER_FITS``)
NEVER_FITS = "no machine of the region "


def job_status(j: Mapping[str, Any]) -> str:
    """The job's status: deleting; halted (a rollout stopped on unhealthy tasks);
    complete or failed (a batch job that ended); settled (every task runs the latest
    version, nothing under way); unplaced (tasks wait for room); rolling-out (an
    operation under way); else converging."""
    if j["deleting"]:
        return "deleting"
    if j["halted"]:
        return "halted"
    if j.get("batch") and j["phase"] != "running":
        return str(j["phase"])  # complete, or failed
    if j["settled"]:
        return "settled"
    if j["unplaced_reason"]:
        return "unplaced"
    return "rolling-out" if j["rollout_active"] else "converging"
