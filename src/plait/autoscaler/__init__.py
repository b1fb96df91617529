"""The autoscaler (SRM): a job's task count from its load and its history
(``policy.recommend``, pure core)."""

from plait.autoscaler.policy import AutoscalePolicy, History, recommend

__all__ = ["AutoscalePolicy", "History", "recommend"]
