"""plait: a cluster manager that implements the design of Meta's Twine.

One control plane per region manages every machine of the region; jobs are bound
to entitlements (quota + pseudo-cluster), not to physical clusters; machines move
between entitlements and a shared free pool.
"""

__version__ = "0.1.0"
