"""The Health Check Service: machines whose agents stop heartbeating become
unavailable in the brokers (DESIGN.md flow 2); machines that come back are healthy
again."""

from plait.health.service import HealthCheck

__all__ = ["HealthCheck"]
