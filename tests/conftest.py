"""Shared test settings: hypothesis profiles (CI runs a few more examples); plait's
logging set up by a test is taken out after it."""

import os

import pytest
from hypothesis import HealthCheck, settings

from plait import logconfig

settings.register_profile("ci", max_examples=60, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", max_examples=30, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("ci" if os.environ.get("CI") else "dev")


@pytest.fixture(autouse=True)
def _plait_logging():
    """A daemon's command run in this process (CliRunner) configures plait's logging
    for the process: the next test starts without it."""
    yield
    if logconfig.configured():
        logconfig.reset()
