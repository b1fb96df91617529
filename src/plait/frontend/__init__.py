"""The front end: the REST API in front of the control plane."""

from plait.frontend.app import create_app

__all__ = ["create_app"]
