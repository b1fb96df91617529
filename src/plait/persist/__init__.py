"""Persistence of the core's state through a Store (shell: the core never imports a
store). Each component writes to its own namespace."""

from plait.persist.allocator import PersistentAllocator
from plait.persist.region import PersistentRegion

__all__ = ["PersistentAllocator", "PersistentRegion"]
