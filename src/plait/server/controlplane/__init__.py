"""The control plane of one region: ``ControlPlane`` (``core``) and its parts, one
module per concern (see ``core``)."""

from plait.server.controlplane.config import ControlPlaneConfig
from plait.server.controlplane.core import ControlPlane
from plait.server.controlplane.jobstate import JobState

__all__ = ["ControlPlane", "ControlPlaneConfig", "JobState"]
