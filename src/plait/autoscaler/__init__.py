"""The autoscaler (SRM): a job's task count from its load and its history
(``policy.recommend``, pure core), within the room there is (``policy.within_room``)."""

from plait.autoscaler.policy import (
    AutoscalePolicy,
    Capped,
    History,
    Room,
    recommend,
    within_room,
)

__all__ = ["AutoscalePolicy", "Capped", "History", "Room", "recommend", "within_room"]
