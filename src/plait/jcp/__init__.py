"""The Job Control Plane: intents from many writers reconciled into one unified spec
per job (``unify``, pure core)."""

from plait.jcp.unify import Canary, Push, Sizing, Unified, round_half_up, unify

__all__ = ["Canary", "Push", "Sizing", "Unified", "round_half_up", "unify"]
